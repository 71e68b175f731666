//! The gym's errors: what stops an evaluation from being made at all (a candidate's failures are
//! [`crate::Verdict`]s, not errors).

/// Why the gym could not evaluate.
#[derive(Debug, thiserror::Error)]
pub enum GymError {
    /// A tool (the C compiler, `nm`, `objdump`, `prlimit`) could not be started.
    #[error(
        "the kernel gym could not start {0} (it needs a C compiler, binutils and util-linux's prlimit)"
    )]
    Spawn(String),
    /// The scratch directory could not be made or written.
    #[error("the kernel gym's scratch directory: {0}")]
    Scratch(#[from] std::io::Error),
    /// The harness (not the candidate) failed: a bug of the gym's, reported with its output.
    #[error("the kernel gym's harness for task {task} failed: {detail}")]
    Harness {
        /// The task.
        task: String,
        /// What happened.
        detail: String,
    },
    /// A remote gym did not answer (every one tried, with the last error).
    #[error("no remote kernel gym answered: {0}")]
    Remote(String),
    /// No task of that name.
    #[error("no kernel task named {0:?} (`ember gym list` names them)")]
    UnknownTask(String),
}
