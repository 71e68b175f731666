//! [`compute_advantages`]: one function per [`AdvantageKind`], each over the same [`AdvCtx`],
//! then the options every estimator shares.

use crate::advantage::{
    self as adv, AdvantageConfig, AdvantageKind, Advantages, BatchBaseline, OpmdBaseline,
    RejectGroups, StdKind,
};
use crate::basis::basis_values;
use crate::batch::RolloutBatch;
use crate::error::{EngineError, Result};
use crate::keys;
use crate::kl::{KlEstimator, kl_penalty};
use crate::metrics::Metrics;
use crate::ops::{masked_mean, masked_whiten, reverse_affine_scan, shift_left};
use burn::tensor::Tensor;

/// Computes advantages for `batch` at optimizer step `step` (used by the CAPO curriculum).
///
/// # Errors
/// [`EngineError::MissingInput`] when the estimator needs an input the batch lacks (values for
/// GAE, baseline rewards for ReMax, log-probs for REINFORCE++'s KL or Lopti), and
/// [`EngineError::InvalidConfig`] for out-of-range settings.
pub fn compute_advantages(
    config: &AdvantageConfig,
    batch: &RolloutBatch,
    step: usize,
) -> Result<Advantages> {
    config.validate()?;
    let c = AdvCtx::new(batch);
    let mut m = Metrics::new();
    let est = match config.kind {
        AdvantageKind::Reinforce { baseline } => reinforce(&c, baseline),
        AdvantageKind::Rloo => rloo(&c),
        AdvantageKind::Grpo {
            std,
            epsilon,
            scale_by_std,
        } => grpo(&c, std, epsilon, scale_by_std),
        AdvantageKind::DrGrpo => grpo(&c, StdKind::Unbiased, 0.0, false),
        AdvantageKind::ReinforcePlusPlus {
            gamma,
            kl_coef,
            whiten,
        } => reinforce_plus_plus(&c, gamma, kl_coef, whiten, &mut m)?,
        AdvantageKind::ReinforcePlusPlusBaseline => reinforce_plus_plus_baseline(&c),
        AdvantageKind::Remax => remax(&c)?,
        AdvantageKind::Opo => opo(&c),
        AdvantageKind::Bnpo { decompose: false } => {
            Estimate::of(c.per_token(adv::bnpo(batch, &c.rewards, &c.valid)))
        }
        AdvantageKind::Bnpo { decompose: true } => bnpo_decomposed(&c)?,
        AdvantageKind::Gae {
            gamma,
            lambda,
            whiten,
        } => gae(&c, gamma, lambda, whiten)?,
        AdvantageKind::Basis {
            bandwidth,
            prior,
            whiten,
        } => basis(&c, bandwidth, prior, whiten, &mut m)?,
        AdvantageKind::Raft { threshold } => raft(&c, threshold),
        AdvantageKind::ReinforceRej { reject, threshold } => {
            reinforce_rej(&c, reject, threshold, &mut m)
        }
        AdvantageKind::Opmd { baseline, tau } => opmd(&c, baseline, tau),
        AdvantageKind::AsymRe { shift } => asymre(&c, shift),
        AdvantageKind::Trloo { gamma } => trloo(&c, gamma)?,
    };
    let mask = est.mask.unwrap_or_else(|| c.mask.clone());
    let mask = match &batch.update_mask {
        Some(keep) => mask * keep.clone(),
        None => mask,
    };
    let adv = shape(config, batch, est.adv, &mask, &c.valid, step)?;
    let returns = est.returns.unwrap_or_else(|| adv.clone());
    let invalid = c.valid.clone().neg().add_scalar(1.0).sum();
    m.push(
        keys::ROLLOUT_REWARD_MEAN,
        masked_mean(c.rewards.clone(), c.valid.clone()),
    );
    m.push("rollout/invalid_rewards", invalid);
    let zero_var = batch
        .groups
        .zero_range(c.rewards.clone(), c.valid.clone())
        .float()
        * c.valid;
    m.push("rollout/zero_variance_samples", zero_var.sum());
    adv::push_stats(&mut m, "advantage", adv.clone(), mask.clone());
    Ok(Advantages {
        advantages: adv,
        returns,
        mask,
        metrics: m,
    })
}

