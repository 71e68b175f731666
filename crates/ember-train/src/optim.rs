//! The one optimizer of every job: AdamW without weight decay by default, with optional
//! global-norm gradient clipping. Each job used to build its own; this is the single place.

use burn::grad_clipping::GradientClippingConfig;
use burn::optim::{AdamWConfig, ModuleOptimizer};
use serde::{Deserialize, Serialize};

fn burn_epsilon() -> f32 {
    1e-5
}

/// An f32 written as its shortest decimal (`1e-5`, not the f64 `9.999999747378752e-6`).
fn shortest<S: serde::Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(x.to_string().parse().unwrap_or(f64::from(*x)))
}

/// AdamW settings (Loshchilov & Hutter 2019; burn's `AdamWConfig`); a recipe embeds them under
/// these names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Decoupled weight decay (0 = none, the RL default).
    #[serde(default)]
    pub weight_decay: f32,
    /// ε of the second-moment denominator (burn's default 1e-5; PyTorch's 1e-8).
    #[serde(
        default = "burn_epsilon",
        rename = "adam_eps",
        serialize_with = "shortest"
    )]
    pub epsilon: f32,
    /// Per-parameter gradient-norm clip before the step (burn's `GradientClippingConfig::Norm`;
    /// 0 = off).
    #[serde(default)]
    pub grad_clip: f32,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            weight_decay: 0.0,
            epsilon: 1e-5,
            grad_clip: 0.0,
        }
    }
}

impl OptimizerConfig {
    /// With gradient-norm clipping at `clip` (0 = off).
    pub fn with_grad_clip(self, clip: f32) -> Self {
        Self {
            grad_clip: clip,
            ..self
        }
    }

    /// With AdamW's ε.
    pub fn with_epsilon(self, epsilon: f32) -> Self {
        Self { epsilon, ..self }
    }

    /// The optimizer (its state is created lazily, per parameter, at the first step).
    pub fn init(&self) -> ModuleOptimizer {
        let mut c = AdamWConfig::new()
            .with_weight_decay(self.weight_decay)
            .with_epsilon(self.epsilon);
        if self.grad_clip > 0.0 {
            c = c.with_grad_clipping(Some(GradientClippingConfig::Norm(self.grad_clip)));
        }
        c.init()
    }
}
