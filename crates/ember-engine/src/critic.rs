//! The learned critic of PPO: its clipped value loss (verl `compute_value_loss`, OpenRLHF
//! `ValueLoss`), the explained variance verl logs, and PACT's importance weights that align the
//! critic's regression with the policy after the actor's update.
//!
//! The critic predicts V(s_t) at every step of the `[batch, steps]` currency (for an LLM: the
//! value of the context before each response token, read from the same positions as the
//! log-probs); GAE ([`crate::AdvantageKind::Gae`]) turns those values into advantages and
//! `returns`, the critic's regression targets.

use crate::error::{Result, check_config, check_shape};
use crate::keys;
use crate::ops::{discounted_suffix_sum, masked_mean, masked_var};
use crate::{AggNorm, LossAgg, Metrics, aggregate};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

fn half() -> f32 {
    0.5
}

fn two() -> f32 {
    2.0
}

/// PACT (Policy Aligned Critic Training; "PACT: From Credit Assignment to Critic Alignment",
/// 2026): the critic is trained after the actor's update, on the same rollout, each step's
/// squared error weighted by an importance weight from the rollout's (old) policy to the
/// updated one, so that the critic regresses towards the values of the policy that will
/// sample next rather than the one that sampled.
///
/// The paper's text was not reachable from this project (only its title); the weight follows
/// per-decision importance sampling for state values (Precup, Sutton & Singh 2000, eq. 2, with
/// truncation as in V-trace, Espeholt et al. 2018, eq. 1): the return from step t depends on
/// the actions from t on, so w_t = min(c̄, Π_{valid s ≥ t} π_new(a_s)/π_old(a_s)), computed as
/// exp of a suffix sum of log-ratios (clamped to ±20 before exp); masked steps carry the
/// product across (observation tokens are not actions).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pact {
    /// c̄: the truncation of the weight.
    #[serde(default = "two")]
    pub weight_clip: f32,
}

impl Default for Pact {
    fn default() -> Self {
        Self { weight_clip: 2.0 }
    }
}

/// The critic's objective and update order.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriticConfig {
    /// ε_v of the clipped value loss (verl `critic.cliprange_value`, 0.5); 0 turns it off.
    #[serde(default = "half")]
    pub value_clip: f32,
    /// Aggregation of the per-step losses (verl's critic uses its `loss_agg_mode`).
    #[serde(default)]
    pub agg: LossAgg,
    /// PACT: train the critic after the actor, importance-weighted towards the updated policy.
    /// Without it the critic is trained on the rollout as sampled (verl: critic first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pact: Option<Pact>,
}

impl Default for CriticConfig {
    fn default() -> Self {
        Self {
            value_clip: 0.5,
            agg: LossAgg::TokenMean,
            pact: None,
        }
    }
}

impl CriticConfig {
    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        check_config(
            "critic.value_clip",
            self.value_clip.into(),
            self.value_clip.is_finite() && self.value_clip >= 0.0,
            "must be ≥ 0 (0 = no clip)",
        )?;
        self.agg.validate()?;
        if let Some(p) = &self.pact {
            check_config(
                "critic.pact.weight_clip",
                p.weight_clip.into(),
                p.weight_clip.is_finite() && p.weight_clip > 0.0,
                "must be > 0",
            )?;
        }
        Ok(())
    }
}

/// Inputs of the value loss, `[batch, steps]` each.
#[derive(Debug, Clone)]
pub struct ValueLossInput {
    /// V_φ(s_t) of the critic being trained (with gradient).
    pub vpreds: Tensor<2>,
    /// V(s_t) of the critic that scored the rollout (the clip's centre).
    pub values: Tensor<2>,
    /// Regression targets (GAE's `returns`).
    pub returns: Tensor<2>,
    /// Valid steps.
    pub mask: Tensor<2>,
    /// Per-step weights (PACT's), applied to the per-step losses; None = 1.
    pub weights: Option<Tensor<2>>,
}

