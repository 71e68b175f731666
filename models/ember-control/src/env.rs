//! Batched environments whose dynamics are burn tensor functions: a batch of episodes steps in
//! one call on the device, and autodiff reaches through a step (the pathwise gradient of a
//! differentiable simulator). Each follows its gymnasium reference step for step
//! (`scripts/make_control_fixtures.py`, `tests/control.rs`).

use crate::error::check;
use burn::tensor::{Device, Tensor, TensorData};
use ember_engine::SplitMix64;
use serde::{Deserialize, Serialize};
use std::f32::consts::PI;

/// An environment's name in a recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvName {
    /// [`Pendulum`].
    Pendulum,
    /// [`CartPole`].
    CartPole,
}

/// gymnasium `Pendulum-v1`: swing a pendulum up and hold it, torque-limited. State (θ, θ̇),
/// observation (cos θ, sin θ, θ̇), action the torque clipped to ±`max_torque`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pendulum {
    /// Gravity (gymnasium's default 10).
    pub g: f32,
    /// Mass.
    pub m: f32,
    /// Length.
    pub l: f32,
    /// Time step.
    pub dt: f32,
    /// |θ̇| bound.
    pub max_speed: f32,
    /// |u| bound.
    pub max_torque: f32,
    /// Viscous joint friction b: a torque −b·θ̇ (0 in the reference).
    pub friction: f32,
}

impl Default for Pendulum {
    fn default() -> Self {
        Self {
            g: 10.0,
            m: 1.0,
            l: 1.0,
            dt: 0.05,
            max_speed: 8.0,
            max_torque: 2.0,
            friction: 0.0,
        }
    }
}

/// gymnasium `CartPole-v1` (Barto, Sutton & Anderson 1983, Euler integration) with a
/// continuous force: the action a is clipped to ±1 and the force is `force_mag`·a (gymnasium's
/// two actions are a = ±1). Reward 1 per step up to and including the one that ends the
/// episode (|x| > 2.4 or |θ| > 12°). State and observation (x, ẋ, θ, θ̇).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CartPole {
    /// Gravity.
    pub gravity: f32,
    /// Cart mass.
    pub masscart: f32,
    /// Pole mass.
    pub masspole: f32,
    /// Half the pole's length.
    pub length: f32,
    /// Force of a = 1.
    pub force_mag: f32,
    /// Time step.
    pub tau: f32,
    /// Viscous cart friction b: a force −b·ẋ on the cart (0 in the reference).
    pub friction: f32,
}

impl Default for CartPole {
    fn default() -> Self {
        Self {
            gravity: 9.8,
            masscart: 1.0,
            masspole: 0.1,
            length: 0.5,
            force_mag: 10.0,
            tau: 0.02,
            friction: 0.0,
        }
    }
}

/// One step of a batch: the next state, each episode's reward and whether it ended.
#[derive(Debug, Clone)]
pub struct Transition {
    /// `[n, state]`.
    pub state: Tensor<2>,
    /// `[n]`.
    pub reward: Tensor<1>,
    /// `[n]` 1 where the episode ended at this step (termination, not the time limit).
    pub terminated: Tensor<1>,
}

/// A batched environment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Env {
    /// Pendulum swing-up.
    Pendulum(Pendulum),
    /// Cart-pole with a continuous force.
    CartPole(CartPole),
}

/// Column `i` of `[n, k]` as `[n, 1]`.
fn col(t: &Tensor<2>, i: usize) -> Tensor<2> {
    t.clone().narrow(1, i, 1)
}

impl Env {
    /// With viscous friction `b` (≥ 0; see [`Pendulum::friction`], [`CartPole::friction`]).
    ///
    /// # Errors
    /// A coefficient that is not finite and ≥ 0.
    pub fn with_friction(self, b: f32) -> crate::Result<Self> {
        check(
            "env.friction",
            b,
            b.is_finite() && b >= 0.0,
            "must be finite and >= 0",
        )?;
        Ok(match self {
            Self::Pendulum(p) => Self::Pendulum(Pendulum { friction: b, ..p }),
            Self::CartPole(c) => Self::CartPole(CartPole { friction: b, ..c }),
        })
    }

    /// The environment `name` with its reference constants, the pole's (or pendulum's) mass
    /// scaled by `mass` (the cart's stays: RARL varies the pendulum's mass, Pinto et al. 2017
    /// §4.4) and lengths by `length` (1 = the reference).
    ///
    /// # Errors
    /// A multiplier that is not finite and positive.
    pub fn new(name: EnvName, mass: f32, length: f32) -> crate::Result<Self> {
        let ok = |v: f32| v.is_finite() && v > 0.0;
        check("env.mass", mass, ok(mass), "must be finite and > 0")?;
        check("env.length", length, ok(length), "must be finite and > 0")?;
        Ok(match name {
            EnvName::Pendulum => {
                let p = Pendulum::default();
                Self::Pendulum(Pendulum {
                    m: p.m * mass,
                    l: p.l * length,
                    ..p
                })
            }
            EnvName::CartPole => {
                let c = CartPole::default();
                Self::CartPole(CartPole {
                    masscart: c.masscart,
                    masspole: c.masspole * mass,
                    length: c.length * length,
                    ..c
                })
            }
        })
    }

