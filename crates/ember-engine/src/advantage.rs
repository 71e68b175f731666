//! Advantage estimators. Every estimator reads the same [`RolloutBatch`] and returns
//! [`Advantages`]; the caller never special-cases one.
//!
//! Conventions shared by all estimators (tested in `tests/engine_golden.rs`):
//! - a sample whose reward (or baseline reward) is not finite is excluded from every baseline
//!   and statistic, gets advantage 0, is removed from the returned mask, and is counted in
//!   `rollout/invalid_rewards`;
//! - group baselines use only the valid samples of the group; a group with a single valid sample
//!   has no baseline to compare against and gets advantage 0 (RLOO, GRPO, REINFORCE++-baseline,
//!   OPO, Reinforce-Rej, OPMD, AsymRE, BNPO);
//! - zero-variance groups get advantage exactly 0 under the std-normalised estimators.

use crate::batch::RolloutBatch;
use crate::error::{EngineError, Result, check_config};
use crate::metrics::Metrics;
use crate::ops::{last_step_indicator, masked_mean, masked_var, reverse_affine_scan};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Baseline of plain REINFORCE.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BatchBaseline {
    /// A = R (Williams 1992).
    #[default]
    None,
    /// A = R − mean over the valid samples of the batch.
    Mean,
    /// A = R − c, a constant (`baseline = { constant = c }`): TOPR's baseline parameter, which
    /// off-policy sets the effective share of positive examples (Le Roux et al. 2025, §4).
    Constant(f32),
}

/// Standard deviation used by GRPO's normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StdKind {
    /// Bessel-corrected, `n − 1` (torch.std default, used by verl and TRL).
    #[default]
    Unbiased,
    /// Population, `n`.
    Population,
}

/// The uniform groups (every reward equal) Reinforce-Rej rejects (Xiong et al. 2025, §3 and the
/// ablation of §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RejectGroups {
    /// All right and all wrong (Reinforce-Rej).
    #[default]
    Both,
    /// Only the all-wrong groups (the ablation the paper finds explains GRPO's gain).
    AllWrong,
    /// Only the all-right groups.
    AllRight,
}

/// Baseline of OPMD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OpmdBaseline {
    /// b = group mean of R.
    #[default]
    Mean,
    /// b = τ · log mean_j exp(R_j / τ) (Kimi k1.5 §2.3; Trinity-RFT `opmd` advantage).
    LogAvgExp,
}

fn one() -> f32 {
    1.0
}
fn grpo_eps() -> f32 {
    1e-6
}
fn yes() -> bool {
    true
}
fn half() -> f32 {
    0.5
}
fn asymre_shift() -> f32 {
    -0.1
}

