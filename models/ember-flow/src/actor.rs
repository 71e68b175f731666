//! The flow model as an engine [`Actor`]: the trained denoising steps of a batch of SDE
//! trajectories are its `[batch, steps]` axis, and [`Actor::score`] recomputes each step's
//! Gaussian log-likelihood under the current weights (Flow-GRPO eq. 9; DDPO, Black et al. 2023,
//! eq. 4), so the engine's ratios, clipping, KL and aggregation apply unchanged.

use crate::dit::{FlowDit, Guidance};
use crate::sde::{SdeCoef, gaussian_log_prob};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_train::{Actor, Replicate, Scored};

/// The trained steps of a batch of trajectories.
#[derive(Debug, Clone)]
pub struct FlowExperience {
    /// `[rows, k, pixels]` each trained step's input latent.
    pub inputs: Tensor<3>,
    /// `[rows, k, pixels]` each trained step's output latent (the sampled x_{σ'}, detached).
    pub outputs: Tensor<3>,
    /// The k trained steps' coefficients (shared by every row).
    pub coefs: Vec<SdeCoef>,
    /// `[rows]` class labels.
    pub labels: Tensor<1, Int>,
    /// Classifier-free guidance scale used when sampling (1 = none).
    pub guidance: f32,
    /// Score the KL to the adapter-free model in closed form ([`FlowExperience::closed_form_kl`]).
    pub closed_form_kl: bool,
    /// Under guidance, the unconditional branch carries no gradient ([`FlowDit::guided_with`]).
    pub detach_uncond: bool,
}

impl FlowExperience {
    /// Gathers the trained steps `steps` (indices into the sampler's grid) of `latents`
    /// (`steps_total + 1` tensors `[rows, pixels]`).
    pub fn from_trajectory(
        latents: &[Tensor<2>],
        coefs: &[SdeCoef],
        steps: &[usize],
        labels: Tensor<1, Int>,
        guidance: f32,
    ) -> Self {
        let pick = |off: usize| {
            Tensor::stack::<3>(steps.iter().map(|&s| latents[s + off].clone()).collect(), 1)
        };
        Self {
            inputs: pick(0),
            outputs: pick(1),
            coefs: steps.iter().map(|&s| coefs[s]).collect(),
            labels,
            guidance,
            closed_form_kl: false,
            detach_uncond: false,
        }
    }

    /// Per-step log-probs of `rows` under `model` with adapters on or off (off: the reference).
    ///
    /// # Shapes
    /// → `[rows.len(), k]`.
    pub fn log_probs(&self, model: &FlowDit, rows: &[usize], adapters: bool) -> Tensor<2> {
        let (mean, next, per_row) = self.step_means(model, rows, adapters);
        let r = rows.len();
        let k = self.coefs.len();
        gaussian_log_prob(next, mean, per_row(|c| c.std)).reshape([r, k])
    }

    /// Flow-GRPO's KL of each step to the adapter-free model (train_sd3.py with `beta > 0`):
    /// mean over pixels of (μ_θ − μ_ref)² / (2σ_t²), σ_t the step's noise level. (The exact KL
    /// of the two Gaussian steps, whose variance is σ_t²·|dt|, is this divided by |dt|; the
    /// reference code's form is kept.) μ_ref carries no gradient.
    ///
    /// # Shapes
    /// → `[rows.len(), k]`.
    pub fn closed_form_kl(&self, model: &FlowDit, rows: &[usize]) -> Tensor<2> {
        let (mean, _, per_row) = self.step_means(model, rows, true);
        self.kl_to_reference(model, rows, mean, per_row(|c| c.noise))
    }

    /// [`closed_form_kl`](Self::closed_form_kl) given the steps' means with adapters `mean`
    /// `[rows·k, pixels]` and their noise levels `[rows·k, 1]` (the reference's means are
    /// computed here, adapters off, without gradient).
    fn kl_to_reference(
        &self,
        model: &FlowDit,
        rows: &[usize],
        mean: Tensor<2>,
        noise: Tensor<2>,
    ) -> Tensor<2> {
        let (mean_ref, _, _) = self.step_means(model, rows, false);
        ((mean - mean_ref.detach()).powi_scalar(2).mean_dim(1) / (noise.powi_scalar(2) * 2.0))
            .reshape([rows.len(), self.coefs.len()])
    }

    /// Each trained step's mean μ `[rows·k, pixels]` under `model` (adapters on or off), the
    /// sampled next latent `[rows·k, pixels]`, and a builder of per-step coefficient columns
    /// `[rows·k, 1]`.
    #[allow(clippy::type_complexity)]
    fn step_means(
        &self,
        model: &FlowDit,
        rows: &[usize],
        adapters: bool,
    ) -> (
        Tensor<2>,
        Tensor<2>,
        impl Fn(fn(&SdeCoef) -> f32) -> Tensor<2> + '_,
    ) {
        let device = self.inputs.device();
        let [_, k, pixels] = self.inputs.dims();
        let r = rows.len();
        let idx = Tensor::<1, Int>::from_data(
            TensorData::new(rows.iter().map(|&x| x as i64).collect::<Vec<_>>(), [r]),
            &device,
        );
        let x = self
            .inputs
            .clone()
            .select(0, idx.clone())
            .reshape([r * k, pixels]);
        let next = self
            .outputs
            .clone()
            .select(0, idx.clone())
            .reshape([r * k, pixels]);
        let per_row = move |f: fn(&SdeCoef) -> f32| {
            let v: Vec<f32> = (0..r).flat_map(|_| self.coefs.iter().map(f)).collect();
            Tensor::<2>::from_data(TensorData::new(v, [r * k, 1]), &device)
        };
        let t = per_row(|c| c.sigma).reshape([r * k]);
        let labels = self
            .labels
            .clone()
            .select(0, idx)
            .unsqueeze_dim::<2>(1)
            .repeat_dim(1, k)
            .reshape([r * k]);
        let guidance = Guidance {
            scale: self.guidance,
            detach_uncond: self.detach_uncond,
        };
        let v = model.guided_with(x.clone(), t, labels, guidance, adapters);
        let mean = x * per_row(|c| c.a_x) + v * per_row(|c| c.a_v);
        (mean, next, per_row)
    }
}

impl Replicate for FlowExperience {
    fn to_device(&self, device: &Device) -> Self {
        Self {
            inputs: self.inputs.clone().to_device(device),
            outputs: self.outputs.clone().to_device(device),
            labels: self.labels.clone().to_device(device),
            ..self.clone()
        }
    }
}

impl Actor for FlowDit {
    type Experience = FlowExperience;

    /// The Gaussian policy's entropy does not depend on θ (its variance is fixed by the
    /// schedule), so no entropy is returned.
    /// With `closed_form_kl`, also flow_grpo's KL, from the same forward pass with adapters.
    fn score(&self, experience: &FlowExperience, rows: &[usize], _with_entropy: bool) -> Scored {
        let (mean, next, per_row) = experience.step_means(self, rows, true);
        let kl = experience
            .closed_form_kl
            .then(|| experience.kl_to_reference(self, rows, mean.clone(), per_row(|c| c.noise)));
        let [r, k] = [rows.len(), experience.coefs.len()];
        Scored {
            recompute: None,
            log_probs: gaussian_log_prob(next, mean, per_row(|c| c.std)).reshape([r, k]),
            entropy: None,
            kl,
        }
    }
}
