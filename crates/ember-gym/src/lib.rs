//! Ember's kernel gym (KernelGYM at CPU scale, after Dr.Kernel, Liu et al. 2026,
//! arXiv:2602.05885): a policy writes a C kernel for a task of the suite, and the gym
//!
//! 1. screens the source (headers, inline assembly, preprocessor escapes; `checks.rs`),
//! 2. compiles it with the system C compiler in a limited process (`sandbox.rs`: scratch
//!    directory, empty environment, CPU/memory/file limits, a deadline, no network),
//! 3. screens the object: the calls it makes, the names it defines, writable state, load-time
//!    code, instructions that reach the kernel or a clock (`checks.rs`),
//! 4. links it with a generated harness (`harness.rs`) that checks it against the reference on
//!    the prompt's shapes and hidden ones, with untouched-output, bounds and input checks, then
//!    times both interleaved and profiles the share of time in the task's library routines,
//! 5. names the outcome ([`Verdict`]) and scores it ([`RewardConfig`], [`RejectionConfig`]).
//!
//! Evaluations run on worker threads (`pool.rs`) through an [`Executor`]: [`Local`] runs each in
//! processes of its own; the `ember gym serve` client sends them to other machines.
//!
//! The other modules:
//! - `task`: the suite, each task's C reference, signature, shapes, tolerance and the library
//!   routines a candidate may call.
//! - `eval`: one evaluation (`evaluate`); `report`: what it takes and gives (`EvalConfig`,
//!   `Job`, `Report`, and `EvaluateRequest`, a server's request); `outcome`: the harness run's lines read back (hidden shapes, verdicts,
//!   timing, coverage).
//! - `verdict`: the named outcomes, and which of them are hacking.
//! - `reward`: the reward (eq. 1 with eq. 8's profiling-based term) and the profiling-based
//!   rejection (eq. 9).
//! - `extract`: the C code of a model's answer; `prompt`: the task prompt and the feedback.
//! - `error`: `GymError`, what stops an evaluation from being made at all.
//!
//! Depends on nothing of Ember's.

mod checks;
mod error;
mod eval;
mod extract;
mod harness;
mod outcome;
mod pool;
mod prompt;
mod report;
mod reward;
mod sandbox;
mod task;
mod verdict;

pub use checks::{MAX_SOURCE, source as screen_source};
pub use error::GymError;
pub use eval::evaluate;
pub use extract::code as extract_code;
pub use outcome::shapes;
pub use pool::{Executor, Local, evaluate_all};
pub use prompt::{feedback, task_prompt};
pub use report::{EvalConfig, EvaluateRequest, Job, Report};
pub use reward::{RejectionConfig, RewardConfig};
pub use sandbox::{Isolation, Limits, isolation};
pub use task::{Buffer, Library, Task, suite, task};
pub use verdict::Verdict;

#[cfg(test)]
mod tests;
