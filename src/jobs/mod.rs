//! The jobs the CLI runs. Each reads top to bottom (set-up, then the per-step loop, then the
//! end) over the shared kits (`run`, `recipe`, `llm`, `images`); no job imports another
//! (`tests/tidy.rs` checks it).

pub mod agent;
pub mod flow;
pub mod llm;
pub mod molora;
pub mod offline;
pub mod plop;
pub mod rollouts;
pub mod value_mse;
pub mod warmup;
