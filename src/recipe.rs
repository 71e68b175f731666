//! Recipes: one TOML file per run, with `--set key=value` overrides checked against the schema.

use crate::engine::*;
use crate::reward::ExternalSpec;
use crate::tasks::{Arithmetic, Countdown, JsonlData, TaskSet};
use anyhow::{Context, Result, bail};
use ember_llm::LoraSettings;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Algorithm presets: an advantage estimator, a policy loss, an aggregation and filters, as the
/// papers define them. `[advantage]` / `[loss]` tables in a recipe override the preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// GRPO (Shao et al. 2024): group-normalised advantages, PPO clip.
    Grpo,
    /// Dr.GRPO (Liu et al. 2025): no std, constant-normalised token sum.
    DrGrpo,
    /// RLOO (Ahmadian et al. 2024) with PPO clip.
    Rloo,
    /// REINFORCE++ (Hu 2025): k1 KL in the reward, batch whitening.
    #[serde(rename = "reinforce++")]
    ReinforcePp,
    /// REINFORCE++-baseline (Hu 2025): group mean then batch whitening.
    #[serde(rename = "reinforce++-baseline")]
    ReinforcePpBaseline,
    /// DAPO (Yu et al. 2025): clip-higher, token-mean, dynamic sampling, overlong shaping.
    Dapo,
    /// CISPO (MiniMax-M1 2025): clipped stop-gradient IS weight on log π.
    Cispo,
    /// GSPO (Zheng et al. 2025): sequence-level ratio.
    Gspo,
    /// TOPR (Le Roux et al. 2025): tapered IS for negatives.
    Topr,
    /// RAFT (Dong et al. 2023): SFT on positives.
    Raft,
    /// Reinforce-Rej (Xiong et al. 2025): reject all-right/all-wrong groups.
    ReinforceRej,
    /// OPO (Hao et al. 2025): length-weighted baseline.
    Opo,
    /// ReMax (Li et al. 2024): greedy-rollout baseline.
    Remax,
}

impl Algorithm {
    /// Every preset, in table order.
    pub const ALL: [Algorithm; 13] = [
        Self::Grpo,
        Self::Rloo,
        Self::ReinforcePp,
        Self::ReinforcePpBaseline,
        Self::DrGrpo,
        Self::Dapo,
        Self::Cispo,
        Self::Gspo,
        Self::Topr,
        Self::Raft,
        Self::ReinforceRej,
        Self::Opo,
        Self::Remax,
    ];