/// Which estimator. The `kind` tag is what a recipe writes (`kind = "rloo"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdvantageKind {
    /// REINFORCE (Williams 1992): A = R, R − batch mean, or R − a constant.
    Reinforce {
        /// The baseline.
        #[serde(default)]
        baseline: BatchBaseline,
    },
    /// RLOO (Ahmadian et al. 2024, eq. 5): A_i = R_i − mean_{j≠i} R_j within the group.
    Rloo,
    /// GRPO (Shao et al. 2024, §4.1.2): A_i = (R_i − mean_g) / (std_g + ε); with
    /// [`RolloutBatch::with_group_stats`], mean_g and std_g are the given pool statistics.
    Grpo {
        /// Which std.
        #[serde(default)]
        std: StdKind,
        /// ε added to the std.
        #[serde(default = "grpo_eps")]
        epsilon: f32,
        /// Divide by the std (false is Dr.GRPO).
        #[serde(default = "yes")]
        scale_by_std: bool,
    },
    /// Dr.GRPO (Liu et al. 2025, eq. 3): A_i = R_i − mean_g, no std.
    DrGrpo,
    /// REINFORCE++ (Hu 2025, §3; verl `compute_reinforce_plus_plus_outcome_advantage`):
    /// r_t = R·[t last] − β·k1_t, G_t = Σ_{s≥t} γ^{s−t} r_s, A = whiten(G) over valid tokens.
    /// Masked steps inside a row (observation tokens of a multi-turn episode) are skipped: the
    /// return is carried across them and γ counts valid steps only, as verl's GAE does. (verl's
    /// REINFORCE++ loop resets the return at every masked step, written for trailing padding; it
    /// would cut the credit of earlier turns at the first observation, so Ember does not.)
    ReinforcePlusPlus {
        /// γ of the reward-to-go.
        #[serde(default = "one")]
        gamma: f32,
        /// β of the k1 KL folded into the reward (needs `old_log_probs` and `ref_log_probs`).
        #[serde(default)]
        kl_coef: f32,
        /// Whiten the returns over valid tokens (REINFORCE++ does; on-policy distillation,
        /// `algorithm = "opd"`, takes each token's return as it is).
        #[serde(default = "yes")]
        whiten: bool,
    },
    /// REINFORCE++-baseline (Hu 2025, §3.2; verl
    /// `compute_reinforce_plus_plus_baseline_outcome_advantage`): A = whiten(R − mean_g).
    ReinforcePlusPlusBaseline,
    /// ReMax (Li et al. 2024, eq. 6; verl `compute_remax_outcome_advantage`): A_t = Σ_{s≥t} r_s
    /// − R(greedy), each step's reward-to-go minus the greedy reward in `baseline_rewards`.
    Remax,
    /// OPO (Hao et al. 2025, eq. 6): A_i = R_i − Σ_j l_j R_j / Σ_j l_j, l = response length.
    Opo,
    /// BNPO (Xiao et al. 2025): A = (R − p_g) / f(p_g; α, β), f the Beta density with α, β
    /// moment-matched to the batch's per-group success rates; rewards in [0, 1].
    Bnpo {
        /// BNPO's advantage decomposition (reference `bnpo_ray_trainer.py`,
        /// `use_advantage_decomposition`): each reward term ([`RolloutBatch::reward_parts`])
        /// gets its own BNPO advantage, with its own p_g, α and β, and A is their mean.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        decompose: bool,
    },
    /// GAE (Schulman et al. 2016, eq. 16; verl `compute_gae_advantage_return`):
    /// δ_t = r_t + γ V_{t+1} − V_t, A_t = Σ_l (γλ)^l δ_{t+l}, returns = A + V. As in verl, masked
    /// steps inside a row are skipped: V_{t+1} is the value of the next valid step, and A is
    /// carried across the gap (rewards on masked steps are ignored).
    Gae {
        /// Discount γ.
        #[serde(default = "one")]
        gamma: f32,
        /// λ.
        #[serde(default = "one")]
        lambda: f32,
        /// Whiten advantages over valid tokens (verl does).
        #[serde(default = "yes")]
        whiten: bool,
    },
    /// BASIS (Gong et al. 2026, arXiv 2605.27293; see [`crate::basis`] for what was followed
    /// and chosen): A_i = R_i − V̂_i, V̂_i a leave-one-out kernel average of the other rows'
    /// rewards over prompt representations (`features`), shrunk to the leave-one-out batch
    /// mean by `prior` pseudo-rows; whitened over valid tokens when `whiten`.
    Basis {
        /// b: the kernel width relative to the batch's mean squared feature distance.
        #[serde(default = "half")]
        bandwidth: f32,
        /// p: pseudo-rows at the leave-one-out batch mean.
        #[serde(default = "one")]
        prior: f32,
        /// Whiten the advantages over valid tokens (REINFORCE++ does).
        #[serde(default = "yes")]
        whiten: bool,
    },
    /// RAFT (Dong et al. 2023; Xiong et al. 2025 "RAFT++"): positives only, A = 1[R > threshold];
    /// the negatives leave the mask, so a token mean averages over the positives' tokens (SFT
    /// on the accepted samples).
    Raft {
        /// Rewards above this are positive.
        #[serde(default)]
        threshold: f32,
    },
    /// Reinforce-Rej (Xiong et al. 2025, §3): A = R − mean_g; groups whose rewards are all
    /// equal (all right or all wrong) are rejected: advantage 0, removed from the mask, counted.
    /// `reject` keeps one side: the paper's ablation (§4) drops only the all-wrong groups.
    ReinforceRej {
        /// Which uniform groups are rejected.
        #[serde(default)]
        reject: RejectGroups,
        /// A uniform group whose common reward is above this is all right, else all wrong.
        #[serde(default = "half")]
        threshold: f32,
    },
    /// OPMD (Trinity-RFT `OPMDAdvantageFn`): A = R − b, b the group mean or τ log-avg-exp.
    Opmd {
        /// The baseline.
        #[serde(default)]
        baseline: OpmdBaseline,
        /// Temperature τ of the log-avg-exp baseline.
        #[serde(default = "one")]
        tau: f32,
    },
    /// AsymRE (Arnal et al. 2025, eq. 3): A = R − (mean_g + δ), δ < 0 favours positives.
    AsymRe {
        /// The baseline shift δ.
        #[serde(default = "asymre_shift")]
        shift: f32,
    },
    /// TRLOO, turn-level REINFORCE leave-one-out (Dr. Kernel / KernelGYM; reference
    /// `compute_multi_turn_rloo_outcome_advantage`): for turn k of episode i, the turn-level
    /// return G_{i,k} = Σ_{k'≥k} γ^{k'−k} r_{i,k'} (r: the turn's rewards, the outcome in the
    /// last turn) minus the mean return at turn k of the other episodes of the same prompt that
    /// reached turn k: A_{i,k} = G_{i,k} − (Σ_{j≠i} G_{j,k})/(n_k − 1), or G_{i,k} when
    /// n_k = 1; every step of turn k gets A_{i,k}. Needs [`RolloutBatch::with_turns`].
    Trloo {
        /// γ over turns.
        #[serde(default = "one")]
        gamma: f32,
    },
}

