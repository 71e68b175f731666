//! Suh et al.'s ball with a wall (ICML 2022, §5; `alpha_gradient`'s `ball_with_wall.py`): a
//! ball launched at angle θ with speed v₀ lands at x = 2v₀²·sin θ·cos θ/g unless a wall of
//! height h at distance d stops it (x = d) — a jump in the landing distance at the angle where
//! the ball first clears the wall, where autodiff's pathwise gradient is blind. The reward is
//! x² (Suh et al. minimise −x²). Without the wall it is the smooth control task.

use crate::gradient::GradientSamples;
use burn::tensor::Tensor;

/// The launch and the wall (None: no wall, the smooth task).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BallWithWall {
    /// Launch speed.
    pub v0: f32,
    /// Gravity.
    pub g: f32,
    /// (distance, height) of the wall.
    pub wall: Option<(f32, f32)>,
}

impl Default for BallWithWall {
    /// Suh et al.'s constants: v₀ = 1, g = 9.81, a wall 0.02 high at 0.06.
    fn default() -> Self {
        Self {
            v0: 1.0,
            g: 9.81,
            wall: Some((0.06, 0.02)),
        }
    }
}

impl BallWithWall {
    /// The landing distance of each launch angle. # Shapes `[n]` → `[n]`.
    pub fn distance(&self, theta: Tensor<1>) -> Tensor<1> {
        let (s, c) = (theta.clone().sin(), theta.clone().cos());
        let land = s * c.clone() * (2.0 * self.v0 * self.v0 / self.g);
        let Some((d, h)) = self.wall else {
            return land;
        };
        // The ball's height when it reaches the wall: d·tan θ − g·d²/(2v₀²·cos² θ).
        let height = theta.tan() * d
            - c.powi_scalar(2).recip() * (self.g * d * d / (2.0 * self.v0 * self.v0));
        let stopped = land
            .clone()
            .greater_elem(d)
            .bool_and(height.lower_equal_elem(h));
        // Where stopped, x = d: land·0 + d keeps the graph (the gradient there is 0).
        land.clone().mask_where(stopped, land * 0.0 + d)
    }

    /// The reward x². # Shapes `[n]` → `[n]`.
    pub fn reward(&self, theta: Tensor<1>) -> Tensor<1> {
        self.distance(theta).powi_scalar(2)
    }

    /// Both estimators' samples at angle `theta` under noise `noise` `[n]` ~ N(0, σ²) (on an
    /// autodiff device): the pathwise ∇x² at θ + w_n, and (x²(θ + w_n) − x²(θ))·w_n/σ² (Suh
    /// et al.'s baseline: the noise-free value).
    pub fn samples(&self, theta: f32, noise: Tensor<1>, sigma: f32) -> GradientSamples {
        let [n] = noise.dims();
        let device = noise.device();
        let x = (noise.clone() + theta).detach().require_grad();
        let values = self.reward(x.clone());
        let grads = values.clone().sum().backward();
        let first = x
            .grad(&grads)
            .map_or_else(|| Tensor::zeros([n], &device), |g| g.to_device(&device));
        let values = values.detach();
        let base = self.reward(Tensor::from_floats([theta], &device)).detach();
        let zeroth = (values.clone() - base) * noise.detach() / (sigma * sigma);
        GradientSamples {
            values,
            first: first.reshape([n, 1]),
            zeroth: zeroth.reshape([n, 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// θ = 0.2: lands at 2·sin 0.2·cos 0.2/9.81 = 0.0397 (before the wall); θ = 0.4: would land
    /// at 0.0731, but its height at the wall is 0.06·tan 0.4 − 9.81·0.0036/(2·cos² 0.4) =
    /// 0.00455 ≤ 0.02: stopped at 0.06; θ = 0.7: height 0.02035 > 0.02, lands at 0.1005.
    /// The pathwise gradient is 0 on the wall and 2x·dx/dθ elsewhere.
    #[test]
    fn landing_distances_and_gradients_match_hand_values() {
        let d = Device::flex().autodiff();
        let ball = BallWithWall::default();
        let th = Tensor::<1>::from_floats([0.2, 0.4, 0.7], &d).require_grad();
        let x = ball.distance(th.clone());
        let xs = x.clone().into_data().try_to_vec::<f32>().unwrap();
        let land = |t: f32| 2.0 * t.sin() * t.cos() / 9.81;
        assert!(
            (xs[0] - land(0.2)).abs() < 1e-7 && (xs[1] - 0.06).abs() < 1e-7,
            "{xs:?}"
        );
        assert!((xs[2] - land(0.7)).abs() < 1e-7, "{xs:?}");
        let g = ball.reward(th.clone()).sum().backward();
        let gs = th
            .grad(&g)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let dland = |t: f32| 2.0 * (2.0 * t).cos() / 9.81;
        assert!(
            (gs[0] - 2.0 * land(0.2) * dland(0.2)).abs() < 1e-6,
            "{gs:?}"
        );
        assert_eq!(gs[1], 0.0);
        assert!(
            (gs[2] - 2.0 * land(0.7) * dland(0.7)).abs() < 1e-6,
            "{gs:?}"
        );
    }
}