    /// The recipe name of the preset.
    pub fn name(&self) -> String {
        toml::Value::try_from(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// (estimator, actor loss, dynamic sampling) of the preset; `max_new_tokens` is Dr.GRPO's
    /// normalising constant.
    pub fn preset(&self, max_new_tokens: usize) -> (AdvantageConfig, ActorLossConfig, bool) {
        let grpo = AdvantageKind::Grpo {
            std: StdKind::Unbiased,
            epsilon: 1e-6,
            scale_by_std: true,
        };
        let ppo = PolicyLossKind::Ppo {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
        };
        let actor = |policy, agg| ActorLossConfig {
            policy,
            agg,
            ..ActorLossConfig::default()
        };
        let (kind, loss, dynamic) = match self {
            Self::Grpo => (grpo, actor(ppo, LossAgg::TokenMean), false),
            Self::DrGrpo => (
                AdvantageKind::DrGrpo,
                actor(
                    ppo,
                    LossAgg::SeqMeanTokenSumNorm {
                        constant: max_new_tokens as f32,
                    },
                ),
                false,
            ),
            Self::Rloo => (AdvantageKind::Rloo, actor(ppo, LossAgg::TokenMean), false),
            Self::ReinforcePp => (
                AdvantageKind::ReinforcePlusPlus {
                    gamma: 1.0,
                    kl_coef: 0.0,
                },
                actor(ppo, LossAgg::TokenMean),
                false,
            ),
            Self::ReinforcePpBaseline => (
                AdvantageKind::ReinforcePlusPlusBaseline,
                actor(ppo, LossAgg::TokenMean),
                false,
            ),
            Self::Dapo => (
                grpo,
                actor(
                    PolicyLossKind::Ppo {
                        clip_low: 0.2,
                        clip_high: 0.28,
                        dual_clip: None,
                    },
                    LossAgg::TokenMean,
                ),
                true,
            ),
            Self::Cispo => (
                grpo,
                actor(
                    PolicyLossKind::Cispo {
                        clip_low: 1.0,
                        clip_high: 0.28,
                    },
                    LossAgg::TokenMean,
                ),
                false,
            ),
            Self::Gspo => (
                grpo,
                actor(
                    PolicyLossKind::Gspo {
                        clip_low: 3e-4,
                        clip_high: 4e-4,
                    },
                    LossAgg::SeqMeanTokenMean,
                ),
                false,
            ),
            Self::Topr => (
                AdvantageKind::Reinforce {
                    baseline: BatchBaseline::Mean,
                },
                actor(
                    PolicyLossKind::Topr {
                        level: RatioLevel::Sequence,
                    },
                    LossAgg::TokenMean,
                ),
                false,
            ),
            Self::Raft => (
                AdvantageKind::Raft { threshold: 0.5 },
                actor(PolicyLossKind::Vanilla, LossAgg::TokenMean),
                false,
            ),
            Self::ReinforceRej => (
                AdvantageKind::ReinforceRej,
                actor(ppo, LossAgg::TokenMean),
                false,
            ),
            Self::Opo => (AdvantageKind::Opo, actor(ppo, LossAgg::TokenMean), false),
            Self::Remax => (AdvantageKind::Remax, actor(ppo, LossAgg::TokenMean), false),
        };
        (AdvantageConfig::new(kind), loss, dynamic)
    }
}

fn f(v: f64) -> f64 {
    v
}

/// The tiny Llama-architecture policy of the CPU recipe (trained from scratch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Hidden size.
    pub d_model: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// MLP size.
    pub d_ff: usize,
}

/// Which task family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// Generated multi-digit arithmetic (`digits`, `ops`).
    #[default]
    Arithmetic,
    /// Generated countdown (`count`, `max_number`, `max_target`).
    Countdown,
    /// A JSONL file (`path`): GSM8K `question`/`answer` or `prompt`/`answer`.
    Jsonl,
}

/// Which task, and its settings (only those of its kind may be set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Task family.
    #[serde(default)]
    pub kind: TaskKind,
    /// Arithmetic: maximum digits per operand (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digits: Option<u32>,
    /// Arithmetic: operators, any of `+-*` (default `+`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<String>,
    /// Countdown: numbers per problem (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// Countdown: largest number (default 9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_number: Option<i64>,
    /// Countdown: largest target (default 99).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_target: Option<i64>,
    /// JSONL: the data file (`~` and `$VAR` are expanded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Held-out problems evaluated.
    pub eval_size: usize,
}

/// Expands a leading `~/` and `$NAME` / `${NAME}` / `${NAME:-default}` environment variables
/// (an unset variable without a default is an error naming it).
pub fn expand_path(p: &str) -> Result<PathBuf> {
    let mut out = String::new();
    let mut rest = p;
    if let Some(r) = rest.strip_prefix("~/") {
        out += &std::env::var("HOME").context("`~` in a path needs HOME")?;
        out.push('/');
        rest = r;
    }
    while let Some(i) = rest.find('$') {
        out += &rest[..i];
        let tail = &rest[i + 1..];
        let (name, after) = if let Some(t) = tail.strip_prefix('{') {
            let end = t
                .find('}')
                .with_context(|| format!("unclosed `${{` in {p:?}"))?;
            (&t[..end], &t[end + 1..])
        } else {
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            (&tail[..end], &tail[end..])
        };
        let (name, default) = match name.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (name, None),
        };
        match (std::env::var(name), default) {
            (Ok(v), _) if !v.is_empty() => out += &v,
            (_, Some(d)) => match d.strip_prefix("~/") {
                Some(t) => {
                    out += &std::env::var("HOME").context("`~` in a path needs HOME")?;
                    out.push('/');
                    out += t;
                }
                None => out += d,
            },
            _ => bail!("environment variable {name} (in {p:?}) is not set"),
        }
        rest = after;
    }
    out += rest;
    Ok(PathBuf::from(out))
}

