//! The policy tables that LLM, agent and MoLoRA recipes share: `[model]` (the tiny policy),
//! `[pretrained]` (a checkpoint with LoRA, prompted through its template), `[warmup]` and the
//! sampled evaluation `[eval]`.

use crate::common::config::check_positive;
use crate::common::config::defaults::{four, ten, two, yes};
use anyhow::{Result, bail};
use ember_llm::chartok;
use ember_llm::{Family, LlamaConfig, LoraSettings};
use serde::{Deserialize, Serialize};

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
    /// `chars` (the arithmetic tasks' characters, the default) or `bytes` (the 256 byte
    /// values: any text, for external environments and datasets).
    #[serde(default, skip_serializing_if = "is_chars")]
    pub vocab: chartok::Vocab,
}

fn is_chars(v: &chartok::Vocab) -> bool {
    *v == chartok::Vocab::Chars
}

/// A pretrained checkpoint (Hugging Face directory or GGUF file) trained through LoRA adapters,
/// prompted through its chat template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainedSpec {
    /// Checkpoint path (`~` and `$VAR` are expanded), or a Hub id (`ORG/NAME[@REVISION]`, a
    /// file inside it as `ORG/NAME/FILE`) found in the local Hugging Face cache
    /// (`ember_hub`).
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
    /// Extra chat-template variables (transformers' `apply_chat_template` keyword arguments,
    /// vLLM's `chat_template_kwargs`), e.g. `{ enable_thinking = false }` for Qwen3.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// LoRA adapters (the only trained parameters).
    #[serde(default)]
    pub lora: LoraSpec,
}

/// `[pretrained.lora]`: rank, α and the projections that get adapters, named, or
/// `targets = "plop"`: PLoP's scores on the task's prompts pick `plop_count` of them when a
/// run starts (`ember plop <recipe>` prints the scores; `llm::plop`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    /// Rank r.
    #[serde(default = "rank8")]
    pub rank: usize,
    /// α (the update is scaled by α/r).
    #[serde(default = "alpha16")]
    pub alpha: f64,
    /// Module names (`q_proj`, …, `down_proj`), or `"plop"`.
    #[serde(default)]
    pub targets: Targets,
    /// With `targets = "plop"`: how many projection types get adapters (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plop_count: Option<usize>,
    /// With `targets = "plop"`: training prompts scored (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plop_prompts: Option<usize>,
}

/// `targets`: a list of module names, or the word `"plop"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a list of module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, \
                 down_proj) or \"plop\""
)]
pub enum Targets {
    /// Named modules.
    Modules(Vec<String>),
    /// `"plop"` (any other word is refused by `validate`).
    Word(String),
}

impl ModelSpec {
    /// The tiny character-level Llama of this table.
    pub fn llama_config(&self) -> LlamaConfig {
        LlamaConfig::new(
            Family::Llama,
            self.vocab.size(),
            self.d_model,
            self.d_ff,
            self.layers,
            self.heads,
            self.kv_heads,
        )
        .with_max_position_embeddings(64)
        .with_rms_norm_eps(1e-5)
    }

    /// Checks the sizes: the tiny model is trained from scratch on a CPU, so sizes beyond these
    /// bounds are typos, and would abort the process allocating them.
    fn validate(&self) -> Result<()> {
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            bail!(
                "model.heads = {} must be a positive multiple of model.kv_heads = {}",
                self.heads,
                self.kv_heads
            );
        }
        for (key, v, max) in [
            ("model.d_model", self.d_model, 1 << 14),
            ("model.d_ff", self.d_ff, 1 << 16),
            ("model.layers", self.layers, 256),
            ("model.heads", self.heads, 256),
        ] {
            crate::common::config::check_count(key, v, 1, max)?;
        }
        self.llama_config()
            .validate()
            .map_err(|e| anyhow::anyhow!("[model]: {e}"))
    }
}

