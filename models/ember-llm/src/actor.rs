//! The LLM as an [`Actor`] of the trainer: its steps are response tokens.

use crate::model::Llama;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_train::{Actor, Replicate, Scored};

/// Sequences (prompt + response) of one RL step, on the training device.
#[derive(Debug, Clone)]
pub struct LlmExperience {
    /// `[rows, prompt_len + response_len]` tokens.
    pub tokens: Tensor<2, Int>,
    /// `[rows, prompt_len + response_len]` mask.
    pub mask: Tensor<2>,
    /// Response columns at the end of each row.
    pub response_len: usize,
    /// Sampling temperature (log-probs are scored at the same temperature).
    pub temperature: f32,
    /// Score with LoRA adapters off (the reference policy).
    pub adapters: bool,
}

impl LlmExperience {
    /// Log-probs `[rows, response_len]` of the response tokens of all rows under `model`.
    pub fn score_all(&self, model: &Llama) -> Tensor<2> {
        let rows: Vec<usize> = (0..self.tokens.dims()[0]).collect();
        model.score(self, &rows, false).log_probs
    }

    /// [`score_all`](Self::score_all) in chunks of `chunk` rows (0: all at once), so that only
    /// one chunk's activations are alive at a time; the same values.
    pub fn score_all_chunked(&self, model: &Llama, chunk: usize) -> Tensor<2> {
        let n = self.tokens.dims()[0];
        if chunk == 0 || chunk >= n {
            return self.score_all(model);
        }
        let rows: Vec<usize> = (0..n).collect();
        Tensor::cat(
            rows.chunks(chunk)
                .map(|c| model.score(self, c, false).log_probs)
                .collect(),
            0,
        )
    }
}

impl Replicate for LlmExperience {
    fn to_device(&self, device: &Device) -> Self {
        Self {
            tokens: self.tokens.clone().to_device(device),
            mask: self.mask.clone().to_device(device),
            ..self.clone()
        }
    }
}

impl Actor for Llama {
    type Experience = LlmExperience;

    fn score(&self, exp: &LlmExperience, rows: &[usize], with_entropy: bool) -> Scored {
        let device = exp.tokens.device();
        let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &device);
        let tokens = exp.tokens.clone().select(0, idx.clone());
        let mask = exp.mask.clone().select(0, idx);
        let (log_probs, entropy) = self.last_log_probs(
            tokens,
            mask,
            exp.response_len,
            exp.temperature,
            with_entropy,
            exp.adapters,
        );
        Scored {
            log_probs,
            entropy,
            kl: None,
        }
    }
}
