//! The one optimizer of every job: AdamW without weight decay by default, with gradient clipping
//! over the global norm of all gradients (the meaning of `grad_clip` in TRL, verl, OpenRLHF and
//! flow_grpo) or, on request, per parameter (burn's `GradientClippingConfig::Norm`). Every step
//! measures the global gradient norm before clipping and skips a step whose norm is not finite.

use crate::parallel::DataParallel;
use burn::grad_clipping::GradientClippingConfig;
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, OptimizerRecord};
use burn::tensor::{DType, FloatDType, Tensor};
use ember_dist::World;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

fn burn_epsilon() -> f32 {
    1e-5
}
fn beta_1() -> f32 {
    0.9
}
fn beta_2() -> f32 {
    0.999
}

/// An f32 written as its shortest decimal (`1e-5`, not the f64 `9.999999747378752e-6`).
fn shortest<S: serde::Serializer>(x: &f32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(x.to_string().parse().unwrap_or(f64::from(*x)))
}

/// What `grad_clip` bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipMode {
    /// The norm of all gradients together, as one vector (`torch.nn.utils.clip_grad_norm_`:
    /// TRL `max_grad_norm`, verl `grad_clip`, OpenRLHF `--max_norm`).
    #[default]
    Global,
    /// Each parameter tensor's gradient norm on its own (burn's `GradientClippingConfig::Norm`).
    PerParameter,
}

/// AdamW settings (Loshchilov & Hutter 2019; burn's `AdamWConfig`) and gradient clipping; a
/// recipe embeds them under these names.
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
    /// Gradient-norm bound before the step (0 = off).
    #[serde(default)]
    pub grad_clip: f32,
    /// Whether `grad_clip` bounds the global norm (default) or each parameter's.
    #[serde(default)]
    pub grad_clip_mode: ClipMode,
    /// β₁ and β₂ of the moment averages (PyTorch's and burn's 0.9 and 0.999); set by code
    /// (the Tinker service's `adam_params`), not by recipes.
    #[serde(skip, default = "beta_1")]
    pub beta_1: f32,
    /// β₂.
    #[serde(skip, default = "beta_2")]
    pub beta_2: f32,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            weight_decay: 0.0,
            epsilon: 1e-5,
            grad_clip: 0.0,
            grad_clip_mode: ClipMode::Global,
            beta_1: beta_1(),
            beta_2: beta_2(),
        }
    }
}

impl OptimizerConfig {
    /// With gradient-norm clipping at `clip` (0 = off), global unless set otherwise.
    pub fn with_grad_clip(self, clip: f32) -> Self {
        Self {
            grad_clip: clip,
            ..self
        }
    }

    /// With the clipping mode.
    pub fn with_clip_mode(self, grad_clip_mode: ClipMode) -> Self {
        Self {
            grad_clip_mode,
            ..self
        }
    }

    /// With AdamW's ε.
    pub fn with_epsilon(self, epsilon: f32) -> Self {
        Self { epsilon, ..self }
    }

    /// With AdamW's β₁ and β₂.
    pub fn with_betas(self, beta_1: f32, beta_2: f32) -> Self {
        Self {
            beta_1,
            beta_2,
            ..self
        }
    }

    /// The optimizer (its state is created lazily, per parameter, at the first step).
    pub fn init(&self) -> Optimizer {
        let mut c = AdamWConfig::new()
            .with_weight_decay(self.weight_decay)
            .with_epsilon(self.epsilon)
            .with_beta_1(self.beta_1)
            .with_beta_2(self.beta_2);
        let clip = self.grad_clip > 0.0;
        if clip && self.grad_clip_mode == ClipMode::PerParameter {
            c = c.with_grad_clipping(Some(GradientClippingConfig::Norm(self.grad_clip)));
        }
        Optimizer {
            adamw: c.init(),
            global_clip: (clip && self.grad_clip_mode == ClipMode::Global)
                .then_some(self.grad_clip),
            parallel: None,
            world: None,
        }
    }
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The global L2 norm of the gradients before clipping (verl's `actor/grad_norm`).
    pub grad_norm: f64,
    /// False when the step was skipped because `grad_norm` was not finite (the weights and the
    /// optimizer state are unchanged), as verl's `dp_actor` skips it.
    pub applied: bool,
}

/// AdamW with gradient clipping and the gradient-norm measurement.
pub struct Optimizer {
    adamw: ModuleOptimizer,
    global_clip: Option<f32>,
    parallel: Option<Arc<DataParallel>>,
    world: Option<World>,
}

impl Optimizer {
    /// One step: measures the global gradient norm (one host read), skips the step when it is
    /// not finite, else clips (globally, when configured) and applies AdamW.
    pub fn step<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        grads: GradientsParams,
    ) -> (M, StepReport) {
        let grad_norm = global_grad_norm(&module, &grads);
        self.step_with_norm(lr, module, grads, grad_norm)
    }

