//! Episodes of a Gaussian policy in a batched environment, all on the device: the noise is
//! drawn by the device's RNG (seed it first for a reproducible rollout), and nothing is read
//! back to the host until the caller asks for metrics.

use crate::env::Env;
use crate::gaussian::gaussian_log_prob;
use crate::net::GaussianPolicy;
use burn::tensor::{Distribution, Tensor};

/// A batch of episodes, `[n, steps]` unless said otherwise.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// `[n, steps, obs]` the observation each action was taken in.
    pub obs: Tensor<3>,
    /// `[n, steps, act]` the actions as sampled (before the environment clips them).
    pub actions: Tensor<3>,
    /// log π(a_t|s_t) under the sampling policy (0 for a deterministic rollout).
    pub log_probs: Tensor<2>,
    /// r_t (0 after the episode ended).
    pub rewards: Tensor<2>,
    /// 1 on the steps taken before the episode ended.
    pub mask: Tensor<2>,
    /// `[n, obs]` the observation after the last step.
    pub last_obs: Tensor<2>,
    /// `[n]` 1 where the episode was still running after the last step (cut by the time
    /// limit, so its return continues beyond the rollout).
    pub alive: Tensor<1>,
    /// The adversary's actions `[n, steps, force]` and log-probs, when one played.
    pub adversary: Option<(Tensor<3>, Tensor<2>)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// Hand-worked: rewards (1, 2, 3) and (4, 5, 6), the second episode ended, V(s_T) = 10,
    /// γ = 0.9, scale 0.5: the protagonist gets (0.5, 1, 1.5 + 9) and (2, 2.5, 3); the
    /// adversary (−0.5, −1, −1.5 + 9) and (−2, −2.5, −3) with its own critic's 10.
    #[test]
    fn learner_rewards_are_zero_sum_and_bootstrapped() {
        let d = Device::flex();
        let ro = Rollout {
            obs: Tensor::zeros([2, 3, 1], &d),
            actions: Tensor::zeros([2, 3, 1], &d),
            log_probs: Tensor::zeros([2, 3], &d),
            rewards: Tensor::from_floats([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &d),
            mask: Tensor::ones([2, 3], &d),
            last_obs: Tensor::zeros([2, 1], &d),
            alive: Tensor::from_floats([1.0, 0.0], &d),
            adversary: None,
        };
        let v = || Tensor::<1>::from_floats([10.0, 10.0], &d);
        let got = |side| {
            let t = ro.learner_rewards(side, v(), 0.9, 0.5);
            t.into_data().try_to_vec::<f32>().unwrap()
        };
        let want = [0.5, 1.0, 10.5, 2.0, 2.5, 3.0];
        for (g, w) in got(Side::Protagonist).iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        let want = [-0.5, -1.0, 7.5, -2.0, -2.5, -3.0];
        for (g, w) in got(Side::Adversary).iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
}

/// RARL's adversary: a Gaussian policy over a disturbance force at the pole's centre, each
/// component clipped to ±`max_force`.
#[derive(Debug, Clone, Copy)]
pub struct Adversary<'a> {
    /// ν(a|s), observing what the protagonist observes.
    pub policy: &'a GaussianPolicy,
    /// The bound of each force component.
    pub max_force: f32,
}

/// One player's action in observation `o`: sampled (with its log-prob, from the same mean)
/// or the mean.
fn act(policy: &GaussianPolicy, o: &Tensor<2>, sample: bool) -> (Tensor<2>, Tensor<1>) {
    let [n, _] = o.dims();
    let device = o.device();
    let mean = policy.mean(o.clone());
    if !sample {
        return (mean, Tensor::zeros([n], &device));
    }
    let log_std = policy.log_std();
    let [act] = log_std.dims();
    let z = Tensor::<2>::random([n, act], Distribution::Normal(0.0, 1.0), &device);
    let a = mean.clone() + z * log_std.clone().exp().reshape([1, act]);
    let lp = gaussian_log_prob(a.clone(), mean, log_std);
    (a, lp)
}

/// Which player a reward is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The protagonist: r.
    Protagonist,
    /// RARL's adversary: −r (zero-sum, Pinto et al. 2017 §3.2: r² = −r¹).
    Adversary,
}

impl Rollout {
    /// The learner's per-step rewards for GAE: its reward (r, or −r for the adversary) times
    /// `scale`, and on the last step of an episode the time limit cut, + γ·V(s_T) of the
    /// learner's critic (Stable-Baselines3's `handle_timeout_termination`: a cut is not an end).
    ///
    /// # Shapes
    /// `last_value` `[n]` → `[n, steps]`.
    pub fn learner_rewards(
        &self,
        side: Side,
        last_value: Tensor<1>,
        gamma: f32,
        scale: f32,
    ) -> Tensor<2> {
        let [n, h] = self.rewards.dims();
        let sign = match side {
            Side::Protagonist => 1.0,
            Side::Adversary => -1.0,
        };
        let r = self.rewards.clone() * (scale * sign);
        let boot = (last_value * self.alive.clone() * gamma).reshape([n, 1]);
        let last = r.clone().narrow(1, h - 1, 1) + boot;
        Tensor::cat(vec![r.narrow(1, 0, h - 1), last], 1)
    }

    /// Each episode's return Σ_t r_t. # Shapes → `[n]`.
    pub fn returns(&self) -> Tensor<1> {
        let [n, _] = self.rewards.dims();
        self.rewards.clone().sum_dim(1).reshape([n])
    }
}

/// Runs `steps` steps of every episode from `state` `[n, state]`: actions sampled from the
/// policy (and the adversary's, when one plays), or their means when `sample` is false. An
/// episode that ended keeps its last state and leaves the mask.
pub fn rollout(
    policy: &GaussianPolicy,
    adversary: Option<Adversary>,
    env: &Env,
    state: Tensor<2>,
    steps: usize,
    sample: bool,
) -> Rollout {
    let [n, _] = state.dims();
    let device = state.device();
    let (mut obs, mut actions, mut log_probs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rewards, mut masks) = (Vec::new(), Vec::new());
    let (mut adv_actions, mut adv_log_probs) = (Vec::new(), Vec::new());
    let (mut state, mut alive) = (state, Tensor::<1>::ones([n], &device));
    for _ in 0..steps {
        let o = env.observe(state.clone());
        let (a, lp) = act(policy, &o, sample);
        log_probs.push(lp);
        let force = adversary.map(|adv| {
            let (f, lp) = act(adv.policy, &o, sample);
            adv_actions.push(f.clone());
            adv_log_probs.push(lp);
            f.clamp(-adv.max_force, adv.max_force)
        });
        let t = env.step_with(state.clone(), a.clone(), force);
        let keep = alive.clone().reshape([n, 1]);
        state = t.state * keep.clone() + state * keep.neg().add_scalar(1.0);
        rewards.push(t.reward * alive.clone());
        masks.push(alive.clone());
        alive = alive * t.terminated.neg().add_scalar(1.0);
        obs.push(o);
        actions.push(a);
    }
    Rollout {
        obs: Tensor::stack(obs, 1),
        actions: Tensor::stack(actions, 1),
        log_probs: Tensor::stack(log_probs, 1),
        rewards: Tensor::stack(rewards, 1),
        mask: Tensor::stack(masks, 1),
        last_obs: env.observe(state),
        alive,
        adversary: adversary.map(|_| {
            (
                Tensor::stack(adv_actions, 1),
                Tensor::stack(adv_log_probs, 1),
            )
        }),
    }
}
