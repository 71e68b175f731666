//! Ember's policy-gradient engine.
//!
//! Everything works on `[batch, steps]` tensors plus a float mask: the engine knows nothing of
//! tokens, images or routers. A [`RolloutBatch`] goes through the group filters (`filter`), then
//! [`compute_advantages`], then [`actor_loss`] (a [`policy_loss`] with KL, entropy,
//! mismatch correction and [`aggregate`]).
//!
//! Every module but `keys` is private; each public name has one path, the crate root (and
//! `keys::*`: the metric keys several crates share, as constants).
//! - `batch`: `RolloutBatch` and the one valid-reward rule (`is_valid_reward`, `REWARD_LIMIT`).
//! - `advantage`: the estimators' config (`AdvantageConfig`, `AdvantageKind`) and shared functions;
//!   `estimator`: `compute_advantages`, one function per estimator over one `AdvCtx`, then the
//!   options every estimator shares.
//! - `pg`: the policy losses (`PolicyLossKind`), one function per loss over one `LossCtx`;
//!   `loss`: the actor objective (policy loss + KL + entropy + correction + aggregation).
//! - `agg`: aggregation, with the whole optimizer step's normalisers (`AggNorm`).
//! - `kl`: KL estimators and the coefficient controllers.
//! - `correction`: rollout/trainer mismatch correction (truncated or masked importance weights).
//! - `filter`: group filters and reward shaping (overlong penalty, dynamic sampling).
//! - `ops`: masked and group reductions and scans, all on the device.
//! - `preset`: the algorithm presets, each an estimator, a loss, an aggregation and filters.
//! - `sequential`: SeeUPO's per-turn masks and update order.
//! - `adaptive`: Reinforce-Ada's rounds and down-sampling rules (host-side).
//! - `critic`: PPO's clipped value loss, PACT's weights and the explained variance.
//! - `basis`: BASIS's batchwise kernel baseline over prompt features.
//! - `replay`: the replay buffer of hard groups (ReRULE-style).
//! - `preference`: the pairwise preference objectives (DPO, IPO, RPO, …).
//! - `metrics`: named metrics kept on the device until `Metrics::to_host`; `keys`: the metric
//!   keys more than one place writes or reads.
//! - `rng`: `SplitMix64`, the seeded RNG of every host-side draw, implementing rand_core's
//!   `TryRng` and `SeedableRng` so that rand's algorithms take it.
//! - `error`: typed errors (`EngineError`), each naming the input that was wrong.

mod adaptive;
mod advantage;
mod agg;
mod basis;
mod batch;
mod correction;
mod critic;
mod error;
mod estimator;
mod filter;
pub mod keys;
mod kl;
mod loss;
mod metrics;
mod ops;
mod pg;
mod preference;
mod preset;
mod replay;
mod rng;
mod sequential;

pub use adaptive::{AdaMode, AdaPool, ReinforceAda};
pub use advantage::{
    AdvantageConfig, AdvantageKind, Advantages, BatchBaseline, OpmdBaseline, RejectGroups, StdKind,
    lgamma,
};
pub use agg::{AggNorm, LossAgg, aggregate};
pub use basis::basis_values;
pub use batch::{REWARD_LIMIT, RolloutBatch, is_valid_reward};
pub use correction::{IsLevel, IsMode, MismatchCorrection};
pub use critic::{
    CriticConfig, Pact, ValueLossInput, explained_variance, pact_weights, value_loss,
};
pub use error::{EngineError, Result};
pub use estimator::compute_advantages;
pub use filter::{OverlongPenalty, dynamic_sampling_keep, mask_truncated};
pub use kl::{KlControl, KlController, KlEstimator, kl_penalty};
pub use loss::{ActorInput, ActorLossConfig, KlLoss, actor_loss};
pub use metrics::Metrics;
pub use ops::{discounted_suffix_sum, masked_mean};
pub use pg::{PolicyLoss, PolicyLossInput, PolicyLossKind, RatioLevel, RecClip, policy_loss};
pub use preference::{PairInput, PreferenceLoss, preference_loss};
pub use preset::{Preset, PresetParts};
pub use replay::{ReplayBuffer, ReplayConfig, ReplayEntry};
pub use rng::SplitMix64;
pub use sequential::{TurnOrder, TurnUpdates, turn_count, turn_mask};
