//! Ember's world over the engines clusters already run: MPI (`mpi` feature: Open MPI or MPICH
//! through the `mpi` crate) for CPU clusters and the tests, NCCL (`nccl` feature, through
//! cudarc) for GPUs. Each implements `ember_dist::Collective`.
//!
//! No collective waits for ever (the failure users of the Python peers report most): before
//! each operation every rank checks in with rank 0 within the timeout, so a rank that died or
//! stalled is named with the step and the operation, and every process ends at once
//! (`MPI_Abort`) instead of hanging.
//!
//! Modules:
//! - `engine`: the one thread that owns the engine (MPI's `MPI_THREAD_FUNNELED`; an NCCL
//!   communicator is not `Send`), to which the job's threads hand operations through a channel.
//! - `mpi_world`: the world over MPI: a check-in with rank 0 before every operation,
//!   non-blocking collectives polled against the timeout, pings that name the silent ranks.
//! - `nccl_world`: the world over NCCL, loaded at run time: the unique id through
//!   `ember_dist::rendezvous`, each call followed by a CUDA event polled against the timeout.
//! - `watchdog`: the collectives' time limit (`EMBER_DIST_TIMEOUT`, 600 s by default).

#[cfg(any(feature = "mpi", feature = "nccl"))]
mod engine;
#[cfg(feature = "mpi")]
mod mpi_world;
#[cfg(feature = "nccl")]
mod nccl_world;
mod watchdog;

#[cfg(feature = "mpi")]
pub use mpi_world::mpi;
#[cfg(feature = "nccl")]
pub use nccl_world::nccl;
pub use watchdog::{DEFAULT_TIMEOUT, timeout_from_env};
