//! Policy-gradient estimators through a differentiable simulator, and their combinations.
//!
//! With Gaussian noise w ~ N(0, σ²) on the decision (an action, or a parameter), the smoothed
//! objective F(θ) = E_w[f(θ + w)] has two sample estimators of ∇F (Suh et al. ICML 2022, §2):
//! the first-order (pathwise) ∇f(θ + w_n) that autodiff gives through the simulator, biased
//! where f jumps, and the zeroth-order (likelihood-ratio) (f(θ + w_n) − f(θ))·w_n/σ²,
//! unbiased but noisy. Onoda et al. 2026 (arXiv 2604.18161) combine them: DDCG keeps the
//! inverse-variance weighted mixture where a test finds f smooth and falls back to the
//! zeroth-order estimator where it does not; IVW-H weights the two per time step and action
//! dimension. Only the paper's abstract was reachable here: the test's confidence term and the
//! zero-variance cases below are our choices (docs/src/control.md says which).

use burn::tensor::{Bool, Tensor};

/// N samples of both estimators of one gradient.
#[derive(Debug, Clone)]
pub struct GradientSamples {
    /// `[n]` f(θ + w_n).
    pub values: Tensor<1>,
    /// `[n, d]` ∇f(θ + w_n): the first-order (pathwise) samples.
    pub first: Tensor<2>,
    /// `[n, d]` (f(θ + w_n) − b)·w_n/σ²: the zeroth-order samples (b a baseline).
    pub zeroth: Tensor<2>,
}

/// The sample variance's trace, (1/(n−1))·Σ_n ‖g_n − ḡ‖² (Suh et al.'s `compute_variance_norm`
/// squared). # Shapes `[n, d]` → `[1]`.
pub fn trace_variance(g: Tensor<2>) -> Tensor<1> {
    let [n, _] = g.dims();
    let centred = g.clone() - g.mean_dim(0);
    centred
        .powi_scalar(2)
        .sum()
        .div_scalar((n.max(2) - 1) as f32)
}

/// α = V̂₀ / (V̂₀ + V̂₁): the first-order estimator's weight in the inverse-variance mixture
/// α·ĝ₁ + (1 − α)·ĝ₀ (Onoda et al. 2026; Suh et al. 2022, eq. 10), V̂ each estimator's trace
/// variance; 0 (the unbiased zeroth-order estimator) when both are 0. # Shapes → `[1]`.
pub fn ivw_weight(s: &GradientSamples) -> Tensor<1> {
    weight(
        trace_variance(s.zeroth.clone()),
        trace_variance(s.first.clone()),
    )
}

/// v₀ / (v₀ + v₁) elementwise, 0 where both are 0.
fn weight<const D: usize>(v0: Tensor<D>, v1: Tensor<D>) -> Tensor<D> {
    let total = v0.clone() + v1;
    let zero = total.clone().equal_elem(0.0);
    (v0 / total.mask_fill(zero.clone(), 1.0)).mask_fill(zero, 0.0)
}

/// DDCG's test and its one hyperparameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DdcgConfig {
    /// c: how far below the smooth relation the gradients' variance may fall (0.3).
    pub c: f32,
    /// The standard-normal quantile of the variance estimate's upper confidence bound
    /// (1.645: one-sided 95 %).
    pub z: f32,
}

impl Default for DdcgConfig {
    fn default() -> Self {
        Self { c: 0.3, z: 1.645 }
    }
}

/// DDCG's smoothness test (Onoda et al. 2026, eq. 14 as secondary sources write it): for a
/// smooth f the first-order samples' trace variance v and the values' variance V[f] satisfy
/// v = 2·V[f]/σ² − 2‖∇F‖² (exactly for a quadratic f); a jump inflates V[f] without moving
/// the gradients, so the test passes when v̂ + ε ≥ 2(1 − c)·V̂[f]/σ² − 2‖ḡ₁‖². ε, our choice,
/// is v̂·z·√(2/(n − 1)) (the normal approximation of v̂'s χ² upper bound). # Shapes → `[1]`.
pub fn ddcg_smooth(s: &GradientSamples, sigma: f32, cfg: DdcgConfig) -> Tensor<1, Bool> {
    let [n, _] = s.first.dims();
    let v = trace_variance(s.first.clone());
    let eps = v.clone() * (cfg.z * (2.0 / (n.max(2) - 1) as f32).sqrt());
    let var_f = trace_variance(s.values.clone().reshape([n, 1]));
    let g = s.first.clone().mean_dim(0).powi_scalar(2).sum();
    let rhs = var_f * (2.0 * (1.0 - cfg.c) / (sigma * sigma)) - g * 2.0;
    (v + eps).greater_equal(rhs)
}

/// DDCG's weight: the inverse-variance α where [`ddcg_smooth`] passes, else 0 (the
/// zeroth-order estimator alone). # Shapes → `[1]`.
pub fn ddcg_weight(s: &GradientSamples, sigma: f32, cfg: DdcgConfig) -> Tensor<1> {
    let smooth = ddcg_smooth(s, sigma, cfg);
    ivw_weight(s).mask_fill(smooth.bool_not(), 0.0)
}

/// α·mean(ĝ₁) + (1 − α)·mean(ĝ₀). # Shapes `alpha` `[1]` → `[d]`.
pub fn mix(s: &GradientSamples, alpha: Tensor<1>) -> Tensor<1> {
    let [_, d] = s.first.dims();
    let g1 = s.first.clone().mean_dim(0).reshape([d]);
    let g0 = s.zeroth.clone().mean_dim(0).reshape([d]);
    blend(g1, g0, alpha)
}

