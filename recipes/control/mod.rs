//! `kind = "control"` recipes: PPO with GAE and a learned critic on batched continuous-control
//! environments (`ember_control`), through the same engine update and run kit as every other
//! kind. `schema.rs`: the recipe; `job.rs`: the loop; `state.rs`: the set-up, what a checkpoint
//! holds and the evaluation.

pub mod job;
pub mod schema;
mod state;
pub mod study;