impl Default for AdvantageKind {
    fn default() -> Self {
        Self::Grpo {
            std: StdKind::Unbiased,
            epsilon: grpo_eps(),
            scale_by_std: true,
        }
    }
}

/// An estimator plus the modifiers that apply on top of any estimator.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct AdvantageConfig {
    /// The estimator.
    #[serde(flatten)]
    pub kind: AdvantageKind,
    /// CAPO curriculum (Yang, Wu et al. 2025, arXiv 2512.02580): for optimizer steps `< capo_positive_steps` only
    /// positive advantages are kept (A ← max(A, 0)); afterwards all. 0 disables it.
    #[serde(default)]
    pub capo_positive_steps: usize,
    /// Lopti advantage reweighting (Yang et al. 2025, arXiv 2505.12929, `compute_reweight_advantage`): A_t ← (α·π_old(t) + 1 − α)·A_t.
    /// Needs `old_log_probs` (or `rollout_log_probs`).
    #[serde(default)]
    pub lopti_alpha: Option<f32>,
    /// Advantage clipping (DDPO, Black et al. 2023, and Flow-GRPO `adv_clip_max`):
    /// A ← clamp(A, −c, c), applied last.
    #[serde(default)]
    pub clip: Option<f32>,
    /// Sequence-level batch whitening (SeeUPO's `special_norm`, Hu et al. 2026, arXiv
    /// 2602.06554 §4.2; AgentEvolver `compute_grpo_outcome_advantage_local`): each valid row's
    /// advantage a_i ← (a_i − mean)/std over the batch's valid rows (std unbiased, skipped when
    /// below 1e-6), before `clip`. Only for estimators whose advantage is one value per row.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whiten_rows: bool,
}

impl AdvantageKind {
    /// Whether the estimator needs `RolloutBatch::baseline_rewards`: the reward of each
    /// prompt's greedy response (ReMax). A job asks this instead of naming estimators.
    pub fn needs_greedy_baseline(&self) -> bool {
        matches!(self, Self::Remax)
    }

    /// Whether the estimator's baseline needs no group of samples of the same prompt (one
    /// sample per prompt is enough).
    pub fn group_free(&self) -> bool {
        matches!(
            self,
            Self::Reinforce { .. }
                | Self::ReinforcePlusPlus { .. }
                | Self::Remax
                | Self::Gae { .. }
                | Self::Basis { .. }
        )
    }

    /// Whether the estimator reads prompt representations ([`RolloutBatch::with_features`]).
    pub fn needs_features(&self) -> bool {
        matches!(self, Self::Basis { .. })
    }

    /// Whether the advantage varies along a row (per-step returns) rather than being one value
    /// per sequence.
    pub fn per_step(&self) -> bool {
        matches!(
            self,
            Self::ReinforcePlusPlus { .. } | Self::Gae { .. } | Self::Trloo { .. }
        )
    }
}