/// The options applied to every estimator's advantages, in order: per-row whitening, CAPO's
/// positive-only curriculum, Lopti's probability weighting, clipping; then the mask.
fn shape(
    config: &AdvantageConfig,
    batch: &RolloutBatch,
    adv: Tensor<2>,
    mask: &Tensor<2>,
    valid: &Tensor<1>,
    step: usize,
) -> Result<Tensor<2>> {
    let mut adv = adv;
    if config.whiten_rows {
        adv = adv::whiten_rows(adv, mask, valid);
    }
    if config.capo_positive_steps > 0 && step < config.capo_positive_steps {
        adv = adv.clamp_min(0.0);
    }
    if let Some(alpha) = config.lopti_alpha {
        let old = batch
            .behaviour_log_probs()
            .ok_or(EngineError::MissingInput {
                what: "lopti_alpha",
                input: "old_log_probs",
            })?;
        adv = adv * (old.clone().exp() * alpha).add_scalar(1.0 - alpha);
    }
    if let Some(c) = config.clip {
        adv = adv.clamp(-c, c);
    }
    Ok(adv * mask.clone())
}
/// What every estimator reads, derived once from the batch.
pub(crate) struct AdvCtx<'a> {
    batch: &'a RolloutBatch,
    /// `[batch]` the outcome rewards, invalid ones zeroed.
    outcome: Tensor<1>,
    /// `[batch]` the sequence reward of the outcome-level estimators: the outcome plus every
    /// per-step reward (verl's `token_level_rewards.sum(-1)`).
    pub(crate) rewards: Tensor<1>,
    /// `[batch]` 1 where the reward is valid.
    pub(crate) valid: Tensor<1>,
    /// `[batch, steps]` the batch's mask without the rows of invalid rewards.
    pub(crate) mask: Tensor<2>,
}

impl<'a> AdvCtx<'a> {
    pub(crate) fn new(batch: &'a RolloutBatch) -> Self {
        let [b, _] = batch.dims();
        let valid = batch.reward_valid();
        let outcome = batch.clean_rewards();
        let rewards = match &batch.token_rewards {
            Some(t) => {
                let t = t.clone().mask_fill(t.clone().is_finite().bool_not(), 0.0);
                outcome.clone() + t.sum_dim(1).reshape([b]) * valid.clone()
            }
            None => outcome.clone(),
        };
        let mask = batch.mask.clone() * valid.clone().reshape([b, 1]);
        Self {
            batch,
            outcome,
            rewards,
            valid,
            mask,
        }
    }

    /// `[batch]` valid samples in each row's group.
    fn count(&self) -> Tensor<1> {
        self.batch.groups.group_count(self.valid.clone())
    }

    /// `[batch]` each row's group mean over valid samples.
    fn mean(&self) -> Tensor<1> {
        (self.batch.groups).group_mean(self.rewards.clone(), self.valid.clone())
    }

    /// `[batch]` 1 where the group has more than one valid sample (a baseline to compare with).
    fn multi(&self) -> Tensor<1> {
        self.count().greater_elem(1.0).float()
    }

    /// `[batch] → [batch, steps]`: a sequence advantage on every step of the mask.
    pub(crate) fn per_token(&self, a: Tensor<1>) -> Tensor<2> {
        let [b, _] = self.mask.dims();
        a.reshape([b, 1]) * self.mask.clone()
    }

    /// `[batch, steps]` the outcome on each row's last valid step plus the per-step rewards.
    fn token_rewards(&self) -> Tensor<2> {
        adv::token_level_rewards(self.batch, &self.outcome)
    }
}

/// An estimator's advantages, its returns when they are not the advantages, and its mask when
/// it drops samples.
pub(crate) struct Estimate {
    pub(crate) adv: Tensor<2>,
    pub(crate) returns: Option<Tensor<2>>,
    pub(crate) mask: Option<Tensor<2>>,
}

impl Estimate {
    pub(crate) fn of(adv: Tensor<2>) -> Self {
        Self {
            adv,
            returns: None,
            mask: None,
        }
    }

    fn with_returns(adv: Tensor<2>, returns: Tensor<2>) -> Self {
        Self {
            returns: Some(returns),
            ..Self::of(adv)
        }
    }
}

fn whiten_if(a: Tensor<2>, whiten: bool, mask: &Tensor<2>) -> Tensor<2> {
    if whiten {
        masked_whiten(a, mask.clone())
    } else {
        a
    }
}

