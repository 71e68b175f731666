//! Gradients through the simulator for a closed-loop policy: episodes with Gaussian noise on
//! every action, u_t = μ_θ(s_t) + w_t (Suh et al. 2022, §2), run on an autodiff device so that
//! the return's derivative by each action (the total one, through the dynamics and the
//! policy's later reactions) is the first-order sample ĝ₁ = ∂R/∂w_t, beside the zeroth-order
//! sample ĝ₀ = (G_t − b_t)·w_t/σ² (G_t the reward-to-go, b_t that of the noise-free episode
//! from the same initial state: Suh et al.'s f(θ, 0) baseline, per step). Both estimate
//! ∂E[R]/∂μ_t; [`policy_surrogate`] carries any mixture of them to θ (the vector-Jacobian
//! product through the policy network that IVW-H uses).

use crate::env::Env;
use crate::net::GaussianPolicy;
use crate::rollout::rollout;
use burn::module::Module;
use burn::tensor::{Distribution, Tensor};

/// Action-space gradient samples of a batch of episodes, `[n, steps, act]` each.
#[derive(Debug, Clone)]
pub struct PathwiseSamples {
    /// `[n]` each episode's return R.
    pub returns: Tensor<1>,
    /// ĝ₁ = ∂R/∂u_t.
    pub first: Tensor<3>,
    /// ĝ₀ = (G_t − b_t)·w_t/σ².
    pub zeroth: Tensor<3>,
    /// `[n, steps, obs]` the observations (detached).
    pub obs: Tensor<3>,
    /// `[n, steps]` G_t − b_t (the zeroth-order estimator's per-step advantage).
    pub advantages: Tensor<2>,
    /// `[n, steps, act]` the actions taken (detached).
    pub actions: Tensor<3>,
}

/// Σ_{k ≥ t} r_k. # Shapes `[n, steps]` → `[n, steps]`.
pub fn reward_to_go(rewards: Tensor<2>) -> Tensor<2> {
    rewards.flip([1]).cumsum(1).flip([1])
}

/// Episodes of `steps` steps from `state` with action noise σ, on `policy`'s (autodiff)
/// device: both estimators' per-step samples.
pub fn pathwise_samples(
    policy: &GaussianPolicy,
    env: &Env,
    state: Tensor<2>,
    steps: usize,
    sigma: f32,
) -> PathwiseSamples {
    let [n, _] = state.dims();
    let device = state.device();
    let act = policy.act_dim();
    let noise =
        Tensor::<3>::random([n, steps, act], Distribution::Normal(0.0, 1.0), &device) * sigma;
    let w = noise.clone().require_grad();
    let (mut s, mut alive) = (state.clone(), Tensor::<1>::ones([n], &device));
    let (mut obs, mut actions, mut rewards) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..steps {
        let o = env.observe(s.clone());
        let u = policy.mean(o.clone()) + w.clone().narrow(1, t, 1).reshape([n, act]);
        let tr = env.step(s.clone(), u.clone());
        let keep = alive.clone().reshape([n, 1]);
        s = tr.state * keep.clone() + s * keep.neg().add_scalar(1.0);
        rewards.push(tr.reward * alive.clone());
        alive = alive * tr.terminated.neg().add_scalar(1.0);
        obs.push(o.detach());
        actions.push(u.detach());
    }
    let rewards = Tensor::stack::<2>(rewards, 1);
    let returns = rewards.clone().sum_dim(1).reshape([n]);
    // + 0·Σw: a return that does not depend on the actions (a reward that only counts steps
    // alive) still has a graph, and its first-order samples are 0.
    let grads = (returns.clone().sum() + w.clone().sum() * 0.0).backward();
    let first = w.grad(&grads).map_or_else(
        || Tensor::zeros([n, steps, act], &device),
        |g| g.to_device(&device),
    );
    let base = rollout(
        &policy.clone().no_grad(),
        None,
        env,
        state.detach(),
        steps,
        false,
    );
    let advantages = reward_to_go(rewards.detach()) - reward_to_go(base.rewards.detach());
    let zeroth = noise * advantages.clone().reshape([n, steps, 1]) / (sigma * sigma);
    PathwiseSamples {
        returns: returns.detach(),
        first,
        zeroth,
        obs: Tensor::stack(obs, 1),
        advantages,
        actions: Tensor::stack(actions, 1),
    }
}

/// −(1/n)·Σ_{n,t,a} ĝ_{n,t,a}·μ_θ(s_{n,t})_a with ĝ held constant: its gradient by θ is minus
/// the mixture's policy gradient (the chain rule's last factor, ∂μ_θ(s_t)/∂θ at the visited
/// states), so minimising it ascends the return. # Shapes `g` `[n, steps, act]` → `[1]`.
pub fn policy_surrogate(policy: &GaussianPolicy, obs: Tensor<3>, g: Tensor<3>) -> Tensor<1> {
    let [n, steps, o] = obs.dims();
    let [_, _, a] = g.dims();
    let mu = policy
        .mean(obs.reshape([n * steps, o]))
        .reshape([n, steps, a]);
    (mu * g.detach()).sum().neg() / n as f32
}
