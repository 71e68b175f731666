//! Reinforce-Ada's adaptive sampling (Xiong et al. 2025, "Reinforce-Ada: An Adaptive Sampling
//! Framework for Reinforce-Style LLM Training", arXiv 2510.04996; reference: RLHFlow/Reinforce-Ada,
//! `RayPPOTrainer._generate_multi_round_adaptive_downsampling` and the `global_stat_est` branch
//! of `compute_grpo_outcome_advantage`).
//!
//! Each prompt is sampled in rounds of `round_repeat` responses, at most `max_rounds` rounds. A
//! response is positive when its reward exceeds `positive_threshold`. A prompt retires once its
//! pool holds ⌊n/2⌋ positives and n − ⌊n/2⌋ negatives (`balanced`) or one positive
//! (`positive_focused`); it is then down-sampled to `n` responses, half positive and half
//! negative where the pool allows, the first ones drawn of each kind. A prompt still active
//! after the last round keeps what it has (at most `n`): `balanced` the same split;
//! `positive_focused` the pool's positive share of `n`, rounded up, at least one and at most
//! n − 1 of them. With `global_stats` the advantage's group mean and std are those of every
//! response drawn for the prompt, not only of the kept ones (the reference rebuilds them from
//! the positive/negative counts as 1s and 0s; Ember uses the rewards themselves, the same for
//! 0/1 rewards).
//!
//! This module keeps the bookkeeping on the host (rewards are read back once per round, as the
//! reference does); the job draws the rounds and stacks the kept responses into one batch.

use crate::error::{Result, check_config};
use serde::{Deserialize, Serialize};

/// When a prompt has enough responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdaMode {
    /// ⌊n/2⌋ positives and n − ⌊n/2⌋ negatives.
    #[default]
    Balanced,
    /// One positive.
    PositiveFocused,
}

fn four() -> usize {
    4
}
fn eight() -> usize {
    8
}
fn threshold() -> f32 {
    0.7
}
fn yes() -> bool {
    true
}

/// Reinforce-Ada's sampler settings (the reference's `algorithm.*` names).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReinforceAda {
    /// `reinforce_ada_choice`.
    #[serde(default)]
    pub mode: AdaMode,
    /// Rounds at most.
    #[serde(default = "four")]
    pub max_rounds: usize,
    /// Responses per active prompt per round.
    #[serde(default = "eight")]
    pub round_repeat: usize,
    /// A response is positive when its reward is above this.
    #[serde(default = "threshold")]
    pub positive_threshold: f32,
    /// Group statistics over every response drawn for the prompt (`global_stat_est`).
    #[serde(default = "yes")]
    pub global_stats: bool,
}

impl Default for ReinforceAda {
    fn default() -> Self {
        Self {
            mode: AdaMode::Balanced,
            max_rounds: 4,
            round_repeat: 8,
            positive_threshold: 0.7,
            global_stats: true,
        }
    }
}

/// One prompt's responses so far: handles (the job's row ids) of positives and negatives in
/// the order drawn, every finite reward, and the kept handles once it has retired.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdaPool {
    /// Positive responses' handles.
    pub positives: Vec<usize>,
    /// Negative responses' handles (a non-finite reward counts as negative).
    pub negatives: Vec<usize>,
    /// Every finite reward drawn.
    pub rewards: Vec<f32>,
    /// The kept handles, once retired.
    pub kept: Option<Vec<usize>>,
}

impl AdaPool {
    /// Mean and unbiased std of every finite reward drawn (0 and 1 when fewer than two, as the
    /// reference's `total_count <= 1`).
    pub fn stats(&self) -> (f32, f32) {
        let n = self.rewards.len();
        if n <= 1 {
            return (0.0, 1.0);
        }
        let mean = self.rewards.iter().map(|r| f64::from(*r)).sum::<f64>() / n as f64;
        let var = self
            .rewards
            .iter()
            .map(|r| (f64::from(*r) - mean).powi(2))
            .sum::<f64>()
            / (n - 1) as f64;
        (mean as f32, var.sqrt() as f32)
    }
}

