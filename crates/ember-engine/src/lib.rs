//! Ember's policy-gradient engine.
//!
//! Everything works on `[batch, steps]` tensors plus a float mask: the engine knows nothing of
//! tokens, images or routers. A [`RolloutBatch`] goes through [`filter`]s, then
//! [`compute_advantages`], then [`actor_loss`] (a [`policy_loss`] with KL, entropy,
//! mismatch correction and [`aggregate`]).

pub mod adaptive;
pub mod advantage;
pub mod agg;
pub mod basis;
pub mod batch;
pub mod correction;
pub mod critic;
pub mod error;
pub mod filter;
pub mod kl;
pub mod loss;
pub mod metrics;
pub mod ops;
pub mod preference;
pub mod preset;
pub mod replay;
pub mod rng;
pub mod sequential;

pub use adaptive::{AdaMode, AdaPool, ReinforceAda};
pub use advantage::{
    AdvantageConfig, AdvantageKind, Advantages, BatchBaseline, OpmdBaseline, StdKind,
    compute_advantages,
};
pub use agg::{AggNorm, LossAgg, aggregate};
pub use basis::basis_values;
pub use batch::{REWARD_LIMIT, RolloutBatch};
pub use correction::{IsLevel, IsMode, MismatchCorrection};
pub use critic::{
    CriticConfig, Pact, ValueLossInput, explained_variance, pact_weights, value_loss,
};
pub use error::{EngineError, Result};
pub use filter::{OverlongPenalty, dynamic_sampling_keep, mask_truncated};
pub use kl::{KlControl, KlController, KlEstimator, kl_penalty};
pub use loss::{
    ActorInput, ActorLossConfig, KlLoss, PolicyLoss, PolicyLossInput, PolicyLossKind, RatioLevel,
    RecClip, actor_loss, policy_loss,
};
pub use metrics::Metrics;
pub use preference::{PairInput, PreferenceLoss, preference_loss};
pub use preset::{Preset, PresetParts};
pub use replay::{ReplayBuffer, ReplayConfig, ReplayEntry};
pub use rng::SplitMix64;
pub use sequential::{TurnOrder, TurnUpdates, turn_count, turn_mask};
