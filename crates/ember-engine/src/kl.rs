//! KL estimators between the policy and a reference, and the KL coefficient controllers.

use crate::error::{Result, check_config};
use serde::{Deserialize, Serialize};

use burn::tensor::Tensor;

/// Which per-token estimator of KL(π‖π_ref) to use (Schulman, "Approximating KL divergence",
/// 2020; verl `kl_penalty`). With `log_ratio = log π − log π_ref`:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// k1 = log_ratio (unbiased, high variance; can be negative).
    K1,
    /// k2 = ½ log_ratio² (its gradient is the true KL gradient at π = π_ref).
    K2,
    /// k3 = exp(−log_ratio) + log_ratio − 1, clamped to [−10, 10] (verl `low_var_kl`).
    #[default]
    K3,
    /// |log_ratio|.
    Abs,
    /// Value of k1, gradient of k2 (verl `k1+`).
    K1StraightThrough,
    /// Value of k3, gradient of k2 (verl `k3+` / `low_var_kl+`).
    K3StraightThrough,
}

/// Per-token KL estimate, `[batch, steps]`. verl `kl_penalty` / `kl_penalty_forward`.
pub fn kl_penalty(log_probs: Tensor<2>, ref_log_probs: Tensor<2>, kind: KlEstimator) -> Tensor<2> {
    let log_ratio = log_probs - ref_log_probs;
    match kind {
        KlEstimator::K1 => log_ratio,
        KlEstimator::K2 => log_ratio.clone() * log_ratio * 0.5,
        KlEstimator::K3 => k3(log_ratio),
        KlEstimator::Abs => log_ratio.abs(),
        KlEstimator::K1StraightThrough => straight_through(log_ratio.clone(), log_ratio),
        KlEstimator::K3StraightThrough => straight_through(k3(log_ratio.clone()), log_ratio),
    }
}

/// k3 = exp(−x) + x − 1 with x = log π − log π_ref, the argument clamped to ±20 and the
/// result to [−10, 10] as verl does for numerical safety.
fn k3(log_ratio: Tensor<2>) -> Tensor<2> {
    let kl = log_ratio.clamp(-20.0, 20.0);
    let ratio = kl.clone().neg().exp();
    (ratio + kl).sub_scalar(1.0).clamp(-10.0, 10.0)
}

/// Straight-through: forward value of `value`, gradient of k2 = ½ log_ratio².
fn straight_through(value: Tensor<2>, log_ratio: Tensor<2>) -> Tensor<2> {
    let k2 = log_ratio.clone() * log_ratio * 0.5;
    k2.clone() - k2.detach() + value.detach()
}

/// How the KL coefficient evolves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KlControl {
    /// A constant coefficient.
    Fixed {
        /// β.
        coef: f32,
    },
    /// Adaptive β (Ziegler et al. 2019, eq. 2; verl `AdaptiveKLController`):
    /// e = clip(KL/target − 1, −0.2, 0.2), β ← β·(1 + e·n/horizon).
    Adaptive {
        /// Initial β.
        init_coef: f32,
        /// Target KL per token.
        target: f32,
        /// Horizon in samples.
        horizon: f32,
    },
}

impl Default for KlControl {
    fn default() -> Self {
        Self::Fixed { coef: 0.0 }
    }
}

/// The live KL coefficient.
#[derive(Debug, Clone, PartialEq)]
pub struct KlController {
    control: KlControl,
    coef: f32,
}

impl KlController {
    /// Starts a controller.
    pub fn new(control: KlControl) -> Result<Self> {
        let coef = match control {
            KlControl::Fixed { coef } => {
                check_config("kl.coef", coef.into(), coef >= 0.0, "must be >= 0")?;
                coef
            }
            KlControl::Adaptive {
                init_coef,
                target,
                horizon,
            } => {
                check_config(
                    "kl.init_coef",
                    init_coef.into(),
                    init_coef >= 0.0,
                    "must be >= 0",
                )?;
                check_config("kl.target", target.into(), target > 0.0, "must be > 0")?;
                check_config("kl.horizon", horizon.into(), horizon > 0.0, "must be > 0")?;
                init_coef
            }
        };
        Ok(Self { control, coef })
    }

    /// The current β.
    pub fn coef(&self) -> f32 {
        self.coef
    }

    /// Sets β (used when resuming from a checkpoint).
    pub fn set_coef(&mut self, coef: f32) {
        self.coef = coef;
    }

    /// Updates β from the measured KL of a step over `n_samples` samples.
    pub fn update(&mut self, current_kl: f32, n_samples: usize) {
        if let KlControl::Adaptive {
            target, horizon, ..
        } = self.control
        {
            let error = (current_kl / target - 1.0).clamp(-0.2, 0.2);
            self.coef *= 1.0 + error * n_samples as f32 / horizon;
        }
    }
}