/// The policy a recipe trains: the tiny `[model]` or a `[pretrained]` checkpoint.
pub enum PolicyChoice<'a> {
    /// The tiny character-level model.
    Tiny(&'a ModelSpec),
    /// A pretrained checkpoint with LoRA.
    Pretrained(&'a PretrainedSpec),
}

/// The one check of a recipe's policy (LLM and agent recipes): exactly one of `[model]` and
/// `[pretrained]`, and the given one's values.
pub fn choose_policy<'a>(
    model: Option<&'a ModelSpec>,
    pretrained: Option<&'a PretrainedSpec>,
) -> Result<PolicyChoice<'a>> {
    match (model, pretrained) {
        (Some(_), Some(_)) => bail!("give either [model] (tiny policy) or [pretrained], not both"),
        (None, None) => bail!("the recipe needs a policy: [model] (tiny) or [pretrained]"),
        (Some(m), None) => {
            m.validate()?;
            Ok(PolicyChoice::Tiny(m))
        }
        (None, Some(p)) => {
            p.lora.validate()?;
            check_positive("pretrained.lora.alpha", p.lora.alpha)?;
            if !p.template.contains("{question}") {
                bail!(
                    "pretrained.template = {:?} must contain {{question}}",
                    p.template
                );
            }
            Ok(PolicyChoice::Pretrained(p))
        }
    }
}

impl Default for Targets {
    fn default() -> Self {
        Self::Modules(LoraSettings::default().targets)
    }
}

fn rank8() -> usize {
    8
}
fn alpha16() -> f64 {
    16.0
}

impl Default for LoraSpec {
    fn default() -> Self {
        Self {
            rank: rank8(),
            alpha: alpha16(),
            targets: Targets::default(),
            plop_count: None,
            plop_prompts: None,
        }
    }
}

impl LoraSpec {
    /// Projection types PLoP picks by default.
    pub const PLOP_COUNT: usize = 3;
    /// Prompts PLoP scores by default.
    pub const PLOP_PROMPTS: usize = 64;

    /// `targets = "plop"`.
    pub fn is_plop(&self) -> bool {
        matches!(&self.targets, Targets::Word(_))
    }

    /// (count, prompts) of a PLoP choice, defaults filled in.
    pub fn plop(&self) -> (usize, usize) {
        (
            self.plop_count.unwrap_or(Self::PLOP_COUNT),
            self.plop_prompts.unwrap_or(Self::PLOP_PROMPTS),
        )
    }

    /// Checks rank, α, the target names (or the word `plop`) and PLoP's settings.
    pub fn validate(&self) -> anyhow::Result<()> {
        let n = ember_llm::LORA_TARGETS.len();
        match &self.targets {
            Targets::Modules(_) => {
                if self.plop_count.is_some() || self.plop_prompts.is_some() {
                    anyhow::bail!(
                        "pretrained.lora.plop_count and plop_prompts apply to targets = \"plop\" only"
                    );
                }
            }
            Targets::Word(w) if w == "plop" => {
                let (count, prompts) = self.plop();
                if count == 0 || count > n {
                    anyhow::bail!("pretrained.lora.plop_count = {count} must be in 1..={n}");
                }
                if prompts == 0 || prompts > 4096 {
                    anyhow::bail!("pretrained.lora.plop_prompts = {prompts} must be in 1..=4096");
                }
            }
            Targets::Word(w) => anyhow::bail!(
                "pretrained.lora.targets = {w:?}: give a list of module names or \"plop\""
            ),
        }
        // Rank and names (a PLoP choice names valid modules; its rank is checked the same).
        let named = match &self.targets {
            Targets::Modules(_) => self.clone(),
            Targets::Word(_) => self.with_targets(vec!["q_proj".into()]),
        };
        Ok(named.settings()?.validate()?)
    }

    /// The same adapters on the named `targets` (a PLoP choice made).
    pub fn with_targets(&self, targets: Vec<String>) -> Self {
        Self {
            targets: Targets::Modules(targets),
            plop_count: None,
            plop_prompts: None,
            ..self.clone()
        }
    }