impl AdvantageConfig {
    /// A config with only an estimator.
    pub fn new(kind: AdvantageKind) -> Self {
        Self {
            kind,
            ..Self::default()
        }
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        match self.kind {
            AdvantageKind::Grpo { epsilon, .. } => check_config(
                "advantage.epsilon",
                epsilon.into(),
                epsilon >= 0.0,
                "must be >= 0",
            )?,
            AdvantageKind::ReinforcePlusPlus { gamma, kl_coef, .. } => {
                check_config(
                    "advantage.gamma",
                    gamma.into(),
                    (0.0..=1.0).contains(&gamma),
                    "must be in [0, 1]",
                )?;
                check_config(
                    "advantage.kl_coef",
                    kl_coef.into(),
                    kl_coef >= 0.0,
                    "must be >= 0",
                )?;
            }
            AdvantageKind::Gae { gamma, lambda, .. } => {
                check_config(
                    "advantage.gamma",
                    gamma.into(),
                    (0.0..=1.0).contains(&gamma),
                    "must be in [0, 1]",
                )?;
                check_config(
                    "advantage.lambda",
                    lambda.into(),
                    (0.0..=1.0).contains(&lambda),
                    "must be in [0, 1]",
                )?;
            }
            AdvantageKind::Opmd { tau, .. } => {
                check_config("advantage.tau", tau.into(), tau > 0.0, "must be > 0")?
            }
            AdvantageKind::Basis {
                bandwidth, prior, ..
            } => {
                check_config(
                    "advantage.bandwidth",
                    bandwidth.into(),
                    bandwidth.is_finite() && bandwidth > 0.0,
                    "must be > 0",
                )?;
                check_config(
                    "advantage.prior",
                    prior.into(),
                    prior.is_finite() && prior >= 0.0,
                    "must be >= 0",
                )?;
            }
            AdvantageKind::Trloo { gamma } => check_config(
                "advantage.gamma",
                gamma.into(),
                (0.0..=1.0).contains(&gamma),
                "must be in [0, 1]",
            )?,
            _ => {}
        }
        if let Some(c) = self.clip {
            check_config("advantage.clip", c.into(), c > 0.0, "must be > 0")?;
        }
        if self.whiten_rows && self.kind.per_step() {
            return Err(EngineError::InvalidConfig {
                field: "advantage.whiten_rows",
                value: "true".into(),
                reason: "needs an estimator with one advantage per row (not reinforce_plus_plus, \
                         gae or trloo)",
            });
        }
        if let Some(alpha) = self.lopti_alpha {
            check_config(
                "advantage.lopti_alpha",
                alpha.into(),
                (0.0..=1.0).contains(&alpha),
                "must be in [0, 1]",
            )?;
        }
        Ok(())
    }
}

/// What an estimator returns.
#[derive(Debug, Clone)]
pub struct Advantages {
    /// `[batch, steps]` advantages, 0 outside `mask`.
    pub advantages: Tensor<2>,
    /// `[batch, steps]` returns (value targets for a critic; equal to the advantages for
    /// critic-free estimators, as in verl).
    pub returns: Tensor<2>,
    /// `[batch, steps]` the loss mask: the batch's mask without invalid or rejected samples.
    pub mask: Tensor<2>,
    /// `advantage/*` and `rollout/*` metrics.
    pub metrics: Metrics,
}

pub(crate) fn whiten_rows(adv: Tensor<2>, mask: &Tensor<2>, valid: &Tensor<1>) -> Tensor<2> {
    let [b, _] = mask.dims();
    let steps = mask.clone().sum_dim(1).reshape([b]);
    let a = (adv * mask.clone()).sum_dim(1).reshape([b]) / steps.clone().clamp_min(1.0);
    let w = valid.clone() * steps.greater_elem(0.0).float();
    let mean = masked_mean(a.clone(), w.clone());
    let std = masked_var(a.clone(), w.clone(), true).sqrt();
    let std = std.clone().mask_fill(std.lower_elem(1e-6), 1.0);
    let a = (a - mean) / std * w;
    a.reshape([b, 1]) * mask.clone()
}

/// GRPO's group normalisation over valid samples; zero-range groups give exactly 0.
pub(crate) fn grpo(
    batch: &RolloutBatch,
    rewards: &Tensor<1>,
    valid: &Tensor<1>,
    std: StdKind,
    epsilon: f32,
    scale_by_std: bool,
) -> Tensor<1> {
    let groups = &batch.groups;
    if let Some((mean, std)) = &batch.group_stats {
        // Reinforce-Ada `global_stat_est`: the pool's statistics, std clamped to ≥ ε, then
        // (R − mean)/(std + ε) (RLHFlow/Reinforce-Ada `compute_grpo_outcome_advantage`).
        let centred = rewards.clone() - mean.clone();
        let a = if scale_by_std {
            centred / std.clone().clamp_min(epsilon).add_scalar(epsilon)
        } else {
            centred
        };
        return a * valid.clone();
    }
    let mean = groups.group_mean(rewards.clone(), valid.clone());
    let centred = rewards.clone() - mean;
    let a = if scale_by_std {
        let var = groups.group_var(rewards.clone(), valid.clone(), std == StdKind::Unbiased);
        centred / var.sqrt().add_scalar(epsilon)
    } else {
        centred
    };
    let zero = groups.zero_range(rewards.clone(), valid.clone());
    a.mask_fill(zero, 0.0) * valid.clone()
}

