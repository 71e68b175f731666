//! The policy losses of [`crate::policy_loss`], one function per [`PolicyLossKind`], each over
//! the same [`LossCtx`]. A loss returns its `[batch, steps]` per-step values and, when it drops
//! samples (A-LoL's negatives), the mask to aggregate with.

use crate::error::{EngineError, Result};
use crate::loss::{LOG_RATIO_CLAMP, PolicyLossInput, PolicyLossKind, RatioLevel, RecClip};
use crate::metrics::Metrics;
use crate::ops::masked_mean;
use burn::tensor::{Bool, Tensor};

/// What every policy loss reads, derived once from the input.
pub(crate) struct LossCtx<'a> {
    input: &'a PolicyLossInput,
    /// `[batch, steps]` advantages, detached.
    adv: Tensor<2>,
    /// `[batch, steps]` the input's mask.
    pub(crate) mask: Tensor<2>,
    /// `[batch, steps]` log π.
    log_probs: Tensor<2>,
    /// `[batch, steps]` log π − log π_old, clamped to ±[`LOG_RATIO_CLAMP`].
    pub(crate) neg_lr: Tensor<2>,
}

impl<'a> LossCtx<'a> {
    pub(crate) fn new(input: &'a PolicyLossInput) -> Self {
        let neg_lr = (input.log_probs.clone() - input.old_log_probs.clone().detach())
            .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
        Self {
            input,
            adv: input.advantages.clone().detach(),
            mask: input.mask.clone(),
            log_probs: input.log_probs.clone(),
            neg_lr,
        }
    }

    fn frac(&self, cond: Tensor<2, Bool>) -> Tensor<1> {
        masked_mean(cond.float(), self.mask.clone())
    }

    /// Per-sequence sum of `x` under the mask, broadcast back to `[batch, steps]`.
    fn seq_sum(&self, x: Tensor<2>) -> Tensor<2> {
        let dims = self.mask.dims();
        (x * self.mask.clone()).sum_dim(1).expand(dims)
    }
}

/// A loss that may drop samples: its per-step values and the mask to aggregate with.
type Dropping = (Tensor<2>, Option<Tensor<2>>);

/// REINFORCE surrogate (Williams 1992): L = −A·log π.
pub(crate) fn vanilla(c: &LossCtx) -> Tensor<2> {
    c.adv.clone().neg() * c.log_probs.clone()
}

/// PPO clip (Schulman et al. 2017, eq. 7; verl `compute_policy_loss`) with asymmetric ε and
/// dual-clip for A < 0 (Ye et al. 2020, eq. 5).
pub(crate) fn ppo(
    c: &LossCtx,
    (lo, hi): (f32, f32),
    dual: Option<f32>,
    m: &mut Metrics,
) -> Tensor<2> {
    let adv = c.adv.clone();
    let ratio = c.neg_lr.clone().exp();
    let l1 = adv.clone().neg() * ratio.clone();
    let l2 = adv.clone().neg() * ratio.clamp(1.0 - lo, 1.0 + hi);
    let clipped = l1.clone().max_pair(l2.clone());
    m.push("actor/clipfrac", c.frac(l2.greater(l1)));
    let Some(dual) = dual else {
        return clipped;
    };
    let l3 = adv.clone().neg() * dual;
    let bounded = clipped.clone().min_pair(l3.clone());
    let negative = adv.lower_elem(0.0);
    let lower = clipped.clone().greater(l3).bool_and(negative.clone());
    m.push("actor/clipfrac_lower", c.frac(lower));
    clipped.mask_where(negative, bounded)
}

/// GSPO (Zheng et al. 2025, eq. 5–7; verl `compute_policy_loss_gspo`): the sequence ratio
/// exp(mean_t log ρ_t) per token as sg(s_i)·π_t/sg(π_t), PPO-clipped.
pub(crate) fn gspo(c: &LossCtx, (lo, hi): (f32, f32), m: &mut Metrics) -> Tensor<2> {
    let len = c
        .mask
        .clone()
        .sum_dim(1)
        .clamp_min(1.0)
        .expand(c.mask.dims());
    let seq_lr = (c.seq_sum(c.neg_lr.clone()) / len).detach();
    let log_s = (seq_lr + c.log_probs.clone() - c.log_probs.clone().detach()).clamp_max(10.0);
    let s = log_s.exp();
    let l1 = c.adv.clone().neg() * s.clone();
    let l2 = c.adv.clone().neg() * s.clamp(1.0 - lo, 1.0 + hi);
    m.push("actor/clipfrac", c.frac(l2.clone().greater(l1.clone())));
    l1.max_pair(l2)
}

