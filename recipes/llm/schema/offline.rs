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
    },
    /// A-LoL seq (LoL-RL `a_lol_seq`): A-LoL with per-token clipped ratios.
    #[serde(rename = "a_lol_seq")]
    ALolSeq {
        /// ε of the ratio clip.
        #[serde(default = "alol_clip")]
        clip: f32,
    },
    /// A-LoL KL (LoL-RL `a_lol_kl`): A-LoL with a KL penalty to the reference instead of the
    /// ratio.
    #[serde(rename = "a_lol_kl")]
    ALolKl {
        /// β of the penalty (LoL-RL's default 0.2).
        #[serde(default = "kl_beta")]
        beta: f32,
    },
    /// REINFORCE with the leave-one-out baseline on each prompt's stored responses (RLOO,
    /// Ahmadian et al. 2024, eq. 5; RPO's REINFORCE-LOO): −Σ_i (R_i − mean_{j≠i} R_j) log π(y_i)
    /// per group, no importance weight (the update of one on-policy step).
    ReinforceLoo,
    /// Supervised fine-tuning (TRL's `SFTTrainer` loss): every response is a demonstration,
    /// −(1/N) Σ_{i,t} log π(y_{i,t} | x_i, y_{i,<t}) over the N response tokens of the step
    /// (teacher forcing; rewards ignored): REINFORCE with A = 1 and the token-mean.
    Sft,
}

/// The `kind`s of [`PreferenceLoss`] and of [`GroupObjective`].
const PAIRWISE: [&str; 6] = ["dpo", "ipo", "simpo", "rpo_sq", "rpo_bwd_kl", "rpo_fwd_kl"];
const GROUP: [&str; 5] = ["a_lol", "a_lol_seq", "a_lol_kl", "reinforce_loo", "sft"];

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
            GroupObjective::ALol { clip } => (AdvantageKind::DrGrpo, PolicyLossKind::Alol { clip }),
            GroupObjective::ALolSeq { clip } => {
                (AdvantageKind::DrGrpo, PolicyLossKind::AlolSeq { clip })
            }
            GroupObjective::ALolKl { beta } => {
                (AdvantageKind::DrGrpo, PolicyLossKind::AlolKl { beta })
            }
            GroupObjective::ReinforceLoo => (AdvantageKind::Rloo, PolicyLossKind::Vanilla),
            GroupObjective::Sft => (
                AdvantageKind::Reinforce {
                    baseline: ember_engine::BatchBaseline::None,
                },
                PolicyLossKind::Vanilla,
            ),
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
        }
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
        if let Some((_, loss)) = self.objective.group() {
            loss.policy.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SFT through the engine, by hand: two responses of 2 and 1 tokens, log π −0.5, −2.0 and
    /// −1.0, dataset rewards replaced by 1: A = 1 on every token and the loss is the token-mean
    /// NLL (0.5 + 2.0 + 1.0) / 3 = 7/6, whatever the rewards were.
    #[test]
    fn sft_is_the_token_mean_nll() {
        use burn::tensor::{Device, Tensor, TensorData};
        let dev = Device::default();
        let t = |v: [f32; 4]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [2, 2]), &dev);
        let sft = parse("[objective]\nkind = \"sft\"").unwrap();
        assert!(sft.is_sft());
        let (adv_cfg, loss) = sft.group().unwrap();
        let mask = t([1.0, 1.0, 1.0, 0.0]);
        let rewards = Tensor::<1>::from_floats([1.0, 1.0], &dev);
        let batch = ember_engine::RolloutBatch::new(mask.clone(), rewards, &[0, 0]).unwrap();
        let adv = ember_engine::compute_advantages(&adv_cfg, &batch, 0).unwrap();
        let lp = t([-0.5, -2.0, -1.0, 0.0]);
        let input = ember_engine::ActorInput {
            policy: ember_engine::PolicyLossInput {
                log_probs: lp.clone(),
                old_log_probs: lp,
                advantages: adv.advantages,
                mask: adv.mask.clone(),
                ref_log_probs: None,
            },
            entropy: None,
            rollout_log_probs: None,
            kl: None,
        };
        let norm = ember_engine::AggNorm::of_mask(&adv.mask);
        let (l, _) = ember_engine::actor_loss(&loss, &input, norm).unwrap();
        let l: Vec<f32> = l.into_data().try_to_vec().unwrap();
        assert!((l[0] - 7.0 / 6.0).abs() < 1e-6, "{l:?}");
    }

    fn parse(text: &str) -> std::result::Result<Objective, toml::de::Error> {
        #[derive(Deserialize)]
        struct Table {
            objective: Objective,
        }
        toml::from_str::<Table>(text).map(|t| t.objective)
    }

    /// A pairwise objective is the engine's `PreferenceLoss` with its defaults; the group
    /// objectives keep theirs; each side names its own unknown keys, and an unknown kind lists
    /// both sides' kinds.
    #[test]
    fn objectives_parse_by_kind_with_the_engine_defaults() {
        let dpo = parse(r#"objective = { kind = "dpo" }"#).unwrap();
        assert_eq!(dpo, Objective::Pairwise(PreferenceLoss::Dpo { beta: 0.1 }));
        let simpo = parse(r#"objective = { kind = "simpo" }"#).unwrap();
        let want = PreferenceLoss::Simpo {
            beta: 2.0,
            gamma: 1.0,
        };
        assert_eq!(simpo, Objective::Pairwise(want));
        let alol = parse(r#"objective = { kind = "a_lol" }"#).unwrap();
        assert_eq!(alol, Objective::Group(GroupObjective::ALol { clip: 0.9 }));
        assert!(alol.is_alol() && alol.pairwise().is_none() && alol.group().is_some());
        let loo = parse(r#"objective = { kind = "reinforce_loo" }"#).unwrap();
        assert_eq!(loo, Objective::Group(GroupObjective::ReinforceLoo));
        let e = parse(r#"objective = { kind = "dpo", clip = 1.0 }"#).unwrap_err();
        assert!(e.to_string().contains("clip"), "{e}");
        let e = parse(r#"objective = { kind = "ppo" }"#).unwrap_err();
        assert!(
            e.to_string().contains("a_lol") && e.to_string().contains("dpo"),
            "{e}"
        );
        // Written back as the recipe wrote it (the resolved recipe is compared on resume).
        let o = Objective::Pairwise(PreferenceLoss::RpoSq {
            beta: 0.5,
            eta: 2.0,
        });
        let text = toml::to_string(&o).unwrap();
        assert_eq!(text, "kind = \"rpo_sq\"\nbeta = 0.5\neta = 2.0\n");
        assert_eq!(
            parse(&format!(
                "objective = {{ {} }}",
                text.trim().replace('\n', ", ")
            ))
            .unwrap(),
            o
        );
    }
}
