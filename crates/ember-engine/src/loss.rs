//! Policy losses. Each maps `[batch, steps]` log-probs, old log-probs, advantages and mask to a
//! per-step loss matrix (to be minimised) plus metrics; [`actor_loss`] adds KL and entropy terms,
//! mismatch correction and aggregation.
//!
//! Log-ratios are clamped to ±20 before `exp` (verl). `sg(·)` below is `detach()`.

use crate::agg::{AggNorm, LossAgg, aggregate};
use crate::correction::MismatchCorrection;
use crate::error::{EngineError, Result, check_config, check_shape};
use crate::kl::{KlEstimator, kl_penalty};
use crate::metrics::Metrics;
use crate::ops::masked_mean;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

const LOG_RATIO_CLAMP: f32 = 20.0;

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

/// Per-token log-ratio log π − log π_old, clamped.
fn log_ratio(input: &PolicyLossInput) -> Tensor<2> {
    (input.log_probs.clone() - input.old_log_probs.clone().detach())
        .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
}

/// Per-sequence sum of `x` under `mask`, broadcast back to `[batch, steps]`.
fn seq_sum(x: Tensor<2>, mask: &Tensor<2>) -> Tensor<2> {
    let dims = mask.dims();
    (x * mask.clone()).sum_dim(1).expand(dims)
}

/// A-LoL's reference log-probs (required) and its positive-advantage indicator.
fn alol_parts(input: &PolicyLossInput, adv: &Tensor<2>) -> Result<(Tensor<2>, Tensor<2>)> {
    let reference = input
        .ref_log_probs
        .clone()
        .ok_or(EngineError::MissingInput {
            what: "alol",
            input: "ref_log_probs",
        })?;
    Ok((reference, adv.clone().greater_elem(0.0).float()))
}

fn frac(cond: Tensor<2, burn::tensor::Bool>, mask: &Tensor<2>) -> Tensor<1> {
    masked_mean(cond.float(), mask.clone())
}

