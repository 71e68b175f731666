//! PLoP, precise LoRA placement (Hayou, Ghosh & Yu 2025, arXiv 2506.20629): score each
//! projection type (q, k, v, o, gate, up, down) of a pretrained model by its normalised feature
//! norm (NFN) on the fine-tuning task's inputs, and put the adapters on the types with the
//! lowest scores, the modules least aligned with the task's data.
//!
//! The paper defines NFN(W, z) = ‖W z‖ / ‖W z̃‖ with z̃ a random vector of z's dimension and norm
//! (centred Gaussian coordinates). We use the expectation of the random denominator's square
//! instead of one draw: for z̃ uniform on the sphere of radius ‖z‖, E‖W z̃‖² = ‖W‖²_F ‖z‖²/d_in,
//! so NFN = ‖W z‖ √d_in / (‖W‖_F ‖z‖): deterministic, and equal to the paper's ratio up to the
//! draw's fluctuation (which vanishes with width). A module type's score is the mean over the
//! task's tokens (padding excluded) and then over layers. Biases (Qwen2's q, k, v) are left out:
//! the score is about W.

use crate::error::{LlmError, Result};
use crate::lora::TARGETS;
use crate::model::Llama;
use burn::tensor::{FloatDType, Int, Tensor};

/// Per-row NFN of a projection with weight `w` `[d_in, d_out]` (burn's layout: y = z·w) on
/// inputs `z` `[rows, d_in]`: ‖z·w‖ √d_in / (‖w‖_F ‖z‖) (PLoP's NFN with the random input's
/// expected squared norm). Rows with ‖z‖ = 0 score 0.
pub fn nfn_rows(w: Tensor<2>, z: Tensor<2>) -> Tensor<1> {
    // In f32 whatever the model's precision (bf16 activations meet f32 weights here).
    let (w, z) = (w.cast(FloatDType::F32), z.cast(FloatDType::F32));
    let [rows, d_in] = z.dims();
    let out = z.clone().matmul(w.clone()).square().sum_dim(1).sqrt();
    let zn = z.square().sum_dim(1).sqrt();
    let wf = w.square().sum().sqrt().reshape([1, 1]);
    let den = (zn * wf).clamp_min(1e-30);
    (out * (d_in as f64).sqrt() / den).reshape([rows])
}

/// NFN scores of a model on a set of inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct NfnScores {
    /// Mean NFN over the valid tokens, per layer, per projection type (in [`TARGETS`]' order).
    pub per_layer: Vec<[f64; 7]>,
    /// Valid tokens scored.
    pub tokens: usize,
}

impl NfnScores {
    /// Each projection type's score: the mean over layers of its per-layer means.
    pub fn by_type(&self) -> [f64; 7] {
        let mut out = [0.0; 7];
        let n = self.per_layer.len().max(1) as f64;
        for l in &self.per_layer {
            for (o, x) in out.iter_mut().zip(l) {
                *o += x / n;
            }
        }
        out
    }

    /// The `count` projection types with the lowest scores (ties in [`TARGETS`]' order), in
    /// [`TARGETS`]' order.
    pub fn choose(&self, count: usize) -> Result<Vec<String>> {
        if count == 0 || count > TARGETS.len() {
            return Err(LlmError::Config {
                field: "lora.plop_count",
                reason: format!("must be in 1..={} (got {count})", TARGETS.len()),
            });
        }
        let s = self.by_type();
        let mut idx: Vec<usize> = (0..TARGETS.len()).collect();
        idx.sort_by(|&a, &b| s[a].total_cmp(&s[b]).then(a.cmp(&b)));
        let mut pick = idx[..count].to_vec();
        pick.sort_unstable();
        Ok(pick.into_iter().map(|i| TARGETS[i].to_string()).collect())
    }
}

/// NFN scores of `model`'s base weights (adapters off) on `batches` of `(tokens [b, t], mask
/// [b, t])`: every projection's score summed over the valid tokens on the device, one host
/// read per batch.
pub fn nfn_scores(model: &Llama, batches: &[(Tensor<2, Int>, Tensor<2>)]) -> Result<NfnScores> {
    let layers = model.n_layers();
    let mut sums = vec![[0.0f64; 7]; layers];
    let mut tokens = 0usize;
    for (ids, mask) in batches {
        let [b, t] = ids.dims();
        let valid = mask.clone().reshape([b * t]);
        let mut parts: Vec<Tensor<1>> = Vec::with_capacity(layers * 7);
        model.visit_projection_inputs(ids.clone(), mask.clone(), &mut |_, _, lin, z| {
            let d = z.dims()[2];
            let r = nfn_rows(lin.weight.base(), z.clone().reshape([b * t, d]));
            parts.push((r * valid.clone()).sum());
        });
        // The token count last, read with the scores.
        parts.push(valid.sum());
        if parts.len() != layers * 7 + 1 {
            return Err(LlmError::Input(format!(
                "PLoP: expected {} projections, saw {}",
                layers * 7,
                parts.len() - 1
            )));
        }
        let host = Tensor::cat(parts, 0)
            .into_data()
            .try_into_vec_as::<f32>()
            .map_err(|e| LlmError::Input(format!("PLoP: reading the scores: {e:?}")))?;
        let (scores, n) = host.split_at(layers * 7);
        for (k, x) in scores.iter().enumerate() {
            sums[k / 7][k % 7] += f64::from(*x);
        }
        tokens += n.first().map_or(0, |x| x.round() as usize);
    }
    if tokens == 0 {
        return Err(LlmError::Input("PLoP: no valid tokens to score".into()));
    }
    let per_layer = sums
        .into_iter()
        .map(|l| l.map(|x| x / tokens as f64))
        .collect();
    Ok(NfnScores { per_layer, tokens })
}
