//! Regression losses of the flow model: pretraining and RAM.

use crate::dit::FlowDit;
use burn::tensor::{Int, Tensor};

/// Rectified-flow / conditional flow-matching loss (Lipman et al. 2023 eq. 23; Liu et al. 2022
/// eq. 1): x_σ = (1 − σ)x₀ + σε, target u = ε − x₀, L = mean ‖v_θ(x_σ, σ, y) − u‖² over pixels
/// and batch.
///
/// # Shapes
/// `x0`, `noise` `[b, pixels]`, `sigma [b]`, `labels [b]` → `[1]`.
pub fn flow_matching_loss(
    model: &FlowDit,
    x0: Tensor<2>,
    noise: Tensor<2>,
    sigma: Tensor<1>,
    labels: Tensor<1, Int>,
) -> Tensor<1> {
    let s = sigma.clone().unsqueeze_dim::<2>(1);
    let xt = x0.clone() * (-s.clone() + 1.0) + noise.clone() * s;
    let v = model.forward(xt, sigma, labels);
    (v - (noise - x0)).powi_scalar(2).mean()
}

/// Reinforce Adjoint Matching (Bergmeister et al. 2026, arXiv 2605.10759, eq. 17; reference
/// `compute_loss` of their `training_sd3.py`).
///
/// With the tilted optimum p*(x₀) ∝ p_base(x₀)·exp(r(x₀)/λ), the adjoint-matching condition and
/// a REINFORCE identity for the bridge score give, on a clean sample x₀ of the current model
/// re-noised as in pretraining (x_σ = (1 − σ)x₀ + σε):
///
/// ```text
/// v̂(x_σ) = v_base(x_σ, σ, y) + ρ·A(x₀)·((ε − x₀) − v_old(x_σ, σ, y))
/// L_RAM  = mean ‖v_θ(x_σ, σ, y) − sg[v̂]‖²
/// ```
///
/// ρ = 1/λ is the reward scale, A the (baselined) reward, v_base the frozen pretrained model
/// (adapters off), v_old the model that drew x₀: `old`, or when `None` the current weights,
/// detached (the paper's Algorithm 1; `old` is for an exponential moving average of the weights,
/// as RAM's code keeps). Limits: A = 0 gives ‖v_θ − v_base‖², which holds the pretrained velocity field
/// (the KL-regularised optimum for a constant reward); ρA = 1 with v_old = v_base gives the
/// flow-matching target ε − x₀ exactly, i.e. [`flow_matching_loss`] on the model's own samples.
///
/// # Shapes
/// `x0`, `noise` `[b, pixels]`, `sigma`, `advantages` `[b]`, `labels [b]` → `[1]`.
pub fn ram_loss(
    model: &FlowDit,
    old: Option<&FlowDit>,
    (x0, noise, sigma): (Tensor<2>, Tensor<2>, Tensor<1>),
    labels: Tensor<1, Int>,
    advantages: Tensor<1>,
    reward_scale: f32,
) -> Tensor<1> {
    let s = sigma.clone().unsqueeze_dim::<2>(1);
    let xt = x0.clone() * (-s.clone() + 1.0) + noise.clone() * s;
    let v = model.forward(xt.clone(), sigma.clone(), labels.clone());
    let v_old = match old {
        Some(old) => old
            .forward(xt.clone(), sigma.clone(), labels.clone())
            .detach(),
        None => v.clone().detach(),
    };
    let v_base = model.forward_with(xt, sigma, labels, false).detach();
    let w = (advantages * reward_scale).unsqueeze_dim::<2>(1);
    let target = (v_base + w * (noise - x0 - v_old)).detach();
    (v - target).powi_scalar(2).mean()
}