/// REINFORCE (Williams 1992): A = R, R − batch mean, or R − c (TOPR's baseline parameter, Le
/// Roux et al. 2025, §4).
pub(crate) fn reinforce(c: &AdvCtx, baseline: BatchBaseline) -> Estimate {
    let a = match baseline {
        BatchBaseline::None => c.rewards.clone(),
        BatchBaseline::Mean => c.rewards.clone() - masked_mean(c.rewards.clone(), c.valid.clone()),
        BatchBaseline::Constant(b) => c.rewards.clone().sub_scalar(b),
    };
    Estimate::of(c.per_token(a * c.valid.clone()))
}

/// RLOO (Ahmadian et al. 2024, eq. 5): A_i = R_i − mean_{j≠i} R_j within the group.
pub(crate) fn rloo(c: &AdvCtx) -> Estimate {
    let sum = (c.batch.groups).group_sum(c.rewards.clone(), c.valid.clone());
    let loo = (sum - c.rewards.clone()) / c.count().sub_scalar(1.0).clamp_min(1.0);
    Estimate::of(c.per_token((c.rewards.clone() - loo) * c.multi() * c.valid.clone()))
}

/// GRPO (Shao et al. 2024, §4.1.2) and Dr.GRPO (Liu et al. 2025, eq. 3, no std).
pub(crate) fn grpo(c: &AdvCtx, std: StdKind, epsilon: f32, scale_by_std: bool) -> Estimate {
    let a = adv::grpo(c.batch, &c.rewards, &c.valid, std, epsilon, scale_by_std);
    Estimate::of(c.per_token(a))
}

/// REINFORCE++ (Hu 2025, eq. 4; verl `compute_reinforce_plus_plus_outcome_advantage`): the
/// discounted return over valid steps, with an optional k1 KL in the reward, whitened.
pub(crate) fn reinforce_plus_plus(
    c: &AdvCtx,
    gamma: f32,
    kl_coef: f32,
    whiten: bool,
    m: &mut Metrics,
) -> Result<Estimate> {
    let mut r = c.token_rewards();
    if kl_coef > 0.0 {
        let missing = |input| EngineError::MissingInput {
            what: "reinforce_plus_plus kl_coef",
            input,
        };
        let old = c
            .batch
            .behaviour_log_probs()
            .ok_or(missing("old_log_probs"))?;
        let reference = c
            .batch
            .ref_log_probs
            .clone()
            .ok_or(missing("ref_log_probs"))?;
        let kl = kl_penalty(old.clone(), reference, KlEstimator::K1);
        m.push(
            "advantage/kl_in_reward",
            masked_mean(kl.clone(), c.mask.clone()),
        );
        r = r - kl * kl_coef;
    }
    let g = adv::skip_masked_suffix_sum(r, &c.mask, gamma) * c.mask.clone();
    Ok(match whiten {
        true => Estimate::with_returns(masked_whiten(g.clone(), c.mask.clone()), g),
        false => Estimate::of(g),
    })
}

/// REINFORCE++-baseline (Hu 2025, §3.2; verl
/// `compute_reinforce_plus_plus_baseline_outcome_advantage`): A = whiten(R − mean_g).
pub(crate) fn reinforce_plus_plus_baseline(c: &AdvCtx) -> Estimate {
    let a = (c.rewards.clone() - c.mean()) * c.multi() * c.valid.clone();
    Estimate::of(masked_whiten(c.per_token(a), c.mask.clone()))
}

/// ReMax (Li et al. 2024, eq. 6; verl `compute_remax_outcome_advantage`): every step's
/// reward-to-go (verl's `token_level_rewards.flip(-1).cumsum(-1).flip(-1)`, the outcome on the
/// last valid step) minus the greedy response's reward; the reward-to-go is the returns.
pub(crate) fn remax(c: &AdvCtx) -> Result<Estimate> {
    let base = c
        .batch
        .baseline_rewards
        .clone()
        .ok_or(EngineError::MissingInput {
            what: "remax",
            input: "baseline_rewards",
        })?;
    let base = base.clone().mask_fill(base.is_finite().bool_not(), 0.0);
    let [b, _] = c.mask.dims();
    let r = c.token_rewards() * c.valid.clone().reshape([b, 1]);
    let to_go = reverse_affine_scan(r.ones_like(), r) * c.mask.clone();
    Ok(Estimate::with_returns(
        to_go.clone() - c.per_token(base),
        to_go,
    ))
}

