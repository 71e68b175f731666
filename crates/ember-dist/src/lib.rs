//! Ember's multi-process world: one process per device (or per node on CPUs), started by the
//! launchers clusters already run (`torchrun`, Slurm's `srun`, Open MPI's or MPICH's `mpirun`).
//!
//! - [`Launch`]: rank, world size and local rank read from the launcher's environment, checked
//!   for consistency (`launch.rs`).
//! - [`Collective`]: what a training step asks of the engine underneath (a sum of gradients, a
//!   gather of rollouts, a broadcast), implemented over MPI and NCCL by `ember-collectives`;
//!   every call names the step and the operation, so that a watchdog can say which rank is
//!   missing where (`world.rs`).
//! - [`World`]: the handle jobs hold: rank 0 is the one writer, shards of a batch by rank,
//!   gradients summed in buckets, a flag agreed by every rank.
//! - [`rendezvous`]: the TCP exchange that gives every rank NCCL's unique id (torchrun's agent
//!   holds `MASTER_PORT` for its own store, so Ember's rendezvous listens on a port of its own).
//! - `error`: `DistError`, naming the variable, launcher or rank at fault (launchers that
//!   disagree, variables that are not numbers, impossible worlds).
//!
//! Depends on nothing of Ember's: `ember-collectives` holds the engines.

mod error;
mod launch;
pub mod rendezvous;
mod world;

pub use error::DistError;
pub use launch::{Launch, Launcher, first_host};
pub use world::{At, BROADCAST_PIECE, BUCKET, Collective, World};
