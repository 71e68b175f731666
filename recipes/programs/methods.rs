//! Neural Symbolic Machines' training signals as rows and advantages for the engine's
//! REINFORCE loss (`PolicyLossKind::Vanilla`, L = −A·log π, summed over a row's tokens and
//! averaged over rows): the memory of the best program found for each question, and the
//! per-row weights of REINFORCE, iterative maximum likelihood and augmented REINFORCE.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The best program found so far for a question (its pseudo-gold in NSM's iterative maximum likelihood).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// The program's tokens, `<eos>` included.
    pub program: Vec<u32>,
    /// Its reward.
    pub reward: f32,
}

/// Question id → its best program with a positive reward.
pub type Memory = BTreeMap<usize, Best>;

/// Keeps `program` as `q`'s best when its reward is positive and above the best's (a tie keeps
/// the shorter program, then the older one); whether it was kept.
pub fn remember(memory: &mut Memory, q: usize, program: &[u32], reward: f32) -> bool {
    if !(reward.is_finite() && reward > 0.0) {
        return false;
    }
    let better = memory.get(&q).is_none_or(|b| {
        reward > b.reward || (reward == b.reward && program.len() < b.program.len())
    });
    if better {
        memory.insert(
            q,
            Best {
                program: program.to_vec(),
                reward,
            },
        );
    }
    better
}

/// One question's rows: its samples' rewards and, for augmented REINFORCE, the memory's best
/// program's reward (the best is then the group's last row).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The step's samples' rewards.
    pub rewards: Vec<f32>,
    /// The best program's reward, when it is a row.
    pub best: Option<f32>,
}

/// Augmented REINFORCE's advantage of every row, groups in order (NSM's augmented REINFORCE: the samples carry
/// weight (1 − α)/n, the best program α; baseline B = Σ w·R; ∇J = Σ w·(R − B)·∇log π, averaged
/// over the questions). The engine averages over rows, so each advantage is scaled by
/// rows / questions: A = (rows / questions)·w·(R − B). With α = 0 or no best program this is
/// REINFORCE with the group's mean reward as baseline, A = R − R̄ (when every group has n rows).
pub fn augmented_advantages(groups: &[Group], alpha: f32) -> Vec<f32> {
    let rows: usize = groups
        .iter()
        .map(|g| g.rewards.len() + usize::from(g.best.is_some()))
        .sum();
    let scale = rows as f32 / groups.len().max(1) as f32;
    let mut out = Vec::with_capacity(rows);
    for g in groups {
        let n = g.rewards.len() as f32;
        let (w_sample, w_best) = match g.best {
            Some(_) => ((1.0 - alpha) / n, alpha),
            None => (1.0 / n, 0.0),
        };
        let baseline =
            w_sample * g.rewards.iter().sum::<f32>() + g.best.map_or(0.0, |b| w_best * b);
        out.extend(g.rewards.iter().map(|r| scale * w_sample * (r - baseline)));
        if let Some(b) = g.best {
            out.push(scale * w_best * (b - baseline));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn augmented_weights_mix_the_best_program_at_alpha() {
        // Two samples (rewards 1, 0) and the best (1) at α = 0.1: weights 0.45, 0.45, 0.1;
        // B = 0.45 + 0.1 = 0.55; one question, three rows, scale 3:
        // A = 3·0.45·0.45 = 0.6075, 3·0.45·(−0.55) = −0.7425, 3·0.1·0.45 = 0.135.
        let g = Group {
            rewards: vec![1.0, 0.0],
            best: Some(1.0),
        };
        let a = augmented_advantages(std::slice::from_ref(&g), 0.1);
        for (x, y) in a.iter().zip([0.6075, -0.7425, 0.135]) {
            assert!((x - y).abs() < 1e-6, "{a:?}");
        }
        // Without the best: REINFORCE with the mean baseline, A = R − 0.5.
        let plain = Group {
            rewards: vec![1.0, 0.0],
            best: None,
        };
        assert_eq!(
            augmented_advantages(std::slice::from_ref(&plain), 0.1),
            vec![0.5, -0.5]
        );
        // Mixed groups: 5 rows over 2 questions, scale 2.5; the plain group's
        // A = 2.5·0.5·(R − 0.5) = ±0.625.
        let a = augmented_advantages(&[plain, g], 0.1);
        assert!(
            (a[0] - 0.625).abs() < 1e-6 && (a[1] + 0.625).abs() < 1e-6,
            "{a:?}"
        );
        assert!((a[4] - 2.5 * 0.1 * 0.45).abs() < 1e-6, "{a:?}");
    }

    #[test]
    fn memory_keeps_the_best_then_the_shortest() {
        let mut m = Memory::new();
        assert!(
            !remember(&mut m, 3, &[1, 2], 0.0),
            "a zero reward is no pseudo-gold"
        );
        assert!(remember(&mut m, 3, &[1, 2, 3], 0.5));
        assert!(!remember(&mut m, 3, &[9], 0.4));
        assert!(remember(&mut m, 3, &[4, 5], 0.5), "as good and shorter");
        assert!(
            !remember(&mut m, 3, &[6, 7], 0.5),
            "as good, as long: the older stays"
        );
        assert!(remember(&mut m, 3, &[1, 2, 3, 4], 1.0));
        assert_eq!(m[&3].program, vec![1, 2, 3, 4]);
        assert!(!remember(&mut m, 4, &[1], f32::NAN));
        assert_eq!(m.len(), 1);
    }
}
