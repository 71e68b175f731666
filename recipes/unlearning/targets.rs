//! The unlearning methods' targets as pure functions: the leave-one-out ensemble's aggregate,
//! REINFORCE's soft targets, and ReRULE's stored hard groups with their importance-weighted
//! replay. Each is the `q` of the job's one loss, −(1/B) Σ_rows Σ_v q(v)·log π(v).

/// A hard group ReRULE stores: its prompt, its answers with their sampler log-probs, and their
/// GRPO advantages.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HardGroup {
    /// The fact asked.
    pub fact: usize,
    /// The sampled answers.
    pub answers: Vec<u32>,
    /// Their log-probs under the policy that sampled them.
    pub log_probs: Vec<f32>,
    /// Their advantages when sampled.
    pub advantages: Vec<f32>,
}

/// The bound of a replayed answer's importance weight (truncated importance sampling, as the
/// engine's rollout-mismatch correction bounds it).
pub const REPLAY_WEIGHT_CAP: f32 = 2.0;

/// ReRULE's importance-sampled off-policy target of a stored group under the current policy's
/// log-probs `now` `[vocab]`: each answer t_j carries min(π(t_j)/π_old(t_j), C)·A_j/n, so
/// the job's `soft_step`'s loss is −(1/n) Σ_j sg(w_j)·A_j·log π(t_j).
pub fn replay_target(g: &HardGroup, now: &[f32]) -> Vec<f32> {
    let n = g.answers.len().max(1) as f32;
    let mut q = vec![0.0; now.len()];
    for ((t, old), a) in g.answers.iter().zip(&g.log_probs).zip(&g.advantages) {
        let t = *t as usize;
        let w = (now[t] - old).exp().min(REPLAY_WEIGHT_CAP);
        q[t] += w * a / n;
    }
    q
}

/// A step's groups: `n` sampled answers to each prompted fact, with the sampler's
/// log-distribution over the vocabulary per fact, each answer's reward and advantage.
pub(super) struct Groups<'a> {
    /// The facts prompted, one per group.
    pub(super) prompts: &'a [usize],
    /// The answers, `n` per group.
    pub(super) tokens: &'a [u32],
    /// `[groups, vocab]` log-probs of the sampler.
    pub(super) lp: &'a [f32],
    pub(super) rewards: &'a [f32],
    pub(super) adv: &'a [f32],
    /// Answers per group.
    pub(super) n: usize,
}

/// Stores this step's hard groups (mean reward below ½ with some non-zero advantage: an
/// all-wrong group has none to learn from), keeping the newest 64.
pub(super) fn admit_hard(hard: &mut Vec<HardGroup>, groups: Groups<'_>) {
    let Groups {
        prompts,
        tokens,
        lp,
        rewards,
        adv,
        n,
    } = groups;
    let v = lp.len() / prompts.len().max(1);
    for (g, fact) in prompts.iter().enumerate() {
        let part = g * n..(g + 1) * n;
        let mean = rewards[part.clone()].iter().sum::<f32>() / n as f32;
        if mean >= 0.5 || adv[part.clone()].iter().all(|a| *a == 0.0) {
            continue;
        }
        hard.push(HardGroup {
            fact: *fact,
            answers: tokens[part.clone()].to_vec(),
            log_probs: tokens[part.clone()]
                .iter()
                .map(|t| lp[g * v + *t as usize])
                .collect(),
            advantages: adv[part].to_vec(),
        });
    }
    if hard.len() > 64 {
        hard.drain(..hard.len() - 64);
    }
}

/// The leave-one-out target of a fact in shard `own`: the mean of the distributions of the
/// teachers other than `own` (`probs[k]` is teacher k's `[vocab]` distribution), the
/// aggregate of the teachers that never saw the fact.
pub(super) fn loo_target(probs: &[&[f32]], own: usize) -> Vec<f32> {
    let v = probs.first().map_or(0, |p| p.len());
    let others: Vec<&[f32]> = probs
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != own)
        .map(|(_, p)| *p)
        .collect();
    let n = others.len().max(1) as f32;
    (0..v)
        .map(|x| others.iter().map(|p| p[x]).sum::<f32>() / n)
        .collect()
}

/// Soft targets that make the job's `soft_step`'s loss REINFORCE's: prompt g's target puts A_j / n on
/// each of its n sampled answers t_j, so −(1/G) Σ_g Σ_v q_g(v)·log π_g(v) =
/// −(1/(G·n)) Σ_j A_j·log π(t_j).
pub(super) fn reinforce_targets(
    tokens: &[u32],
    adv: &[f32],
    n: usize,
    vocab: usize,
) -> Vec<Vec<f32>> {
    let mut out = vec![vec![0.0; vocab]; tokens.len() / n.max(1)];
    for (j, (t, a)) in tokens.iter().zip(adv).enumerate() {
        out[j / n][*t as usize] += a / n as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loo_targets_average_the_teachers_that_never_saw_the_fact() {
        let (a, b, c) = ([0.5, 0.5, 0.0], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4]);
        let rows: [&[f32]; 3] = [&a, &b, &c];
        // The fact is teacher 0's: the mean of teachers 1 and 2.
        let t = loo_target(&rows, 0);
        for (x, y) in t.iter().zip([0.2, 0.3, 0.5]) {
            assert!((x - y).abs() < 1e-6, "{t:?}");
        }
    }

    #[test]
    fn replayed_answers_carry_truncated_importance_weights() {
        // Answers 0 and 1, sampled at log-probs ln 0.5 and ln 0.25, advantages 1 and −1; now
        // π = (0.5, 0.75): w = 1 and min(3, 2) = 2; n = 2: q = (0.5, −1).
        let g = HardGroup {
            fact: 0,
            answers: vec![0, 1],
            log_probs: vec![0.5f32.ln(), 0.25f32.ln()],
            advantages: vec![1.0, -1.0],
        };
        let q = replay_target(&g, &[0.5f32.ln(), 0.75f32.ln(), -10.0]);
        for (x, y) in q.iter().zip([0.5, -1.0, 0.0]) {
            assert!((x - y).abs() < 1e-6, "{q:?}");
        }
    }

    #[test]
    fn reinforce_targets_put_each_advantage_on_its_answer() {
        // Two prompts, two samples each: answers 1, 1 | 0, 2 with advantages 1, −1 | 0.5, −0.5.
        let q = reinforce_targets(&[1, 1, 0, 2], &[1.0, -1.0, 0.5, -0.5], 2, 3);
        assert_eq!(q, vec![vec![0.0, 0.0, 0.0], vec![0.25, 0.0, -0.25]]);
    }
}
