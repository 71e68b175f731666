//! Rollout/trainer mismatch correction: importance weights between the sampler's log-probs
//! (`rollout_log_probs`, the behaviour policy μ) and the trainer's recomputation
//! (`old_log_probs`, π_old).
//!
//! Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings
//! you off-policy RL training", eq. 3; verl `rollout_corr` / `compute_rollout_correction_weights`):
//! w = min(π_old/μ, C) per token, or per sequence with the product of token ratios; masking
//! variants drop tokens or sequences whose ratio leaves [1/C, C] instead of truncating.

use crate::error::{Result, check_config};
use crate::metrics::Metrics;
use crate::ops::{masked_mean, masked_sum};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Token-level or sequence-level ratios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    /// ρ_t = π_old(t)/μ(t).
    #[default]
    Token,
    /// ρ = Π_t π_old(t)/μ(t), one weight per sequence.
    Sequence,
    /// ρ = exp(mean_t log π_old(t)/μ(t)), the per-token geometric mean (length-neutral).
    Geometric,
}

/// Truncate the weight, or mask what falls outside the trust band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IsMode {
    /// w = min(ρ, C) (TIS).
    #[default]
    Truncate,
    /// w = 1, but tokens/sequences with ρ ∉ [1/C, C] are removed from the loss mask (MIS).
    Mask,
}

/// Mismatch-correction settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MismatchCorrection {
    /// Token, sequence or geometric-mean ratios.
    #[serde(default)]
    pub level: IsLevel,
    /// Truncate or mask.
    #[serde(default)]
    pub mode: IsMode,
    /// The cap C (> 1).
    #[serde(default = "default_cap")]
    pub cap: f32,
}

fn default_cap() -> f32 {
    2.0
}

impl Default for MismatchCorrection {
    fn default() -> Self {
        Self {
            level: IsLevel::Token,
            mode: IsMode::Truncate,
            cap: default_cap(),
        }
    }
}

/// The weights to multiply into the per-token policy loss and the mask to use.
#[derive(Debug, Clone)]
pub struct CorrectionWeights {
    /// `[batch, steps]` detached weights (1 under `Mask` mode).
    pub weights: Tensor<2>,
    /// `[batch, steps]` mask after dropping out-of-band tokens or sequences.
    pub mask: Tensor<2>,
    /// `mismatch/*` metrics.
    pub metrics: Metrics,
}

impl MismatchCorrection {
    /// Checks the cap.
    pub fn validate(&self) -> Result<()> {
        check_config(
            "mismatch.cap",
            self.cap.into(),
            self.cap > 1.0,
            "must be > 1",
        )
    }

    /// Computes weights from `old_log_probs` (π_old) and `rollout_log_probs` (μ) under `mask`.
    ///
    /// # Shapes
    /// all `[batch, steps]`.
    pub fn weights(
        &self,
        old_log_probs: Tensor<2>,
        rollout_log_probs: Tensor<2>,
        mask: Tensor<2>,
    ) -> Result<CorrectionWeights> {
        self.validate()?;
        let [b, t] = mask.dims();
        let log_ratio = (old_log_probs.detach() - rollout_log_probs.detach()) * mask.clone();
        let log_rho = match self.level {
            IsLevel::Token => log_ratio.clone(),
            IsLevel::Sequence => log_ratio.clone().sum_dim(1).expand([b, t]),
            IsLevel::Geometric => (log_ratio.clone().sum_dim(1)
                / mask.clone().sum_dim(1).clamp_min(1.0))
            .expand([b, t]),
        };
        // Clamp before exp so a long sequence cannot overflow.
        let rho = log_rho.clamp(-20.0, 20.0).exp();
        let cap_ln = self.cap.ln();
        let (weights, mask_out) = match self.mode {
            IsMode::Truncate => (rho.clone().clamp_max(self.cap) * mask.clone(), mask.clone()),
            IsMode::Mask => {
                let lr = rho.clone().log();
                let inside = lr
                    .clone()
                    .lower_equal_elem(cap_ln)
                    .bool_and(lr.greater_equal_elem(-cap_ln));
                let m = mask.clone() * inside.float();
                (m.clone(), m)
            }
        };
        let mut metrics = Metrics::new();
        metrics.push(
            "mismatch/is_weight_mean",
            masked_mean(weights.clone(), mask.clone()),
        );
        let max = rho
            .clone()
            .mask_fill(mask.clone().equal_elem(0.0), f32::NEG_INFINITY)
            .max();
        metrics.push("mismatch/is_ratio_max", max);
        // Effective sample size, normalised to (0, 1]: (Σw)² / (n Σw²) (Kong 1992).
        let sw = masked_sum(weights.clone(), mask.clone());
        let sw2 = masked_sum(weights.clone() * weights.clone(), mask.clone());
        let n = mask.clone().sum();
        metrics.push(
            "mismatch/ess",
            (sw.clone() * sw) / (n * sw2).clamp_min(1e-12),
        );
        let dropped = (mask.clone() - mask_out.clone()).sum() / mask.clone().sum().clamp_min(1.0);
        metrics.push("mismatch/masked_frac", dropped);
        // KL(μ‖π_old) estimates on the sampled tokens: k1 = log μ − log π_old, k3 = ρ − 1 − log ρ.
        metrics.push(
            "mismatch/kl_k1",
            masked_mean(log_ratio.clone().neg(), mask.clone()),
        );
        let tok_rho = log_ratio.clone().clamp(-20.0, 20.0);
        let k3 = (tok_rho.clone().exp() - tok_rho).sub_scalar(1.0);
        metrics.push("mismatch/kl_k3", masked_mean(k3, mask.clone()));
        Ok(CorrectionWeights {
            weights: weights.detach(),
            mask: mask_out,
            metrics,
        })
    }
}
