//! BASIS's batchwise value estimate (Gong, Xu, Ye, Quinzan, Livieri & Shi 2026, "BASIS:
//! Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning",
//! arXiv 2605.27293): one rollout per prompt, and each prompt's value (the baseline of its
//! advantage) estimated from the rewards of the *other* prompts of the batch.
//!
//! Only the paper's abstract and summaries were reachable from this project, not its equations
//! or code (none is public). What is implemented follows the authors' companion paper on
//! kernelized advantage estimation (Gong et al. 2026, arXiv 2604.28005: kernel smoothing of
//! rewards as the value estimate) in the form of a leave-one-out Nadaraya–Watson estimator over
//! prompt representations, with these choices:
//! - features: the policy's final-normed hidden state at the last prompt token (the job
//!   provides them, [`crate::RolloutBatch::with_features`]), L2-normalised;
//! - kernel: Gaussian, K_ij = exp(−‖x_i − x_j‖² / (2 (b·h)²)), h² the mean squared distance
//!   between distinct valid rows of the batch (a scale-free bandwidth), b = `bandwidth`;
//! - leave-one-out: K_ii = 0 and rows with invalid rewards get weight 0, so a row's baseline
//!   never depends on its own reward (the policy gradient stays unbiased);
//! - calibration: `prior` pseudo-rows at the leave-one-out batch mean m_{−i} (the paper's
//!   "online calibration" is not specified in what was readable; this shrinks the estimate to
//!   REINFORCE++'s baseline where the kernel has little mass):
//!   V̂_i = (Σ_{j≠i} K_ij R_j + p·m_{−i}) / (Σ_{j≠i} K_ij + p);
//! - the paper's "offline estimation" stage is not implemented.
//!
//! The advantage is R_i − V̂_i, whitened over the batch's valid tokens when `whiten` is set (as
//! REINFORCE++, the paper's single-rollout baseline, does).

use burn::tensor::Tensor;

/// V̂ `[batch]` as above from `features` `[batch, dim]`, `rewards` `[batch]` (invalid entries
/// already 0) and `valid` `[batch]` (1/0).
pub fn basis_values(
    features: Tensor<2>,
    rewards: Tensor<1>,
    valid: Tensor<1>,
    bandwidth: f32,
    prior: f32,
) -> Tensor<1> {
    let [b, _] = features.dims();
    let device = features.device();
    let norm = features
        .clone()
        .powf_scalar(2.0)
        .sum_dim(1)
        .sqrt()
        .clamp_min(1e-12);
    let x = features / norm;
    // ‖x_i − x_j‖² = 2 − 2 x_i·x_j for unit vectors (clamped at 0 against rounding).
    let d2 = (x.clone().matmul(x.transpose()).mul_scalar(-2.0) + 2.0).clamp_min(0.0);
    let eye = Tensor::<2>::eye(b, &device);
    let vv = valid.clone().reshape([b, 1]) * valid.clone().reshape([1, b]);
    let pairs = vv * (eye.clone().neg() + 1.0);
    let h2 = (d2.clone() * pairs.clone()).sum() / pairs.clone().sum().clamp_min(1.0);
    let scale = h2.mul_scalar(2.0 * bandwidth * bandwidth).clamp_min(1e-12);
    let k = (d2.neg() / scale.reshape([1, 1])).exp() * pairs;
    let kr = k
        .clone()
        .matmul(rewards.clone().reshape([b, 1]))
        .reshape([b]);
    let ks = k.sum_dim(1).reshape([b]);
    // Leave-one-out batch mean over the other valid rows.
    let total = (rewards.clone() * valid.clone()).sum();
    let n = valid.clone().sum();
    let loo =
        (total.reshape([1]) - rewards * valid.clone()) / (n.reshape([1]) - valid).clamp_min(1.0);
    (kr + loo * prior) / (ks + prior).clamp_min(1e-12)
}
