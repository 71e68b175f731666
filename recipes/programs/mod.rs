//! Program-synthesis recipes (`kind = "programs"`): Neural Symbolic Machines' programmer, a
//! tiny Llama over the task's words, writing programs for a symbolic computer that masks the
//! sampler (`ember_tasks::program`), trained by REINFORCE, iterative maximum likelihood or
//! augmented REINFORCE. The schema (`schema.rs`), the methods' rows and advantages
//! (`methods.rs`), the job (`job.rs`) and its set-up and checkpoint records (`state.rs`).

pub mod job;
pub mod methods;
pub mod schema;
mod state;