impl ReinforceAda {
    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        check_config(
            "reinforce_ada.max_rounds",
            self.max_rounds as f64,
            (1..=64).contains(&self.max_rounds),
            "must be in 1..=64",
        )?;
        check_config(
            "reinforce_ada.round_repeat",
            self.round_repeat as f64,
            (1..=1024).contains(&self.round_repeat),
            "must be in 1..=1024",
        )?;
        check_config(
            "reinforce_ada.positive_threshold",
            self.positive_threshold.into(),
            self.positive_threshold.is_finite(),
            "must be finite",
        )
    }

    /// Adds one round's responses of a prompt (`(handle, reward)`) to its pool, then retires it
    /// when the pool has enough for `n` (the whole round joins the pool first, as in the
    /// reference). A retired pool ignores further rounds.
    pub fn observe(&self, pool: &mut AdaPool, responses: &[(usize, f32)], n: usize) {
        if pool.kept.is_some() {
            return;
        }
        for &(h, r) in responses {
            if r > self.positive_threshold {
                pool.positives.push(h);
            } else {
                pool.negatives.push(h);
            }
            if r.is_finite() {
                pool.rewards.push(r);
            }
        }
        let done = match self.mode {
            AdaMode::Balanced => pool.positives.len() >= n / 2 && pool.negatives.len() >= n - n / 2,
            AdaMode::PositiveFocused => !pool.positives.is_empty(),
        };
        if done {
            pool.kept = Some(down_sample(pool, n / 2, n));
        }
    }

    /// Whether the prompt still draws.
    pub fn active(&self, pool: &AdaPool) -> bool {
        pool.kept.is_none()
    }

    /// The kept handles of a pool: its down-sample if retired, else the fallback for a prompt
    /// that did not retire within `max_rounds`.
    pub fn kept(&self, pool: &AdaPool, n: usize) -> Vec<usize> {
        if let Some(k) = &pool.kept {
            return k.clone();
        }
        let (p, total) = (
            pool.positives.len(),
            pool.positives.len() + pool.negatives.len(),
        );
        let take = n.min(total);
        let target_pos = match self.mode {
            AdaMode::Balanced => n / 2,
            AdaMode::PositiveFocused => {
                let share = if total > 0 {
                    p as f64 / total as f64
                } else {
                    0.0
                };
                let t = (share * n as f64).ceil() as usize;
                t.min(take.saturating_sub(1)).max(1)
            }
        };
        down_sample(pool, target_pos, take)
    }
}

