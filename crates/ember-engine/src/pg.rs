//! Policy losses: the choice ([`PolicyLossKind`]), its input, and [`policy_loss`], which
//! dispatches to one function per loss, each over the same [`LossCtx`]. A loss returns its
//! `[batch, steps]` per-step values and, when it drops samples (A-LoL's negatives), the mask to
//! aggregate with.

use crate::error::{EngineError, Result, check_config, check_shape};
use crate::keys;
use crate::metrics::Metrics;
use crate::ops::masked_mean;
use burn::tensor::{Bool, Tensor};
use serde::{Deserialize, Serialize};

pub(crate) const LOG_RATIO_CLAMP: f32 = 20.0;

fn f02() -> f32 {
    0.2
}
fn f028() -> f32 {
    0.28
}
fn f1() -> f32 {
    1.0
}
fn gspo_low() -> f32 {
    3e-4
}
fn gspo_high() -> f32 {
    4e-4
}
fn rec_low_prime() -> f32 {
    0.6
}
fn rec_high_prime() -> f32 {
    2.0
}
fn alol_clip() -> f32 {
    0.9
}

fn alol_kl_beta() -> f32 {
    0.2
}

/// REC's clipping-by-masking rule (Yao et al. 2025, arXiv 2509.24203; Trinity-RFT
/// `RECPolicyLossFn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecClip {
    /// Keep [A ≥ 0 ∧ ρ ≤ 1+ε_h] ∨ [A ≤ 0 ∧ ρ ≥ 1−ε_l] (PPO's zero-gradient region, as a mask).
    #[default]
    OneSide,
    /// Keep 1−ε_l ≤ ρ ≤ 1+ε_h.
    TwoSide,
    /// Two-side band, plus the outer ring [A ≥ 0 ∧ ρ ≤ 1−ε′_l] ∨ [A ≤ 0 ∧ ρ ≥ 1+ε′_h].
    Ring,
}

/// Token- or sequence-level importance ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    /// Product of token ratios over the sequence (the papers' definition).
    #[default]
    Sequence,
    /// One ratio per token.
    Token,
}

