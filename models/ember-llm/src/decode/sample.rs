//! Batched sampling with a preallocated KV cache: left-padded prompts, temperature, top-k,
//! top-p, min-p, stop tokens, n samples per prompt, seeded.
//!
//! Tokens are chosen on the device by inverse-CDF sampling: one uniform number per row (from a
//! seeded host RNG, so results do not depend on the device's global RNG or on other work sharing
//! it) is compared with the cumulative distribution of the truncated softmax. The only host
//! reads are the stop check every `stop_check_every` steps and the final results.

use crate::cache::{KvCache, bucketed};
use crate::decode::shrink::Shrinking;
use crate::decode::temperature::{MAX_TEMPERATURE, temperature_ok};
use crate::error::{LlmError, Result};
use crate::model::Llama;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

fn one() -> f32 {
    1.0
}
fn n1() -> usize {
    1
}
fn max_new() -> usize {
    64
}
fn every() -> usize {
    8
}
fn bucket() -> usize {
    64
}

/// Sampling settings (vLLM / HF `generate` semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 is greedy (log-probs then at temperature 1: see
    /// [`SamplingConfig::scoring_temperature`]).
    #[serde(default = "one")]
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    #[serde(default)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = off).
    #[serde(default = "one")]
    pub top_p: f32,
    /// Drop tokens with probability below min_p · max probability (0 = off).
    #[serde(default)]
    pub min_p: f32,
    /// New tokens at most.
    #[serde(default = "max_new")]
    pub max_new_tokens: usize,
    /// Tokens that end a response (included in it).
    #[serde(default)]
    pub stop_tokens: Vec<u32>,
    /// Samples per prompt.
    #[serde(default = "n1")]
    pub n: usize,
    /// RNG seed.
    #[serde(default)]
    pub seed: u64,
    /// Steps between host checks for "all rows finished".
    #[serde(default = "every")]
    pub stop_check_every: usize,
    /// KV-cache capacity bucket (positions).
    #[serde(default = "bucket")]
    pub cache_bucket: usize,
    /// Left-pad the prompt batch to a multiple of this many tokens (0 or 1 = to the longest
    /// prompt), so that prefill sees a few shapes on GPUs; the padding is masked, so results
    /// are unchanged.
    #[serde(default)]
    pub prompt_bucket: usize,
    /// `(first row, rows)`: this batch's rows are rows `first..` of a larger batch of `rows`
    /// rows sampled with the same seed, and draw the uniform numbers that batch would draw for
    /// them (one multi-process rank's share of a rollout samples what one process samples).
    /// None: the batch is the whole.
    #[serde(skip)]
    pub rows_in: Option<(usize, usize)>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            max_new_tokens: max_new(),
            stop_tokens: Vec::new(),
            n: 1,
            seed: 0,
            stop_check_every: every(),
            cache_bucket: bucket(),
            prompt_bucket: 0,
            rows_in: None,
        }
    }
}

