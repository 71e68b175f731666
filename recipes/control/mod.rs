//! `kind = "control"` recipes: PPO with GAE and a learned critic on batched continuous-control
//! environments (`ember_control`), through the same engine update and run kit as every other
//! kind. `schema.rs`: the recipe; `job.rs`: the loop; `pathwise.rs`: the loop's iteration under
//! `[gradient]` (DDCG, IVW-H and the two estimators they mix); `state.rs`: the set-up, what a
//! checkpoint holds and the evaluation; `study.rs`: the gradient estimators' study.

pub mod job;
pub mod pathwise;
pub mod schema;
mod state;
pub mod study;