    /// [`step`](Self::step) with the global gradient norm already measured (a multi-process
    /// update measures it on the host from the summed buffer, the same bits on every rank).
    pub fn step_with_norm<M: Module>(
        &mut self,
        lr: f64,
        module: M,
        mut grads: GradientsParams,
        grad_norm: f64,
    ) -> (M, StepReport) {
        if !grad_norm.is_finite() {
            return (
                module,
                StepReport {
                    grad_norm,
                    applied: false,
                },
            );
        }
        if let Some(max_norm) = self.global_clip {
            let coef = clip_coefficient(grad_norm, max_norm);
            if coef < 1.0 {
                grads = scale_grads(&module, grads, coef);
            }
        }
        let module = self.adamw.step(lr, module, grads);
        (
            module,
            StepReport {
                grad_norm,
                applied: true,
            },
        )
    }

    /// The AdamW state, for a checkpoint.
    /// Updates through this optimizer run data-parallel over `group`'s devices (the model
    /// stays on the first); like Horovod's `DistributedOptimizer`, the optimizer is what knows
    /// the group. Steps taken with [`step`](Self::step) directly are unaffected.
    #[must_use]
    pub fn with_data_parallel(self, group: Arc<DataParallel>) -> Self {
        Self {
            parallel: Some(group),
            ..self
        }
    }

    /// The data-parallel group, if any.
    pub fn data_parallel(&self) -> Option<&Arc<DataParallel>> {
        self.parallel.as_ref()
    }

    /// Updates through this optimizer run data-parallel over the processes of `world` too: each
    /// rank takes its share of every mini-batch's rows (then cuts it over its own devices, when
    /// it has a group), and the gradients are summed over the ranks before the step, which is
    /// then the same on every rank. Ranks across nodes, devices within one.
    #[must_use]
    pub fn with_world(self, world: World) -> Self {
        Self {
            world: (world.size() > 1).then_some(world),
            ..self
        }
    }

    /// The multi-process world, when it has more than one rank.
    pub fn world(&self) -> Option<&World> {
        self.world.as_ref()
    }

    pub fn to_record(&self) -> OptimizerRecord {
        self.adamw.to_record()
    }

    /// With the AdamW state of a checkpoint.
    pub fn load_record(self, record: OptimizerRecord) -> Self {
        Self {
            adamw: self.adamw.load_record(record),
            ..self
        }
    }
}

/// `torch.nn.utils.clip_grad_norm_`'s factor: min(1, max_norm / (‖g‖₂ + 1e-6)).
pub fn clip_coefficient(grad_norm: f64, max_norm: f32) -> f32 {
    (f64::from(max_norm) / (grad_norm + 1e-6)).min(1.0) as f32
}

/// The L2 norm of all of `module`'s gradients in `grads` as one vector, √Σ‖g_p‖² (summed in
/// f32 on the device, one host read). Parameters without a gradient (frozen) do not count.
pub fn global_grad_norm<M: Module>(module: &M, grads: &GradientsParams) -> f64 {
    struct SumSquares<'a> {
        grads: &'a GradientsParams,
        seen: Vec<ParamId>,
        total: Option<Tensor<1>>,
    }
    impl ModuleVisitor for SumSquares<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.seen.contains(&param.id) {
                return; // a parameter shared by two paths counts once
            }
            self.seen.push(param.id);
            if let Some(g) = self.grads.get::<D>(param.id) {
                let g = match g.dtype() {
                    DType::F16 | DType::BF16 => g.cast(FloatDType::F32),
                    _ => g,
                };
                let s = g.square().sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + s,
                    None => s,
                });
            }
        }
    }
    let mut v = SumSquares {
        grads,
        seen: Vec::new(),
        total: None,
    };
    module.visit(&mut v);
    v.total
        .map_or(0.0, |t| f64::from(t.into_scalar::<f32>()).sqrt())
}

/// Every gradient of `module` multiplied by `coef`.
fn scale_grads<M: Module>(module: &M, grads: GradientsParams, coef: f32) -> GradientsParams {
    struct Scale {
        grads: GradientsParams,
        ids: Vec<ParamId>,
        coef: f32,
    }
    impl ModuleVisitor for Scale {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.ids.contains(&param.id) {
                return; // a parameter shared by two paths is scaled once
            }
            if let Some(g) = self.grads.remove::<D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.coef));
                self.ids.push(param.id);
            }
        }
    }
    let mut v = Scale {
        grads,
        ids: Vec::new(),
        coef,
    };
    module.visit(&mut v);
    v.grads
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_mode_names() {
        let c: OptimizerConfig = parse(r#"{"grad_clip": 1.0, "grad_clip_mode": "per_parameter"}"#);
        assert_eq!(c.grad_clip_mode, ClipMode::PerParameter);
        let c: OptimizerConfig = parse(r#"{"grad_clip": 1.0}"#);
        assert_eq!(c.grad_clip_mode, ClipMode::Global);
    }

    #[test]
    fn clip_coefficient_is_torchs() {
        assert_eq!(clip_coefficient(0.5, 1.0), 1.0);
        assert!((clip_coefficient(5.0, 1.0) - (1.0 / (5.0 + 1e-6)) as f32).abs() < 1e-9);
    }

    fn parse(json: &str) -> OptimizerConfig {
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }
}
