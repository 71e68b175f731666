//! The reward of a report and the profiling-based rejection of a turn (Dr.Kernel, Liu et al.
//! 2026, arXiv:2602.05885: eq. 1 the reward, eq. 7–8 the profiling-based reward, eq. 9 the
//! profiling-based rejection sampling).

use crate::report::Report;
use serde::{Deserialize, Serialize};

/// The reward's weights: `R = correct·C + speedup·C·min(T_ref/T_kernel, cap) + coverage·C·PR`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardConfig {
    /// Weight of correctness C ∈ {0, 1} (eq. 1: 1).
    #[serde(default = "one")]
    pub correct: f64,
    /// Weight of the capped speed-up (eq. 1: 1).
    #[serde(default = "one")]
    pub speedup: f64,
    /// The speed-up's cap (eq. 1: 3).
    #[serde(default = "three")]
    pub speedup_cap: f64,
    /// Weight of the profiled coverage PR (eq. 8: 1 with PR, 0 without).
    #[serde(default)]
    pub coverage: f64,
}

fn one() -> f64 {
    1.0
}

fn three() -> f64 {
    3.0
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            correct: 1.0,
            speedup: 1.0,
            speedup_cap: 3.0,
            coverage: 0.0,
        }
    }
}

impl RewardConfig {
    /// Dr.Kernel eq. 1 + eq. 8: the report's reward, 0 unless correct (hacking verdicts are
    /// never correct).
    pub fn reward(&self, r: &Report) -> f64 {
        if !r.verdict.correct() {
            return 0.0;
        }
        let speedup = r.speedup.unwrap_or(0.0).clamp(0.0, self.speedup_cap);
        let pr = r.coverage.unwrap_or(1.0);
        self.correct + self.speedup * speedup + self.coverage * pr
    }
}

/// Profiling-based rejection sampling (eq. 9): a correct turn is kept with probability
/// `clip((PR − τ)/s, 0, 1)`, PR rounded to two decimals as the reference's reward manager does;
/// incorrect turns are always kept.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RejectionConfig {
    /// τ (the paper's 0.3).
    #[serde(default = "tau")]
    pub threshold: f64,
    /// s, the soft band's width (the paper's 0.1; 0 is a hard cut at τ).
    #[serde(default = "band")]
    pub band: f64,
}

fn tau() -> f64 {
    0.3
}

fn band() -> f64 {
    0.1
}

impl Default for RejectionConfig {
    fn default() -> Self {
        Self {
            threshold: tau(),
            band: band(),
        }
    }
}

impl RejectionConfig {
    /// Dr.Kernel eq. 9: the probability that the turn of `r` stays in the update.
    pub fn keep_probability(&self, r: &Report) -> f64 {
        let Some(pr) = r.coverage.filter(|_| r.verdict.correct()) else {
            return 1.0;
        };
        let pr = (pr * 100.0).round() / 100.0;
        if self.band <= 0.0 {
            return if pr >= self.threshold { 1.0 } else { 0.0 };
        }
        ((pr - self.threshold) / self.band).clamp(0.0, 1.0)
    }

    /// Whether the turn stays, with `u` a uniform draw in `[0, 1)`.
    pub fn keep(&self, r: &Report, u: f64) -> bool {
        u < self.keep_probability(r)
    }
}
