//! The LLM as an [`Actor`] of the trainer: its steps are response tokens.

use crate::model::{Llama, Scoring};
use crate::shared::SharedRows;
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

/// Rows of an experience prepared for one pass: the columns no row of the chunk uses (left
/// padding of the prompts, right padding of the responses) dropped, which changes no kept value
/// (masked keys get no attention weight, and the pass is causal), and the rows grouped by
/// prompt where the model shares prompts.
pub(crate) struct Chunk {
    pub(crate) tokens: Tensor<2, Int>,
    pub(crate) mask: Tensor<2>,
    /// Response columns kept.
    pub(crate) response_len: usize,
    /// Response columns of the experience.
    full: usize,
    pub(crate) shared: Option<SharedRows>,
}

/// The columns `lead..p + n` of `[rows, cols]` `mask` (host, row-major) that some row uses:
/// `lead` the first prompt column where any row's mask is 1 (at most `p − 1`), `n` the response
/// columns up to the last one any row uses (at least 1).
fn used_columns(mask: &[f32], cols: usize, p: usize) -> (usize, usize) {
    let rows = mask.chunks(cols.max(1));
    let (mut lead, mut last) = (p.saturating_sub(1), p);
    for r in rows {
        if let Some(c) = r[..p].iter().position(|m| *m != 0.0) {
            lead = lead.min(c);
        }
        if let Some(c) = r[p..].iter().rposition(|m| *m != 0.0) {
            last = last.max(p + c + 1);
        }
    }
    (lead, (last - p).max(1))
}

impl LlmExperience {
    /// `rows` of this experience as a [`Chunk`] for `model` (one host read of their mask).
    pub(crate) fn chunk(&self, model: &Llama, rows: &[usize]) -> Chunk {
        let device = self.tokens.device();
        let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &device);
        let mut tokens = self.tokens.clone().select(0, idx.clone());
        let mut mask = self.mask.clone().select(0, idx);
        let [b, t] = tokens.dims();
        let mut n = self.response_len;
        if n >= 1 && n < t {
            let p = t - n;
            if let Ok(host) = mask.clone().try_into_vec_as::<f32>() {
                let (lead, keep) = used_columns(&host, t, p);
                if lead > 0 || keep < n {
                    tokens = tokens.slice([0..b, lead..p + keep]);
                    mask = mask.slice([0..b, lead..p + keep]);
                    n = keep;
                }
            }
        }
        let t = tokens.dims()[1];
        let shared = (model.can_share() && n >= 1 && n < t)
            .then(|| SharedRows::split(tokens.clone(), mask.clone(), t - n))
            .flatten();
        Chunk {
            tokens,
            mask,
            response_len: n,
            full: self.response_len,
            shared,
        }
    }
}

impl Chunk {
    /// `x` `[rows, kept response columns]` padded with zeros to the experience's response length.
    pub(crate) fn pad(&self, x: Tensor<2>) -> Tensor<2> {
        let [b, n] = x.dims();
        if n >= self.full {
            return x;
        }
        let zeros = Tensor::<2>::zeros([b, self.full - n], &x.device());
        Tensor::cat(vec![x, zeros], 1)
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
        let c = exp.chunk(self, rows);
        let how = Scoring {
            temperature: exp.temperature,
            entropy: with_entropy,
            adapters: exp.adapters,
        };
        // A training pass (the model on an autodiff device) checkpoints its layers when asked.
        let checkpoint = self.embed_tokens.weight.device().is_autodiff() && self.checkpoints();
        let kept = |(scores, r)| (scores, Some(r));
        let (tokens, n) = (c.tokens.clone(), c.response_len);
        let ((log_probs, entropy), recompute) = match (&c.shared, checkpoint) {
            (Some(s), false) => (self.shared_log_probs(s, how), None),
            (Some(s), true) => kept(self.checkpointed_shared_log_probs(s, how)),
            (None, false) => (self.last_log_probs(tokens, c.mask.clone(), n, how), None),
            (None, true) => kept(self.checkpointed_last_log_probs(tokens, &c.mask, n, how)),
        };
        let (log_probs, entropy) = (c.pad(log_probs), entropy.map(|e| c.pad(e)));
        Scored {
            recompute,
            log_probs,
            entropy,
            kl: None,
        }
    }

    /// Each row's span, its first to its last valid column (prompt and response): the columns a
    /// pass over that row alone computes (one host read of the mask).
    fn row_tokens(&self, exp: &LlmExperience) -> Option<Vec<usize>> {
        let cols = exp.mask.dims()[1];
        let host = exp.mask.clone().try_into_vec_as::<f32>().ok()?;
        Some(row_spans(&host, cols))
    }

    fn shares_groups(&self) -> bool {
        self.can_share()
    }
}

/// Per row of a `[rows, cols]` host mask, last valid column − first valid column + 1 (0 for a
/// row without one).
fn row_spans(mask: &[f32], cols: usize) -> Vec<usize> {
    mask.chunks(cols.max(1))
        .map(|r| {
            let first = r.iter().position(|m| *m != 0.0);
            let last = r.iter().rposition(|m| *m != 0.0);
            first.zip(last).map_or(0, |(f, l)| l - f + 1)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{row_spans, used_columns};

    #[test]
    fn row_spans_run_from_the_first_to_the_last_valid_column() {
        let m = [
            0., 1., 1., 1., 0., 0., 0., 0., 1., 0., 1., 0., 0., 0., 0., 0., 0., 0.,
        ];
        assert_eq!(row_spans(&m, 6), vec![3, 3, 0]);
    }

    #[test]
    fn used_columns_drop_shared_padding_only() {
        // Prompt columns 0..3, response 3..6; row 0 starts at column 1, row 1 at 2; the last
        // response column any row uses is 4 (row 1), so column 5 goes.
        let m = [0., 1., 1., 1., 0., 0., 0., 0., 1., 1., 1., 0.];
        assert_eq!(used_columns(&m, 6, 3), (1, 2));
        // A response no row uses keeps one column; an empty prompt keeps its last column.
        let m = [0., 0., 0., 0., 0., 0.];
        assert_eq!(used_columns(&m, 6, 3), (2, 1));
        // A hole in the middle of a response is kept.
        let m = [1., 1., 1., 1., 0., 1.];
        assert_eq!(used_columns(&m, 6, 3), (0, 3));
    }
}
