//! Errors of the multi-process world.

/// A world that cannot be formed, or a collective that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistError {
    /// A launcher variable that is not a number.
    #[error("{name}={value:?} is not a non-negative integer ({launcher} sets it)")]
    BadVar {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// The launcher it belongs to.
        launcher: &'static str,
    },
    /// A launcher's variable is set but a companion it needs is not.
    #[error("{present} is set but {missing} is not: {launcher}'s environment is incomplete")]
    Missing {
        /// The variable found.
        present: &'static str,
        /// The one missing.
        missing: &'static str,
        /// The launcher.
        launcher: &'static str,
    },
    /// Numbers that cannot describe a world (rank past the size, local rank past the local
    /// size, an empty world).
    #[error("{launcher} gives an impossible world: {what}")]
    Inconsistent {
        /// The launcher.
        launcher: &'static str,
        /// What is wrong.
        what: String,
    },
    /// Two launchers' variables describe different worlds.
    #[error(
        "the environment holds two launchers that disagree: {a} says rank {ra} of {sa}, {b} \
         says rank {rb} of {sb}; unset one of them (a process started by one launcher inside \
         another inherits its variables)"
    )]
    Disagree {
        /// The first launcher.
        a: &'static str,
        /// Its rank.
        ra: usize,
        /// Its size.
        sa: usize,
        /// The second launcher.
        b: &'static str,
        /// Its rank.
        rb: usize,
        /// Its size.
        sb: usize,
    },
    /// The rendezvous that exchanges NCCL's id failed.
    #[error("rendezvous at {addr}: {what}")]
    Rendezvous {
        /// `host:port`.
        addr: String,
        /// What happened.
        what: String,
    },
    /// A collective failed in a way the engine reported.
    #[error("{engine} {what} at step {step}: {message}")]
    Engine {
        /// `mpi` or `nccl`.
        engine: &'static str,
        /// The operation.
        what: &'static str,
        /// The step.
        step: usize,
        /// The engine's message.
        message: String,
    },
}