/// The inverse-variance combination α·ĝ₁ + (1 − α)·ĝ₀ (Onoda et al. 2026, as [`mix`] and
/// [`ivw_h`] apply it), `alpha` broadcast against the estimates.
/// # Shapes `first`, `zeroth` `[..]`, `alpha` of the same rank, broadcastable → `[..]`.
pub fn blend<const D: usize>(first: Tensor<D>, zeroth: Tensor<D>, alpha: Tensor<D>) -> Tensor<D> {
    first * alpha.clone() + zeroth * alpha.neg().add_scalar(1.0)
}

/// IVW-H's weights (Onoda et al. 2026, §4 as secondary sources write it): per time step t and
/// action dimension a, α_{t,a} = V̂_n[ĝ₀]/(V̂_n[ĝ₀] + V̂_n[ĝ₁]) over the n episodes (0 where
/// both are 0), and the combined action-space gradients α·ĝ₁ + (1 − α)·ĝ₀ per episode, which
/// the caller back-propagates through the policy.
///
/// # Shapes
/// `zeroth`, `first` `[n, steps, act]` → (`[steps, act]`, `[n, steps, act]`).
pub fn ivw_h(zeroth: Tensor<3>, first: Tensor<3>) -> (Tensor<2>, Tensor<3>) {
    let [n, h, a] = first.dims();
    let var = |g: Tensor<3>| {
        let c = g.clone() - g.mean_dim(0);
        c.powi_scalar(2).sum_dim(0).reshape([h, a]) / (n.max(2) - 1) as f32
    };
    let alpha = weight(var(zeroth.clone()), var(first.clone()));
    let mixed = blend(first, zeroth, alpha.clone().reshape([1, h, a]));
    (alpha, mixed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    fn samples(values: [f32; 3], first: [f32; 3], zeroth: [f32; 3]) -> GradientSamples {
        let d = Device::flex();
        GradientSamples {
            values: Tensor::from_floats(values, &d),
            first: Tensor::<1>::from_floats(first, &d).reshape([3, 1]),
            zeroth: Tensor::<1>::from_floats(zeroth, &d).reshape([3, 1]),
        }
    }

    /// Hand-worked: ĝ₁ = (1, 2, 3): mean 2, v₁ = (1 + 0 + 1)/2 = 1; ĝ₀ = (0, 4, 8): mean 4,
    /// v₀ = (16 + 0 + 16)/2 = 16; α = 16/17; the mixture 16/17·2 + 1/17·4 = 36/17.
    #[test]
    fn inverse_variance_weight_and_mixture_match_hand_values() {
        let s = samples([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [0.0, 4.0, 8.0]);
        let a: f32 = ivw_weight(&s).into_scalar();
        assert!((a - 16.0 / 17.0).abs() < 1e-6, "{a}");
        let g: f32 = mix(&s, ivw_weight(&s)).into_scalar();
        assert!((g - 36.0 / 17.0).abs() < 1e-5, "{g}");
        let still = samples([0.0; 3], [2.0; 3], [2.0; 3]);
        assert_eq!(ivw_weight(&still).into_scalar::<f32>(), 0.0);
    }

    /// The switch, by hand with σ = 1, c = 0.3, n = 3 (ε = v̂·1.645·1 = 1.645·v̂):
    /// ĝ₁ = (1, 2, 3) (v̂ = 1, ‖ḡ₁‖² = 4). f = (0, 1, 2): V̂[f] = 1, the right side
    /// 1.4 − 8 < 0: smooth, α = IVW's. f = (0, 10, 20): V̂[f] = 100, 140 − 8 = 132 > 2.645:
    /// a jump, α = 0.
    #[test]
    fn ddcg_switches_to_zeroth_order_at_a_jump() {
        let cfg = DdcgConfig::default();
        let smooth = samples([0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [0.0, 4.0, 8.0]);
        assert!(ddcg_smooth(&smooth, 1.0, cfg).into_scalar::<bool>());
        let a: f32 = ddcg_weight(&smooth, 1.0, cfg).into_scalar();
        assert!((a - 16.0 / 17.0).abs() < 1e-6);
        let jump = samples([0.0, 10.0, 20.0], [1.0, 2.0, 3.0], [0.0, 4.0, 8.0]);
        assert!(!ddcg_smooth(&jump, 1.0, cfg).into_scalar::<bool>());
        assert_eq!(ddcg_weight(&jump, 1.0, cfg).into_scalar::<f32>(), 0.0);
    }

    /// IVW-H per (step, action): step 0 as above (α = 16/17), step 1 with equal first-order
    /// samples (v₁ = 0, α = 1), step 2 with both constant (α = 0).
    #[test]
    fn ivw_h_weights_each_step() {
        let d = Device::flex();
        let first = Tensor::<1>::from_floats([1.0, 5.0, 7.0, 2.0, 5.0, 7.0, 3.0, 5.0, 7.0], &d)
            .reshape([3, 3, 1]);
        let zeroth = Tensor::<1>::from_floats([0.0, 1.0, 7.0, 4.0, 2.0, 7.0, 8.0, 3.0, 7.0], &d)
            .reshape([3, 3, 1]);
        let (alpha, mixed) = ivw_h(zeroth, first);
        let a = alpha.into_data().try_to_vec::<f32>().unwrap();
        assert!(
            (a[0] - 16.0 / 17.0).abs() < 1e-6 && a[1] == 1.0 && a[2] == 0.0,
            "{a:?}"
        );
        let m = mixed.into_data().try_to_vec::<f32>().unwrap();
        assert!(
            (m[1] - 5.0).abs() < 1e-6 && (m[2] - 7.0).abs() < 1e-6,
            "{m:?}"
        );
    }
}
