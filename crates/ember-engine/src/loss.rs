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
    use crate::pg;
    kind.validate()?;
    input.check()?;
    let c = pg::LossCtx::new(input);
    let mut m = Metrics::new();
    // approx_kl = mean(log π_old − log π) (verl `ppo_kl`).
    m.push(
        "actor/approx_kl",
        masked_mean(c.neg_lr.clone().neg().detach(), c.mask.clone()),
    );
    let (per_step, mask) = match *kind {
        PolicyLossKind::Vanilla => (pg::vanilla(&c), None),
        PolicyLossKind::Ppo {
            clip_low,
            clip_high,
            dual_clip,
        } => (pg::ppo(&c, (clip_low, clip_high), dual_clip, &mut m), None),
        PolicyLossKind::Gspo {
            clip_low,
            clip_high,
        } => (pg::gspo(&c, (clip_low, clip_high), &mut m), None),
        PolicyLossKind::Cispo {
            clip_low,
            clip_high,
        } => (pg::cispo(&c, (clip_low, clip_high), &mut m), None),
        PolicyLossKind::Dispo {
            pos_down,
            pos_up,
            neg_down,
            neg_up,
        } => {
            let band = [pos_down, pos_up, neg_down, neg_up];
            (pg::dispo(&c, band, &mut m), None)
        }
        PolicyLossKind::Topr { level } => (pg::topr(&c, level, &mut m), None),
        PolicyLossKind::Rec { .. } => (pg::rec(&c, kind, &mut m), None),
        PolicyLossKind::Opmd { tau, k2_coef } => (pg::opmd(&c, tau, k2_coef), None),
        PolicyLossKind::Alol { clip } => pg::alol(&c, clip, &mut m)?,
        PolicyLossKind::AlolSeq { clip } => pg::alol_seq(&c, clip, &mut m)?,
        PolicyLossKind::AlolKl { beta } => pg::alol_kl(&c, beta, &mut m)?,
    };
    Ok(PolicyLoss {
        per_step,
        mask: mask.unwrap_or(c.mask),
        metrics: m,
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
