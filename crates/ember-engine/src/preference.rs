//! Offline preference objectives over pairs of responses to one prompt (the chosen y_w and the
//! rejected y_l), in the Reward-aware Preference Optimization framework (Sun et al. 2025, "RPO: A
//! Unified Mathematical Framework for Model Alignment", arXiv 2502.00203; reference:
//! NeMo-Aligner `MegatronGPTDPOModel.loss_func`): with the implicit reward
//! h(y) = log π(y) − log π_ref(y) (summed over the response's tokens, or averaged when
//! `average_log_probs`) and Δh = h(y_w) − h(y_l),
//!
//! - DPO (Rafailov et al. 2023, eq. 7): −log σ(β Δh);
//! - IPO (Azar et al. 2023, eq. 17): (Δh − 1/(2β))²;
//! - RPO with an explicit reward r (NeMo-Aligner `rpo_sq`, `rpo_bwd_kl`, `rpo_fwd_kl`): a
//!   distance between the implicit reward gap β Δh and the explicit one η (r_w − r_l): squared,
//!   or the backward/forward KL between the Bernoulli distributions σ(η Δr) and σ(β Δh);
//! - SimPO (Meng et al. 2024, eq. 6), reference-free: −log σ(β (log π(y_w)/|y_w| −
//!   log π(y_l)/|y_l|) − γ).
//!
//! Inputs are per-pair sequence sums `[pairs]`; the loss is their mean.

use crate::error::{Result, check_config, check_shape};
use crate::metrics::Metrics;
use burn::tensor::Tensor;
use burn::tensor::activation::log_sigmoid;
use serde::{Deserialize, Serialize};

fn beta() -> f32 {
    0.1
}
fn one() -> f32 {
    1.0
}
fn simpo_beta() -> f32 {
    2.0
}
fn simpo_gamma() -> f32 {
    1.0
}

/// Which pairwise objective. The `kind` tag is what a recipe writes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PreferenceLoss {
    /// DPO: −log σ(β Δh).
    Dpo {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
    },
    /// IPO: (Δh − 1/(2β))² (β is IPO's τ).
    Ipo {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
    },
    /// RPO, squared distance: (β Δh − η Δr)².
    RpoSq {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
        /// η, the scale of the explicit rewards (NeMo-Aligner `gt_reward_scale`).
        #[serde(default = "one")]
        eta: f32,
    },
    /// RPO, backward KL: KL(Bern(σ(η Δr)) ‖ Bern(σ(β Δh))).
    RpoBwdKl {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
        /// η.
        #[serde(default = "one")]
        eta: f32,
    },
    /// RPO, forward KL: KL(Bern(σ(β Δh)) ‖ Bern(σ(η Δr))).
    RpoFwdKl {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
        /// η.
        #[serde(default = "one")]
        eta: f32,
    },
    /// SimPO: −log σ(β (ℓ_w − ℓ_l) − γ), ℓ the length-averaged log-prob; no reference.
    Simpo {
        /// β.
        #[serde(default = "simpo_beta")]
        beta: f32,
        /// γ, the target margin.
        #[serde(default = "simpo_gamma")]
        gamma: f32,
    },
}

impl PreferenceLoss {
    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        let (beta, other) = match *self {
            Self::Dpo { beta } | Self::Ipo { beta } => (beta, 1.0),
            Self::RpoSq { beta, eta }
            | Self::RpoBwdKl { beta, eta }
            | Self::RpoFwdKl { beta, eta } => (beta, eta),
            Self::Simpo { beta, gamma } => (beta, gamma),
        };
        check_config(
            "preference.beta",
            beta.into(),
            beta.is_finite() && beta > 0.0 && beta <= 1e6,
            "must be in (0, 1e6] (a β of 2^63 saturates every pair's sigmoid)",
        )?;
        check_config(
            "preference.eta/gamma",
            other.into(),
            other.is_finite() && other.abs() <= 1e6,
            "must be finite and within ±1e6",
        )
    }

    /// Whether the objective compares with a reference policy.
    pub fn uses_reference(&self) -> bool {
        !matches!(self, Self::Simpo { .. })
    }

    /// Whether it reads explicit rewards.
    pub fn uses_rewards(&self) -> bool {
        matches!(
            self,
            Self::RpoSq { .. } | Self::RpoBwdKl { .. } | Self::RpoFwdKl { .. }
        )
    }
}