    /// Observation width.
    pub fn obs_dim(&self) -> usize {
        match self {
            Self::Pendulum(_) => 3,
            Self::CartPole(_) => 4,
        }
    }

    /// Action width.
    pub fn act_dim(&self) -> usize {
        1
    }

    /// The reference's time limit (gymnasium's `TimeLimit`): 200 and 500 steps.
    pub fn time_limit(&self) -> usize {
        match self {
            Self::Pendulum(_) => 200,
            Self::CartPole(_) => 500,
        }
    }

    /// `n` initial states drawn from `rng` as the reference's `reset` draws them:
    /// θ ~ U(−π, π), θ̇ ~ U(−1, 1) for the pendulum; each of the four ~ U(−0.05, 0.05) for the
    /// cart-pole. # Shapes → `[n, state]`.
    pub fn reset(&self, n: usize, rng: &mut SplitMix64, device: &Device) -> Tensor<2> {
        let highs: &[f64] = match self {
            Self::Pendulum(_) => &[std::f64::consts::PI, 1.0],
            Self::CartPole(_) => &[0.05; 4],
        };
        let v: Vec<f32> = (0..n)
            .flat_map(|_| highs.to_vec())
            .map(|h| rng.uniform(-h, h) as f32)
            .collect();
        Tensor::from_data(TensorData::new(v, [n, highs.len()]), device)
    }

    /// The observation of each state. # Shapes `[n, state]` → `[n, obs]`.
    pub fn observe(&self, state: Tensor<2>) -> Tensor<2> {
        match self {
            Self::Pendulum(_) => {
                let th = col(&state, 0);
                Tensor::cat(vec![th.clone().cos(), th.sin(), col(&state, 1)], 1)
            }
            Self::CartPole(_) => state,
        }
    }

    /// One step of every episode. # Shapes `state` `[n, state]`, `action` `[n, act]`.
    pub fn step(&self, state: Tensor<2>, action: Tensor<2>) -> Transition {
        self.step_with(state, action, None)
    }

    /// One step with a disturbance: a force (horizontal, vertical) `[n, 2]` applied at the
    /// centre of the pole (RARL's adversary on InvertedPendulum, Pinto et al. 2017 §4.1: "a 2D
    /// force on the center of pendulum"), entering the equations of motion as the generalised
    /// forces Q_θ = d·(F_h·cos θ − F_v·sin θ) (d the pivot-to-centre distance) and, on the
    /// cart, Q_x = F_h.
    pub fn step_with(
        &self,
        state: Tensor<2>,
        action: Tensor<2>,
        force: Option<Tensor<2>>,
    ) -> Transition {
        match self {
            Self::Pendulum(p) => p.step(state, action, force),
            Self::CartPole(c) => c.step(state, action, force),
        }
    }

    /// The disturbance's width (a planar force).
    pub fn force_dim(&self) -> usize {
        2
    }
}

/// ((x + π) mod 2π) − π, the reference's `angle_normalize`, as x − 2π·⌊(x + π)/2π⌋.
fn angle_normalize(x: Tensor<2>) -> Tensor<2> {
    let turns = x.clone().add_scalar(PI).div_scalar(2.0 * PI).floor();
    x - turns * (2.0 * PI)
}

/// Q_θ = d·(F_h·cos θ − F_v·sin θ): the generalised force on the angle of a force
/// (F_h, F_v) `[n, 2]` applied at distance d from the pivot (θ from the upright, towards +x).
fn centre_torque(theta: &Tensor<2>, force: &Tensor<2>, d: f32) -> Tensor<2> {
    (col(force, 0) * theta.clone().cos() - col(force, 1) * theta.clone().sin()) * d
}

