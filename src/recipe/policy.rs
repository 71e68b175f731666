//! The policy tables that LLM and agent recipes share: `[model]` (the tiny policy), `[pretrained]`
//! (a checkpoint with LoRA, prompted through its template) and `[warmup]`.

use super::defaults::yes;
use ember_llm::LoraSettings;
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