impl TaskSpec {
    /// Builds the task (reads a JSONL file), checking that only this kind's fields are set.
    pub fn build(&self) -> Result<TaskSet> {
        let given = |name: &str, set: bool, kinds: &str| -> Result<()> {
            if set {
                bail!("task.{name} applies to kind = {kinds}, not {:?}", self.kind);
            }
            Ok(())
        };
        let k = self.kind;
        given(
            "digits",
            self.digits.is_some() && k != TaskKind::Arithmetic,
            "arithmetic",
        )?;
        given(
            "ops",
            self.ops.is_some() && k != TaskKind::Arithmetic,
            "arithmetic",
        )?;
        for (n, set) in [
            ("count", self.count.is_some()),
            ("max_number", self.max_number.is_some()),
            ("max_target", self.max_target.is_some()),
        ] {
            given(n, set && k != TaskKind::Countdown, "countdown")?;
        }
        given("path", self.path.is_some() && k != TaskKind::Jsonl, "jsonl")?;
        Ok(match k {
            TaskKind::Arithmetic => {
                let d = Arithmetic::default();
                let t = Arithmetic {
                    digits: self.digits.unwrap_or(d.digits),
                    ops: self.ops.clone().unwrap_or(d.ops),
                };
                t.validate().map_err(anyhow::Error::msg)?;
                TaskSet::Arithmetic(t)
            }
            TaskKind::Countdown => {
                let d = Countdown::default();
                let t = Countdown {
                    count: self.count.unwrap_or(d.count),
                    max_number: self.max_number.unwrap_or(d.max_number),
                    max_target: self.max_target.unwrap_or(d.max_target),
                };
                t.validate().map_err(anyhow::Error::msg)?;
                TaskSet::Countdown(t)
            }
            TaskKind::Jsonl => {
                let p = self
                    .path
                    .as_deref()
                    .context("task.kind = \"jsonl\" needs task.path")?;
                TaskSet::Jsonl(JsonlData::load(&expand_path(p)?)?)
            }
        })
    }
}

/// A pretrained checkpoint (Hugging Face directory or GGUF file) trained through LoRA adapters,
/// prompted through its chat template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainedSpec {
    /// Checkpoint path (`~` and `$VAR` are expanded).
    pub path: String,
    /// Wrap the prompt in the tokenizer's chat template.
    #[serde(default = "yes")]
    pub chat: bool,
    /// Optional system message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The user message; `{question}` is replaced by the example's question.
    #[serde(default = "question")]
    pub template: String,
    /// LoRA adapters (the only trained parameters).
    #[serde(default)]
    pub lora: LoraSettings,
}

fn question() -> String {
    "{question}".into()
}

/// The reward: a weighted sum of the task's verifiable reward, a format reward, an external
/// program's reward, plus DAPO's overlong penalty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    /// Weight of the verifiable (correctness) reward.
    #[serde(default = "one_f32")]
    pub correct: f32,
    /// Weight of the format reward (see `reward::format_reward`).
    #[serde(default)]
    pub format: f32,
    /// DAPO's soft overlong penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlong: Option<OverlongPenalty>,
    /// An external reward program speaking JSON lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalSpec>,
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            correct: 1.0,
            format: 0.0,
            overlong: None,
            external: None,
        }
    }
}

fn one_f32() -> f32 {
    1.0
}

/// Supervised warm-up on generated demonstrations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Warmup {
    /// Optimizer steps.
    pub steps: usize,
    /// Examples per step.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
}