    /// The model crate's settings; an error while `targets` is still `"plop"` (the choice is
    /// made by the jobs that start a run: `ember train`, the offline job).
    pub fn settings(&self) -> anyhow::Result<LoraSettings> {
        match &self.targets {
            Targets::Modules(t) => Ok(LoraSettings {
                rank: self.rank,
                alpha: self.alpha,
                targets: t.clone(),
            }),
            Targets::Word(_) => anyhow::bail!(
                "pretrained.lora.targets = \"plop\" is chosen when `ember train` starts a run (or \
                 read from its plop.json); this command needs the module names: run `ember plop \
                 <recipe>` to see the scores and name the modules in the recipe"
            ),
        }
    }
}

fn question() -> String {
    "{question}".into()
}

/// Supervised warm-up on generated demonstrations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Warmup {
    /// Optimizer steps (the most, with `until_accuracy`).
    pub steps: usize,
    /// Examples per step.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Stop once the greedy accuracy on a fixed sample of training problems (never the held-out
    /// split) reaches this: RL then starts from the same point whatever the summation order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_accuracy: Option<f64>,
    /// Steps between two checks of `until_accuracy`.
    #[serde(default = "check_every")]
    pub check_every: usize,
}

fn check_every() -> usize {
    25
}

impl Warmup {
    /// The stopping rule's values, checked.
    ///
    /// # Errors
    /// `until_accuracy` outside (0, 1], or `check_every` 0.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(a) = self.until_accuracy
            && !(a > 0.0 && a <= 1.0)
        {
            anyhow::bail!("warmup.until_accuracy = {a} must be in (0, 1]");
        }
        if self.check_every == 0 {
            anyhow::bail!("warmup.check_every = 0 must be at least 1 (steps between checks)");
        }
        Ok(())
    }
}

/// Sampled evaluation: `samples` responses per held-out problem at `temperature` give
/// `eval/mean@N` (mean accuracy over the samples) and `eval/pass@k` (k = 1, 2, 4, …, N) beside
/// the greedy `eval/accuracy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Responses per problem (0 = greedy accuracy only).
    #[serde(default)]
    pub samples: usize,
    /// Sampling temperature.
    #[serde(default = "crate::common::config::defaults::one_f32")]
    pub temperature: f32,
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self {
            samples: 0,
            temperature: 1.0,
        }
    }
}

/// The RL phase: one `[train]` table holding the loop's own settings and the configs it embeds
/// from `ember-train` (learning-rate schedule, AdamW, update schedule), each stated once, there.
pub type TrainSpec = crate::common::config::Training<TrainLoop>;

impl crate::common::config::LoopSettings for TrainLoop {
    const TABLE: &'static str = "train";
}

/// The RL loop's own settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainLoop {
    /// RL steps (one rollout batch each).
    pub steps: usize,
    /// KL coefficient (KL to the reference in the loss when > 0; the reference is the
    /// warm-started policy, or the pretrained weights with adapters off).
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
    /// Completions written to `samples.jsonl` per step (the first rows: whole groups first),
    /// and to TensorBoard's Text tab at each evaluation; 0 = none.
    #[serde(default = "four")]
    pub log_samples: usize,
    /// Per-layer activation checkpointing of the update's passes: each decoder layer's input is
    /// kept alone and the layer recomputed in the backward pass (less memory for about one more
    /// forward pass; the same gradients). Default false.
    #[serde(default)]
    pub checkpoint_activations: bool,
}

impl TrainLoop {
    /// `(steps, checkpoint_every, keep_checkpoints)` for the run kit.
    pub fn run_loop(&self) -> crate::common::run::RunLoop {
        crate::common::run::RunLoop {
            steps: self.steps,
            checkpoint_every: self.checkpoint_every,
            keep_checkpoints: self.keep_checkpoints,
        }
    }
}
