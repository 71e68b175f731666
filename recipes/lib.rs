//! Ember: pure-Rust policy-gradient post-training on burn.
//!
//! The root package holds the leaf of the workspace: one folder per recipe kind beside the
//! recipe files it runs (`llm`, `agent`, `offline`, `flow`, `molora`: each kind's schema, job and
//! parts), the OpenAI-compatible server (`serve`), what they share (`common`: device,
//! recipe parsing, kernel cache, heap) and the one parse of a recipe of any kind (`kinds`). The
//! crates below hold the engine (`ember_engine`), the update (`ember_train`), the run kit
//! (`ember_run`), tasks/rewards/environments (`ember_tasks`) and the models (`ember_llm`,
//! `ember_flow`, `ember_molora`). The CLI is `recipes/cli/`.

#[cfg(not(any(feature = "cpu", feature = "cuda", feature = "wgpu")))]
compile_error!(
    "Ember needs a compute backend: build with one of the cargo features `cpu` (the default), \
     `cuda` or `wgpu`, e.g. `cargo build --release --features cuda`."
);

pub mod agent;
pub mod common;
pub mod control;
pub mod flow;
pub mod gym;
pub mod kinds;
pub mod llm;
pub mod lm;
pub mod molora;
pub mod offline;
pub mod programs;
pub mod serve;
pub mod unlearning;