/// Sampling of rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Prompts per RL step.
    pub prompts_per_step: usize,
    /// Samples per prompt (the group size).
    pub samples_per_prompt: usize,
    /// Temperature.
    pub temperature: f32,
    /// Maximum response length.
    pub max_new_tokens: usize,
    /// Pad prompts and responses to multiples of this many tokens before rescoring and
    /// training, so GPU kernels see a few shapes (0 = off, the CPU default; 16 or 32 on GPUs).
    #[serde(default)]
    pub shape_bucket: usize,
}

/// The RL phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    /// RL steps (one rollout batch each).
    pub steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps.
    #[serde(default)]
    pub warmup_steps: usize,
    /// Cosine floor as a fraction of the peak.
    #[serde(default = "one_f")]
    pub min_lr_ratio: f64,
    /// μ epochs per batch.
    #[serde(default = "one")]
    pub epochs: usize,
    /// Optimizer steps per epoch.
    #[serde(default = "one")]
    pub mini_batches: usize,
    /// Rows per forward/backward (0 = whole mini-batch).
    #[serde(default)]
    pub micro_batch_rows: usize,
    /// Per-parameter gradient-norm clip (0 = off).
    #[serde(default)]
    pub grad_clip: f32,
    /// KL coefficient (KL in the loss when > 0; the reference is the warm-started policy).
    #[serde(default)]
    pub kl_coef: f32,
    /// Evaluate every this many steps.
    #[serde(default = "ten")]
    pub eval_every: usize,
    /// Recompute old log-probs with the trainer (true) or take the sampler's (bypass).
    #[serde(default = "yes")]
    pub recompute_old_log_probs: bool,
    /// Write a checkpoint every this many steps (0 = only at the end or on Ctrl-C).
    #[serde(default)]
    pub checkpoint_every: usize,
    /// Checkpoints kept (the newest).
    #[serde(default = "two")]
    pub keep_checkpoints: usize,
}

fn two() -> usize {
    2
}

fn one() -> usize {
    1
}
fn ten() -> usize {
    10
}
fn one_f() -> f64 {
    f(1.0)
}
fn yes() -> bool {
    true
}
fn auto() -> String {
    "auto".into()
}
fn grpo() -> Algorithm {
    Algorithm::Grpo
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Run name (the default run directory is `runs/<name>`).
    pub name: String,
    /// Seed of every random choice.
    #[serde(default)]
    pub seed: u64,
    /// `cpu`, `cuda`, `wgpu` or `auto`.
    #[serde(default = "auto")]
    pub device: String,
    /// `f32` (default) or `bf16`: mixed precision of the LLM's products (f32 parameters,
    /// optimizer state, norms, softmax and losses); wgpu falls back to f32 with a message.
    #[serde(default)]
    pub precision: crate::device::Precision,
    /// Run multi-token passes (prefill, rescoring) through burn's fused attention op; decode
    /// steps keep the explicit path that every backend runs.
    #[serde(default)]
    pub fused_attention: bool,
    /// Algorithm preset.
    #[serde(default = "grpo")]
    pub algorithm: Algorithm,
    /// The tiny policy trained from scratch (or use `[pretrained]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// A pretrained policy with LoRA (or use `[model]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<PretrainedSpec>,
    /// The task.
    pub task: TaskSpec,
    /// The reward.
    #[serde(default)]
    pub reward: RewardSpec,
    /// Supervised warm-up of the tiny policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<Warmup>,
    /// Rollouts.
    pub rollout: RolloutSpec,
    /// RL phase.
    pub train: TrainSpec,
    /// Overrides the preset's estimator.
    #[serde(default)]
    pub advantage: Option<AdvantageConfig>,
    /// Overrides the preset's actor loss.
    #[serde(default)]
    pub loss: Option<ActorLossConfig>,
}

