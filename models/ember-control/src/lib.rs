//! Ember's control models: the engine's `[episodes, steps]` currency for continuous control.
//! Depends on the engine and `ember-train` only.
//!
//! - [`GaussianPolicy`]: a diagonal Gaussian over actions whose mean is an MLP of the
//!   observation and whose log-std is one learned vector (state-independent), and
//!   [`ValueNet`], an MLP critic; both with the orthogonal initialisation of PPO's
//!   implementations (`net.rs`; the Gaussian's log-density and entropy in `gaussian.rs`);
//! - [`Env`]: batched environments whose dynamics are burn tensor functions (so a batch of
//!   episodes steps in one call on the device, and autodiff reaches through a step):
//!   [`Pendulum`] (gymnasium `Pendulum-v1`) and [`CartPole`] (gymnasium `CartPole-v1` with a
//!   continuous force), with mass, length and friction variations and RARL's disturbance force
//!   (`env.rs`);
//! - [`rollout`]: episodes of a policy in an environment, sampled on the device, with an
//!   optional adversary and each player's zero-sum, time-limit-bootstrapped rewards;
//! - [`GradientSamples`]: the first-order (pathwise, through the simulator) and zeroth-order
//!   estimators of a smoothed objective's gradient, DDCG's switch and IVW(-H)'s
//!   inverse-variance mixtures (`gradient.rs`); `pathwise.rs`: per-step samples of a
//!   closed-loop policy's episodes and the vector-Jacobian product that carries a mixture to θ;
//!   [`BallWithWall`], Suh et al.'s discontinuous test problem (`ball.rs`);
//! - [`ControlExperience`] + the engine's [`Actor`](ember_train::Actor) and
//!   [`Critic`](ember_train::Critic): time steps are the engine's `steps` axis, so PPO with
//!   GAE is the engine's estimator and losses (`actor.rs`);
//! - `error`: the crate's typed errors.

mod actor;
mod ball;
mod env;
mod error;
mod gaussian;
mod gradient;
mod net;
mod pathwise;
mod rollout;

pub use actor::ControlExperience;
pub use ball::BallWithWall;
pub use env::{CartPole, Env, EnvName, Pendulum, Transition};
pub use error::{ControlError, Result};
pub use gaussian::{gaussian_entropy, gaussian_log_prob};
pub use gradient::{
    DdcgConfig, GradientSamples, blend, ddcg_smooth, ddcg_weight, ivw_h, ivw_weight, mix,
    trace_variance,
};
pub use net::{GaussianPolicy, GaussianPolicyConfig, Mlp, MlpConfig, ValueNet, ValueNetConfig};
pub use pathwise::{PathwiseSamples, pathwise_samples, policy_surrogate, reward_to_go};
pub use rollout::{Adversary, Rollout, Side, rollout};
