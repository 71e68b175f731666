//! Ember's LLM policy: Llama/Mistral/Qwen2/Qwen3 decoders loaded from Hugging Face or GGUF
//! checkpoints, batched KV-cache sampling with the log-probs RL needs, LoRA with PEFT I/O, and
//! export.
//!
//! The model:
//! - `config`: the Hugging Face `config.json` read into `LlamaConfig`; `model`: the decoder
//!   (`Llama`); `rope`: rotary embeddings with Llama 3, linear and YaRN scaling; `cache`: the
//!   preallocated KV cache.
//! - `load`: Hugging Face safetensors and GGUF in, Hugging Face export out; `hf`: the Hugging Face
//!   tensor layout stated once; `gguf`: the GGUF reader and its dequantization.
//! - `blocks`: a GGUF file's quantized blocks kept beside the f32 weights for decoding steps
//!   (`BLOCK_ROWS`: when a product reads them); `quantize`: `load_with_blocks` and
//!   `Llama::quantized`.
//! - `tokenizer`: tokenizers and chat templates (`Tokenizer::for_checkpoint`); `chartok`: the
//!   tiny policy's vocabularies (characters, or bytes for any text) and their tokenizer files.
//!
//! Generation:
//! - `sample`: batched seeded sampling (temperature, top-k, top-p, min-p, stop tokens);
//!   `temperature`: the one temperature rule of every surface.
//! - `constrain`: constrained decoding: a `TokenConstraint` names each row's allowed tokens before
//!   each step; `ConstrainedLlama` scores the same distribution in the update.
//! - `running`: continuous batching (rows join a decode batch at any step and leave as they end);
//!   `shrink`: the decode batch without its finished rows.
//!
//! Training:
//! - `actor`: the `Actor` impl (each micro-batch's unused padding columns dropped); `shared`:
//!   shared-prefix scoring (rows with the same prompt run it once).
//! - `lora`: LoRA and PEFT I/O; `mixture`: MoLoRA attached to the projections; `plop`: PLoP's
//!   feature norms for LoRA placement.
//! - `value`: PPO's value model, the policy's transformer with a scalar head.
//! - `error`: `LlmError`, each naming the file, key or value at fault.

pub mod actor;
mod blocks;
pub mod cache;
pub mod chartok;
mod config;
mod constrain;
mod error;
pub mod gguf;
pub(crate) mod hf;
mod load;
mod lora;
mod mixture;
mod model;
pub mod plop;
mod quantize;
mod rope;
pub mod running;
mod sample;
mod shared;
mod shrink;
mod temperature;
mod tokenizer;
mod value;

pub use blocks::BLOCK_ROWS;
pub use config::{Family, HfConfig, LlamaConfig};
pub use constrain::{
    Constrained, ConstrainedExperience, ConstrainedLlama, MASKED_LOGIT, TokenConstraint,
    generate_constrained,
};
pub use error::{LlmError, Result};
pub use load::{
    GenerationDefaults, Loaded, SafetensorsSource, config_from_gguf, load, save_hf, unpermute_rows,
};
pub use lora::{
    LoraSettings, TARGETS as LORA_TARGETS, adapter_param_count, apply_lora, load_peft, merge,
    save_peft, target_paths,
};
pub use mixture::{apply_mixture, mixtures};
pub use model::{Llama, Scoring, chosen_log_probs};
pub use quantize::load_with_blocks;
pub use rope::RopeScaling;
pub use sample::{
    Generation, Observer, SamplingConfig, generate, generate_observed, left_pad, left_pad_to,
    sample_rows, sample_rows_with,
};
pub use temperature::{MAX_TEMPERATURE, temperature_ok};
pub use tokenizer::{Message, Tokenizer, render_chat, render_chat_with};
pub use value::ValueModel;
