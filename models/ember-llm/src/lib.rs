//! Ember's LLM policy: Llama/Qwen2 decoders loaded from Hugging Face or GGUF checkpoints,
//! batched KV-cache sampling with the log-probs RL needs, LoRA with PEFT I/O, and export.

pub mod actor;
pub mod cache;
pub mod chartok;
pub mod config;
pub mod error;
pub mod gguf;
pub(crate) mod hf;
pub mod load;
pub mod lora;
pub mod mixture;
pub mod model;
pub mod plop;
pub mod sample;
pub mod tokenizer;
pub mod value;

pub use config::{Family, HfConfig, LlamaConfig};
pub use error::{LlmError, Result};
pub use load::{Loaded, load, save_hf};
pub use lora::{LoraSettings, apply_lora, load_peft, merge, save_peft};
pub use mixture::{apply_mixture, mixtures};
pub use model::{Llama, Precision};
pub use sample::{Generation, SamplingConfig, generate, left_pad_to};
pub use tokenizer::{Message, Tokenizer};
pub use value::ValueModel;