/// Which policy loss. The `kind` tag is what a recipe writes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyLossKind {
    /// REINFORCE surrogate (Williams 1992): L = −A·log π.
    Vanilla,
    /// PPO clip (Schulman et al. 2017, eq. 7) with asymmetric ε (DAPO clip-higher, Yu et al.
    /// 2025, eq. 10) and dual-clip for A < 0 (Ye et al. 2020, eq. 5; verl `compute_policy_loss`):
    /// L = max(−Aρ, −A·clip(ρ, 1−ε_l, 1+ε_h)), and for A < 0, min(that, −A·c).
    Ppo {
        /// ε_l.
        #[serde(default = "f02")]
        clip_low: f32,
        /// ε_h.
        #[serde(default = "f02")]
        clip_high: f32,
        /// Dual-clip constant c > 1 (None disables it).
        #[serde(default)]
        dual_clip: Option<f32>,
    },
    /// GSPO (Zheng et al. 2025, eq. 5–7; verl `compute_policy_loss_gspo`): sequence ratio
    /// s_i = exp(mean_t log ρ_t), per token s_{i,t} = sg(s_i)·π_t/sg(π_t), PPO-clipped.
    Gspo {
        /// ε_l.
        #[serde(default = "gspo_low")]
        clip_low: f32,
        /// ε_h.
        #[serde(default = "gspo_high")]
        clip_high: f32,
    },
    /// CISPO (MiniMax-M1, 2025, eq. 4; verl `compute_policy_loss_cispo`):
    /// L = −sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π.
    Cispo {
        /// ε_l (1 leaves the weight unbounded below, as MiniMax does).
        #[serde(default = "f1")]
        clip_low: f32,
        /// ε_h.
        #[serde(default = "f028")]
        clip_high: f32,
    },
    /// DISPO (Karaman et al. 2026, arXiv 2602.00983): REINFORCE-style L = −sg(ρ)·M·A·log π with
    /// the trust band of ρ decoupled by the sign of A: M = 1[1−ε⁺_down ≤ ρ ≤ 1+ε⁺_up] for A > 0
    /// and 1[1−ε⁻_down ≤ ρ ≤ 1+ε⁻_up] for A ≤ 0 (tokens outside get no gradient).
    Dispo {
        /// ε⁺_down.
        #[serde(default = "f02")]
        pos_down: f32,
        /// ε⁺_up.
        #[serde(default = "f028")]
        pos_up: f32,
        /// ε⁻_down.
        #[serde(default = "f02")]
        neg_down: f32,
        /// ε⁻_up.
        #[serde(default = "f02")]
        neg_up: f32,
    },
    /// TOPR (Le Roux et al. 2025, eq. 9): L = −sg(α)·A·log π, α = 1 for A ≥ 0 and
    /// clip(π/μ, 0, 1) for A < 0; the ratio per sequence (paper) or per token (Trinity `topr`).
    Topr {
        /// Sequence or token ratio.
        #[serde(default)]
        level: RatioLevel,
    },
    /// REC (Trinity-RFT `RECPolicyLossFn`): L = −Â·log π·M, Â = A (NoIS) or A·sg(ρ) (IS), M the
    /// clipping mask of [`RecClip`].
    Rec {
        /// One-side, two-side or ring.
        #[serde(default)]
        clip: RecClip,
        /// Weight by sg(ρ) (the `-IS` variants).
        #[serde(default)]
        importance_sampling: bool,
        /// ε_l.
        #[serde(default = "f02")]
        clip_low: f32,
        /// ε_h.
        #[serde(default = "f02")]
        clip_high: f32,
        /// ε′_l of the ring.
        #[serde(default = "rec_low_prime")]
        clip_low_prime: f32,
        /// ε′_h of the ring.
        #[serde(default = "rec_high_prime")]
        clip_high_prime: f32,
    },
    /// OPMD / AsymRE loss (Trinity-RFT `OPMDPolicyLossFn`; Kimi k1.5 §2.3.2 for the regulariser):
    /// L = [−A·log π + c·(log π − log π_old)²] / (1 + τ).
    Opmd {
        /// τ.
        #[serde(default = "f1")]
        tau: f32,
        /// c, the squared log-ratio regulariser (Kimi's τ/2); 0 disables it.
        #[serde(default)]
        k2_coef: f32,
    },
    /// A-LoL (Baheti et al. 2023, eq. 4; LoL-RL `a_lol`): L = −A⁺·sg(clip(r, 1−ε, 1+ε))·log π,
    /// r = π(y)/π_ref(y) per sequence, only samples with A > 0.
    Alol {
        /// ε.
        #[serde(default = "alol_clip")]
        clip: f32,
    },
    /// A-LoL seq (Baheti et al. 2023, §2.2; LoL-RL `a_lol_seq`): per-token ratios,
    /// L_t = −A⁺·sg(clip(π_t/π_ref,t, 1−ε, 1+ε))·log π_t, only samples with A > 0.
    AlolSeq {
        /// ε.
        #[serde(default = "alol_clip")]
        clip: f32,
    },
    /// A-LoL KL (Baheti et al. 2023, §2.2; LoL-RL `a_lol_kl`): no ratio; a KL penalty on the
    /// sampled sequence instead, L_t = −A⁺·log π_t + β·(log π_t − log π_ref,t), only samples
    /// with A > 0.
    AlolKl {
        /// β of the penalty.
        #[serde(default = "alol_kl_beta")]
        beta: f32,
    },
}

impl Default for PolicyLossKind {
    fn default() -> Self {
        Self::Ppo {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
        }
    }
}

impl PolicyLossKind {
    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        let nonneg = |f: &'static str, v: f32| check_config(f, v.into(), v >= 0.0, "must be >= 0");
        match *self {
            Self::Vanilla => Ok(()),
            Self::Ppo {
                clip_low,
                clip_high,
                dual_clip,
            } => {
                check_config(
                    "policy_loss.clip_low",
                    clip_low.into(),
                    (0.0..1.0).contains(&clip_low),
                    "must be in [0, 1)",
                )?;
                nonneg("policy_loss.clip_high", clip_high)?;
                if let Some(c) = dual_clip {
                    check_config("policy_loss.dual_clip", c.into(), c > 1.0, "must be > 1")?;
                }
                Ok(())
            }
            Self::Gspo {
                clip_low,
                clip_high,
            }
            | Self::Cispo {
                clip_low,
                clip_high,
            } => {
                check_config(
                    "policy_loss.clip_low",
                    clip_low.into(),
                    (0.0..=1.0).contains(&clip_low),
                    "must be in [0, 1]",
                )?;
                nonneg("policy_loss.clip_high", clip_high)
            }
            Self::Dispo {
                pos_down,
                pos_up,
                neg_down,
                neg_up,
            } => {
                for (f, v) in [
                    ("policy_loss.pos_down", pos_down),
                    ("policy_loss.neg_down", neg_down),
                ] {
                    check_config(f, v.into(), (0.0..=1.0).contains(&v), "must be in [0, 1]")?;
                }
                nonneg("policy_loss.pos_up", pos_up)?;
                nonneg("policy_loss.neg_up", neg_up)
            }
            Self::Topr { .. } => Ok(()),
            Self::Rec {
                clip_low,
                clip_high,
                clip_low_prime,
                clip_high_prime,
                ..
            } => {
                for (f, v) in [
                    ("policy_loss.clip_low", clip_low),
                    ("policy_loss.clip_high", clip_high),
                    ("policy_loss.clip_low_prime", clip_low_prime),
                    ("policy_loss.clip_high_prime", clip_high_prime),
                ] {
                    nonneg(f, v)?;
                }
                Ok(())
            }
            Self::Opmd { tau, k2_coef } => {
                nonneg("policy_loss.tau", tau)?;
                nonneg("policy_loss.k2_coef", k2_coef)
            }
            Self::Alol { clip } | Self::AlolSeq { clip } => check_config(
                "policy_loss.clip",
                clip.into(),
                (0.0..=1.0).contains(&clip),
                "must be in [0, 1]",
            ),
            Self::AlolKl { beta } => nonneg("policy_loss.beta", beta),
        }
    }
}

