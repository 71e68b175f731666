//! Ember's LLM policy: Llama/Mistral/Qwen2/Qwen3 decoders loaded from Hugging Face or GGUF
//! checkpoints, batched KV-cache sampling with the log-probs RL needs, LoRA with PEFT I/O, and
//! export. Three rooms: the model (this folder's files), `load/` and `decode/`, which import the
//! model and which the model never imports.
//!
//! The model:
//! - `config`: the Hugging Face `config.json` read into `LlamaConfig`; `model`: the decoder
//!   (`Llama`); `rope`: rotary embeddings with Llama 3, linear and YaRN scaling; `cache`: the
//!   preallocated KV cache; `blocks`: quantized blocks kept beside the f32 weights for decoding
//!   steps (`BLOCK_ROWS`: when a product reads them).
//! - `lora`: LoRA and PEFT I/O; `mixture`: MoLoRA attached to the projections; `plop`: PLoP's
//!   feature norms for LoRA placement.
//! - `checkpoint`: per-layer activation checkpointing of training passes.
//! - `actor`: the `Actor` impl (each micro-batch's unused padding columns dropped); `shared`:
//!   shared-prefix scoring (rows with the same prompt run it once); `value`: PPO's value
//!   model, the policy's transformer with a scalar head.
//! - `chartok`: the tiny policy's vocabularies (characters, or bytes for any text) and their
//!   tokenizer files; `files`: tensor files (safetensors in and out, atomic writes);
//!   `error`: `LlmError`, each naming the file, key or value at fault.
//!
//! `load`: Hugging Face safetensors and GGUF in, Hugging Face export out, quantized blocks and
//! tokenizers (its module doc has the map). `decode`: the samplers, continuous batching,
//! constrained decoding and the one temperature rule (its module doc has the map).

pub mod actor;
mod blocks;
pub mod cache;
pub mod chartok;
mod checkpoint;
mod config;
mod decode;
mod error;
mod files;
mod load;
mod lora;
mod mixture;
mod model;
pub mod plop;
mod rope;
mod shared;
mod value;

pub use decode::running;
pub use load::gguf;

pub use blocks::BLOCK_ROWS;
pub use config::{Family, HfConfig, LlamaConfig};
pub use decode::constrain::{
    Constrained, ConstrainedExperience, ConstrainedLlama, MASKED_LOGIT, TokenConstraint,
    generate_constrained,
};
pub use decode::sample::{
    Generation, Observer, SamplingConfig, generate, generate_observed, left_pad, left_pad_to,
    sample_rows, sample_rows_with,
};
pub use decode::temperature::{MAX_TEMPERATURE, temperature_ok};
pub use error::{LlmError, Result};
pub use files::SafetensorsSource;
pub use load::quantize::load_with_blocks;
pub use load::tokenizer::{Message, Tokenizer, render_chat, render_chat_with};
pub use load::{GenerationDefaults, Loaded, config_from_gguf, load, save_hf, unpermute_rows};
pub use lora::{
    LoraSettings, TARGETS as LORA_TARGETS, adapter_param_count, apply_lora, load_peft, merge,
    save_peft, target_paths,
};
pub use mixture::{apply_mixture, mixtures};
pub use model::{Llama, Scoring, chosen_log_probs};
pub use rope::RopeScaling;
pub use value::ValueModel;
