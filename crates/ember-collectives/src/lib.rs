//! Ember's world over the engines clusters already run: MPI (`mpi` feature: Open MPI or MPICH
//! through the `mpi` crate) for CPU clusters and the tests, NCCL (`nccl` feature, through
//! cudarc) for GPUs. Each implements `ember_dist::Collective`.
//!
//! No collective waits for ever (the failure users of the Python peers report most): before
//! each operation every rank checks in with rank 0 within the timeout, so a rank that died or
//! stalled is named with the step and the operation, and every process ends at once
//! (`MPI_Abort`) instead of hanging.

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
