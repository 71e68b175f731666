//! Policy losses. Each maps `[batch, steps]` log-probs, old log-probs, advantages and mask to a
//! per-step loss matrix (to be minimised) plus metrics; [`actor_loss`] adds KL and entropy terms,
//! mismatch correction and aggregation.
//!
//! Log-ratios are clamped to ±20 before `exp` (verl). `sg(·)` below is `detach()`.

use crate::agg::{AggNorm, LossAgg, aggregate};
use crate::correction::MismatchCorrection;
use crate::error::{EngineError, Result, check_shape};
use crate::keys;
use crate::kl::{KlEstimator, kl_penalty};
use crate::metrics::Metrics;
use crate::pg::{PolicyLossInput, PolicyLossKind, policy_loss};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Where a KL regulariser goes in the loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KlLoss {
    /// The estimator.
    #[serde(default)]
    pub estimator: KlEstimator,
    /// β: the loss adds β · agg(KL) (GRPO, Shao et al. 2024, eq. 3). An adaptive controller
    /// ([`crate::KlController`]) sets it per step.
    #[serde(default)]
    pub coef: f32,
}

/// The complete actor objective.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ActorLossConfig {
    /// The policy loss.
    #[serde(default)]
    pub policy: PolicyLossKind,
    /// Aggregation of per-step losses.
    #[serde(default)]
    pub agg: LossAgg,
    /// KL(π‖π_ref) in the loss (GRPO, Shao et al. 2024, eq. 3) with its coefficient; None
    /// keeps KL out of the loss.
    #[serde(default)]
    pub kl: Option<KlLoss>,
    /// Entropy bonus coefficient: loss −= coef · agg(entropy).
    #[serde(default)]
    pub entropy_coef: f32,
    /// Rollout/trainer mismatch correction (needs `rollout_log_probs`).
    #[serde(default)]
    pub mismatch: Option<MismatchCorrection>,
}

/// Inputs of the full actor objective: the policy-loss input plus what the extra terms need.
#[derive(Debug, Clone)]
pub struct ActorInput {
    /// The policy-loss inputs.
    pub policy: PolicyLossInput,
    /// `[batch, steps]` full-distribution entropy of π_θ at each step, with gradient.
    pub entropy: Option<Tensor<2>>,
    /// `[batch, steps]` the sampler's log-probs, for mismatch correction.
    pub rollout_log_probs: Option<Tensor<2>>,
    /// `[batch, steps]` a KL to the reference the actor computed in closed form (with
    /// gradient); when given, the KL term uses it instead of an estimator on `ref_log_probs`
    /// (Flow-GRPO's Gaussian mean-difference KL).
    pub kl: Option<Tensor<2>>,
}

/// TOPR's ratio is against the behaviour policy μ (Le Roux et al. 2025, eq. 9: π/μ, truncated
/// for negatives only): with the sampler's log-probs at hand, TOPR reads them as its `old_log_probs`
/// (stale and replayed rows included), and a symmetric mismatch weight, which would also
/// reweight its positives, is refused. `None`: the policy input as it is.
fn behaviour_input(
    config: &ActorLossConfig,
    input: &ActorInput,
) -> Result<Option<PolicyLossInput>> {
    if !matches!(config.policy, PolicyLossKind::Topr { .. }) {
        return Ok(None);
    }
    if config.mismatch.is_some() {
        return Err(EngineError::InvalidConfig {
            field: "loss.mismatch",
            value: "set".into(),
            reason: "TOPR truncates its own ratio to the behaviour policy (negatives only); a mismatch weight would reweight its positives too",
        });
    }
    Ok(input.rollout_log_probs.clone().map(|mu| {
        let mut p = input.policy.clone();
        p.old_log_probs = mu;
        p
    }))
}

/// The full actor objective: aggregated policy loss (with mismatch weights) + β·agg(KL)
/// − c_H·agg(H). Returns the scalar loss `[1]` and metrics.
pub fn actor_loss(
    config: &ActorLossConfig,
    input: &ActorInput,
    norm: AggNorm,
) -> Result<(Tensor<1>, Metrics)> {
    config.agg.validate()?;
    let behaviour = behaviour_input(config, input)?;
    let pg = policy_loss(&config.policy, behaviour.as_ref().unwrap_or(&input.policy))?;
    let mut metrics = pg.metrics;
    let mut per_step = pg.per_step;
    let mut mask = pg.mask;
    if let Some(corr) = &config.mismatch {
        let rollout = input
            .rollout_log_probs
            .clone()
            .ok_or(EngineError::MissingInput {
                what: "mismatch correction",
                input: "rollout_log_probs",
            })?;
        check_shape("rollout_log_probs", rollout.dims(), mask.dims())?;
        let w = corr.weights(input.policy.old_log_probs.clone(), rollout, mask.clone())?;
        per_step = per_step * w.weights;
        mask = mask * w.mask;
        metrics.extend(w.metrics);
    }
    let pg_loss = aggregate(per_step, mask.clone(), config.agg, norm);
    metrics.push(keys::ACTOR_PG_LOSS, pg_loss.clone());
    let mut loss = pg_loss;
    if let Some(kl) = &config.kl {
        let k = match &input.kl {
            Some(k) => {
                check_shape("kl", k.dims(), mask.dims())?;
                k.clone()
            }
            None => {
                let reference =
                    input
                        .policy
                        .ref_log_probs
                        .clone()
                        .ok_or(EngineError::MissingInput {
                            what: "kl loss",
                            input: "ref_log_probs",
                        })?;
                kl_penalty(input.policy.log_probs.clone(), reference, kl.estimator)
            }
        };
        let kl_loss = aggregate(k, mask.clone(), config.agg, norm);
        metrics.push(keys::ACTOR_KL_LOSS, kl_loss.clone());
        metrics.push_f32("actor/kl_coef", kl.coef, &kl_loss.device());
        loss = loss + kl_loss * kl.coef;
    }
    if let Some(entropy) = &input.entropy {
        check_shape("entropy", entropy.dims(), mask.dims())?;
        let h = aggregate(entropy.clone(), mask.clone(), config.agg, norm);
        metrics.push("actor/entropy", h.clone());
        if config.entropy_coef != 0.0 {
            loss = loss - h * config.entropy_coef;
        }
    } else if config.entropy_coef != 0.0 {
        return Err(EngineError::MissingInput {
            what: "entropy bonus",
            input: "entropy",
        });
    }
    metrics.push(keys::ACTOR_LOSS, loss.clone());
    Ok((loss, metrics))
}
