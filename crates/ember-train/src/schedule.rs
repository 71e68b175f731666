//! Learning-rate schedule: linear warm-up then cosine decay (Loshchilov & Hutter 2017, eq. 5).

use serde::{Deserialize, Serialize};

fn ratio() -> f64 {
    0.1
}

/// Linear warm-up over `warmup_steps`, then cosine decay to `min_ratio · lr` at `total_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps (0 = none).
    #[serde(default)]
    pub warmup_steps: usize,
    /// Steps of the whole run (the cosine reaches its floor there).
    pub total_steps: usize,
    /// Floor as a fraction of the peak.
    #[serde(default = "ratio")]
    pub min_ratio: f64,
}

fn one() -> f64 {
    1.0
}

/// A run's learning-rate settings as a recipe states them; the run's step count gives the
/// schedule its length ([`LrConfig::schedule`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps (0 = none).
    #[serde(default)]
    pub warmup_steps: usize,
    /// Cosine floor as a fraction of the peak (1 = constant after the warm-up).
    #[serde(default = "one")]
    pub min_lr_ratio: f64,
}

impl LrConfig {
    /// The schedule over a run of `total_steps` steps.
    pub fn schedule(&self, total_steps: usize) -> LrSchedule {
        LrSchedule {
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            total_steps,
            min_ratio: self.min_lr_ratio,
        }
    }
}

impl LrSchedule {
    /// A constant rate.
    pub fn constant(lr: f64) -> Self {
        Self {
            lr,
            warmup_steps: 0,
            total_steps: 0,
            min_ratio: 1.0,
        }
    }

    /// The rate at optimizer step `step` (0-based).
    pub fn at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps);
        if span == 0 {
            return self.lr;
        }
        let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_ratio + (1.0 - self.min_ratio) * cosine)
    }
}
