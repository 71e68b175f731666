//! Constrained decoding: a [`TokenConstraint`] names, before each step, the tokens each row may
//! draw (a grammar, a schema, or the symbolic computer of Neural Symbolic Machines, which
//! prunes the programs that cannot run). The sampler draws from the softmax over the allowed
//! tokens only and reports its log-probs; [`ConstrainedLlama`] scores the same distribution
//! in the update, from the masks the sampler used.
//!
//! The constraint runs on the host, so constrained decoding reads each step's tokens back (one
//! `[rows]` read per step); unconstrained generation keeps its stop checks every
//! `stop_check_every` steps. The masks are `[rows, steps, vocab]` booleans: meant for
//! vocabularies of thousands of tokens, not a 150k one.

use crate::decode::sample::{Generation, Prefilled, SamplingConfig, check_inputs, prefill};
use crate::decode::sample::{sample_rows, truncate};
use crate::error::{LlmError, Result};
use crate::model::{Llama, chosen_log_probs};
use burn::module::Module;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use ember_engine::SplitMix64;
use ember_molora::RouteCtx;
use ember_train::{Actor, Replicate, Scored};

/// The logit of a token a constraint removes: finite, so that `0 · logit` stays 0 in the
/// entropy, and far enough below any logit that its probability is exactly 0 in f32.
pub const MASKED_LOGIT: f32 = -1e9;

/// What a row may draw next.
pub trait TokenConstraint {
    /// The token ids row `row` (rows prompt-major, `cfg.n` per prompt) may draw after `drawn`,
    /// its tokens so far. Asked only while the row has not stopped; an empty answer is an
    /// error (a constraint ends a row by allowing only a stop token).
    fn allowed(&mut self, row: usize, drawn: &[u32]) -> Vec<u32>;
}

/// A constrained generation and its masks.
#[derive(Debug, Clone)]
pub struct Constrained {
    /// The rows, as [`crate::generate`] returns them; `log_probs` are those of the softmax over
    /// each step's allowed tokens.
    pub generation: Generation,
    /// `[rows, steps, vocab]`: the tokens each row was allowed at each step (all of them once
    /// the row had stopped).
    pub allowed: Tensor<3, Bool>,
}

/// `[rows, vocab]` allowed tokens of each row still drawing (all for stopped rows).
fn step_mask(
    constraint: &mut dyn TokenConstraint,
    drawn: &[Vec<u32>],
    alive: &[bool],
    vocab: usize,
) -> Result<Vec<bool>> {
    let mut out = vec![true; drawn.len() * vocab];
    for (r, row) in drawn.iter().enumerate().filter(|(r, _)| alive[*r]) {
        let allowed = constraint.allowed(r, row);
        if allowed.is_empty() {
            return Err(LlmError::Input(format!(
                "the constraint allows row {r} no token after {} tokens",
                row.len()
            )));
        }
        let slot = &mut out[r * vocab..(r + 1) * vocab];
        slot.fill(false);
        for t in allowed {
            let t = t as usize;
            if t >= vocab {
                return Err(LlmError::Input(format!(
                    "the constraint allows token {t}, outside the vocabulary of {vocab}"
                )));
            }
            slot[t] = true;
        }
    }
    Ok(out)
}

/// Samples `cfg.n` responses per prompt, each step's token drawn among those `constraint`
/// allows (top-k, top-p and min-p apply within them; greedy takes the most likely allowed).
///
/// # Errors
/// As [`crate::generate`]; a constraint that allows a row nothing or a token outside the
/// vocabulary.
pub fn generate_constrained(
    model: &Llama,
    prompts: &[Vec<u32>],
    cfg: &SamplingConfig,
    device: &Device,
    constraint: &mut dyn TokenConstraint,
) -> Result<Constrained> {
    check_inputs(model, prompts, cfg)?;
    let Prefilled {
        prompt_tokens,
        prompt_mask,
        group_ids,
        mut cache,
        mut logits,
        route,
    } = prefill(model, prompts, cfg, device);
    let (b, vocab) = (group_ids.len(), model.vocab_size());
    let mut rng = SplitMix64(cfg.seed);
    let mut drawn: Vec<Vec<u32>> = vec![Vec::new(); b];
    let mut alive = vec![true; b];
    let (mut toks, mut lps, mut masks, mut allowed) = (vec![], vec![], vec![], vec![]);
    for step in 0..cfg.max_new_tokens {
        let ok = step_mask(constraint, &drawn, &alive, vocab)?;
        let ok = Tensor::<2, Bool>::from_data(TensorData::new(ok, [b, vocab]), device);
        allowed.push(ok.clone().reshape([b, 1, vocab]));
        let lp = log_softmax(
            logits.mask_fill(ok.bool_not(), MASKED_LOGIT) / cfg.scoring_temperature(),
            1,
        );
        let token = if cfg.temperature == 0.0 {
            lp.clone().argmax(1)
        } else {
            sample_rows(
                truncate(lp.clone(), cfg.top_k, cfg.top_p, cfg.min_p),
                &mut rng,
            )
        };
        let live = alive_tensor(&alive, device);
        lps.push(lp.gather(1, token.clone()) * live.clone());
        masks.push(live.clone());
        let token = token * live.clone().int();
        toks.push(token.clone());
        let host = token.clone().try_into_vec_as::<i64>().unwrap_or_default();
        for (r, t) in host.iter().enumerate() {
            if alive[r] {
                drawn[r].push(*t as u32);
                alive[r] = !cfg.stop_tokens.contains(&(*t as u32));
            }
        }
        if step + 1 == cfg.max_new_tokens || !alive.contains(&true) {
            break;
        }
        logits = model.forward_cached_routed(token, live, &mut cache, &route);
    }
    let tokens = Tensor::cat(toks, 1);
    let decode_positions = tokens.dims()[0] * tokens.dims()[1];
    Ok(Constrained {
        generation: Generation {
            prompt_tokens,
            prompt_mask,
            tokens,
            log_probs: Tensor::cat(lps, 1),
            mask: Tensor::cat(masks, 1),
            group_ids,
            truncated: alive,
            decode_positions,
        },
        allowed: Tensor::cat(allowed, 1),
    })
}