/// CISPO (MiniMax-M1 2025, eq. 4; verl `compute_policy_loss_cispo`):
/// L = −sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π.
pub(crate) fn cispo(c: &LossCtx, (lo, hi): (f32, f32), m: &mut Metrics) -> Tensor<2> {
    let ratio = c.neg_lr.clone().exp().detach();
    let w = ratio.clone().clamp((1.0 - lo).max(0.0), 1.0 + hi);
    m.push("actor/clipfrac", c.frac(w.clone().not_equal(ratio)));
    (w * c.adv.clone()).neg() * c.log_probs.clone()
}

/// DISPO (Karaman et al. 2026, arXiv 2602.00983): L = −sg(ρ)·M·A·log π, the band of ρ chosen by
/// the sign of A (`[pos_down, pos_up, neg_down, neg_up]`).
pub(crate) fn dispo(c: &LossCtx, band: [f32; 4], m: &mut Metrics) -> Tensor<2> {
    let [pos_down, pos_up, neg_down, neg_up] = band;
    let ratio = c.neg_lr.clone().exp().detach();
    let within = |down: f32, up: f32| {
        ratio
            .clone()
            .greater_equal_elem(1.0 - down)
            .bool_and(ratio.clone().lower_equal_elem(1.0 + up))
    };
    let positive = c.adv.clone().greater_elem(0.0);
    let keep = within(neg_down, neg_up)
        .float()
        .mask_where(positive, within(pos_down, pos_up).float());
    m.push(
        "actor/clipfrac",
        masked_mean(keep.clone().neg().add_scalar(1.0), c.mask.clone()),
    );
    (ratio * keep * c.adv.clone()).neg() * c.log_probs.clone()
}

/// TOPR (Le Roux et al. 2025, eq. 9): L = −sg(α)·A·log π, α = 1 for A ≥ 0 and clip(π/μ, 0, 1)
/// for A < 0, the ratio per sequence (paper) or per token (Trinity `topr`).
pub(crate) fn topr(c: &LossCtx, level: RatioLevel, m: &mut Metrics) -> Tensor<2> {
    let lr = match level {
        RatioLevel::Sequence => c.seq_sum(c.neg_lr.clone()),
        RatioLevel::Token => c.neg_lr.clone(),
    };
    let truncated = lr.clamp(-LOG_RATIO_CLAMP, 0.0).exp().detach();
    let adv = c.adv.clone();
    let alpha = truncated.mask_where(adv.clone().greater_equal_elem(0.0), adv.ones_like());
    m.push(
        "actor/is_weight_mean",
        masked_mean(alpha.clone(), c.mask.clone()),
    );
    (alpha * adv).neg() * c.log_probs.clone()
}

/// REC (Trinity-RFT `RECPolicyLossFn`): L = −Â·log π·M, Â = A or A·sg(ρ), M the clipping mask
/// of [`RecClip`].
pub(crate) fn rec(c: &LossCtx, kind: &PolicyLossKind, m: &mut Metrics) -> Tensor<2> {
    let PolicyLossKind::Rec {
        clip,
        importance_sampling,
        clip_low,
        clip_high,
        clip_low_prime,
        clip_high_prime,
    } = *kind
    else {
        unreachable!("rec is called for PolicyLossKind::Rec only")
    };
    let ratio = c.neg_lr.clone().exp().detach();
    let (lo, hi) = (1.0 - clip_low, 1.0 + clip_high);
    let nonneg = c.adv.clone().greater_equal_elem(0.0);
    let nonpos = c.adv.clone().lower_equal_elem(0.0);
    let at_most = |x: f32| ratio.clone().lower_equal_elem(x);
    let at_least = |x: f32| ratio.clone().greater_equal_elem(x);
    let band = at_least(lo).bool_and(at_most(hi));
    let keep = match clip {
        RecClip::OneSide => nonneg
            .bool_and(at_most(hi))
            .bool_or(nonpos.bool_and(at_least(lo))),
        RecClip::TwoSide => band,
        RecClip::Ring => band
            .bool_or(nonneg.bool_and(at_most(1.0 - clip_low_prime)))
            .bool_or(nonpos.bool_and(at_least(1.0 + clip_high_prime))),
    }
    .float();
    m.push(
        "actor/clipfrac",
        masked_mean(keep.clone().neg().add_scalar(1.0), c.mask.clone()),
    );
    let weight = if importance_sampling {
        c.adv.clone() * ratio
    } else {
        c.adv.clone()
    };
    (weight * keep).neg() * c.log_probs.clone()
}

