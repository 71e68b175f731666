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

pub use critic::{Critic, CriticBatch, critic_update};
pub use optim::{
    ClipMode, Optimizer, OptimizerConfig, StepReport, clip_coefficient, global_grad_norm,
};
pub use parallel::{DataParallel, ParallelError, Reduce, Replicate};
pub use pass::update;
pub use precision::Precision;
pub use schedule::{LrConfig, LrSchedule};
pub use sequential::sequential_update;
pub use update::{Actor, Scored, UpdateConfig, UpdateSchedule, UpdateStats, accumulated_step};