/// Computes the per-step policy loss of `kind`.
///
/// # Errors
/// Shape mismatches, an empty batch, invalid settings, and A-LoL without `ref_log_probs`.
pub fn policy_loss(kind: &PolicyLossKind, input: &PolicyLossInput) -> Result<PolicyLoss> {
    kind.validate()?;
    let [b, t] = input.check()?;
    let adv = input.advantages.clone().detach();
    let mask = input.mask.clone();
    let log_probs = input.log_probs.clone();
    let mut metrics = Metrics::new();
    let neg_lr = log_ratio(input);
    // approx_kl = mean(log π_old − log π) (verl `ppo_kl`).
    metrics.push(
        "actor/approx_kl",
        masked_mean(neg_lr.clone().neg().detach(), mask.clone()),
    );
    let mut mask_out = mask.clone();

    let per_step = match *kind {
        PolicyLossKind::Vanilla => adv.neg() * log_probs,
        PolicyLossKind::Ppo {
            clip_low,
            clip_high,
            dual_clip,
        } => {
            let ratio = neg_lr.exp();
            let l1 = adv.clone().neg() * ratio.clone();
            let l2 = adv.clone().neg() * ratio.clone().clamp(1.0 - clip_low, 1.0 + clip_high);
            let clipped = l1.clone().max_pair(l2.clone());
            metrics.push("actor/clipfrac", frac(l2.greater(l1), &mask));
            match dual_clip {
                Some(c) => {
                    let l3 = adv.clone().neg() * c;
                    let dual = clipped.clone().min_pair(l3.clone());
                    let negative = adv.lower_elem(0.0);
                    metrics.push(
                        "actor/clipfrac_lower",
                        frac(
                            clipped.clone().greater(l3).bool_and(negative.clone()),
                            &mask,
                        ),
                    );
                    clipped.mask_where(negative, dual)
                }
                None => clipped,
            }
        }
        PolicyLossKind::Gspo {
            clip_low,
            clip_high,
        } => {
            let len = mask.clone().sum_dim(1).clamp_min(1.0).expand([b, t]);
            let seq_lr = (seq_sum(neg_lr.clone(), &mask) / len).detach();
            let log_s = (seq_lr + log_probs.clone() - log_probs.detach()).clamp_max(10.0);
            let s = log_s.exp();
            let l1 = adv.clone().neg() * s.clone();
            let l2 = adv.neg() * s.clamp(1.0 - clip_low, 1.0 + clip_high);
            metrics.push(
                "actor/clipfrac",
                frac(l2.clone().greater(l1.clone()), &mask),
            );
            l1.max_pair(l2)
        }
        PolicyLossKind::Cispo {
            clip_low,
            clip_high,
        } => {
            let ratio = neg_lr.exp().detach();
            let w = ratio
                .clone()
                .clamp((1.0 - clip_low).max(0.0), 1.0 + clip_high);
            metrics.push("actor/clipfrac", frac(w.clone().not_equal(ratio), &mask));
            (w * adv).neg() * log_probs
        }
        PolicyLossKind::Dispo {
            pos_down,
            pos_up,
            neg_down,
            neg_up,
        } => {
            let ratio = neg_lr.exp().detach();
            let positive = adv.clone().greater_elem(0.0);
            let in_pos = ratio
                .clone()
                .greater_equal_elem(1.0 - pos_down)
                .bool_and(ratio.clone().lower_equal_elem(1.0 + pos_up));
            let in_neg = ratio
                .clone()
                .greater_equal_elem(1.0 - neg_down)
                .bool_and(ratio.clone().lower_equal_elem(1.0 + neg_up));
            let keep = in_neg.float().mask_where(positive, in_pos.float());
            metrics.push(
                "actor/clipfrac",
                masked_mean(keep.clone().neg().add_scalar(1.0), mask.clone()),
            );
            (ratio * keep * adv).neg() * log_probs
        }
        PolicyLossKind::Topr { level } => {
            let lr = match level {
                RatioLevel::Sequence => seq_sum(neg_lr.clone(), &mask),
                RatioLevel::Token => neg_lr.clone(),
            };
            let truncated = lr.clamp(-LOG_RATIO_CLAMP, 0.0).exp().detach();
            let alpha =
                truncated.mask_where(adv.clone().greater_equal_elem(0.0), adv.clone().ones_like());
            metrics.push(
                "actor/is_weight_mean",
                masked_mean(alpha.clone(), mask.clone()),
            );
            (alpha * adv).neg() * log_probs
        }
        PolicyLossKind::Rec {
            clip,
            importance_sampling,
            clip_low,
            clip_high,
            clip_low_prime,
            clip_high_prime,
        } => {
            let ratio = neg_lr.exp().detach();
            let lo = 1.0 - clip_low;
            let hi = 1.0 + clip_high;
            let nonneg = adv.clone().greater_equal_elem(0.0);
            let nonpos = adv.clone().lower_equal_elem(0.0);
            let band = ratio
                .clone()
                .greater_equal_elem(lo)
                .bool_and(ratio.clone().lower_equal_elem(hi));
            let keep = match clip {
                RecClip::OneSide => nonneg
                    .bool_and(ratio.clone().lower_equal_elem(hi))
                    .bool_or(nonpos.bool_and(ratio.clone().greater_equal_elem(lo))),
                RecClip::TwoSide => band,
                RecClip::Ring => band
                    .bool_or(nonneg.bool_and(ratio.clone().lower_equal_elem(1.0 - clip_low_prime)))
                    .bool_or(
                        nonpos.bool_and(ratio.clone().greater_equal_elem(1.0 + clip_high_prime)),
                    ),
            }
            .float();
            metrics.push(
                "actor/clipfrac",
                masked_mean(keep.clone().neg().add_scalar(1.0), mask.clone()),
            );
            let weight = if importance_sampling {
                adv * ratio
            } else {
                adv
            };
            (weight * keep).neg() * log_probs
        }
        PolicyLossKind::Opmd { tau, k2_coef } => {
            let mut l = adv.neg() * log_probs;
            if k2_coef > 0.0 {
                l = l + neg_lr.clone() * neg_lr * k2_coef;
            }
            l / (1.0 + tau)
        }
        PolicyLossKind::Alol { clip } => {
            let (reference, positive) = alol_parts(input, &adv)?;
            let lr = seq_sum(log_probs.clone().detach() - reference, &mask)
                .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
            let w = lr.exp().clamp(1.0 - clip, 1.0 + clip).detach();
            mask_out = mask.clone() * positive.clone();
            metrics.push(
                "actor/is_weight_mean",
                masked_mean(w.clone(), mask_out.clone()),
            );
            (w * adv * positive).neg() * log_probs
        }
        PolicyLossKind::AlolSeq { clip } | PolicyLossKind::AlolKl { beta: clip } => {
            let (reference, positive) = alol_parts(input, &adv)?;
            mask_out = mask.clone() * positive.clone();
            let lr = (log_probs.clone() - reference).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
            if matches!(kind, PolicyLossKind::AlolSeq { .. }) {
                let w = lr.detach().exp().clamp(1.0 - clip, 1.0 + clip);
                metrics.push(
                    "actor/is_weight_mean",
                    masked_mean(w.clone(), mask_out.clone()),
                );
                (w * adv * positive).neg() * log_probs
            } else {
                metrics.push("actor/alol_kl", masked_mean(lr.clone(), mask_out.clone()));
                ((adv.neg() * log_probs) + lr * clip) * positive
            }
        }
    };
    Ok(PolicyLoss {
        per_step,
        mask: mask_out,
        metrics,
    })
}

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

/// The full actor objective: aggregated policy loss (with mismatch weights) + β·agg(KL)
/// − c_H·agg(H). Returns the scalar loss `[1]` and metrics.
pub fn actor_loss(
    config: &ActorLossConfig,
    input: &ActorInput,
    norm: AggNorm,
) -> Result<(Tensor<1>, Metrics)> {
    config.agg.validate()?;
    let pg = policy_loss(&config.policy, &input.policy)?;
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
    metrics.push("actor/pg_loss", pg_loss.clone());
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
        metrics.push("actor/kl_loss", kl_loss.clone());
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
    metrics.push("actor/loss", loss.clone());
    Ok((loss, metrics))
}