/// `target_pos` positives (fewer if the pool has fewer) and negatives up to `take`, topped up
/// from the positives when negatives run out (reference `downsample_cache`).
fn down_sample(pool: &AdaPool, target_pos: usize, take: usize) -> Vec<usize> {
    let (np, nn) = (pool.positives.len(), pool.negatives.len());
    let mut pos = target_pos.min(np).min(take);
    let mut neg = (take - pos).min(nn);
    if pos + neg < take {
        if np > pos {
            pos += (np - pos).min(take - pos - neg);
        } else if nn > neg {
            neg += (nn - neg).min(take - pos - neg);
        }
    }
    pool.positives[..pos]
        .iter()
        .chain(&pool.negatives[..neg])
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ada: &ReinforceAda, rounds: &[&[f32]], n: usize) -> (AdaPool, usize) {
        let mut pool = AdaPool::default();
        let mut h = 0;
        let mut used = 0;
        for r in rounds {
            if !ada.active(&pool) {
                break;
            }
            used += 1;
            let resp: Vec<(usize, f32)> = r
                .iter()
                .map(|x| {
                    h += 1;
                    (h - 1, *x)
                })
                .collect();
            ada.observe(&mut pool, &resp, n);
        }
        (pool, used)
    }

    /// Balanced, n = 4: needs 2 positives and 2 negatives. Round 1 (handles 0–3): 1, 0, 0, 0 →
    /// one positive; round 2 (4–7): 0, 1, 1, 0 → positives [0, 5, 6], and the pool retires
    /// after the round: kept = positives [0, 5] + the first two negatives [1, 2]; round 3 is
    /// not drawn.
    #[test]
    fn balanced_retires_and_down_samples() {
        let ada = ReinforceAda::default();
        let (pool, used) = run(&ada, &[&[1., 0., 0., 0.], &[0., 1., 1., 0.], &[1.; 4]], 4);
        assert_eq!(used, 2);
        assert_eq!(pool.kept, Some(vec![0, 5, 1, 2]));
        assert_eq!(ada.kept(&pool, 4), vec![0, 5, 1, 2]);
        // Every response of both rounds: 1,0,0,0,0,1,1,0 → mean 3/8, unbiased var
        // (3·(5/8)² + 5·(3/8)²)/7 = (75/64 + 45/64)/7.
        let (m, s) = pool.stats();
        assert!((m - 0.375).abs() < 1e-6);
        assert!((s - (120.0f32 / 64.0 / 7.0).sqrt()).abs() < 1e-6);
    }

    /// Positive-focused retires after the first round with a positive: round 1 all wrong,
    /// round 2 right then wrong. n = 4: kept = ⌊4/2⌋ = 2 positives where there are (one here)
    /// and negatives to fill: [3, 0, 1, 2].
    #[test]
    fn positive_focused_retires_at_the_first_positive() {
        let ada = ReinforceAda {
            mode: AdaMode::PositiveFocused,
            ..ReinforceAda::default()
        };
        let (pool, used) = run(&ada, &[&[0.; 3], &[0.9, 0.0], &[1.0]], 4);
        assert_eq!(used, 2);
        assert_eq!(pool.kept, Some(vec![3, 0, 1, 2]));
        // A first round whose first response is right still joins whole: two positives kept,
        // then two negatives (the reference caches the round before deciding).
        let (pool, _) = run(&ada, &[&[1.0, 0.0, 1.0, 0.0, 0.0]], 4);
        assert_eq!(pool.kept, Some(vec![0, 2, 1, 3]));
        assert_eq!(pool.rewards.len(), 5);
    }

    /// Not retired after the last round: balanced keeps what it has, up to n, split as far as
    /// the pool allows (all wrong → n negatives); positive-focused with 1 positive of 8 drawn and
    /// n = 4: ⌈4/8⌉ … at least 1 positive, so [the positive, 3 negatives]; with 7 of 8 positive:
    /// ⌈3.5⌉ = 4, capped at n − 1 = 3 positives and one negative.
    #[test]
    fn fallback_when_rounds_run_out() {
        let ada = ReinforceAda {
            max_rounds: 2,
            ..ReinforceAda::default()
        };
        let (pool, _) = run(&ada, &[&[0.; 3], &[0.; 3]], 4);
        assert!(ada.active(&pool));
        assert_eq!(ada.kept(&pool, 4), vec![0, 1, 2, 3]);
        let (pool, _) = run(&ada, &[&[1.; 3]], 4);
        assert_eq!(ada.kept(&pool, 4), vec![0, 1, 2]);
        let pf = ReinforceAda {
            mode: AdaMode::PositiveFocused,
            ..ReinforceAda::default()
        };
        let mut pool = AdaPool {
            positives: vec![6],
            negatives: vec![0, 1, 2, 3, 4, 5, 7],
            ..AdaPool::default()
        };
        assert_eq!(pf.kept(&pool, 4), vec![6, 0, 1, 2]);
        pool.positives = vec![0, 1, 2, 3, 4, 5, 7];
        pool.negatives = vec![6];
        assert_eq!(pf.kept(&pool, 4), vec![0, 1, 2, 6]);
        // A NaN reward is a negative and is left out of the statistics.
        let mut p = AdaPool::default();
        ReinforceAda::default().observe(&mut p, &[(0, f32::NAN), (1, 1.0), (2, 0.0)], 8);
        assert_eq!(p.negatives, vec![0, 2]);
        let (m, sd) = p.stats();
        assert!(m == 0.5 && (sd - 0.5f32.sqrt()).abs() < 1e-6);
    }
}
