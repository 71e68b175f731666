//! The diagonal Gaussian's log-density and entropy.

use burn::tensor::Tensor;

/// ½·ln(2π).
const HALF_LN_2PI: f32 = 0.918_938_5;

/// log N(a; μ, diag σ²) summed over the action dimension (cleanrl `ppo_continuous_action`:
/// `Normal(mean, std).log_prob(a).sum(1)`): Σ_i −½((a_i − μ_i)/σ_i)² − ln σ_i − ½ ln 2π.
///
/// # Shapes
/// `actions`, `mean` `[n, act]`, `log_std` `[act]` → `[n]`.
pub fn gaussian_log_prob(actions: Tensor<2>, mean: Tensor<2>, log_std: Tensor<1>) -> Tensor<1> {
    let [n, act] = actions.dims();
    debug_assert_eq!(mean.dims(), [n, act]);
    let log_std = log_std.reshape([1, act]);
    let z = (actions - mean) * log_std.clone().neg().exp();
    let lp = z.powi_scalar(2) * -0.5 - log_std - HALF_LN_2PI;
    lp.sum_dim(1).reshape([n])
}

/// The diagonal Gaussian's entropy, Σ_i ½ + ½ ln 2π + ln σ_i (it does not depend on the mean).
///
/// # Shapes
/// `log_std` `[act]` → `[1]`.
pub fn gaussian_entropy(log_std: Tensor<1>) -> Tensor<1> {
    let [act] = log_std.dims();
    log_std.sum().add_scalar(act as f32 * (0.5 + HALF_LN_2PI))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// Hand-worked: a = (1, −1), μ = (0, 0), σ = (1, e):
    /// (−½ − 0 − 0.9189385) + (−½·e⁻² − 1 − 0.9189385) = −3.4057435…
    /// Entropy of σ = (1, e): 2·(½ + 0.9189385) + 1 = 3.837877.
    #[test]
    fn log_prob_and_entropy_match_hand_worked_values() {
        let d = Device::flex();
        let a = Tensor::<2>::from_floats([[1.0, -1.0]], &d);
        let mu = Tensor::<2>::zeros([1, 2], &d);
        let log_std = Tensor::<1>::from_floats([0.0, 1.0], &d);
        let lp: f32 = gaussian_log_prob(a, mu, log_std.clone()).into_scalar();
        let want = -0.5 - 0.918_938_5 + (-0.5 * (-2.0f32).exp() - 1.0 - 0.918_938_5);
        assert!((lp - want).abs() < 1e-6, "{lp} vs {want}");
        let h: f32 = gaussian_entropy(log_std).into_scalar();
        assert!((h - 3.837_877).abs() < 1e-5, "{h}");
    }
}
