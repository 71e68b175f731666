//! `[offline]`: training on a fixed dataset of scored responses instead of fresh rollouts (an
//! LLM recipe with this table is run by the offline job): the data file, the objective, and the
//! batch. The policy, warm-up, task (held-out evaluation), `[train]` (steps, learning rate,
//! optimizer, evaluation and checkpoints) are the recipe's as for online RL.

use anyhow::{Result, bail};
use ember_engine::*;
use ember_tasks::expand_path;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

fn beta() -> f32 {
    0.1
}
fn one() -> f32 {
    1.0
}
fn two() -> f32 {
    2.0
}
fn alol_clip() -> f32 {
    0.9
}
fn kl_beta() -> f32 {
    0.2
}
fn batch() -> usize {
    16
}

/// The offline objective. Pairwise objectives train on (chosen, rejected) pairs (a dataset's
/// explicit pairs, or each prompt's best- and worst-scored responses when their rewards differ);
/// group objectives train on every scored response of a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Objective {
    /// DPO ([`PreferenceLoss::Dpo`]).
    Dpo {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
    },
    /// IPO ([`PreferenceLoss::Ipo`]).
    Ipo {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
    },
    /// SimPO ([`PreferenceLoss::Simpo`]), reference-free.
    Simpo {
        /// β.
        #[serde(default = "two")]
        beta: f32,
        /// γ.
        #[serde(default = "one")]
        gamma: f32,
    },
    /// RPO with the squared distance to the explicit reward gap ([`PreferenceLoss::RpoSq`]).
    RpoSq {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
        /// η.
        #[serde(default = "one")]
        eta: f32,
    },
    /// RPO with the backward Bernoulli KL ([`PreferenceLoss::RpoBwdKl`]).
    RpoBwdKl {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
        /// η.
        #[serde(default = "one")]
        eta: f32,
    },
    /// RPO with the forward Bernoulli KL ([`PreferenceLoss::RpoFwdKl`]).
    RpoFwdKl {
        /// β.
        #[serde(default = "beta")]
        beta: f32,
        /// η.
        #[serde(default = "one")]
        eta: f32,
    },
    /// A-LoL (Baheti et al. 2023, eq. 4; LoL-RL `a_lol`): every response with a positive
    /// advantage A = R − V_ref(x), weighted by the clipped sequence ratio π/π_ref; V_ref(x) is
    /// the mean reward of the prompt's responses in the dataset (the Monte-Carlo value of the
    /// reference when the data are its own samples, as `ember rollouts` writes them; LoL-RL
    /// trains a value head instead). Groups are drawn in proportion to their positive advantage
    /// (LoL-RL `good_priority`).
    ALol {
        /// ε of the ratio clip (LoL-RL's default 0.9).
        #[serde(default = "alol_clip")]
        clip: f32,
    },
    /// A-LoL seq (LoL-RL `a_lol_seq`): A-LoL with per-token clipped ratios.
    ALolSeq {
        /// ε of the ratio clip.
        #[serde(default = "alol_clip")]
        clip: f32,
    },
    /// A-LoL KL (LoL-RL `a_lol_kl`): A-LoL with a KL penalty to the reference instead of the
    /// ratio.
    ALolKl {
        /// β of the penalty (LoL-RL's default 0.2).
        #[serde(default = "kl_beta")]
        beta: f32,
    },
    /// REINFORCE with the leave-one-out baseline on each prompt's stored responses (RLOO,
    /// Ahmadian et al. 2024, eq. 5; RPO's REINFORCE-LOO): −Σ_i (R_i − mean_{j≠i} R_j) log π(y_i)
    /// per group, no importance weight (the update of one on-policy step).
    ReinforceLoo,
}

impl Objective {
    /// The pairwise loss, for the pairwise objectives.
    pub fn pairwise(&self) -> Option<PreferenceLoss> {
        Some(match *self {
            Self::Dpo { beta } => PreferenceLoss::Dpo { beta },
            Self::Ipo { beta } => PreferenceLoss::Ipo { beta },
            Self::Simpo { beta, gamma } => PreferenceLoss::Simpo { beta, gamma },
            Self::RpoSq { beta, eta } => PreferenceLoss::RpoSq { beta, eta },
            Self::RpoBwdKl { beta, eta } => PreferenceLoss::RpoBwdKl { beta, eta },
            Self::RpoFwdKl { beta, eta } => PreferenceLoss::RpoFwdKl { beta, eta },
            Self::ALol { .. } | Self::ALolSeq { .. } | Self::ALolKl { .. } | Self::ReinforceLoo => {
                return None;
            }
        })
    }

    /// A group objective's estimator and actor loss (sequence sums averaged over responses).
    pub fn group(&self) -> Option<(AdvantageConfig, ActorLossConfig)> {
        let (kind, policy) = match *self {
            Self::ALol { clip } => (AdvantageKind::DrGrpo, PolicyLossKind::Alol { clip }),
            Self::ALolSeq { clip } => (AdvantageKind::DrGrpo, PolicyLossKind::AlolSeq { clip }),
            Self::ALolKl { beta } => (AdvantageKind::DrGrpo, PolicyLossKind::AlolKl { beta }),
            Self::ReinforceLoo => (AdvantageKind::Rloo, PolicyLossKind::Vanilla),
            _ => return None,
        };
        Some((
            AdvantageConfig::new(kind),
            ActorLossConfig {
                policy,
                agg: LossAgg::SeqMeanTokenSum,
                ..ActorLossConfig::default()
            },
        ))
    }

    /// The name logged in summaries.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Dpo { .. } => "dpo",
            Self::Ipo { .. } => "ipo",
            Self::Simpo { .. } => "simpo",
            Self::RpoSq { .. } => "rpo_sq",
            Self::RpoBwdKl { .. } => "rpo_bwd_kl",
            Self::RpoFwdKl { .. } => "rpo_fwd_kl",
            Self::ALol { .. } => "a_lol",
            Self::ALolSeq { .. } => "a_lol_seq",
            Self::ALolKl { .. } => "a_lol_kl",
            Self::ReinforceLoo => "reinforce_loo",
        }
    }
}

/// The `[offline]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineSpec {
    /// The dataset (JSONL; `~` and `$VAR` expand): one prompt per line with `"responses":
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
        if let Some((_, loss)) = self.objective.group() {
            loss.policy.validate()?;
        }
        Ok(())
    }
}