/// `[rows, 1]` ones for the rows still drawing.
fn alive_tensor(alive: &[bool], device: &Device) -> Tensor<2> {
    let v: Vec<f32> = alive.iter().map(|a| f32::from(u8::from(*a))).collect();
    Tensor::from_data(TensorData::new(v, [alive.len(), 1]), device)
}

impl Llama {
    /// Log-probs (and entropies) of the last `n` tokens under the softmax over the tokens
    /// `allowed` leaves in at each position (logits of the others set to [`MASKED_LOGIT`]):
    /// the distribution [`generate_constrained`] samples from.
    ///
    /// # Shapes
    /// `tokens`, `mask` `[batch, seq]`, `allowed` `[batch, n, vocab]`, `1 <= n < seq`.
    pub fn masked_log_probs(
        &self,
        (tokens, mask, n): (Tensor<2, Int>, Tensor<2>, usize),
        allowed: Tensor<3, Bool>,
        temperature: f32,
        with_entropy: bool,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let [b, t] = tokens.dims();
        assert!(
            n >= 1 && n < t,
            "masked_log_probs: n = {n} for sequences of {t}"
        );
        let h = self.hidden_routed(tokens.clone(), mask, &RouteCtx::plain(true));
        let d = h.dims()[2];
        let h = h.slice([0..b, t - 1 - n..t - 1, 0..d]);
        let logits = self
            .head(h, true)
            .mask_fill(allowed.bool_not(), MASKED_LOGIT);
        chosen_log_probs(
            logits,
            tokens.slice([0..b, t - n..t]),
            temperature,
            with_entropy,
        )
    }
}

/// The policy of a constrained task as the trainer's [`Actor`]: its steps are response tokens,
/// scored under each step's allowed tokens.
#[derive(Module, Debug)]
pub struct ConstrainedLlama {
    /// The model.
    pub llama: Llama,
}

/// Sequences (prompt + response) with the masks they were drawn under.
#[derive(Debug, Clone)]
pub struct ConstrainedExperience {
    /// `[rows, prompt_len + response_len]` tokens.
    pub tokens: Tensor<2, Int>,
    /// `[rows, prompt_len + response_len]` mask.
    pub mask: Tensor<2>,
    /// `[rows, response_len, vocab]` allowed tokens.
    pub allowed: Tensor<3, Bool>,
    /// Response columns at the end of each row.
    pub response_len: usize,
    /// Sampling temperature.
    pub temperature: f32,
}

impl Replicate for ConstrainedExperience {
    fn to_device(&self, device: &Device) -> Self {
        Self {
            tokens: self.tokens.clone().to_device(device),
            mask: self.mask.clone().to_device(device),
            allowed: self.allowed.clone().to_device(device),
            ..self.clone()
        }
    }
}

impl Actor for ConstrainedLlama {
    type Experience = ConstrainedExperience;

    fn score(&self, exp: &ConstrainedExperience, rows: &[usize], with_entropy: bool) -> Scored {
        let device = exp.tokens.device();
        let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &device);
        let seqs = (
            exp.tokens.clone().select(0, idx.clone()),
            exp.mask.clone().select(0, idx.clone()),
            exp.response_len,
        );
        let allowed = exp.allowed.clone().select(0, idx);
        let (log_probs, entropy) =
            self.llama
                .masked_log_probs(seqs, allowed, exp.temperature, with_entropy);
        Scored {
            recompute: None,
            log_probs,
            entropy,
            kl: None,
        }
    }
}