/// BNPO (Xiao et al. 2025; reference `compute_bnpo_outcome_advantage` of the authors' code):
/// A_i = (R_i − p_g) / f(p_g; α, β) with p_g the group's mean reward (rewards in [0, 1]) and
/// f the Beta(α, β) density. α, β come from the batch: with μ, σ² the mean and unbiased
/// variance of the groups' p, ν = μ(1 − μ)/σ² − 1, α = max(1, 1 + νμ/3),
/// β = max(1, 1 + ν(1 − μ)/3); the weight 1/f is clamped to [0, 1e6]. With fewer than two
/// groups or σ² = 0, α = β = 1 (plain group-mean baseline).
pub(crate) fn bnpo(batch: &RolloutBatch, rewards: &Tensor<1>, valid: &Tensor<1>) -> Tensor<1> {
    let groups = &batch.groups;
    let count_g = groups.sum(valid.clone());
    let p_g = groups.sum(rewards.clone() * valid.clone()) / count_g.clone().clamp_min(1.0);
    let has = count_g.greater_elem(0.0).float();
    let mu = masked_mean(p_g.clone(), has.clone());
    let var = crate::ops::masked_var(p_g, has.clone(), true);
    let degenerate = has
        .sum()
        .lower_elem(2.0)
        .bool_or(var.clone().lower_elem(1e-12));
    let nu = (mu.clone() * mu.clone().neg().add_scalar(1.0)) / var.clamp_min(1e-12);
    let nu = nu.sub_scalar(1.0);
    let alpha = (nu.clone() * mu.clone())
        .div_scalar(3.0)
        .add_scalar(1.0)
        .clamp_min(1.0);
    let beta = (nu * mu.neg().add_scalar(1.0))
        .div_scalar(3.0)
        .add_scalar(1.0)
        .clamp_min(1.0);
    let alpha = alpha.mask_fill(degenerate.clone(), 1.0);
    let beta = beta.mask_fill(degenerate, 1.0);
    let p = groups
        .group_mean(rewards.clone(), valid.clone())
        .clamp(1e-6, 1.0 - 1e-6);
    let q = p.clone().neg().add_scalar(1.0);
    let log_f = p.clone().log() * alpha.clone().sub_scalar(1.0)
        + q.log() * beta.clone().sub_scalar(1.0)
        - log_beta(alpha, beta);
    let weight = log_f.neg().exp().clamp(0.0, 1e6);
    let adv = (rewards.clone() - p) * weight;
    let zero = groups.zero_range(rewards.clone(), valid.clone());
    adv.mask_fill(zero, 0.0) * valid.clone()
}

/// ln B(a, b) = lnΓ(a) + lnΓ(b) − lnΓ(a + b), elementwise.
fn log_beta(a: Tensor<1>, b: Tensor<1>) -> Tensor<1> {
    lgamma(a.clone()) + lgamma(b.clone()) - lgamma(a + b)
}

/// ln Γ(x) for x > 0 by the Lanczos approximation (g = 7, n = 9; Numerical Recipes §6.1),
/// written with tensor ops so it runs on any backend. Accurate to ~1e-7 relative in f64,
/// ~1e-6 in f32 for x in [1, 1e4].
pub fn lgamma(x: Tensor<1>) -> Tensor<1> {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    // Γ(x) = Γ(x + 1) / x keeps the series argument ≥ 1.
    let z = x.clone(); // series in z − 1 form: Γ(z) with z = x
    let zm1 = z.clone().sub_scalar(1.0);
    let mut series = zm1.clone().ones_like() * C[0] as f32;
    for (i, c) in C.iter().enumerate().skip(1) {
        series = series + (zm1.clone().add_scalar(i as f32)).recip() * (*c as f32);
    }
    let t = zm1.clone().add_scalar(G as f32 + 0.5);
    let half_ln_2pi = 0.918_938_5_f32;
    (zm1.add_scalar(0.5)) * t.clone().log() - t + series.log() + half_ln_2pi
}

