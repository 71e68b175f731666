//! Neural Symbolic Machines' training signals as rows and advantages for the engine's
//! REINFORCE loss (`PolicyLossKind::Vanilla`, L = −A·log π, summed over a row's tokens and
//! averaged over rows): the memory of the good programs found for each question, and the
//! per-row weights of REINFORCE, iterative maximum likelihood, augmented REINFORCE and MAPO.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A program found for a question with a positive reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// The program's tokens, `<eos>` included.
    pub program: Vec<u32>,
    /// Its reward.
    pub reward: f32,
}

/// Programs kept per question.
pub const KEPT: usize = 8;

/// Question id → its distinct programs with a positive reward, best first (highest reward,
/// then shortest, then oldest): the first is NSM's pseudo-gold, all of them MAPO's buffer.
pub type Memory = BTreeMap<usize, Vec<Best>>;

/// Adds `program` to `q`'s programs when its reward is positive and it is not there yet,
/// keeping the [`KEPT`] best; whether it was kept.
pub fn remember(memory: &mut Memory, q: usize, program: &[u32], reward: f32) -> bool {
    if !(reward.is_finite() && reward > 0.0) {
        return false;
    }
    let list = memory.entry(q).or_default();
    if list.iter().any(|b| b.program == program) {
        return false;
    }
    let at = list
        .iter()
        .position(|b| reward > b.reward || (reward == b.reward && program.len() < b.program.len()))
        .unwrap_or(list.len());
    if at >= KEPT {
        return false;
    }
    list.insert(
        at,
        Best {
            program: program.to_vec(),
            reward,
        },
    );
    list.truncate(KEPT);
    true
}

/// The rows' advantages, groups in order, each row `(weight, reward)` (weights normalised
/// within the group): B = Σ w·R, A = (rows / groups)·w·(R − B), so that the engine's mean
/// over rows gives the mean over groups of Σ w·(R − B)·∇log π.
pub fn weighted_advantages(groups: &[Vec<(f32, f32)>]) -> Vec<f32> {
    let rows: usize = groups.iter().map(Vec::len).sum();
    let scale = rows as f32 / groups.len().max(1) as f32;
    let mut out = Vec::with_capacity(rows);
    for g in groups {
        let total: f32 = g.iter().map(|r| r.0).sum();
        let total = if total > 0.0 { total } else { 1.0 };
        let baseline: f32 = g.iter().map(|(w, r)| w / total * r).sum();
        out.extend(g.iter().map(|(w, r)| scale * w / total * (r - baseline)));
    }
    out
}

/// MAPO's memory weight clip (Liang et al. 2018: the buffer's weight is at least 0.1).
pub const MAPO_CLIP: f32 = 0.1;

/// MAPO's weight of a question's buffer: π_B = Σ π(a) over its programs, clipped below at
/// [`MAPO_CLIP`] (0 for an empty buffer).
pub fn mapo_weight(probs: &[f32]) -> f32 {
    if probs.is_empty() {
        0.0
    } else {
        probs.iter().sum::<f32>().clamp(MAPO_CLIP, 1.0)
    }
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
    let weighted: Vec<Vec<(f32, f32)>> = groups
        .iter()
        .map(|g| {
            let n = g.rewards.len() as f32;
            let w = if g.best.is_some() {
                (1.0 - alpha) / n
            } else {
                1.0 / n
            };
            let mut rows: Vec<(f32, f32)> = g.rewards.iter().map(|r| (w, *r)).collect();
            rows.extend(g.best.map(|b| (alpha, b)));
            rows
        })
        .collect();
    weighted_advantages(&weighted)
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
    fn memory_keeps_the_best_first_then_the_shortest() {
        let mut m = Memory::new();
        assert!(
            !remember(&mut m, 3, &[1, 2], 0.0),
            "a zero reward is no good program"
        );
        assert!(remember(&mut m, 3, &[1, 2, 3], 0.5));
        assert!(remember(&mut m, 3, &[9], 0.4));
        assert!(remember(&mut m, 3, &[4, 5], 0.5), "as good and shorter");
        assert!(
            remember(&mut m, 3, &[6, 7], 0.5),
            "as good, as long: after the older"
        );
        assert!(!remember(&mut m, 3, &[6, 7], 0.5), "once");
        assert!(remember(&mut m, 3, &[1, 2, 3, 4], 1.0));
        let order: Vec<Vec<u32>> = m[&3].iter().map(|b| b.program.clone()).collect();
        assert_eq!(
            order,
            [
                vec![1, 2, 3, 4],
                vec![4, 5],
                vec![6, 7],
                vec![1, 2, 3],
                vec![9]
            ]
        );
        for k in 0..10 {
            remember(&mut m, 3, &[100 + k], 0.3);
        }
        assert_eq!(m[&3].len(), KEPT);
        assert!(!remember(&mut m, 4, &[1], f32::NAN));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn mapo_weights_clip_the_buffer_and_normalise_the_rest() {
        assert_eq!(mapo_weight(&[]), 0.0);
        assert!(
            (mapo_weight(&[0.02, 0.03]) - 0.1).abs() < 1e-7,
            "clipped at 0.1"
        );
        assert!((mapo_weight(&[0.3, 0.4]) - 0.7).abs() < 1e-7);
        // Buffer row (w = 0.7, R = 1), two outside rows ((1 − 0.7)/2 each, R = 0 and 1):
        // B = 0.7 + 0.15 = 0.85; one group of 3 rows, scale 3:
        // A = 3·0.7·0.15 = 0.315, 3·0.15·(−0.85) = −0.3825, 3·0.15·0.15 = 0.0675.
        let a = weighted_advantages(&[vec![(0.7, 1.0), (0.15, 0.0), (0.15, 1.0)]]);
        for (x, y) in a.iter().zip([0.315, -0.3825, 0.0675]) {
            assert!((x - y).abs() < 1e-6, "{a:?}");
        }
        // Weights are normalised within a group: (0.1) alone is weight 1, A = 0.
        assert_eq!(weighted_advantages(&[vec![(0.1, 1.0)]]), vec![0.0]);
    }
}
