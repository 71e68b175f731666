//! Ember's policy-gradient engine.
//!
//! Everything works on `[batch, steps]` tensors plus a float mask: the engine knows nothing of
//! tokens, images or routers. A [`RolloutBatch`] goes through [`filter`]s, then
//! [`compute_advantages`], then [`actor_loss`] (a [`policy_loss`] with KL, entropy,
//! mismatch correction and [`aggregate`]).

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