/// Parses `text` with `key=value` overrides applied (dotted keys address nested tables; values
/// are TOML, bare words are strings). Unknown keys are errors that list the valid ones.
pub fn parse(text: &str, overrides: &[String]) -> Result<Recipe> {
    let root = apply_overrides(text, overrides)?;
    let recipe: Recipe = toml::Value::Table(root)
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("invalid recipe: {}", e.message()))?;
    recipe.validate()?;
    Ok(recipe)
}

/// Parses TOML `text` and applies `key=value` overrides (dotted keys address nested tables;
/// values are TOML, bare words are strings).
pub fn apply_overrides(text: &str, overrides: &[String]) -> Result<toml::Table> {
    let mut root: toml::Table = text.parse().context("recipe is not valid TOML")?;
    for o in overrides {
        let (key, value) = o
            .split_once('=')
            .with_context(|| format!("--set {o:?}: expected key=value"))?;
        let value: toml::Value = match format!("v = {value}").parse::<toml::Table>() {
            Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(value.into())),
            Err(_) => toml::Value::String(value.to_string()),
        };
        let parts: Vec<&str> = key.trim().split('.').collect();
        let mut table = &mut root;
        for p in &parts[..parts.len() - 1] {
            table = table
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .with_context(|| format!("--set {key}: `{p}` is not a table"))?;
        }
        table.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(root)
}

impl Recipe {
    /// Checks the values serde cannot.
    pub fn validate(&self) -> Result<()> {
        match (&self.model, &self.pretrained) {
            (Some(_), Some(_)) => {
                bail!("give either [model] (tiny policy) or [pretrained], not both")
            }
            (None, None) => bail!("the recipe needs a policy: [model] (tiny) or [pretrained]"),
            (Some(m), None) => {
                if self.warmup.is_none() {
                    bail!("the tiny [model] needs a [warmup] table (steps, batch, lr)");
                }
                if m.heads == 0 || m.kv_heads == 0 || !m.heads.is_multiple_of(m.kv_heads) {
                    bail!(
                        "model.heads = {} must be a positive multiple of model.kv_heads = {}",
                        m.heads,
                        m.kv_heads
                    );
                }
            }
            (None, Some(p)) => {
                if self.warmup.is_some() {
                    bail!("[warmup] applies to the tiny [model] only, not to [pretrained]");
                }
                p.lora.validate()?;
                if !p.template.contains("{question}") {
                    bail!(
                        "pretrained.template = {:?} must contain {{question}}",
                        p.template
                    );
                }
            }
        }
        if let Some(o) = &self.reward.overlong {
            o.validate()?;
        }
        if !(self.reward.correct.is_finite() && self.reward.format.is_finite()) {
            bail!("reward.correct and reward.format must be finite");
        }
        if self.rollout.samples_per_prompt < 2 {
            bail!(
                "rollout.samples_per_prompt = {} must be >= 2 (group baselines need two samples)",
                self.rollout.samples_per_prompt
            );
        }
        if self.rollout.prompts_per_step == 0
            || self.task.eval_size == 0
            || self.warmup.as_ref().is_some_and(|w| w.batch == 0)
        {
            bail!("rollout.prompts_per_step, task.eval_size and warmup.batch must be >= 1");
        }
        if self.train.eval_every == 0 {
            bail!("train.eval_every must be >= 1");
        }
        Ok(())
    }

    /// Estimator, actor loss and dynamic sampling after preset and overrides.
    pub fn algorithm_parts(&self) -> (AdvantageConfig, ActorLossConfig, bool) {
        let (mut adv, mut loss, dynamic) = self.algorithm.preset(self.rollout.max_new_tokens);
        if let Some(a) = self.advantage {
            adv = a;
        }
        if let Some(l) = self.loss {
            loss = l;
        }
        if self.train.kl_coef > 0.0 && loss.kl.is_none() {
            loss.kl = Some(KlLoss {
                estimator: KlEstimator::K3,
            });
        }
        (adv, loss, dynamic)
    }
}