/// Inputs of a policy loss. All `[batch, steps]`.
#[derive(Debug, Clone)]
pub struct PolicyLossInput {
    /// log π_θ of the taken steps, with gradient.
    pub log_probs: Tensor<2>,
    /// log π_old (the behaviour policy of the update), no gradient.
    pub old_log_probs: Tensor<2>,
    /// Advantages.
    pub advantages: Tensor<2>,
    /// Float mask.
    pub mask: Tensor<2>,
    /// log π_ref; needed by A-LoL and by the KL term.
    pub ref_log_probs: Option<Tensor<2>>,
}

impl PolicyLossInput {
    fn check(&self) -> Result<[usize; 2]> {
        let dims = self.mask.dims();
        if dims[0] == 0 || dims[1] == 0 {
            return Err(EngineError::EmptyBatch("mask"));
        }
        check_shape("log_probs", self.log_probs.dims(), dims)?;
        check_shape("old_log_probs", self.old_log_probs.dims(), dims)?;
        check_shape("advantages", self.advantages.dims(), dims)?;
        if let Some(r) = &self.ref_log_probs {
            check_shape("ref_log_probs", r.dims(), dims)?;
        }
        Ok(dims)
    }
}

/// A per-step loss matrix (0 outside the mask is not guaranteed: aggregate with the mask) plus
/// metrics and the mask the loss must be aggregated with.
#[derive(Debug, Clone)]
pub struct PolicyLoss {
    /// `[batch, steps]` loss to minimise.
    pub per_step: Tensor<2>,
    /// `[batch, steps]` mask for aggregation (may drop samples, e.g. A-LoL's negatives).
    pub mask: Tensor<2>,
    /// `actor/*` metrics.
    pub metrics: Metrics,
}

/// Computes the per-step policy loss of `kind`: one function per loss in [`crate::pg`], found
/// by the loss's name.
///
/// # Errors
/// Shape mismatches, an empty batch, invalid settings, and A-LoL without `ref_log_probs`.
pub fn policy_loss(kind: &PolicyLossKind, input: &PolicyLossInput) -> Result<PolicyLoss> {
    kind.validate()?;
    input.check()?;
    let c = LossCtx::new(input);
    let mut m = Metrics::new();
    // approx_kl = mean(log π_old − log π) (verl `ppo_kl`).
    m.push(
        "actor/approx_kl",
        masked_mean(c.neg_lr.clone().neg().detach(), c.mask.clone()),
    );
    ratio_spread(&c, &mut m);
    let (per_step, mask) = match *kind {
        PolicyLossKind::Vanilla => (vanilla(&c), None),
        PolicyLossKind::Ppo {
            clip_low,
            clip_high,
            dual_clip,
        } => (ppo(&c, clip_low, clip_high, dual_clip, &mut m), None),
        PolicyLossKind::Gspo {
            clip_low,
            clip_high,
        } => (gspo(&c, (clip_low, clip_high), &mut m), None),
        PolicyLossKind::Cispo {
            clip_low,
            clip_high,
        } => (cispo(&c, (clip_low, clip_high), &mut m), None),
        PolicyLossKind::Dispo {
            pos_down,
            pos_up,
            neg_down,
            neg_up,
        } => {
            let band = [pos_down, pos_up, neg_down, neg_up];
            (dispo(&c, band, &mut m), None)
        }
        PolicyLossKind::Topr { level } => (topr(&c, level, &mut m), None),
        PolicyLossKind::Rec { .. } => (rec(&c, kind, &mut m), None),
        PolicyLossKind::Opmd { tau, k2_coef } => (opmd(&c, tau, k2_coef), None),
        PolicyLossKind::Alol { clip } => alol(&c, clip, &mut m)?,
        PolicyLossKind::AlolSeq { clip } => alol_seq(&c, clip, &mut m)?,
        PolicyLossKind::AlolKl { beta } => alol_kl(&c, beta, &mut m)?,
    };
    Ok(PolicyLoss {
        per_step,
        mask: mask.unwrap_or(c.mask),
        metrics: m,
    })
}

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

