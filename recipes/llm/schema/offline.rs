//! `[offline]`: training on a fixed dataset of scored responses instead of fresh rollouts (an
//! LLM recipe with this table is run by the offline job): the data file, the objective, and the
//! batch. The policy, warm-up, task (held-out evaluation), `[train]` (steps, learning rate,
//! optimizer, evaluation and checkpoints) are the recipe's as for online RL.

use anyhow::{Result, bail};
use ember_engine::*;
use ember_tasks::expand_path;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

fn alol_clip() -> f32 {
    0.9
}
fn kl_beta() -> f32 {
    0.2
}
fn batch() -> usize {
    16
}
fn f02() -> f32 {
    0.2
}
fn one() -> f32 {
    1.0
}
fn rec_low_prime() -> f32 {
    0.6
}
fn rec_high_prime() -> f32 {
    2.0
}
fn asymre_shift() -> f32 {
    -0.1
}
fn topr_baseline() -> BatchBaseline {
    BatchBaseline::Mean
}

/// The offline objective. Pairwise objectives (the engine's [`PreferenceLoss`]: DPO, IPO,
/// SimPO, RPO's three distances, with its defaults) train on (chosen, rejected) pairs (a
/// dataset's explicit pairs, or each prompt's best- and worst-scored responses when their
/// rewards differ); group objectives train on every scored response of a prompt. A recipe names
/// either by its `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Objective {
    /// A pairwise objective.
    Pairwise(PreferenceLoss),
    /// A group objective.
    Group(GroupObjective),
}

/// The objectives that train on every scored response of a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GroupObjective {
    /// A-LoL (Baheti et al. 2023, eq. 4; LoL-RL `a_lol`): every response with a positive
    /// advantage A = R − V_ref(x), weighted by the clipped sequence ratio π/π_ref; V_ref(x) is
    /// the mean reward of the prompt's responses in the dataset (the Monte-Carlo value of the
    /// reference when the data are its own samples, as `ember rollouts` writes them; LoL-RL
    /// trains a value head instead). Groups are drawn in proportion to their positive advantage
    /// (LoL-RL `good_priority`).
    #[serde(rename = "a_lol")]
    ALol {
        /// ε of the ratio clip (LoL-RL's default 0.9).
        #[serde(default = "alol_clip")]
        clip: f32,
        /// Where V_ref(x) comes from.
        #[serde(default, skip_serializing_if = "AlolValue::is_default")]
        value: AlolValue,
    },
    /// A-LoL seq (LoL-RL `a_lol_seq`): A-LoL with per-token clipped ratios.
    #[serde(rename = "a_lol_seq")]
    ALolSeq {
        /// ε of the ratio clip.
        #[serde(default = "alol_clip")]
        clip: f32,
        /// Where V_ref(x) comes from.
        #[serde(default, skip_serializing_if = "AlolValue::is_default")]
        value: AlolValue,
    },
    /// A-LoL KL (LoL-RL `a_lol_kl`): A-LoL with a KL penalty to the reference instead of the
    /// ratio.
    #[serde(rename = "a_lol_kl")]
    ALolKl {
        /// β of the penalty (LoL-RL's default 0.2).
        #[serde(default = "kl_beta")]
        beta: f32,
        /// Where V_ref(x) comes from.
        #[serde(default, skip_serializing_if = "AlolValue::is_default")]
        value: AlolValue,
    },
    /// REINFORCE with the leave-one-out baseline on each prompt's stored responses (RLOO,
    /// Ahmadian et al. 2024, eq. 5; RPO's REINFORCE-LOO): −Σ_i (R_i − mean_{j≠i} R_j) log π(y_i)
    /// per group, no importance weight (the update of one on-policy step).
    ReinforceLoo,
    /// Supervised fine-tuning (TRL's `SFTTrainer` loss): every response is a demonstration,
    /// −(1/N) Σ_{i,t} log π(y_{i,t} | x_i, y_{i,<t}) over the N response tokens of the step
    /// (teacher forcing; rewards ignored): REINFORCE with A = 1 and the token-mean.
    Sft,
    /// TOPR (Le Roux et al. 2025, eq. 9) against the data's behaviour policy μ (the frozen
    /// reference that sampled the file): L = −sg(α)·(R − c)·log π, α = 1 when R ≥ c and
    /// clip(π/μ, 0, 1) otherwise. c is the mean reward of the step's responses (as the online
    /// preset) or a constant (the paper's §4 knob for the share of positives); one response per
    /// prompt is enough.
    Topr {
        /// Sequence (the paper) or token ratio.
        #[serde(default)]
        level: RatioLevel,
        /// c: `"mean"` (the step's responses), `{ constant = c }` or `"none"` (c = 0).
        #[serde(default = "topr_baseline")]
        baseline: BatchBaseline,
    },
    /// REC (Yao et al. 2025, arXiv 2509.24203; Trinity-RFT `RECPolicyLossFn`) with the ratio
    /// π/μ to the data's behaviour policy: L = −Â·log π·M, A = R − mean over the `pool`, Â = A
    /// or A·sg(π/μ), M the clipping mask.
    Rec {
        /// One-side, two-side or ring.
        #[serde(default)]
        clip: RecClip,
        /// Weight by sg(π/μ) (the `-IS` variants).
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
        /// Which responses the baseline averages.
        #[serde(default)]
        pool: Pool,
    },
    /// OPMD (Trinity-RFT `OPMDAdvantageFn` + `OPMDPolicyLossFn`; Kimi k1.5 §2.3.2):
    /// L = [−(R − b)·log π + c·(log π − log μ)²] / (1 + τ), b the mean over the `pool`.
    Opmd {
        /// τ.
        #[serde(default = "one")]
        tau: f32,
        /// c, the squared log-ratio regulariser (0 disables it).
        #[serde(default)]
        k2_coef: f32,
        /// Which responses the baseline averages.
        #[serde(default)]
        pool: Pool,
    },
    /// AsymRE (Arnal et al. 2025, eq. 3): REINFORCE with A = R − (mean + δ) over the `pool`,
    /// no importance weight; δ < 0 favours the positives.
    AsymRe {
        /// δ.
        #[serde(default = "asymre_shift")]
        shift: f32,
        /// Which responses the baseline averages.
        #[serde(default)]
        pool: Pool,
    },
}

