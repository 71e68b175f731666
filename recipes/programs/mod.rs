//! Program-synthesis recipes (`kind = "programs"`): Neural Symbolic Machines' programmer, a
//! tiny Llama over the task's words, writing programs for a symbolic computer that masks the
//! sampler (`ember_tasks::program`), trained by REINFORCE, iterative maximum likelihood,
//! augmented REINFORCE or MAPO. The schema (`schema.rs`), the methods' rows and advantages
//! (`methods.rs`; MAPO's, which score the buffer, in `mapo.rs`), the job (`job.rs`) and its set-up and checkpoint records (`state.rs`).

pub mod job;
mod mapo;
pub mod methods;
pub mod schema;
mod state;