/// The spread of the ratio ρ = π/π_old over the masked steps (`actor/ratio_mean`, `_std`,
/// `_min`, `_max`): ρ ≡ 1 on-policy, and every clip, taper and mask acts only where it leaves 1.
fn ratio_spread(c: &LossCtx, m: &mut Metrics) {
    let ratio = c.neg_lr.clone().detach().exp();
    let mask = c.mask.clone();
    let mean = masked_mean(ratio.clone(), mask.clone());
    let centred = ratio.clone() - mean.clone().reshape([1, 1]);
    let var = masked_mean(centred.clone() * centred, mask.clone());
    let off = mask.clone().neg().add_scalar(1.0);
    // ρ > 0: masked steps become 0 for the maximum and 10³⁰ for the minimum; a micro-batch
    // without a valid step reports ρ = 1 throughout (`none` is 1 there, else 0).
    let count = mask.clone().sum();
    let none = count.clone().clamp_max(1.0).neg().add_scalar(1.0);
    let max = (ratio.clone() * mask.clone()).max() + none.clone();
    let min = (ratio * mask + off * 1e30).min() * none.clone().neg().add_scalar(1.0);
    // The steps behind these: ember-train pools micro-batches and ranks by them.
    m.push(keys::ACTOR_RATIO_COUNT, count);
    m.push(keys::ACTOR_RATIO_MAX, max);
    m.push(keys::ACTOR_RATIO_MIN, min + none.clone());
    m.push(keys::ACTOR_RATIO_MEAN, mean + none);
    m.push(keys::ACTOR_RATIO_STD, var.sqrt());
}

/// A loss that may drop samples: its per-step values and the mask to aggregate with.
type Dropping = (Tensor<2>, Option<Tensor<2>>);

/// REINFORCE surrogate (Williams 1992): L = −A·log π.
pub(crate) fn vanilla(c: &LossCtx) -> Tensor<2> {
    c.adv.clone().neg() * c.log_probs.clone()
}

/// PPO clip (Schulman et al. 2017, eq. 7; verl `compute_policy_loss`) with asymmetric ε and
/// dual-clip for A < 0 (Ye et al. 2020, eq. 5).
pub(crate) fn ppo(c: &LossCtx, lo: f32, hi: f32, dual: Option<f32>, m: &mut Metrics) -> Tensor<2> {
    let adv = c.adv.clone();
    let ratio = c.neg_lr.clone().exp();
    let l1 = adv.clone().neg() * ratio.clone();
    let l2 = adv.clone().neg() * ratio.clamp(1.0 - lo, 1.0 + hi);
    let clipped = l1.clone().max_pair(l2.clone());
    m.push(keys::ACTOR_CLIPFRAC, c.frac(l2.greater(l1)));
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
    m.push(keys::ACTOR_CLIPFRAC, c.frac(l2.clone().greater(l1.clone())));
    l1.max_pair(l2)
}

/// CISPO (MiniMax-M1 2025, eq. 4; verl `compute_policy_loss_cispo`):
/// L = −sg(clip(ρ, 1−ε_l, 1+ε_h))·A·log π.
pub(crate) fn cispo(c: &LossCtx, (lo, hi): (f32, f32), m: &mut Metrics) -> Tensor<2> {
    let ratio = c.neg_lr.clone().exp().detach();
    let w = ratio.clone().clamp((1.0 - lo).max(0.0), 1.0 + hi);
    m.push(keys::ACTOR_CLIPFRAC, c.frac(w.clone().not_equal(ratio)));
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
        keys::ACTOR_CLIPFRAC,
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
        keys::ACTOR_IS_WEIGHT_MEAN,
        masked_mean(alpha.clone(), c.mask.clone()),
    );
    // The steps TOPR's taper touches: negatives whose weight fell below 1 by more than the
    // rounding of an on-policy ratio (10⁻³).
    m.push(
        "actor/topr_tapered_frac",
        c.frac(alpha.clone().lower_elem(1.0 - 1e-3)),
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
        keys::ACTOR_CLIPFRAC,
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
    m.push(
        keys::ACTOR_IS_WEIGHT_MEAN,
        masked_mean(w.clone(), mask.clone()),
    );
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
    m.push(
        keys::ACTOR_IS_WEIGHT_MEAN,
        masked_mean(w.clone(), mask.clone()),
    );
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
