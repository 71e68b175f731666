//! Ember's LLM policy: Llama/Mistral/Qwen2/Qwen3 decoders loaded from Hugging Face or GGUF checkpoints,
//! batched KV-cache sampling with the log-probs RL needs, LoRA with PEFT I/O, and export.

pub mod actor;
mod blocks;
pub mod cache;
pub mod chartok;
mod config;
mod constrain;
mod error;
pub mod gguf;
pub(crate) mod hf;
pub mod hub;
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
pub use model::{Llama, chosen_log_probs};
pub use quantize::load_with_blocks;
pub use rope::RopeScaling;
pub use sample::{
    Generation, Observer, SamplingConfig, generate, generate_observed, left_pad, left_pad_to,
    sample_rows, sample_rows_with,
};
pub use temperature::{MAX_TEMPERATURE, temperature_ok};
pub use tokenizer::{Message, Tokenizer, render_chat, render_chat_with};
pub use value::ValueModel;
