//! The engine's view of control episodes: time steps are the `steps` axis, so PPO's update and
//! GAE's critic are `ember-train`'s, unchanged.

use crate::net::{GaussianPolicy, ValueNet};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_train::{Actor, Critic, Replicate, Scored};

/// What the policy and the critic read of a batch of episodes (or of segments of them: each
/// step is scored on its own, so rows may be any cut of the episodes).
#[derive(Debug, Clone)]
pub struct ControlExperience {
    /// `[rows, steps, obs]`.
    pub obs: Tensor<3>,
    /// `[rows, steps, act]` the actions taken.
    pub actions: Tensor<3>,
}

impl ControlExperience {
    /// The experience cut into rows of `len` steps (`steps` must be a multiple of `len`).
    pub fn segments(&self, len: usize) -> Self {
        let cut = |t: &Tensor<3>| {
            let [r, s, k] = t.dims();
            t.clone().reshape([r * s / len, len, k])
        };
        Self {
            obs: cut(&self.obs),
            actions: cut(&self.actions),
        }
    }

    fn rows(&self, rows: &[usize]) -> (Tensor<2>, Tensor<2>, [usize; 2]) {
        let device = self.obs.device();
        let v: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(v, [rows.len()]), &device);
        let [_, steps, o] = self.obs.dims();
        let [_, _, a] = self.actions.dims();
        let n = rows.len() * steps;
        let obs = self.obs.clone().select(0, idx.clone()).reshape([n, o]);
        let act = self.actions.clone().select(0, idx).reshape([n, a]);
        (obs, act, [rows.len(), steps])
    }
}

impl Replicate for ControlExperience {
    fn to_device(&self, device: &Device) -> Self {
        Self {
            obs: self.obs.clone().to_device(device),
            actions: self.actions.clone().to_device(device),
        }
    }
}

impl Actor for GaussianPolicy {
    type Experience = ControlExperience;

    /// log π(a_t|s_t) of every step of `rows`; the entropy is the same in every state.
    fn score(&self, experience: &ControlExperience, rows: &[usize], with_entropy: bool) -> Scored {
        let (obs, actions, shape) = experience.rows(rows);
        let log_probs = self.log_prob(obs, actions).reshape(shape);
        let entropy = with_entropy.then(|| self.entropy().reshape([1, 1]).expand(shape));
        Scored {
            recompute: None,
            log_probs,
            entropy,
            kl: None,
        }
    }
}

impl Critic for ValueNet {
    type Experience = ControlExperience;

    fn values(&self, experience: &ControlExperience, rows: &[usize]) -> Tensor<2> {
        let (obs, _, shape) = experience.rows(rows);
        self.value(obs).reshape(shape)
    }
}
