//! Reinforce-Ada's rollout (`ember_engine::ReinforceAda`): the step's prompts are sampled in
//! rounds, each round one batched `generate` of `round_repeat` responses for every prompt still
//! active, scored by the recipe's reward; a prompt retires once its pool is balanced (or has a
//! positive), and the responses kept from all rounds are stacked into one generation that the
//! rest of the step uses unchanged. One host read of the rewards per round (the retirement
//! rule needs them), as the reference does.

use crate::lm::score::{Scorer, completions};
use crate::lm::step::SamplerRef;
use anyhow::Result;
use ember_engine::{AdaPool, ReinforceAda};
use ember_llm::{Generation, SamplingConfig, generate};
use ember_tasks::task::Example;
use std::collections::BTreeMap;

/// What Reinforce-Ada's rounds leave for the step.
pub struct AdaRollout {
    /// The kept responses of every prompt, stacked (group id = prompt index).
    pub generation: Generation,
    /// Their rewards.
    pub rewards: Vec<f32>,
    /// Per kept row: the mean and std of every reward drawn for its prompt.
    pub pool_mean: Vec<f32>,
    /// See `pool_mean`.
    pub pool_std: Vec<f32>,
    /// Responses generated in all rounds.
    pub drawn: usize,
    /// Response tokens generated in all rounds.
    pub tokens_drawn: usize,
    /// Mean finite reward over every response drawn (NaN when none).
    pub reward_mean_drawn: f64,
    /// Rounds run.
    pub rounds: usize,
    /// Prompts that did not retire within `max_rounds` (kept what they had).
    pub unfinished: usize,
}

/// How each round is scored: the run's scorer at step `step` (its `reward/*` metrics into
/// `row`), the responses' ids turned into text by `decode`.
pub struct AdaScoring<'a, 's> {
    /// The run's scorer.
    pub scorer: &'a mut Scorer<'s>,
    /// The step (1-based) the rewards are logged at.
    pub step: usize,
    /// The step's metrics.
    pub row: &'a mut BTreeMap<String, f64>,
    /// Ids to text.
    pub decode: &'a dyn Fn(&[u32]) -> String,
}

/// Runs the rounds for `prompts` (token ids; `examples` alongside) and keeps `n` responses per
/// prompt. `decode` turns ids into text for the reward; `scorer` scores each round (the
/// `reward/*` metrics put in `row` are those of the first round, which covers every prompt).
pub fn ada_rollout(
    ada: &ReinforceAda,
    n: usize,
    prompts: &[Vec<u32>],
    examples: &[Example],
    sampler: SamplerRef,
    scoring: AdaScoring,
) -> Result<AdaRollout> {
    let (sampler, sc, device) = (sampler.model, sampler.config, sampler.device);
    let AdaScoring {
        scorer,
        step,
        row,
        decode,
    } = scoring;
    let mut pools = vec![AdaPool::default(); prompts.len()];
    let mut rounds: Vec<(Generation, Vec<f32>)> = Vec::new();
    let (mut drawn, mut tokens_drawn) = (0, 0);
    let (mut reward_sum, mut finite) = (0.0f64, 0usize);
    for r in 0..ada.max_rounds {
        let active: Vec<usize> = (0..prompts.len())
            .filter(|&i| ada.active(&pools[i]))
            .collect();
        if active.is_empty() {
            break;
        }
        let ps: Vec<Vec<u32>> = active.iter().map(|&i| prompts[i].clone()).collect();
        let cfg = SamplingConfig {
            n: ada.round_repeat,
            seed: sc.seed ^ ((r as u64) << 40),
            ..sc.clone()
        };
        let mut g = generate(sampler, &ps, &cfg, device)?;
        g.group_ids = g.group_ids.iter().map(|gi| active[*gi]).collect();
        let ids = g.response_ids();
        tokens_drawn += ids.iter().map(Vec::len).sum::<usize>();
        let texts: Vec<String> = ids.iter().map(|ids| decode(ids)).collect();
        // Each round is scored into its own map (a reward's component metrics may be written
        // once per step); the first round's, which covers every prompt, are the step's.
        let mut scratch = BTreeMap::new();
        let rewards = scorer.score(step, &completions(&g, examples, &ids, &texts), &mut scratch)?;
        if r == 0 {
            row.extend(
                scratch
                    .into_iter()
                    .filter(|(k, _)| k.starts_with("reward/")),
            );
        }
        for x in rewards
            .iter()
            .filter(|&&x| ember_engine::is_valid_reward(x.into()))
        {
            reward_sum += f64::from(*x);
            finite += 1;
        }
        drawn += rewards.len();
        // Each prompt's responses of this round, as (handle, reward); handle = round·B + row.
        let base = rounds.iter().map(|(g, _)| g.group_ids.len()).sum::<usize>();
        for &p in &active {
            let mine: Vec<(usize, f32)> = g
                .group_ids
                .iter()
                .enumerate()
                .filter(|(_, gi)| **gi == p)
                .map(|(j, _)| (base + j, rewards[j]))
                .collect();
            ada.observe(&mut pools[p], &mine, n);
        }
        rounds.push((g, rewards));
    }
    let unfinished = pools.iter().filter(|p| ada.active(p)).count();
    // Kept handles → (round, row), grouped by round for stacking.
    let mut by_round: Vec<Vec<(usize, usize)>> = vec![Vec::new(); rounds.len()];
    let offsets: Vec<usize> = rounds
        .iter()
        .scan(0, |acc, (g, _)| {
            let o = *acc;
            *acc += g.group_ids.len();
            Some(o)
        })
        .collect();
    for (p, pool) in pools.iter().enumerate() {
        for h in ada.kept(pool, n) {
            let r = offsets.iter().rposition(|o| *o <= h).unwrap_or(0);
            by_round[r].push((h - offsets[r], p));
        }
    }
    let (mut parts, mut group_ids, mut rewards) = (Vec::new(), Vec::new(), Vec::new());
    let (mut pool_mean, mut pool_std) = (Vec::new(), Vec::new());
    let n_rounds = rounds.len();
    for ((g, rw), mut kept) in rounds.into_iter().zip(by_round) {
        kept.sort_unstable();
        for &(row, p) in &kept {
            group_ids.push(p);
            rewards.push(rw[row]);
            let (m, s) = pools[p].stats();
            pool_mean.push(m);
            pool_std.push(s);
        }
        parts.push((g, kept.into_iter().map(|(row, _)| row).collect()));
    }
    Ok(AdaRollout {
        generation: Generation::stack(parts, group_ids),
        rewards,
        pool_mean,
        pool_std,
        drawn,
        tokens_drawn,
        reward_mean_drawn: if finite > 0 {
            reward_sum / finite as f64
        } else {
            f64::NAN
        },
        rounds: n_rounds,
        unfinished,
    })
}