/// BNPO's advantage decomposition (Xiao et al. 2025; reference `bnpo_ray_trainer.py`,
/// `use_advantage_decomposition`): A = (1/K) Σ_k A_k, A_k the BNPO advantage of reward term k
/// alone ([`RolloutBatch::reward_parts`]), its p_g, α and β its own. A term's failed value
/// (non-finite, or past `REWARD_LIMIT`) leaves that term out of its own baseline and
/// advantage; a row whose reward failed has advantage 0.
///
/// # Errors
/// No reward parts, or per-step rewards (they are not among the parts).
pub(crate) fn bnpo_decomposed(c: &AdvCtx) -> Result<Estimate> {
    let batch = c.batch;
    let parts = batch
        .reward_parts
        .clone()
        .ok_or(EngineError::MissingInput {
            what: "BNPO's advantage decomposition",
            input: "reward_parts",
        })?;
    if batch.token_rewards.is_some() {
        return Err(EngineError::InvalidConfig {
            field: "advantage.decompose",
            value: "true".into(),
            reason: "per-step rewards are not among the reward's parts; decompose needs every term as a part",
        });
    }
    let [b, k] = parts.dims();
    let mut sum: Option<Tensor<1>> = None;
    for j in 0..k {
        let part = parts.clone().slice([0..b, j..j + 1]).reshape([b]);
        // Valid as `rewards` are: finite and within ±REWARD_LIMIT.
        let ok = part.clone().is_finite().bool_and(
            part.clone()
                .abs()
                .lower_equal_elem(crate::batch::REWARD_LIMIT),
        );
        let valid = c.valid.clone() * ok.clone().float();
        let rewards = part.mask_fill(ok.bool_not(), 0.0);
        let a = adv::bnpo(batch, &rewards, &valid);
        sum = Some(match sum {
            Some(s) => s + a,
            None => a,
        });
    }
    let mean = sum.map_or_else(|| c.valid.zeros_like(), |s| s / k as f32);
    Ok(Estimate::of(c.per_token(mean * c.valid.clone())))
}

/// OPO (Hao et al. 2025, eq. 6): A_i = R_i − Σ_j l_j R_j / Σ_j l_j, l = response length.
pub(crate) fn opo(c: &AdvCtx) -> Estimate {
    let groups = &c.batch.groups;
    let len = c.batch.lengths() * c.valid.clone();
    let num = groups.group_sum(len.clone() * c.rewards.clone(), c.valid.clone());
    let den = groups.group_sum(len, c.valid.clone()).clamp_min(1e-8);
    let a = (c.rewards.clone() - num / den) * c.multi() * c.valid.clone();
    Estimate::of(c.per_token(a))
}

/// GAE (Schulman et al. 2016, eq. 16; verl `compute_gae_advantage_return`), skipping masked
/// steps: V_{t+1} is the next valid step's value; returns = A + V.
pub(crate) fn gae(c: &AdvCtx, gamma: f32, lambda: f32, whiten: bool) -> Result<Estimate> {
    let values = c.batch.values.clone().ok_or(EngineError::MissingInput {
        what: "gae",
        input: "values",
    })?;
    let mask = &c.mask;
    let values = values * mask.clone();
    let r = c.token_rewards() * mask.clone();
    // V of the next valid step (0 after the last): the first valid value at or after each
    // step, shifted by one.
    let carry = mask.clone().neg().add_scalar(1.0);
    let next_values = shift_left(reverse_affine_scan(carry, values.clone()));
    let delta = r + next_values * gamma - values.clone();
    let a = adv::skip_masked_suffix_sum(delta, mask, gamma * lambda) * mask.clone();
    let returns = (a.clone() + values) * mask.clone();
    Ok(Estimate::with_returns(whiten_if(a, whiten, mask), returns))
}