/// One batch of pairs, `[pairs]` each.
#[derive(Debug, Clone)]
pub struct PairInput {
    /// log π(y_w): the chosen response's log-prob (summed over its tokens), with gradient.
    pub chosen: Tensor<1>,
    /// log π(y_l), with gradient.
    pub rejected: Tensor<1>,
    /// log π_ref(y_w) (ignored by SimPO).
    pub chosen_ref: Tensor<1>,
    /// log π_ref(y_l).
    pub rejected_ref: Tensor<1>,
    /// |y_w| in tokens.
    pub chosen_len: Tensor<1>,
    /// |y_l|.
    pub rejected_len: Tensor<1>,
    /// r(y_w) (RPO's explicit reward).
    pub chosen_reward: Tensor<1>,
    /// r(y_l).
    pub rejected_reward: Tensor<1>,
}

/// The objective's mean over pairs `[1]` and metrics: `preference/loss`,
/// `preference/accuracy` (share of pairs whose implicit reward ranks y_w above y_l),
/// `preference/margin` (mean β Δh, or SimPO's β Δℓ).
///
/// `average_log_probs` divides each sequence's log-prob (and reference log-prob) by its length
/// before the implicit reward (NeMo-Aligner `preference_average_log_probs`); SimPO always does.
///
/// # Errors
/// Shapes that differ, or invalid settings.
pub fn preference_loss(
    kind: &PreferenceLoss,
    input: &PairInput,
    average_log_probs: bool,
) -> Result<(Tensor<1>, Metrics)> {
    kind.validate()?;
    let n = input.chosen.dims();
    for (name, t) in [
        ("rejected", &input.rejected),
        ("chosen_ref", &input.chosen_ref),
        ("rejected_ref", &input.rejected_ref),
        ("chosen_len", &input.chosen_len),
        ("rejected_len", &input.rejected_len),
        ("chosen_reward", &input.chosen_reward),
        ("rejected_reward", &input.rejected_reward),
    ] {
        check_shape(name, t.dims(), n)?;
    }
    let (lw, ll) = (
        input.chosen_len.clone().clamp_min(1.0),
        input.rejected_len.clone().clamp_min(1.0),
    );
    let per = |x: Tensor<1>, len: &Tensor<1>| {
        if average_log_probs {
            x / len.clone()
        } else {
            x
        }
    };
    let dh = per(
        input.chosen.clone() - input.chosen_ref.clone().detach(),
        &lw,
    ) - per(
        input.rejected.clone() - input.rejected_ref.clone().detach(),
        &ll,
    );
    let dr = input.chosen_reward.clone() - input.rejected_reward.clone();
    let bern_kl = |lp_a: Tensor<1>, lq_a: Tensor<1>, lp_b: Tensor<1>, lq_b: Tensor<1>| {
        // Σ_{x∈{a,b}} p_x (log p_x − log q_x) from log p and log q of both outcomes.
        lp_a.clone().exp() * (lp_a - lq_a) + lp_b.clone().exp() * (lp_b - lq_b)
    };
    let (loss, margin) = match *kind {
        PreferenceLoss::Dpo { beta } => {
            let z = dh * beta;
            (log_sigmoid(z.clone()).neg(), z)
        }
        PreferenceLoss::Ipo { beta } => {
            let d = dh.clone().sub_scalar(1.0 / (2.0 * beta));
            (d.clone() * d, dh * beta)
        }
        PreferenceLoss::RpoSq { beta, eta } => {
            let d = dh.clone() * beta - dr * eta;
            (d.clone() * d, dh * beta)
        }
        PreferenceLoss::RpoBwdKl { beta, eta } => {
            let z = dh * beta;
            let g = dr * eta;
            let kl = bern_kl(
                log_sigmoid(g.clone()),
                log_sigmoid(z.clone()),
                log_sigmoid(g.neg()),
                log_sigmoid(z.clone().neg()),
            );
            (kl, z)
        }
        PreferenceLoss::RpoFwdKl { beta, eta } => {
            let z = dh * beta;
            let g = dr * eta;
            let kl = bern_kl(
                log_sigmoid(z.clone()),
                log_sigmoid(g.clone()),
                log_sigmoid(z.clone().neg()),
                log_sigmoid(g.neg()),
            );
            (kl, z)
        }
        PreferenceLoss::Simpo { beta, gamma } => {
            let z = (input.chosen.clone() / lw - input.rejected.clone() / ll) * beta;
            (log_sigmoid(z.clone().sub_scalar(gamma)).neg(), z)
        }
    };
    let loss = loss.mean();
    let mut metrics = Metrics::new();
    metrics.push("preference/loss", loss.clone());
    metrics.push(
        "preference/accuracy",
        margin.clone().greater_elem(0.0).float().mean(),
    );
    metrics.push("preference/margin", margin.mean());
    Ok((loss, metrics))
}
