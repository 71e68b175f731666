//! Ember's image policy: a class-conditional rectified-flow model fine-tuned by the same engine
//! as the LLM.
//!
//! - [`FlowDit`]: a small DiT with adaLN-Zero predicting the velocity v_θ(x_σ, σ, y), with LoRA
//!   through burn's `apply_lora` and a base-only forward (the KL reference without a second
//!   copy; `dit.rs`);
//! - [`sample`]: the Euler ODE and the Flow-GRPO SDE samplers with per-step log-probs (`sde.rs`);
//! - [`FlowExperience`] + the engine's [`Actor`](ember_train::Actor): denoising steps are the
//!   engine's `steps` axis, so DDPO / Flow-GRPO / LOOP are the engine's estimators and losses
//!   (`actor.rs`);
//! - [`flow_matching_loss`], [`ram_loss`]: the pretraining (flow-matching) loss and the RAM loss
//!   (`loss.rs`); `ema.rs`: the weights' exponential moving average;
//! - [`DigitClassifier`]: the reward model, the PyPI `digit-recognizer-py` CNN loaded with
//!   burn-store (`classifier.rs`);
//! - `error`: the crate's errors, each naming the value or file at fault.

mod actor;
mod classifier;
mod dit;
mod ema;
mod error;
mod loss;
mod sde;

pub use actor::FlowExperience;
pub use classifier::DigitClassifier;
pub use dit::{FlowDit, FlowDitConfig, Guidance, LORA_TARGETS};
pub use ema::ema_update;
pub use error::{FlowError, Result};
pub use loss::{flow_matching_loss, ram_loss};
pub use sde::{SdeCoef, Trajectory, gaussian_log_prob, sample, sde_coefs, sigmas};
