//! Unlearning recipes (`kind = "unlearning"`): a corpus of fictitious facts
//! (`ember_tasks::facts`), a supervised stage that teaches them, and the methods that make the
//! model forget a share of them (gradient ascent, RULE, ReRULE, the leave-one-out teacher
//! ensemble, retraining without them), with forget and retain metrics. The schema
//! (`schema.rs`), the methods' targets (`targets.rs`), the job (`job.rs`), its state, set-up and
//! checkpoint records (`state.rs`), and the metrics of what the model answers (`eval.rs`).

mod eval;
pub mod job;
pub mod schema;
mod state;
pub mod targets;