/// BASIS: A_i = R_i − V̂_i, V̂_i the leave-one-out kernel average of the other rows' rewards
/// over prompt representations ([`basis_values`]), `(bandwidth, prior)`.
pub(crate) fn basis(
    c: &AdvCtx,
    bandwidth: f32,
    prior: f32,
    whiten: bool,
    m: &mut Metrics,
) -> Result<Estimate> {
    let features = c.batch.features.clone().ok_or(EngineError::MissingInput {
        what: "basis",
        input: "features",
    })?;
    let v = basis_values(
        features,
        c.rewards.clone(),
        c.valid.clone(),
        bandwidth,
        prior,
    );
    m.push(
        "advantage/basis_value_mean",
        masked_mean(v.clone(), c.valid.clone()),
    );
    let a = c.per_token((c.rewards.clone() - v) * c.valid.clone());
    Ok(Estimate::of(whiten_if(a, whiten, &c.mask)))
}

/// RAFT (Dong et al. 2023; Xiong et al. 2025 "RAFT++"): positives only, A = 1[R > threshold];
/// the rejected samples leave the mask (the loss is the accepted samples' SFT loss, averaged
/// over their tokens).
pub(crate) fn raft(c: &AdvCtx, threshold: f32) -> Estimate {
    let [b, _] = c.mask.dims();
    let a = c.rewards.clone().greater_elem(threshold).float() * c.valid.clone();
    Estimate {
        mask: Some(c.mask.clone() * a.clone().reshape([b, 1])),
        ..Estimate::of(c.per_token(a))
    }
}

/// Reinforce-Rej (Xiong et al. 2025, §3): A = R − mean_g; groups whose rewards are all equal
/// are rejected (advantage 0, out of the mask, counted): both kinds, or one side (§4's
/// ablation), a uniform group being all right when its reward is above `threshold`.
pub(crate) fn reinforce_rej(
    c: &AdvCtx,
    reject: RejectGroups,
    threshold: f32,
    m: &mut Metrics,
) -> Estimate {
    let [b, _] = c.mask.dims();
    let groups = &c.batch.groups;
    let uniform = groups
        .zero_range(c.rewards.clone(), c.valid.clone())
        .float();
    let right = c.rewards.clone().greater_elem(threshold).float();
    let rejected = match reject {
        RejectGroups::Both => uniform,
        RejectGroups::AllWrong => uniform * right.neg().add_scalar(1.0),
        RejectGroups::AllRight => uniform * right,
    };
    let keep = rejected.clone().neg().add_scalar(1.0);
    m.push(
        "advantage/rejected_samples",
        (rejected * c.valid.clone()).sum(),
    );
    let a = (c.rewards.clone() - c.mean()) * keep.clone() * c.valid.clone();
    Estimate {
        mask: Some(c.mask.clone() * keep.reshape([b, 1])),
        ..Estimate::of(c.per_token(a))
    }
}

/// OPMD (Trinity-RFT `OPMDAdvantageFn`): A = R − b, b the group mean or τ·log mean exp(R/τ).
pub(crate) fn opmd(c: &AdvCtx, baseline: OpmdBaseline, tau: f32) -> Estimate {
    let base = match baseline {
        OpmdBaseline::Mean => c.mean(),
        OpmdBaseline::LogAvgExp => {
            // τ·log mean exp(R/τ), stabilised by the group mean.
            let m = c.mean();
            let e = ((c.rewards.clone() - m.clone()) / tau).exp();
            let avg = c.batch.groups.group_sum(e, c.valid.clone()) / c.count().clamp_min(1.0);
            m + avg.clamp_min(1e-30).log() * tau
        }
    };
    Estimate::of(c.per_token((c.rewards.clone() - base) * c.multi() * c.valid.clone()))
}

/// AsymRE (Arnal et al. 2025, eq. 3): A = R − (mean_g + δ), δ < 0 favours positives.
pub(crate) fn asymre(c: &AdvCtx, shift: f32) -> Estimate {
    let a = (c.rewards.clone() - c.mean().add_scalar(shift)) * c.multi() * c.valid.clone();
    Estimate::of(c.per_token(a))
}

/// TRLOO (turn-level leave-one-out over the episodes of a prompt that reached each turn; see
/// [`AdvantageKind::Trloo`](crate::AdvantageKind::Trloo)).
pub(crate) fn trloo(c: &AdvCtx, gamma: f32) -> Result<Estimate> {
    let turns = c.batch.turn_ids.clone().ok_or(EngineError::MissingInput {
        what: "trloo",
        input: "turn_ids",
    })?;
    let r = c.token_rewards() * c.mask.clone();
    let (a, g) = adv::trloo(&turns, r, &c.mask, &c.batch.groups, gamma);
    Ok(Estimate::with_returns(a, g))
}