impl Pendulum {
    /// gymnasium `PendulumEnv.step`: cost = norm(θ)² + 0.1·θ̇² + 0.001·u²,
    /// θ̇' = clip(θ̇ + (3g/(2l)·sin θ + 3/(m l²)·u)·dt, ±max_speed), θ' = θ + θ̇'·dt.
    /// With friction, the torque −b·θ̇ and the disturbance's Q_θ join u in the angular
    /// acceleration (the pendulum's inertia about the pivot is m·l²/3).
    fn step(&self, state: Tensor<2>, action: Tensor<2>, force: Option<Tensor<2>>) -> Transition {
        let [n, _] = state.dims();
        let (th, thdot) = (col(&state, 0), col(&state, 1));
        let u = col(&action, 0).clamp(-self.max_torque, self.max_torque);
        let cost = angle_normalize(th.clone()).powi_scalar(2)
            + thdot.clone().powi_scalar(2) * 0.1
            + u.clone().powi_scalar(2) * 0.001;
        let mut torque = u;
        if self.friction != 0.0 {
            torque = torque - thdot.clone() * self.friction;
        }
        if let Some(f) = force {
            torque = torque + centre_torque(&th, &f, 0.5 * self.l);
        }
        let acc = th.clone().sin() * (3.0 * self.g / (2.0 * self.l))
            + torque * (3.0 / (self.m * self.l * self.l));
        let newthdot = (thdot + acc * self.dt).clamp(-self.max_speed, self.max_speed);
        let newth = th + newthdot.clone() * self.dt;
        Transition {
            state: Tensor::cat(vec![newth, newthdot], 1),
            reward: cost.neg().reshape([n]),
            terminated: Tensor::zeros([n], &state.device()),
        }
    }
}

