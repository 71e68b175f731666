//! The LLM recipe's jobs, each run by one CLI command: `train` (`ember train`), `eval` (`ember eval`),
//! `warmup`, `value_mse`, `rollouts`, `plop`, `bench` (`ember bench-llm`). No job imports
//! another (`tests/tidy.rs`).

pub mod bench;
pub mod eval;
pub mod plop;
pub mod rollouts;
pub mod train;
pub mod value_mse;
pub mod warmup;