/// A-LoL's value estimate V_ref(x).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlolValue {
    /// The mean reward of the prompt's responses in the file (two valid rewards a prompt).
    #[default]
    GroupMean,
    /// A linear head on the reference's state before the response, fitted to the file's
    /// rewards (`crate::offline::value`; one response a prompt is enough).
    Head,
}

impl AlolValue {
    fn is_default(&self) -> bool {
        *self == Self::GroupMean
    }
}

/// Which responses a group objective's mean-reward baseline averages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// The prompt's stored responses (needs two valid rewards per prompt).
    #[default]
    Group,
    /// Every response of the step (a file with one response per prompt is enough).
    Batch,
}

/// The `kind`s of [`PreferenceLoss`] and of [`GroupObjective`].
const PAIRWISE: [&str; 6] = ["dpo", "ipo", "simpo", "rpo_sq", "rpo_bwd_kl", "rpo_fwd_kl"];
const GROUP: [&str; 9] = [
    "a_lol",
    "a_lol_seq",
    "a_lol_kl",
    "reinforce_loo",
    "sft",
    "topr",
    "rec",
    "opmd",
    "asym_re",
];

impl<'de> Deserialize<'de> for Objective {
    /// Dispatches on `kind`, so that each side's errors (unknown keys, bad values) are its own.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error;
        let table = toml::Table::deserialize(d)?;
        let kind = table
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_string();
        let kind = kind.as_str();
        let value = toml::Value::Table(table);
        if PAIRWISE.contains(&kind) {
            PreferenceLoss::deserialize(value)
                .map(Self::Pairwise)
                .map_err(D::Error::custom)
        } else if GROUP.contains(&kind) {
            GroupObjective::deserialize(value)
                .map(Self::Group)
                .map_err(D::Error::custom)
        } else {
            Err(D::Error::custom(format!(
                "offline.objective: kind = {:?} is not one of {}",
                kind,
                PAIRWISE
                    .iter()
                    .chain(&GROUP)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

impl Objective {
    /// The pairwise loss, for the pairwise objectives.
    pub fn pairwise(&self) -> Option<PreferenceLoss> {
        match *self {
            Self::Pairwise(p) => Some(p),
            Self::Group(_) => None,
        }
    }

    /// A group objective's estimator and actor loss (sequence sums averaged over responses).
    pub fn group(&self) -> Option<(AdvantageConfig, ActorLossConfig)> {
        let Self::Group(g) = *self else {
            return None;
        };
        let (kind, policy) = match g {
            GroupObjective::ALol { clip, value } => {
                (alol_adv(value), PolicyLossKind::Alol { clip })
            }
            GroupObjective::ALolSeq { clip, value } => {
                (alol_adv(value), PolicyLossKind::AlolSeq { clip })
            }
            GroupObjective::ALolKl { beta, value } => {
                (alol_adv(value), PolicyLossKind::AlolKl { beta })
            }
            GroupObjective::ReinforceLoo => (AdvantageKind::Rloo, PolicyLossKind::Vanilla),
            GroupObjective::Sft => (
                AdvantageKind::Reinforce {
                    baseline: BatchBaseline::None,
                },
                PolicyLossKind::Vanilla,
            ),
            GroupObjective::Topr { level, baseline } => (
                AdvantageKind::Reinforce { baseline },
                PolicyLossKind::Topr { level },
            ),
            GroupObjective::Rec {
                clip,
                importance_sampling,
                clip_low,
                clip_high,
                clip_low_prime,
                clip_high_prime,
                ..
            } => (
                AdvantageKind::AsymRe { shift: 0.0 },
                PolicyLossKind::Rec {
                    clip,
                    importance_sampling,
                    clip_low,
                    clip_high,
                    clip_low_prime,
                    clip_high_prime,
                },
            ),
            GroupObjective::Opmd { tau, k2_coef, .. } => (
                AdvantageKind::Opmd {
                    baseline: OpmdBaseline::Mean,
                    tau,
                },
                PolicyLossKind::Opmd { tau, k2_coef },
            ),
            GroupObjective::AsymRe { shift, .. } => {
                (AdvantageKind::AsymRe { shift }, PolicyLossKind::Vanilla)
            }
        };
        let agg = match g {
            GroupObjective::Sft => LossAgg::TokenMean,
            _ => LossAgg::SeqMeanTokenSum,
        };
        Some((
            AdvantageConfig::new(kind),
            ActorLossConfig {
                policy,
                agg,
                ..ActorLossConfig::default()
            },
        ))
    }

    /// A-LoL's value estimate, for the A-LoL objectives.
    pub fn alol_value(&self) -> Option<AlolValue> {
        match *self {
            Self::Group(
                GroupObjective::ALol { value, .. }
                | GroupObjective::ALolSeq { value, .. }
                | GroupObjective::ALolKl { value, .. },
            ) => Some(value),
            _ => None,
        }
    }

    /// Which responses a group objective's baseline averages: the prompt's (A-LoL,
    /// REINFORCE-LOO and the others by default) or the step's (TOPR, whose baseline is the
    /// batch's or a constant, and any objective with `pool = "batch"`).
    pub fn pool(&self) -> Pool {
        match *self {
            Self::Group(GroupObjective::Topr { .. } | GroupObjective::Sft) => Pool::Batch,
            // A fitted head's V(x) is per prompt: no group needed.
            o if o.alol_value() == Some(AlolValue::Head) => Pool::Batch,
            Self::Group(
                GroupObjective::Rec { pool, .. }
                | GroupObjective::Opmd { pool, .. }
                | GroupObjective::AsymRe { pool, .. },
            ) => pool,
            _ => Pool::Group,
        }
    }

    /// Supervised fine-tuning: every response a demonstration, rewards ignored.
    pub fn is_sft(&self) -> bool {
        matches!(self, Self::Group(GroupObjective::Sft))
    }

    /// A-LoL's three variants (groups drawn by their positive advantage).
    pub fn is_alol(&self) -> bool {
        matches!(
            self,
            Self::Group(
                GroupObjective::ALol { .. }
                    | GroupObjective::ALolSeq { .. }
                    | GroupObjective::ALolKl { .. }
            )
        )
    }

    /// The name logged in summaries (the recipe's `kind`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pairwise(PreferenceLoss::Dpo { .. }) => "dpo",
            Self::Pairwise(PreferenceLoss::Ipo { .. }) => "ipo",
            Self::Pairwise(PreferenceLoss::Simpo { .. }) => "simpo",
            Self::Pairwise(PreferenceLoss::RpoSq { .. }) => "rpo_sq",
            Self::Pairwise(PreferenceLoss::RpoBwdKl { .. }) => "rpo_bwd_kl",
            Self::Pairwise(PreferenceLoss::RpoFwdKl { .. }) => "rpo_fwd_kl",
            Self::Group(GroupObjective::ALol { .. }) => "a_lol",
            Self::Group(GroupObjective::ALolSeq { .. }) => "a_lol_seq",
            Self::Group(GroupObjective::ALolKl { .. }) => "a_lol_kl",
            Self::Group(GroupObjective::ReinforceLoo) => "reinforce_loo",
            Self::Group(GroupObjective::Sft) => "sft",
            Self::Group(GroupObjective::Topr { .. }) => "topr",
            Self::Group(GroupObjective::Rec { .. }) => "rec",
            Self::Group(GroupObjective::Opmd { .. }) => "opmd",
            Self::Group(GroupObjective::AsymRe { .. }) => "asym_re",
        }
    }
}

/// A-LoL's estimator: A = R − the prompt's mean reward, or A = R − V(x) with V(x) given per row
/// as a baseline reward (the estimator ReMax's greedy reward goes through).
fn alol_adv(value: AlolValue) -> AdvantageKind {
    match value {
        AlolValue::GroupMean => AdvantageKind::DrGrpo,
        AlolValue::Head => AdvantageKind::Remax,
    }
}

/// The `[offline]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineSpec {
    /// The dataset (JSONL, or Parquet: a `.parquet` file or a Hub dataset directory whose rows
    /// have the same keys; `~` and `$VAR` expand): one prompt per line with `"responses":
    /// [{"response", "reward"}, ...]`, or `"response"` + `"reward"` (lines of one prompt are
    /// grouped), or `"chosen"` + `"rejected"` (optionally `"chosen_reward"`,
    /// `"rejected_reward"`).
    pub data: String,
    /// The objective.
    pub objective: Objective,
    /// Pairs (pairwise objectives) or prompts (group objectives) per optimizer step.
    #[serde(default = "batch")]
    pub batch: usize,
    /// Length-average the implicit rewards of the pairwise objectives (SimPO always does).
    #[serde(default)]
    pub average_log_probs: bool,
    /// Use only each prompt's first `responses` responses (RPO's responses-per-prompt
    /// ablation; default all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responses: Option<usize>,
    /// Pairwise objectives: `"best_worst"` (each prompt's best and worst response, the default)
    /// or `"all"` (every pair of its responses with different rewards, drawn uniformly over
    /// pairs, so a prompt with more pairs is drawn more often, as a dataset of pairs would be).
    #[serde(default, skip_serializing_if = "Pairs::is_default")]
    pub pairs: Pairs,
}

/// Which pairs a prompt's scored responses give the pairwise objectives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pairs {
    /// The best- and the worst-rewarded response.
    #[default]
    BestWorst,
    /// Every pair with different rewards.
    All,
}

impl Pairs {
    fn is_default(&self) -> bool {
        *self == Self::BestWorst
    }
}

impl OfflineSpec {
    /// The data file's path.
    pub fn path(&self) -> Result<PathBuf> {
        Ok(expand_path(&self.data)?)
    }

    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 || self.batch > 100_000 {
            bail!("offline.batch = {} must be in 1..=100000", self.batch);
        }
        if let Some(k) = self.responses.filter(|k| *k < 2) {
            bail!(
                "offline.responses = {k} must be at least 2 (a pair, or a leave-one-out baseline)"
            );
        }
        if self.pairs == Pairs::All && self.objective.pairwise().is_none() {
            bail!(
                "offline.pairs = \"all\" applies to the pairwise objectives; {:?} trains on every \
                 response of a prompt",
                self.objective.name()
            );
        }
        if let Some(p) = self.objective.pairwise() {
            p.validate()?;
        }
        if let Some((adv, loss)) = self.objective.group() {
            adv.validate()?;
            loss.policy.validate()?;
        }
        Ok(())
    }
}