impl CartPole {
    /// gymnasium `CartPoleEnv.step` (Euler), force = force_mag·clip(a, ±1). Friction adds
    /// −b·ẋ to the cart's force; the disturbance adds F_h to it and Q_θ/(m_p·l) to the pole's
    /// equation (from the Lagrangian of cart and pole, whose inertia about its centre is
    /// m_p·l²/3, l half the pole's length).
    fn step(&self, state: Tensor<2>, action: Tensor<2>, dist: Option<Tensor<2>>) -> Transition {
        let [n, _] = state.dims();
        let (x, x_dot) = (col(&state, 0), col(&state, 1));
        let (theta, theta_dot) = (col(&state, 2), col(&state, 3));
        let mut force = col(&action, 0).clamp(-1.0, 1.0) * self.force_mag;
        if self.friction != 0.0 {
            force = force - x_dot.clone() * self.friction;
        }
        let q_theta = dist.map(|f| {
            force = force.clone() + col(&f, 0);
            centre_torque(&theta, &f, self.length) / (self.masspole * self.length)
        });
        let total = self.masscart + self.masspole;
        let pml = self.masspole * self.length;
        let (cos, sin) = (theta.clone().cos(), theta.clone().sin());
        let temp = (force + theta_dot.clone().powi_scalar(2) * sin.clone() * pml) / total;
        let denom = (cos.clone().powi_scalar(2) * (-self.masspole / total)).add_scalar(4.0 / 3.0)
            * self.length;
        let mut num = sin * self.gravity - cos.clone() * temp.clone();
        if let Some(q) = q_theta {
            num = num + q;
        }
        let thetaacc = num / denom;
        let xacc = temp - thetaacc.clone() * cos * (pml / total);
        let x2 = x + x_dot.clone() * self.tau;
        let x_dot2 = x_dot + xacc * self.tau;
        let theta2 = theta + theta_dot.clone() * self.tau;
        let theta_dot2 = theta_dot + thetaacc * self.tau;
        let limit = 12.0 * 2.0 * PI / 360.0;
        let out = x2.clone().abs().greater_elem(2.4).float()
            + theta2.clone().abs().greater_elem(limit).float();
        Transition {
            state: Tensor::cat(vec![x2, x_dot2, theta2, theta_dot2], 1),
            reward: Tensor::ones([n], &state.device()),
            terminated: out.clamp_max(1.0).reshape([n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-worked pendulum step: θ = π/2, θ̇ = 1, u = 3 (clipped to 2):
    /// cost = (π/2)² + 0.1 + 0.004; θ̇' = 1 + (15·1 + 3·2)·0.05 = 2.05; θ' = π/2 + 0.1025.
    #[test]
    fn pendulum_step_matches_hand_worked_values() {
        let d = Device::flex();
        let env = Env::new(EnvName::Pendulum, 1.0, 1.0).unwrap();
        let s = Tensor::<2>::from_floats([[PI / 2.0, 1.0]], &d);
        let t = env.step(s, Tensor::from_floats([[3.0]], &d));
        let st: Vec<f32> = t.state.into_data().try_to_vec::<f32>().unwrap();
        let r: f32 = t.reward.into_scalar();
        assert!((st[1] - 2.05).abs() < 1e-6 && (st[0] - (PI / 2.0 + 0.1025)).abs() < 1e-6);
        assert!((r + (PI * PI / 4.0 + 0.104)).abs() < 1e-5, "{r}");
        // angle_normalize wraps to [−π, π): 3π → −π… (the reference's Python `%` too).
        let a = angle_normalize(Tensor::from_floats([[3.5 * PI, -3.5 * PI, 0.25]], &d));
        let a: Vec<f32> = a.into_data().try_to_vec::<f32>().unwrap();
        assert!(
            (a[0] + 0.5 * PI).abs() < 1e-5 && (a[1] - 0.5 * PI).abs() < 1e-5,
            "{a:?}"
        );
        assert!((a[2] - 0.25).abs() < 1e-7);
    }

    /// Hand-worked cart-pole step from rest, upright, a = 1: temp = 10/1.1,
    /// θ̈ = −temp/(0.5·(4/3 − 0.1/1.1)), ẍ = temp − 0.05·θ̈/1.1; positions unchanged (Euler).
    #[test]
    fn cart_pole_step_matches_hand_worked_values() {
        let d = Device::flex();
        let env = Env::new(EnvName::CartPole, 1.0, 1.0).unwrap();
        let s = Tensor::<2>::zeros([1, 4], &d);
        let t = env.step(s, Tensor::from_floats([[2.0]], &d));
        let st: Vec<f32> = t.state.into_data().try_to_vec::<f32>().unwrap();
        let temp = 10.0f32 / 1.1;
        let thacc = -temp / (0.5 * (4.0 / 3.0 - 0.1 / 1.1));
        let xacc = temp - 0.05 * thacc / 1.1;
        let want = [0.0, 0.02 * xacc, 0.0, 0.02 * thacc];
        for (g, w) in st.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{st:?} vs {want:?}");
        }
        assert_eq!(t.terminated.into_scalar::<f32>(), 0.0);
        let far = Tensor::<2>::from_floats([[2.39, 1.0, 0.0, 0.0], [0.0, 0.0, -0.2, -1.0]], &d);
        let t = env.step(far, Tensor::zeros([2, 1], &d));
        let ended: Vec<f32> = t.terminated.into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(ended, vec![1.0, 1.0]);
        assert!(Env::new(EnvName::CartPole, 0.0, 1.0).is_err());
    }

    /// Hand-worked disturbances from rest, upright, no action. Pendulum, F_h = 1 at the centre
    /// (l/2 = 0.5): Q_θ = 0.5, θ̈ = 3/(m l²)·0.5 = 1.5, θ̇' = 0.075. Cart-pole, F_h = 1:
    /// temp = 1/1.1, Q_θ/(m_p l) = (0.5·1)/(0.1·0.5) = 10, θ̈ = (10 − temp)/(0.5·(4/3 − 0.1/1.1)),
    /// ẍ = temp − 0.05·θ̈/1.1. Friction b = 2 on a cart moving at ẋ = 1 is a force of −2.
    #[test]
    fn disturbances_and_friction_match_hand_worked_values() {
        let d = Device::flex();
        let f = Tensor::<2>::from_floats([[1.0, 0.0]], &d);
        let env = Env::new(EnvName::Pendulum, 1.0, 1.0).unwrap();
        let t = env.step_with(
            Tensor::zeros([1, 2], &d),
            Tensor::zeros([1, 1], &d),
            Some(f.clone()),
        );
        let st = t.state.into_data().try_to_vec::<f32>().unwrap();
        assert!((st[1] - 0.075).abs() < 1e-6, "{st:?}");
        let env = Env::new(EnvName::CartPole, 1.0, 1.0).unwrap();
        let t = env.step_with(
            Tensor::zeros([1, 4], &d),
            Tensor::zeros([1, 1], &d),
            Some(f),
        );
        let st = t.state.into_data().try_to_vec::<f32>().unwrap();
        let temp = 1.0f32 / 1.1;
        let thacc = (10.0 - temp) / (0.5 * (4.0 / 3.0 - 0.1 / 1.1));
        let xacc = temp - 0.05 * thacc / 1.1;
        assert!((st[3] - 0.02 * thacc).abs() < 1e-5 && (st[1] - 0.02 * xacc).abs() < 1e-6);
        let env = env.with_friction(2.0).unwrap();
        let moving = Tensor::<2>::from_floats([[0.0, 1.0, 0.0, 0.0]], &d);
        let a = Tensor::<2>::from_floats([[-0.2]], &d);
        let with = env.step(moving.clone(), Tensor::zeros([1, 1], &d)).state;
        let without = Env::new(EnvName::CartPole, 1.0, 1.0)
            .unwrap()
            .step(moving, a)
            .state;
        let (w, wo) = (
            with.into_data().try_to_vec::<f32>().unwrap(),
            without.into_data().try_to_vec::<f32>().unwrap(),
        );
        for (x, y) in w.iter().zip(&wo) {
            assert!((x - y).abs() < 1e-6, "{w:?} vs {wo:?}");
        }
        assert!(env.with_friction(-1.0).is_err());
    }
}
