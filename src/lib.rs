//! Ember: pure-Rust policy-gradient post-training on burn.
//!
//! This facade re-exports the engine, picks the compute device among the backends compiled in
//! (cargo features `cpu`, `cuda`, `wgpu`), and holds what the CLI runs: the run kit (`run`:
//! run directory, metrics, checkpoints, the end-of-step protocol), the recipes (`recipe`), the
//! shared LLM and image-model parts (`llm`, `images`), tasks and rewards, and the jobs (`jobs`).

#[cfg(not(any(feature = "cpu", feature = "cuda", feature = "wgpu")))]
compile_error!(
    "Ember needs a compute backend: build with one of the cargo features `cpu` (the default), \
     `cuda` or `wgpu`, e.g. `cargo build --release --features cuda`."
);

pub use ember_engine as engine;

pub mod bench;
pub mod chartok;
pub mod device;
pub mod digits;
pub mod env;
pub mod heap;
pub mod images;
pub mod jobs;
pub mod kernel_cache;
pub mod llm;
pub mod process;
pub mod recipe;
pub mod reward;
pub mod run;
pub mod serve;
pub mod tasks;

/// The tokenizer of a checkpoint: `tokenizer.json` in a directory, or GGUF metadata.
pub fn tokenizer_for(model: &std::path::Path) -> ember_llm::Result<ember_llm::Tokenizer> {
    if model.is_dir() {
        ember_llm::Tokenizer::from_hf_dir(model)
    } else {
        ember_llm::Tokenizer::from_gguf(&ember_llm::gguf::GgufFile::open(model)?)
    }
}
