//! Samplers of the rectified flow x_σ = (1 − σ)·x₀ + σ·ε (σ = 1 noise, σ = 0 data; Liu et al.
//! 2022, Esser et al. 2024 §2): the Euler ODE and the Flow-GRPO SDE with per-step Gaussian
//! log-likelihoods (Liu et al. 2025, "Flow-GRPO", eq. 8–9; reference `sde_step_with_logprob`).
//!
//! Every step of a batch shares one σ, so the step coefficients are host scalars
//! ([`SdeCoef`]) and a step is two fused multiply-adds on the device.

use crate::dit::FlowDit;
use crate::error::{FlowError, Result};
use burn::tensor::{Device, Distribution, Int, Tensor};

/// σ grid from 1 to 0 with `steps` intervals, time-shifted by `shift` (SD3, Esser et al. 2024
/// eq. 23: σ' = sσ / (1 + (s − 1)σ); s = 1 is the uniform grid). Length `steps + 1`.
pub fn sigmas(steps: usize, shift: f32) -> Vec<f32> {
    (0..=steps)
        .map(|i| {
            let s = 1.0 - i as f32 / steps as f32;
            shift * s / (1.0 + (shift - 1.0) * s)
        })
        .collect()
}

/// The affine form of one SDE step from σ to σ' = σ_next (dt = σ' − σ < 0):
/// mean = a_x·x + a_v·v, next = mean + std·z.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SdeCoef {
    /// σ of the step's input.
    pub sigma: f32,
    /// Coefficient of x in the mean.
    pub a_x: f32,
    /// Coefficient of v_θ in the mean.
    pub a_v: f32,
    /// Standard deviation of the step's noise, σ_t·√(−dt).
    pub std: f32,
    /// σ_t, the noise level of the step (flow_grpo's `std_dev_t`).
    pub noise: f32,
}

/// Flow-GRPO's SDE step (eq. 8; `sde_step_with_logprob`): with σ_t = a·√(σ / (1 − σ)) (at σ = 1
/// the denominator uses the grid's second value), mean = x·(1 + σ_t²/(2σ)·dt) +
/// v·(1 + σ_t²(1 − σ)/(2σ))·dt and noise σ_t·√(−dt). `noise_level` = 0 gives the Euler step.
pub fn sde_coefs(sigmas: &[f32], noise_level: f32) -> Result<Vec<SdeCoef>> {
    if sigmas.len() < 2 {
        return Err(FlowError::Config {
            field: "sampler.steps",
            reason: "needs at least one step".into(),
        });
    }
    if !(0.0..=10.0).contains(&noise_level) {
        return Err(FlowError::Config {
            field: "sampler.noise_level",
            reason: format!("{noise_level} is outside [0, 10]"),
        });
    }
    let sigma_max = sigmas[1];
    Ok(sigmas
        .windows(2)
        .map(|w| {
            let (s, s_next) = (w[0], w[1]);
            let dt = s_next - s;
            let denom = 1.0 - if s >= 1.0 { sigma_max } else { s };
            let std_t = noise_level * (s / denom).sqrt();
            SdeCoef {
                sigma: s,
                a_x: 1.0 + std_t * std_t / (2.0 * s) * dt,
                a_v: (1.0 + std_t * std_t * (1.0 - s) / (2.0 * s)) * dt,
                std: std_t * (-dt).sqrt(),
                noise: std_t,
            }
        })
        .collect())
}

/// ln N(sample; mean, std²) averaged over pixels (Flow-GRPO averages over all but the batch
/// dim), computed in f32: −(x − μ)²/(2s²) − ln s − ½ln 2π.
///
/// # Shapes
/// `sample`, `mean` `[b, pixels]`, `std` `[b, 1]` → `[b]`.
pub fn gaussian_log_prob(sample: Tensor<2>, mean: Tensor<2>, std: Tensor<2>) -> Tensor<1> {
    let [b, _] = sample.dims();
    let half_ln_2pi = 0.5 * (2.0 * std::f32::consts::PI).ln();
    let z = (sample - mean) / std.clone();
    let lp = z.powi_scalar(2) * -0.5 - std.log() - half_ln_2pi;
    lp.mean_dim(1).reshape([b])
}

/// A sampled trajectory: the latents at every grid point and the log-prob of each step.
#[derive(Debug, Clone)]
pub struct Trajectory {
    /// `steps + 1` latents `[b, pixels]`, from noise (index 0) to the sample (last).
    pub latents: Vec<Tensor<2>>,
    /// `[b, steps]` log-prob of each step's output under the sampling policy (0 for steps with
    /// zero noise, which are deterministic).
    pub log_probs: Tensor<2>,
}

impl Trajectory {
    /// The final sample `[b, pixels]`.
    pub fn sample(&self) -> Tensor<2> {
        self.latents[self.latents.len() - 1].clone()
    }
}

/// Integrates from noise to data with the SDE (`noise_level > 0`) or the Euler ODE
/// (`noise_level = 0`), recording per-step log-probs. Runs without gradients: give it
/// `model.valid()` for speed. Noise comes from the device RNG (seed it for reproducibility).
///
/// # Shapes
/// `labels [b]` → latents `[b, side²]`.
pub fn sample(
    model: &FlowDit,
    labels: Tensor<1, Int>,
    coefs: &[SdeCoef],
    guidance: f32,
    device: &Device,
) -> Trajectory {
    let [b] = labels.dims();
    let pixels = model.pixels();
    let mut x = Tensor::<2>::random([b, pixels], Distribution::Normal(0.0, 1.0), device);
    let mut latents = vec![x.clone()];
    let mut lps = Vec::with_capacity(coefs.len());
    for c in coefs {
        let t = Tensor::<1>::full([b], c.sigma, device);
        let v = model.guided(x.clone(), t, labels.clone(), guidance, true);
        let mean = x * c.a_x + v * c.a_v;
        if c.std > 0.0 {
            let z = Tensor::<2>::random([b, pixels], Distribution::Normal(0.0, 1.0), device);
            x = mean.clone() + z * c.std;
            let std = Tensor::<2>::full([b, 1], c.std, device);
            lps.push(gaussian_log_prob(x.clone(), mean, std).unsqueeze_dim(1));
        } else {
            x = mean;
            lps.push(Tensor::<2>::zeros([b, 1], device));
        }
        latents.push(x.clone());
    }
    Trajectory {
        latents,
        log_probs: Tensor::cat(lps, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_and_zero_noise_is_euler() {
        let s = sigmas(4, 1.0);
        assert_eq!(s, vec![1.0, 0.75, 0.5, 0.25, 0.0]);
        // shift 3 at σ = 0.5: 1.5 / 2 = 0.75
        assert!((sigmas(2, 3.0)[1] - 0.75).abs() < 1e-6);
        for c in sde_coefs(&s, 0.0).unwrap() {
            assert_eq!(c.a_x, 1.0);
            assert!((c.a_v + 0.25).abs() < 1e-7);
            assert_eq!(c.std, 0.0);
        }
        assert!(sde_coefs(&[1.0], 0.7).is_err());
    }
}
