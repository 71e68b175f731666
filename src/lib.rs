//! Ember: pure-Rust policy-gradient post-training on burn.
//!
//! This facade re-exports the engine, picks the compute device among the backends compiled in
//! (cargo features `cpu`, `cuda`, `wgpu`), and holds the jobs the CLI runs: recipes, tasks,
//! rewards and the RL loop of the CPU recipe.

#[cfg(not(any(feature = "cpu", feature = "cuda", feature = "wgpu")))]
compile_error!(
    "Ember needs a compute backend: build with one of the cargo features `cpu` (the default), \
     `cuda` or `wgpu`, e.g. `cargo build --release --features cuda`."
);

pub use ember_engine as engine;

pub mod bench;
pub mod chartok;
pub mod checkpoint;
pub mod device;
pub mod digits;
pub mod flow_job;
pub mod heap;
pub mod job;
pub mod kernel_cache;
pub mod molora_job;
pub mod plot;
pub mod recipe;
pub mod reward;
pub mod tasks;
pub mod warmup;

/// The tokenizer of a checkpoint: `tokenizer.json` in a directory, or GGUF metadata.
pub fn tokenizer_for(model: &std::path::Path) -> ember_llm::Result<ember_llm::Tokenizer> {
    if model.is_dir() {
        ember_llm::Tokenizer::from_hf_dir(model)
    } else {
        ember_llm::Tokenizer::from_gguf(&ember_llm::gguf::GgufFile::open(model)?)
    }
}
