//! PPO's critic for the LLM: the policy's transformer with a scalar value head on its
//! final-normed hidden states (verl's critic is a token-classification model with one label,
//! initialised from the policy's checkpoint; OpenRLHF's `CriticModel` likewise).

use crate::actor::LlmExperience;
use crate::model::Llama;
use burn::module::Module;
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor};
use ember_train::Critic;

/// A value model: `trunk` (a copy of the policy, LoRA adapters included, so a LoRA policy's
/// critic trains its own adapters and the head) and `head` `[d_model → 1]`.
#[derive(Module, Debug)]
pub struct ValueModel {
    /// The transformer.
    pub trunk: Llama,
    /// The value head.
    pub value_head: Linear,
}

impl ValueModel {
    /// A critic initialised from `policy`'s weights with a zero head (V = 0 until it learns;
    /// verl initialises the head randomly, a zero head gives the same start on every backend).
    pub fn from_policy(policy: Llama, device: &Device) -> Self {
        let d = policy.norm.gamma.val().dims()[0];
        let head = LinearConfig::new(d, 1)
            .with_initializer(Initializer::Zeros)
            .init(device);
        Self {
            trunk: policy,
            value_head: head,
        }
    }

    /// V(s) `[batch, n]` of the states before each of the last `n` tokens.
    ///
    /// # Shapes
    /// `tokens`, `mask` `[batch, seq]`, `1 <= n < seq`.
    pub fn values_of(&self, tokens: Tensor<2, Int>, mask: Tensor<2>, n: usize) -> Tensor<2> {
        let h = self.trunk.last_hidden(tokens, mask, n, true);
        let [b, n, _] = h.dims();
        self.value_head.forward(h).reshape([b, n])
    }
}

impl Critic for ValueModel {
    type Experience = LlmExperience;

    fn values(&self, exp: &LlmExperience, rows: &[usize]) -> Tensor<2> {
        let c = exp.chunk(&self.trunk, rows);
        let values = match &c.shared {
            Some(s) => {
                let h = self.trunk.shared_last_hidden(s, true);
                let [b, n, _] = h.dims();
                self.value_head.forward(h).reshape([b, n])
            }
            None => self.values_of(c.tokens.clone(), c.mask.clone(), c.response_len),
        };
        c.pad(values)
    }
}

impl LlmExperience {
    /// V(s) `[rows, response_len]` of every row under `critic`, in chunks of `chunk` rows (0:
    /// all at once).
    pub fn values_all(&self, critic: &ValueModel, chunk: usize) -> Tensor<2> {
        let n = self.tokens.dims()[0];
        let rows: Vec<usize> = (0..n).collect();
        let chunk = if chunk == 0 { n.max(1) } else { chunk };
        Tensor::cat(
            rows.chunks(chunk).map(|c| critic.values(self, c)).collect(),
            0,
        )
    }
}
