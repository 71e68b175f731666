//! Loss aggregation: how a `[batch, steps]` matrix of per-step losses becomes one scalar.
//!
//! Normalisers are those of the whole optimizer step ([`AggNorm`]), not of a micro-batch, so
//! that gradient accumulation over micro-batches gives the same gradient as one big batch
//! (verl `agg_loss` with `global_batch_info`).

use crate::error::{Result, check_config};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// The aggregation mode (verl `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum LossAgg {
    /// Σ_{i,t} l·m / N_tokens (DAPO, Yu et al. 2025, eq. 12).
    #[default]
    TokenMean,
    /// Σ_i [Σ_t l·m / Σ_t m] / N_seqs (the original GRPO, Shao et al. 2024, eq. 3).
    SeqMeanTokenMean,
    /// Σ_i Σ_t l·m / N_seqs.
    SeqMeanTokenSum,
    /// Σ_i Σ_t l·m / (N_seqs · C), C a fixed constant such as the maximum response length
    /// (Dr.GRPO, Liu et al. 2025, eq. 3).
    SeqMeanTokenSumNorm {
        /// The constant C.
        constant: f32,
    },
}

impl LossAgg {
    /// Checks the constant.
    pub fn validate(&self) -> Result<()> {
        if let LossAgg::SeqMeanTokenSumNorm { constant } = self {
            check_config(
                "loss_agg.constant",
                (*constant).into(),
                *constant > 0.0,
                "must be > 0",
            )?;
        }
        Ok(())
    }
}

/// Global normalisers of one optimizer step: the valid tokens and valid sequences summed over
/// every micro-batch that contributes to the step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggNorm {
    /// Valid steps (tokens) in the optimizer step.
    pub tokens: f32,
    /// Sequences with at least one valid step in the optimizer step.
    pub seqs: f32,
}

impl AggNorm {
    /// The normalisers of a single batch (one host read of two scalars).
    pub fn of_mask(mask: &Tensor<2>) -> Self {
        let [b, _] = mask.dims();
        let tokens = mask.clone().sum();
        let seqs = mask
            .clone()
            .sum_dim(1)
            .reshape([b])
            .greater_elem(0.0)
            .float()
            .sum();
        let both: Vec<f32> = Tensor::cat(vec![tokens, seqs], 0)
            .try_into_vec_as::<f32>()
            .expect("reading two counts back from the device");
        Self {
            tokens: both[0],
            seqs: both[1],
        }
    }

    /// Adds the counts of another micro-batch.
    pub fn merge(self, other: Self) -> Self {
        Self {
            tokens: self.tokens + other.tokens,
            seqs: self.seqs + other.seqs,
        }
    }
}

/// Aggregates `loss` `[batch, steps]` under `mask` into a scalar `[1]`.
pub fn aggregate(loss: Tensor<2>, mask: Tensor<2>, mode: LossAgg, norm: AggNorm) -> Tensor<1> {
    let tokens = norm.tokens.max(1.0);
    let seqs = norm.seqs.max(1.0);
    let masked = loss * mask.clone();
    match mode {
        LossAgg::TokenMean => masked.sum() / tokens,
        LossAgg::SeqMeanTokenMean => {
            let per_seq = masked.sum_dim(1) / mask.sum_dim(1).clamp_min(1.0);
            per_seq.sum() / seqs
        }
        LossAgg::SeqMeanTokenSum => masked.sum() / seqs,
        LossAgg::SeqMeanTokenSumNorm { constant } => masked.sum() / (seqs * constant),
    }
}