/// verl `compute_value_loss`: l_t = max((V_φ − R)², (clip(V_φ, V_old ± ε_v) − R)²) (the
/// unclipped square when ε_v = 0), times the step's weight, loss = ½·agg(l). Metrics
/// `critic/vf_loss`, `critic/vf_clipfrac` (share of valid steps where the clipped square is
/// the larger), `critic/vpred_mean`.
pub fn value_loss(
    cfg: &CriticConfig,
    input: &ValueLossInput,
    norm: AggNorm,
) -> Result<(Tensor<1>, Metrics)> {
    cfg.validate()?;
    let dims = input.vpreds.dims();
    check_shape("values", input.values.dims(), dims)?;
    check_shape("returns", input.returns.dims(), dims)?;
    check_shape("mask", input.mask.dims(), dims)?;
    let mask = input.mask.clone();
    let err = input.vpreds.clone() - input.returns.clone();
    let unclipped = err.clone() * err;
    let mut metrics = Metrics::new();
    let per_step = if cfg.value_clip > 0.0 {
        let values = input.values.clone().detach();
        let delta = (input.vpreds.clone() - values.clone()).clamp(-cfg.value_clip, cfg.value_clip);
        let e2 = values + delta - input.returns.clone();
        let clipped = e2.clone() * e2;
        metrics.push(
            "critic/vf_clipfrac",
            masked_mean(
                clipped.clone().greater(unclipped.clone()).float(),
                mask.clone(),
            ),
        );
        unclipped.max_pair(clipped)
    } else {
        unclipped
    };
    let per_step = match &input.weights {
        Some(w) => {
            check_shape("critic weights", w.dims(), dims)?;
            per_step * w.clone().detach()
        }
        None => per_step,
    };
    let loss = aggregate(per_step, mask.clone(), cfg.agg, norm) * 0.5;
    metrics.push(keys::CRITIC_VF_LOSS, loss.clone());
    metrics.push("critic/vpred_mean", masked_mean(input.vpreds.clone(), mask));
    Ok((loss, metrics))
}

/// PACT's weights ([`Pact`]): w_t = min(c̄, exp(clamp(Σ_{valid s ≥ t} (log π_new − log
/// π_old)_s, ±20))), 0 on masked steps. Metrics `critic/pact_weight_mean` and
/// `critic/pact_clipped_fraction` over valid steps.
///
/// # Shapes
/// `new_log_probs`, `old_log_probs`, `mask` `[batch, steps]` → `[batch, steps]`.
///
/// # Errors
/// Shapes that differ.
pub fn pact_weights(
    pact: &Pact,
    new_log_probs: Tensor<2>,
    old_log_probs: Tensor<2>,
    mask: Tensor<2>,
) -> Result<(Tensor<2>, Metrics)> {
    let dims = mask.dims();
    check_shape("new_log_probs", new_log_probs.dims(), dims)?;
    check_shape("old_log_probs", old_log_probs.dims(), dims)?;
    // A step whose log-prob is not finite (a masked pad) must not poison the suffix sums.
    let diff = new_log_probs.detach() - old_log_probs.detach();
    let diff = diff.clone().mask_fill(diff.is_finite().bool_not(), 0.0) * mask.clone();
    let log_w = discounted_suffix_sum(diff, 1.0).clamp(-20.0, 20.0);
    let raw = log_w.exp();
    let clipped = raw.clone().greater_elem(pact.weight_clip).float();
    let w = raw.clamp_max(pact.weight_clip) * mask.clone();
    let mut metrics = Metrics::new();
    metrics.push(
        "critic/pact_weight_mean",
        masked_mean(w.clone(), mask.clone()),
    );
    metrics.push("critic/pact_clipped_fraction", masked_mean(clipped, mask));
    Ok((w, metrics))
}

/// verl's `critic/vf_explained_var` (`compute_data_metrics`): 1 − Var(R − V) / (Var(R) + 1e-5)
/// over valid steps, unbiased variances as `torch.var`.
///
/// # Errors
/// Shapes that differ.
pub fn explained_variance(
    values: Tensor<2>,
    returns: Tensor<2>,
    mask: Tensor<2>,
) -> Result<Tensor<1>> {
    check_shape("values", values.dims(), mask.dims())?;
    check_shape("returns", returns.dims(), mask.dims())?;
    let resid = masked_var(returns.clone() - values, mask.clone(), true);
    let var = masked_var(returns, mask, true);
    Ok((resid / (var + 1e-5)).neg().add_scalar(1.0))
}