/// OPMD / AsymRE (Trinity-RFT `OPMDPolicyLossFn`; Kimi k1.5 §2.3.2 for the regulariser):
/// L = [−A·log π + c·(log π − log π_old)²] / (1 + τ).
pub(crate) fn opmd(c: &LossCtx, tau: f32, k2_coef: f32) -> Tensor<2> {
    let mut l = vanilla(c);
    if k2_coef > 0.0 {
        l = l + c.neg_lr.clone() * c.neg_lr.clone() * k2_coef;
    }
    l / (1.0 + tau)
}

/// A-LoL's reference log-probs (required) and its positive-advantage indicator.
fn alol_parts(c: &LossCtx) -> Result<(Tensor<2>, Tensor<2>)> {
    let reference = c
        .input
        .ref_log_probs
        .clone()
        .ok_or(EngineError::MissingInput {
            what: "alol",
            input: "ref_log_probs",
        })?;
    Ok((reference, c.adv.clone().greater_elem(0.0).float()))
}

/// A-LoL (Baheti et al. 2023, eq. 4; LoL-RL `a_lol`): L = −A⁺·sg(clip(r, 1−ε, 1+ε))·log π,
/// r = π(y)/π_ref(y) per sequence, only samples with A > 0.
pub(crate) fn alol(c: &LossCtx, clip: f32, m: &mut Metrics) -> Result<Dropping> {
    let (reference, positive) = alol_parts(c)?;
    let lr = c
        .seq_sum(c.log_probs.clone().detach() - reference)
        .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let w = lr.exp().clamp(1.0 - clip, 1.0 + clip).detach();
    let mask = c.mask.clone() * positive.clone();
    m.push("actor/is_weight_mean", masked_mean(w.clone(), mask.clone()));
    let per_step = (w * c.adv.clone() * positive).neg() * c.log_probs.clone();
    Ok((per_step, Some(mask)))
}

/// A-LoL seq (Baheti et al. 2023, §2.2; LoL-RL `a_lol_seq`): per-token ratios,
/// L_t = −A⁺·sg(clip(π_t/π_ref,t, 1−ε, 1+ε))·log π_t, only samples with A > 0.
pub(crate) fn alol_seq(c: &LossCtx, clip: f32, m: &mut Metrics) -> Result<Dropping> {
    let (reference, positive) = alol_parts(c)?;
    let mask = c.mask.clone() * positive.clone();
    let lr = (c.log_probs.clone() - reference).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let w = lr.detach().exp().clamp(1.0 - clip, 1.0 + clip);
    m.push("actor/is_weight_mean", masked_mean(w.clone(), mask.clone()));
    let per_step = (w * c.adv.clone() * positive).neg() * c.log_probs.clone();
    Ok((per_step, Some(mask)))
}

/// A-LoL KL (Baheti et al. 2023, §2.2; LoL-RL `a_lol_kl`):
/// L_t = −A⁺·log π_t + β·(log π_t − log π_ref,t), only samples with A > 0.
pub(crate) fn alol_kl(c: &LossCtx, beta: f32, m: &mut Metrics) -> Result<Dropping> {
    let (reference, positive) = alol_parts(c)?;
    let mask = c.mask.clone() * positive.clone();
    let lr = (c.log_probs.clone() - reference).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    m.push("actor/alol_kl", masked_mean(lr.clone(), mask.clone()));
    let per_step = (vanilla(c) + lr * beta) * positive;
    Ok((per_step, Some(mask)))
}