impl SamplingConfig {
    /// The temperature that the reported log-probs use, and that a trainer must rescore at to
    /// agree with them: the sampling temperature, or 1 for greedy decoding (temperature 0, where
    /// the argmax is taken and its log-prob reported under the model's own distribution).
    pub fn scoring_temperature(&self) -> f32 {
        crate::decode::temperature::scoring_temperature(self.temperature)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(LlmError::Input(s));
        if !temperature_ok(self.temperature.into(), true) {
            return bad(format!(
                "temperature {} must be in [0, {MAX_TEMPERATURE}]",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p {} must be in (0, 1]", self.top_p));
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return bad(format!("min_p {} must be in [0, 1)", self.min_p));
        }
        if self.n == 0 || self.max_new_tokens == 0 {
            return bad("n and max_new_tokens must be >= 1".into());
        }
        Ok(())
    }
}

/// The result of [`generate`]: prompts (left-padded) and responses (right-padded), one row per
/// sample; rows `i·n .. (i+1)·n` belong to prompt `i`.
#[derive(Debug, Clone)]
pub struct Generation {
    /// `[rows, prompt_len]` left-padded prompt tokens (pad = 0).
    pub prompt_tokens: Tensor<2, Int>,
    /// `[rows, prompt_len]` prompt mask.
    pub prompt_mask: Tensor<2>,
    /// `[rows, new]` response tokens (0 after the end).
    pub tokens: Tensor<2, Int>,
    /// `[rows, new]` log-probs of the sampled tokens under the temperature-scaled distribution
    /// (before top-k/top-p/min-p truncation, as vLLM reports them).
    pub log_probs: Tensor<2>,
    /// `[rows, new]` response mask (1 up to and including the stop token).
    pub mask: Tensor<2>,
    /// Prompt index of each row.
    pub group_ids: Vec<usize>,
    /// True for rows that hit `max_new_tokens` without a stop token.
    pub truncated: Vec<bool>,
    /// Positions the batched decode computed (rows × steps, summed over the steps as finished
    /// rows leave the batch), prefill aside.
    pub decode_positions: usize,
}

impl Generation {
    /// Response token ids of each row (up to and including the stop token).
    pub fn response_ids(&self) -> Vec<Vec<u32>> {
        let [rows, t] = self.tokens.dims();
        let toks: Vec<i64> = self
            .tokens
            .clone()
            .try_into_vec_as::<i64>()
            .unwrap_or_default();
        let mask: Vec<f32> = self
            .mask
            .clone()
            .try_into_vec_as::<f32>()
            .unwrap_or_default();
        (0..rows)
            .map(|r| {
                (0..t)
                    .filter(|&j| mask[r * t + j] > 0.5)
                    .map(|j| toks[r * t + j] as u32)
                    .collect()
            })
            .collect()
    }

    /// `[rows, prompt_len + new]` prompt and response concatenated, with its mask: the input of
    /// rescoring. The response occupies the last `new` columns.
    pub fn sequences(&self) -> (Tensor<2, Int>, Tensor<2>) {
        (
            Tensor::cat(vec![self.prompt_tokens.clone(), self.tokens.clone()], 1),
            Tensor::cat(vec![self.prompt_mask.clone(), self.mask.clone()], 1),
        )
    }
}

impl Generation {
    /// Pads the prompt columns (on the left) and the response columns (on the right) with
    /// masked zeros up to multiples of `bucket`, so that rescoring and training see a few
    /// distinct shapes instead of one per step (GPU kernels are compiled and autotuned per
    /// shape). Position ids come from the mask and padded keys are masked, so every real
    /// position's log-prob is unchanged. `bucket` 0 or 1 leaves the generation as it is.
    pub fn padded(self, bucket: usize) -> Generation {
        if bucket <= 1 {
            return self;
        }
        let p = self.prompt_tokens.dims()[1];
        let n = self.tokens.dims()[1];
        self.pad_to(p.div_ceil(bucket) * bucket, n.div_ceil(bucket) * bucket)
    }

    /// Rows `rows` of each part, in order, as one generation with `group_ids`: prompts
    /// left-padded and responses right-padded with masked zeros to the widest part (as
    /// [`Generation::padded`], so every real position's log-prob is unchanged). Reinforce-Ada
    /// stacks the responses it keeps from several rounds this way.
    ///
    /// # Panics
    /// When no row is selected, `group_ids` does not have one id per selected row, or a row
    /// index is out of range.
    pub fn stack(parts: Vec<(Generation, Vec<usize>)>, group_ids: Vec<usize>) -> Generation {
        let p = parts
            .iter()
            .map(|(g, _)| g.prompt_tokens.dims()[1])
            .max()
            .unwrap_or(1);
        let n = parts
            .iter()
            .map(|(g, _)| g.tokens.dims()[1])
            .max()
            .unwrap_or(1);
        let total: usize = parts.iter().map(|(_, r)| r.len()).sum();
        assert_eq!(total, group_ids.len(), "one group id per stacked row");
        // Every part's decode was computed, kept rows or not.
        let decode_positions = parts.iter().map(|(g, _)| g.decode_positions).sum();
        let mut cols: [Vec<Tensor<2>>; 3] = Default::default();
        let (mut pt, mut tk, mut truncated) = (Vec::new(), Vec::new(), Vec::new());
        for (g, rows) in parts {
            if rows.is_empty() {
                continue;
            }
            let device = g.tokens.device();
            let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
            let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &device);
            truncated.extend(rows.iter().map(|r| g.truncated[*r]));
            let g = g.pad_to(p, n);
            pt.push(g.prompt_tokens.select(0, idx.clone()));
            tk.push(g.tokens.select(0, idx.clone()));
            cols[0].push(g.prompt_mask.select(0, idx.clone()));
            cols[1].push(g.log_probs.select(0, idx.clone()));
            cols[2].push(g.mask.select(0, idx));
        }
        let [pm, lp, m] = cols;
        Generation {
            prompt_tokens: Tensor::cat(pt, 0),
            prompt_mask: Tensor::cat(pm, 0),
            tokens: Tensor::cat(tk, 0),
            log_probs: Tensor::cat(lp, 0),
            mask: Tensor::cat(m, 0),
            group_ids,
            truncated,
            decode_positions,
        }
    }

    /// Pads the prompt columns on the left to `p2` and the response columns on the right to
    /// `n2` (no-ops where already that wide).
    pub fn pad_to(self, p2: usize, n2: usize) -> Generation {
        let [rows, p] = self.prompt_tokens.dims();
        let n = self.tokens.dims()[1];
        let (p2, n2) = (p2.max(p), n2.max(n));
        let device = self.tokens.device();
        let left = |t: Tensor<2>| -> Tensor<2> {
            if p2 == p {
                t
            } else {
                Tensor::cat(vec![Tensor::zeros([rows, p2 - p], &device), t], 1)
            }
        };
        let right = |t: Tensor<2>| -> Tensor<2> {
            if n2 == n {
                t
            } else {
                Tensor::cat(vec![t, Tensor::zeros([rows, n2 - n], &device)], 1)
            }
        };
        let prompt_tokens = if p2 == p {
            self.prompt_tokens
        } else {
            Tensor::cat(
                vec![
                    Tensor::<2, Int>::zeros([rows, p2 - p], &device),
                    self.prompt_tokens,
                ],
                1,
            )
        };
        let tokens = if n2 == n {
            self.tokens
        } else {
            Tensor::cat(
                vec![
                    self.tokens,
                    Tensor::<2, Int>::zeros([rows, n2 - n], &device),
                ],
                1,
            )
        };
        Generation {
            prompt_tokens,
            prompt_mask: left(self.prompt_mask),
            tokens,
            log_probs: right(self.log_probs),
            mask: right(self.mask),
            group_ids: self.group_ids,
            truncated: self.truncated,
            decode_positions: self.decode_positions,
        }
    }
}

/// Left-pads token lists into `[rows, len]` tokens and mask.
pub fn left_pad(rows: &[Vec<u32>], device: &Device) -> (Tensor<2, Int>, Tensor<2>) {
    left_pad_to(rows, 1, device)
}

/// [`left_pad`] to a width rounded up to a multiple of `bucket` (0 or 1: the longest row).
pub fn left_pad_to(
    rows: &[Vec<u32>],
    bucket: usize,
    device: &Device,
) -> (Tensor<2, Int>, Tensor<2>) {
    let longest = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let len = bucketed(longest, bucket);
    let mut toks = vec![0i64; rows.len() * len];
    let mut mask = vec![0f32; rows.len() * len];
    for (r, row) in rows.iter().enumerate() {
        let off = len - row.len();
        for (j, t) in row.iter().enumerate() {
            toks[r * len + off + j] = i64::from(*t);
            mask[r * len + off + j] = 1.0;
        }
    }
    (
        Tensor::from_data(TensorData::new(toks, [rows.len(), len]), device),
        Tensor::from_data(TensorData::new(mask, [rows.len(), len]), device),
    )
}

/// Applies top-k, top-p and min-p to log-probs `[rows, vocab]` (removed entries become −inf).
pub fn truncate(lp: Tensor<2>, top_k: usize, top_p: f32, min_p: f32) -> Tensor<2> {
    let [rows, vocab] = lp.dims();
    let mut lp = lp;
    if top_k > 0 && top_k < vocab {
        let sorted = lp.clone().sort_descending(1);
        let kth = sorted.slice([0..rows, top_k - 1..top_k]);
        lp = lp
            .clone()
            .mask_fill(lp.lower(kth.expand([rows, vocab])), f32::NEG_INFINITY);
    }
    if top_p < 1.0 {
        // Keep sorted tokens whose preceding cumulative mass is below p (always the first).
        let sorted = lp.clone().sort_descending(1);
        let probs = sorted.clone().exp();
        let before = probs.clone().cumsum(1) - probs;
        let kept = before.lower_elem(top_p);
        let smallest_kept = sorted.mask_fill(kept.bool_not(), f32::INFINITY).min_dim(1);
        lp = lp.clone().mask_fill(
            lp.lower(smallest_kept.expand([rows, vocab])),
            f32::NEG_INFINITY,
        );
    }
    if min_p > 0.0 {
        let max = lp.clone().max_dim(1);
        let threshold = max.add_scalar(min_p.ln());
        lp = lp
            .clone()
            .mask_fill(lp.lower(threshold.expand([rows, vocab])), f32::NEG_INFINITY);
    }
    lp
}

use ember_engine::SplitMix64;

/// Draws one token per row from the distribution whose log-probs are `lp` `[rows, vocab]`
/// (−inf entries have probability 0) by inverse CDF: the index where the cumulative mass first
/// exceeds u·total.
pub fn sample_rows(lp: Tensor<2>, rng: &mut SplitMix64) -> Tensor<2, Int> {
    let rows = lp.dims()[0];
    let u: Vec<f32> = (0..rows).map(|_| rng.next_f32()).collect();
    sample_rows_with(lp, &u)
}

/// [`sample_rows`] with row `r`'s uniform number given as `u[r]` (in [0, 1)).
///
/// # Panics
/// When `u` does not have one number per row.
pub fn sample_rows_with(lp: Tensor<2>, u: &[f32]) -> Tensor<2, Int> {
    let [rows, vocab] = lp.dims();
    assert_eq!(u.len(), rows, "one uniform number per row");
    let device = lp.device();
    let probs = (lp.clone() - lp.max_dim(1)).exp();
    let index = Tensor::<1, Int>::arange(0..vocab as i64, &device).reshape([1, vocab]);
    let last = (probs.clone().greater_elem(0.0).int() * index.expand([rows, vocab])).max_dim(1);
    let cdf = probs.cumsum(1);
    let total = cdf.clone().slice([0..rows, vocab - 1..vocab]);
    let u = Tensor::<2>::from_data(TensorData::new(u.to_vec(), [rows, 1]), &device) * total;
    let below = cdf.lower_equal(u.expand([rows, vocab])).int().sum_dim(1);
    // u·total can round up to the total: then the last token with mass (`last`), never one
    // after it that top-k, top-p or a constraint removed.
    below.min_pair(last)
}

/// The checks of [`generate`]: settings, non-empty prompts within the vocabulary and, with
/// `max_new_tokens`, within the context (checked arithmetic: a huge `max_new_tokens` must not
/// wrap around to a small sum).
pub(crate) fn check_inputs(
    model: &Llama,
    prompts: &[Vec<u32>],
    cfg: &SamplingConfig,
) -> Result<()> {
    cfg.validate()?;
    if prompts.is_empty() {
        return Err(LlmError::Input("no prompts".into()));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(LlmError::Input(format!("prompt {i} is empty")));
    }
    let vocab = model.vocab_size();
    if let Some(bad) = prompts.iter().flatten().find(|t| **t as usize >= vocab) {
        return Err(LlmError::Input(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest
        .checked_add(cfg.max_new_tokens)
        .is_none_or(|n| n > model.max_positions())
    {
        return Err(LlmError::Input(format!(
            "prompt of {longest} tokens + max_new_tokens {} exceeds the context of {} positions",
            cfg.max_new_tokens,
            model.max_positions()
        )));
    }
    Ok(())
}

/// `[rows, k]` token ids as host rows (empty rows if the device read fails).
fn host_rows(t: Tensor<2, Int>) -> Vec<Vec<u32>> {
    let [rows, k] = t.dims();
    let flat = t.try_into_vec_as::<i64>().unwrap_or_default();
    (0..rows)
        .map(|r| {
            flat.get(r * k..(r + 1) * k)
                .map(|s| s.iter().map(|&x| x as u32).collect())
                .unwrap_or_default()
        })
        .collect()
}

/// New tokens a batched sampler's KV cache has room for at first, where it grows
/// ([`KvCache::growing_to`]).
const FIRST_ROOM: usize = 32;

/// The state after the prompts' prefill: what decoding starts from.
pub(crate) struct Prefilled {
    pub(crate) prompt_tokens: Tensor<2, Int>,
    pub(crate) prompt_mask: Tensor<2>,
    /// Each row's prompt (rows prompt-major, `cfg.n` per prompt).
    pub(crate) group_ids: Vec<usize>,
    pub(crate) cache: KvCache,
    /// `[rows, vocab]` logits of each row's first token.
    pub(crate) logits: Tensor<2>,
    pub(crate) route: ember_molora::RouteCtx,
}

/// Prefills `cfg.n` rows per prompt (inputs checked by [`check_inputs`]).
pub(crate) fn prefill(
    model: &Llama,
    prompts: &[Vec<u32>],
    cfg: &SamplingConfig,
    device: &Device,
) -> Prefilled {
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), cfg.n))
        .collect();
    let group_ids: Vec<usize> = (0..prompts.len())
        .flat_map(|i| std::iter::repeat_n(i, cfg.n))
        .collect();
    let b = rows.len();
    let (prompt_tokens, prompt_mask) = left_pad_to(&rows, cfg.prompt_bucket, device);
    let prompt_len = prompt_tokens.dims()[1];
    let full = bucketed(prompt_len + cfg.max_new_tokens, cfg.cache_bucket);
    // Where shapes cost nothing (the CPU) the cache starts with room for FIRST_ROOM new tokens
    // and doubles as rows lengthen, finished rows having left the batch; elsewhere it holds
    // the full length from the start, so that every decode step has one shape.
    let first = bucketed(
        prompt_len + cfg.max_new_tokens.min(FIRST_ROOM),
        cfg.cache_bucket,
    );
    let capacity = match ember_kernels::op::shapes_are_free(device) {
        true => first,
        false => full,
    };
    let new_cache = |rows| {
        KvCache::new(model.cache_shape(), rows, capacity, device).growing_to(full, cfg.cache_bucket)
    };
    // Mixture-of-LoRA routers take their top-k; sequence routing decides on the prompt and
    // replays that decision for every decoded token.
    let route = ember_molora::RouteCtx::decoding(prompt_mask.clone());
    // The n samples of a prompt share its prefill: each distinct prompt runs once and its keys,
    // values and last logits are repeated n times (vLLM's prefix sharing for `n` > 1; HF
    // `generate` instead expands the prompts first). Mixture-of-LoRA models prefill every row,
    // since their routing records are per row.
    let (cache, logits) = if cfg.n > 1 && crate::mixture::mixtures(model).is_empty() {
        let (toks, mask) = left_pad_to(prompts, cfg.prompt_bucket, device);
        let mut cache = new_cache(prompts.len());
        let logits = model.forward_cached_routed(toks, mask, &mut cache, &route);
        let idx = crate::cache::repeat_index(prompts.len(), cfg.n, device);
        (cache.repeat_rows(&idx), logits.select(0, idx))
    } else {
        let mut cache = new_cache(b);
        let logits = model.forward_cached_routed(
            prompt_tokens.clone(),
            prompt_mask.clone(),
            &mut cache,
            &route,
        );
        (cache, logits)
    };
    let mut route = route;
    route.start_replay();
    route.stop_recording();
    Prefilled {
        prompt_tokens,
        prompt_mask,
        group_ids,
        cache,
        logits,
        route,
    }
}

/// Samples `cfg.n` responses for each prompt.
///
/// # Errors
/// An empty prompt list or prompt, a prompt plus `max_new_tokens` longer than the model's
/// context, or an invalid setting.
pub fn generate(
    model: &Llama,
    prompts: &[Vec<u32>],
    cfg: &SamplingConfig,
    device: &Device,
) -> Result<Generation> {
    generate_observed(model, prompts, cfg, device, None)
}

/// Called at each stop check with the tokens of every row drawn since the previous check
/// (`[rows][k]`, rows prompt-major, 0 after a row stopped); returns false to end generation
/// there (every reader has gone). Streaming servers set `stop_check_every` to how often they
/// send.
pub type Observer<'a> = &'a mut dyn FnMut(&[Vec<u32>]) -> bool;

/// [`generate`], showing `observe` (if any) the tokens as they are drawn: one host read of the
/// new tokens per stop check, beside the check's own.
pub fn generate_observed(
    model: &Llama,
    prompts: &[Vec<u32>],
    cfg: &SamplingConfig,
    device: &Device,
    observe: Option<Observer<'_>>,
) -> Result<Generation> {
    match observe {
        // On a worker of the CPU backend's pool, so that each step's parallel products split
        // between this thread and the others (`ember_kernels::on_workers`); an observer may
        // hold what cannot leave its thread.
        None => ember_kernels::on_workers(|| generate_on(model, prompts, cfg, device, None)),
        Some(o) => generate_on(model, prompts, cfg, device, Some(o)),
    }
}

/// [`generate_observed`] on the calling thread.
fn generate_on(
    model: &Llama,
    prompts: &[Vec<u32>],
    cfg: &SamplingConfig,
    device: &Device,
    mut observe: Option<Observer<'_>>,
) -> Result<Generation> {
    check_inputs(model, prompts, cfg)?;
    let Prefilled {
        prompt_tokens,
        prompt_mask,
        group_ids,
        mut cache,
        mut logits,
        route,
    } = prefill(model, prompts, cfg, device);
    let b = group_ids.len();
    if let Some((first, rows)) = cfg.rows_in
        && first.checked_add(b).is_none_or(|end| end > rows)
    {
        return Err(LlmError::Input(format!(
            "rows {first}..{} of a batch of {rows}",
            first.saturating_add(b)
        )));
    }
    let stop: Vec<i64> = cfg.stop_tokens.iter().map(|t| i64::from(*t)).collect();
    let mut alive = Tensor::<2>::ones([b, 1], device);
    // Finished rows leave the batch at stop checks, except where the rows must stay whole (an
    // observer reads every row; Mixture-of-LoRA routing replays per row). With a prompt
    // bucket (few shapes, for GPUs) the rows kept are a multiple of 8.
    let shrinks = observe.is_none() && crate::mixture::mixtures(model).is_empty();
    let multiple = if cfg.prompt_bucket > 1 { 8 } else { 1 };
    let mut batch = Shrinking::new(b);
    for step in 0..cfg.max_new_tokens {
        let lp = log_softmax(logits / cfg.scoring_temperature(), 1);
        let token = if cfg.temperature == 0.0 {
            lp.clone().argmax(1)
        } else {
            let filtered = truncate(lp.clone(), cfg.top_k, cfg.top_p, cfg.min_p);
            sample_rows_with(filtered, &batch.uniforms(cfg.seed, step, cfg.rows_in))
        };
        let lp = lp.gather(1, token.clone()) * alive.clone();
        let token = token * alive.clone().int();
        batch.push(token.clone(), lp, alive.clone());
        let mut stopped: Tensor<2, Bool> = token.clone().equal_elem(-1);
        for s in &stop {
            stopped = stopped.bool_or(token.clone().equal_elem(*s));
        }
        let mut step_mask = alive.clone();
        alive = alive * stopped.bool_not().float();
        let last = step + 1 == cfg.max_new_tokens;
        if last {
            break;
        }
        let mut token = token;
        if (step + 1) % cfg.stop_check_every.max(1) == 0 {
            if let Some(f) = observe.as_mut()
                && !f(&host_rows(batch.recent(cfg.stop_check_every.max(1))))
            {
                break;
            }
            let flags = alive.clone().try_into_vec_as::<f32>().unwrap_or_default();
            if flags.iter().all(|a| *a <= 0.5) {
                break;
            }
            if let Some(keep) = Shrinking::worth_dropping(&flags, multiple).filter(|_| shrinks) {
                let idx = batch.keep(&keep, device);
                cache.compact(&keep, 0);
                (alive, step_mask) = (
                    alive.select(0, idx.clone()),
                    step_mask.select(0, idx.clone()),
                );
                token = token.select(0, idx);
            }
        }
        logits = model.forward_cached_routed(token, step_mask, &mut cache, &route);
    }
    let flags = alive.try_into_vec_as::<f32>().unwrap_or_default();
    let decode_positions = batch.positions;
    let (tokens, log_probs, mask, truncated) = batch.finish(&flags, device);
    Ok(Generation {
        prompt_tokens,
        prompt_mask,
        tokens,
        log_probs,
        mask,
        group_ids,
        truncated,
        decode_positions,
    })
}