/// Masked mean, std, max and min of a `[batch, steps]` tensor as `area/*` metrics.
pub(crate) fn push_stats(metrics: &mut Metrics, area: &str, x: Tensor<2>, mask: Tensor<2>) {
    let mean = masked_mean(x.clone(), mask.clone());
    let var = crate::ops::masked_var(x.clone(), mask.clone(), false);
    let invalid = mask.equal_elem(0.0);
    let max = x
        .clone()
        .mask_fill(invalid.clone(), f32::NEG_INFINITY)
        .max();
    let min = x.mask_fill(invalid, f32::INFINITY).min();
    metrics.push(format!("{area}/mean"), mean);
    metrics.push(format!("{area}/std"), var.sqrt());
    metrics.push(format!("{area}/max"), max);
    metrics.push(format!("{area}/min"), min);
}

/// TRLOO's per-step advantages and turn returns (see [`AdvantageKind::Trloo`]). `turns`: the
/// turn of each step (−1 outside the turns); `r`: per-step rewards (masked). One host read
/// (the number of turns); the rest stays on the device: a `[batch, steps, turns]` one-hot
/// sums rewards per turn and spreads the turn advantages back to the steps.
pub(crate) fn trloo(
    turns: &Tensor<2>,
    r: Tensor<2>,
    mask: &Tensor<2>,
    groups: &crate::ops::Groups,
    gamma: f32,
) -> (Tensor<2>, Tensor<2>) {
    let [b, t] = mask.dims();
    let device = mask.device();
    let max_turn = turns.clone().max().into_scalar::<f32>();
    let k = if max_turn.is_finite() && max_turn >= 0.0 {
        (max_turn as usize).saturating_add(1).min(t.max(1))
    } else {
        1
    };
    let ks = Tensor::<1, burn::tensor::Int>::arange(0..k as i64, &device)
        .float()
        .reshape([1, 1, k]);
    let hot = turns
        .clone()
        .reshape([b, t, 1])
        .equal(ks.expand([b, t, k]))
        .float();
    let on_turn = hot.clone() * mask.clone().reshape([b, t, 1]);
    // Per turn: its reward and whether the episode reached it.
    let turn_r = (on_turn.clone() * r.reshape([b, t, 1]))
        .sum_dim(1)
        .reshape([b, k]);
    let reached = on_turn
        .clone()
        .sum_dim(1)
        .reshape([b, k])
        .greater_elem(0.0)
        .float();
    let g = skip_masked_suffix_sum(turn_r, &reached, gamma) * reached.clone();
    // Leave-one-out over the episodes of the same prompt that reached each turn.
    let one_hot = groups.one_hot().clone();
    let per_group = |x: Tensor<2>| {
        one_hot
            .clone()
            .matmul(one_hot.clone().transpose().matmul(x))
    };
    let sum = per_group(g.clone());
    let n = per_group(reached.clone());
    let several = n.clone().greater_elem(1.0).float();
    let loo = (sum - g.clone()) / n.sub_scalar(1.0).clamp_min(1.0);
    let a_turn = (g.clone() - loo * several) * reached;
    let a = (on_turn * a_turn.reshape([b, 1, k]))
        .sum_dim(2)
        .reshape([b, t])
        * mask.clone();
    let returns = (hot * g.reshape([b, 1, k])).sum_dim(2).reshape([b, t]) * mask.clone();
    (a, returns)
}

/// Σ_{valid s ≥ t} γ^{(valid steps from t to s)} x_s: a discounted suffix sum over the valid steps
/// of each row, carried unchanged across masked ones (y_t = γ·y_next + x_t where m_t = 1,
/// y_t = y_{t+1} where m_t = 0).
pub(crate) fn skip_masked_suffix_sum(x: Tensor<2>, mask: &Tensor<2>, gamma: f32) -> Tensor<2> {
    let a = mask.clone() * (gamma - 1.0) + 1.0;
    reverse_affine_scan(a, x * mask.clone())
}

/// Outcome reward on the last valid step plus any per-step rewards.
pub(crate) fn token_level_rewards(batch: &RolloutBatch, rewards: &Tensor<1>) -> Tensor<2> {
    let [b, _] = batch.dims();
    let last = last_step_indicator(batch.mask.clone());
    let r = last * rewards.clone().reshape([b, 1]);
    match &batch.token_rewards {
        Some(t) => {
            let t = t.clone();
            let bad = t.clone().is_finite().bool_not();
            r + t.mask_fill(bad, 0.0)
        }
        None => r,
    }
}
