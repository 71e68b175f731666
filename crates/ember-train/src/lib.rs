//! Ember's trainer: the model-agnostic part of the RL loop.
//!
//! A model implements [`Actor`] (score the steps of some rows of an experience batch); the
//! trainer runs μ epochs × mini-batches with gradient accumulation over micro-batches, one
//! optimizer step per mini-batch with step-global loss normalisers, and the learning-rate
//! schedule; the one AdamW builder ([`OptimizerConfig`]) and the durable-write helpers ([`io`])
//! every writer uses; SeeUPO's turn-by-turn schedule ([`sequential_update`]); a learned critic's
//! update ([`critic_update`]); Lopti's two-pass token isolation
//! ([`UpdateSchedule::lopti_threshold`]). Rollout, rewards and evaluation are the job's (see the
//! root package).
//!
//! Modules:
//! - `pass`: the entry point `update`: one pass, or Lopti's two split by π_old's probability.
//! - `update`: the `Actor` trait and one pass's epochs × mini-batches × micro-batches with the
//!   mini-batch's normalisers (`accumulated_step`: one optimizer step over accumulated parts).
//! - `micro`: micro-batches cut by rows or by a token budget, longest first, groups kept whole
//!   where the actor shares their prompt.
//! - `sequential`: SeeUPO's turn-by-turn schedule; `critic`: the `Critic` trait and its update.
//! - `parallel`: data-parallel updates over the devices of one process (`DataParallel`,
//!   `Replicate`); `world`: the same across processes (each rank's share of a mini-batch,
//!   gradients summed over the ranks, metrics gathered, rank 0's trained parameters broadcast at
//!   the start, the ranks' parameters compared bit for bit).
//! - `optim`: the one AdamW with global-norm clipping and the skip of a non-finite step;
//!   `schedule`: warm-up then cosine decay; `precision`: the precision of a model's products.
//! - `io`: durable writes (temporary file, fsync, rename, directory sync; `publish_dir`) and reads
//!   of regular files only.
//! - `manifest`: `manifest.json`, the checksums of every directory a run reads back (a
//!   checkpoint, `final/`, a pushed `serving/step-N/`), written before it is published.

mod critic;
pub mod io;
pub mod manifest;
mod micro;
mod optim;
mod parallel;
mod pass;
mod precision;
mod schedule;
mod sequential;
mod update;
mod world;
pub use world::{broadcast_trained, check_identical};

pub use critic::{Critic, CriticBatch, CriticData, CriticStep, critic_update};
pub use optim::{
    ClipMode, Optimizer, OptimizerConfig, StepReport, clip_coefficient, global_grad_norm,
};
pub use parallel::{DataParallel, ParallelError, Reduce, Replicate};
pub use pass::{UpdateData, update};
pub use precision::Precision;
pub use schedule::{LrConfig, LrSchedule};
pub use sequential::{Turns, sequential_update};
pub use update::{
    Actor, Recompute, Scored, UpdateConfig, UpdateSchedule, UpdateStats, accumulated_step,
};
