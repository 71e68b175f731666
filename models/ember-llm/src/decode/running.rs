//! Continuous batching: one decode batch that rows join at any step and leave as they finish
//! (iteration-level scheduling, Yu et al., "Orca", OSDI 2022, §3; vLLM's scheduler).
//!
//! The batch holds one KV cache of `slots × capacity` positions. A joining row is prefilled on
//! its own (with the other rows that join at the same step, identical prompts once) and its
//! keys and values are copied into a free slot so that its prompt ends at the batch's current
//! write position; the rows already decoding are never prefilled again. Every row keeps its own
//! position ids (from its own mask), so where its keys sit in the buffer changes nothing but
//! the order of a sum. A long prompt may be prefilled a chunk of columns at a time
//! ([`Running::begin`], [`Running::prefill`], [`Running::finish`]: chunked prefill, as vLLM's)
//! while the batch goes on decoding. A row that finishes frees its slot at once. When a joiner
//! does not fit, the live rows are compacted (finished slots dropped, positions no live row
//! reads shifted out) and the buffer grows, within `max_rows` and `max_cells`.
//!
//! Each row samples with its own settings and its own seeded generator, so what a row draws
//! does not depend on which rows share its steps beyond the last bits of batched arithmetic.
//! Tokens are read back once per step (the scheduler must know which rows ended).

use crate::cache::{CacheShape, KvCache, bucketed};
use crate::decode::sample::{left_pad, sample_rows_with, truncate};
use crate::error::{LlmError, Result};
use crate::model::Llama;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use ember_engine::SplitMix64;

/// How one row samples (vLLM semantics, as [`crate::SamplingConfig`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// Softmax temperature; 0 is greedy (log-probs then at temperature 1).
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Nucleus mass (1 = off).
    pub top_p: f32,
    /// Drop tokens below min_p · the largest probability (0 = off).
    pub min_p: f32,
}

impl RowSampling {
    fn scoring_temperature(&self) -> f32 {
        crate::decode::temperature::scoring_temperature(self.temperature)
    }

    fn truncation(&self) -> (usize, u32, u32) {
        (self.top_k, self.top_p.to_bits(), self.min_p.to_bits())
    }
}

/// A row to decode.
#[derive(Debug, Clone)]
pub struct RowSpec {
    /// The caller's name for the row (given back with each drawn token).
    pub tag: u64,
    /// Prompt token ids (non-empty, within the vocabulary).
    pub prompt: Vec<u32>,
    /// New tokens at most (≥ 1).
    pub max_tokens: usize,
    /// Tokens that end the row (included in it).
    pub stop_tokens: Vec<u32>,
    /// Sampling settings.
    pub sampling: RowSampling,
    /// The seed of the row's own generator.
    pub seed: u64,
}

/// Why a row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It drew a stop token.
    Stop,
    /// It drew `max_tokens` tokens.
    Length,
}

/// One token drawn for one row at one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    /// The row's tag.
    pub tag: u64,
    /// The token.
    pub token: u32,
    /// Its log-prob under the temperature-scaled distribution (before truncation).
    pub log_prob: f32,
    /// Set when this token ended the row (its slot is free from now on).
    pub finished: Option<Finish>,
}

/// The bounds of a running batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Rows decoding at once.
    pub max_rows: usize,
    /// Rows × KV-cache positions held at once (bounds memory).
    pub max_cells: usize,
    /// Capacity is rounded up to a multiple of this where the cell budget allows.
    pub bucket: usize,
}

struct Row {
    tag: u64,
    /// First buffer position of its prompt.
    start: usize,
    /// Tokens it may still draw.
    remaining: usize,
    stop: Vec<u32>,
    sampling: RowSampling,
    rng: SplitMix64,
}

struct State {
    cache: KvCache,
    /// `[slots, vocab]` next-token logits of every slot (meaningless for free slots).
    logits: Tensor<2>,
    slots: Vec<Option<Row>>,
}

/// Rows whose prompts are being prefilled a chunk of columns at a time ([`Running::begin`],
/// [`Running::prefill`], [`Running::finish`]), so that a long prompt delays the rows decoding
/// by one chunk at a time instead of its whole prefill.
pub struct Prefill {
    rows: Vec<RowSpec>,
    /// Each row's prompt among the unique ones.
    pick: Vec<usize>,
    /// The unique prompts, left-padded, and their mask.
    toks: Tensor<2, Int>,
    mask: Tensor<2>,
    /// Their keys and values so far.
    pre: KvCache,
    /// Columns prefilled.
    done: usize,
    /// The last prefilled position's logits.
    logits: Option<Tensor<2>>,
}

impl Prefill {
    /// The tags of its rows.
    pub fn tags(&self) -> Vec<u64> {
        self.rows.iter().map(|r| r.tag).collect()
    }

    /// Its rows' (prompt length, `max_tokens`), to count in [`Running::fits`] while they wait.
    pub fn sizes(&self) -> Vec<(usize, usize)> {
        self.rows
            .iter()
            .map(|r| (r.prompt.len(), r.max_tokens))
            .collect()
    }

    /// True once every column is prefilled.
    pub fn is_done(&self) -> bool {
        self.done == self.toks.dims()[1]
    }
}

/// A continuously batched decoder over one model.
pub struct Running {
    shape: CacheShape,
    vocab: usize,
    device: Device,
    limits: Limits,
    state: Option<State>,
}

impl Running {
    /// An empty batch for `model`.
    ///
    /// # Errors
    /// For Mixture-of-LoRA models (their routing records are per batch, not per slot).
    pub fn new(model: &Llama, limits: Limits, device: &Device) -> Result<Self> {
        if !crate::mixture::mixtures(model).is_empty() {
            return Err(LlmError::Input(
                "continuous batching does not take Mixture-of-LoRA models".into(),
            ));
        }
        Ok(Self {
            shape: model.cache_shape(),
            vocab: model.vocab_size(),
            device: device.clone(),
            limits: Limits {
                max_rows: limits.max_rows.max(1),
                max_cells: limits.max_cells.max(1),
                bucket: limits.bucket.max(1),
            },
            state: None,
        })
    }

    /// Rows decoding now.
    pub fn live(&self) -> usize {
        self.state
            .as_ref()
            .map_or(0, |s| s.slots.iter().flatten().count())
    }

    /// True when no row is decoding.
    pub fn is_empty(&self) -> bool {
        self.live() == 0
    }

    /// Slots and positions the buffer holds now (0 × 0 when empty).
    pub fn footprint(&self) -> (usize, usize) {
        self.state
            .as_ref()
            .map_or((0, 0), |s| (s.slots.len(), s.cache.capacity()))
    }

    /// The live rows' (tags, earliest start, most tokens still to draw).
    fn live_extent(&self) -> (usize, usize, usize) {
        let Some(st) = &self.state else {
            return (0, 0, 0);
        };
        let rows = st.slots.iter().flatten();
        let start = rows
            .clone()
            .map(|r| r.start)
            .min()
            .unwrap_or(st.cache.len());
        let remaining = rows.clone().map(|r| r.remaining).max().unwrap_or(0);
        (rows.count(), start, remaining)
    }

    /// Whether rows of these `(prompt length, max_tokens)` can join now (compacting the live
    /// rows if need be) within the limits.
    pub fn fits(&self, joiners: &[(usize, usize)]) -> bool {
        let (live, start, remaining) = self.live_extent();
        let len = self.state.as_ref().map_or(0, |s| s.cache.len());
        let base = if live == 0 { 0 } else { len - start };
        let p = joiners.iter().map(|j| j.0).max().unwrap_or(0);
        let m = joiners.iter().map(|j| j.1).max().unwrap_or(0);
        let cols = base.max(p) + m.max(remaining);
        let rows = live + joiners.len();
        rows <= self.limits.max_rows
            && rows
                .checked_mul(cols)
                .is_some_and(|c| c <= self.limits.max_cells)
    }

    /// Prefills `rows` and adds them to the batch; their first tokens come with the next
    /// [`step`](Self::step).
    ///
    /// # Errors
    /// An empty prompt, a token outside the vocabulary, `max_tokens` 0, or rows that do not
    /// [`fit`](Self::fits).
    pub fn admit(&mut self, model: &Llama, rows: Vec<RowSpec>) -> Result<()> {
        let Some(mut p) = self.begin(rows)? else {
            return Ok(());
        };
        self.prefill(model, &mut p, usize::MAX);
        self.finish(p)
    }

    /// Checks `rows` and sets up their prefill (identical prompts once), which
    /// [`prefill`](Self::prefill) then runs a chunk of columns at a time while the batch goes
    /// on decoding, and [`finish`](Self::finish) adds to the batch; None for no rows.
    ///
    /// # Errors
    /// As [`admit`](Self::admit).
    pub fn begin(&self, rows: Vec<RowSpec>) -> Result<Option<Prefill>> {
        self.check(&rows)?;
        let sizes: Vec<(usize, usize)> = rows
            .iter()
            .map(|r| (r.prompt.len(), r.max_tokens))
            .collect();
        if rows.is_empty() {
            return Ok(None);
        }
        if !self.fits(&sizes) {
            return Err(LlmError::Input(format!(
                "{} rows do not fit the running batch's limits",
                rows.len()
            )));
        }
        let mut unique: Vec<Vec<u32>> = Vec::new();
        let pick: Vec<usize> = rows
            .iter()
            .map(|r| match unique.iter().position(|u| *u == r.prompt) {
                Some(i) => i,
                None => {
                    unique.push(r.prompt.clone());
                    unique.len() - 1
                }
            })
            .collect();
        let (toks, mask) = left_pad(&unique, &self.device);
        let pre = KvCache::new(self.shape, unique.len(), toks.dims()[1], &self.device);
        Ok(Some(Prefill {
            rows,
            pick,
            toks,
            mask,
            pre,
            done: 0,
            logits: None,
        }))
    }

    /// Prefills the next `chunk` columns of `p` (all that are left when fewer): the chunk
    /// attends to the keys the earlier chunks left in `p`'s cache.
    pub fn prefill(&self, model: &Llama, p: &mut Prefill, chunk: usize) {
        let [u, cols] = p.toks.dims();
        let end = p.done.saturating_add(chunk.max(1)).min(cols);
        let (toks, mask) = (p.toks.clone(), p.mask.clone());
        let logits = model.forward_cached(
            toks.slice([0..u, p.done..end]),
            mask.slice([0..u, p.done..end]),
            &mut p.pre,
        );
        p.logits = Some(logits);
        p.done = end;
    }

    /// Adds the rows of a finished prefill to the batch.
    ///
    /// # Errors
    /// When `p` is not prefilled to its end, or its rows no longer fit.
    pub fn finish(&mut self, p: Prefill) -> Result<()> {
        let cols = p.toks.dims()[1];
        let logits = match p.logits {
            Some(l) if p.done == cols => l,
            _ => return Err(LlmError::Input("the prefill is not finished".into())),
        };
        let sizes: Vec<(usize, usize)> = p
            .rows
            .iter()
            .map(|r| (r.prompt.len(), r.max_tokens))
            .collect();
        if !self.fits(&sizes) {
            return Err(LlmError::Input(format!(
                "{} rows do not fit the running batch's limits",
                p.rows.len()
            )));
        }
        let m = sizes.iter().map(|s| s.1).max().unwrap_or(1);
        let at = self.make_room(p.rows.len(), cols, m);
        let st = self
            .state
            .as_mut()
            .ok_or_else(|| LlmError::Input("no batch".into()))?;
        let free: Vec<usize> = (0..st.slots.len())
            .filter(|&s| st.slots[s].is_none())
            .collect();
        if free.len() < p.rows.len() {
            return Err(LlmError::Input("no free slot after growing".into()));
        }
        for ((row, u), slot) in p.rows.into_iter().zip(p.pick).zip(free) {
            st.cache.place_row(slot, &p.pre, u, at);
            let v = logits.dims()[1];
            st.logits = st.logits.clone().slice_assign(
                [slot..slot + 1, 0..v],
                logits.clone().slice([u..u + 1, 0..v]),
            );
            st.slots[slot] = Some(Row {
                tag: row.tag,
                start: at + cols - row.prompt.len(),
                remaining: row.max_tokens,
                stop: row.stop_tokens,
                sampling: row.sampling,
                rng: SplitMix64(row.seed),
            });
        }
        Ok(())
    }

    fn check(&self, rows: &[RowSpec]) -> Result<()> {
        for r in rows {
            let s = &r.sampling;
            if r.prompt.is_empty() || r.max_tokens == 0 {
                return Err(LlmError::Input(format!(
                    "row {}: empty prompt or max_tokens 0",
                    r.tag
                )));
            }
            if let Some(t) = r.prompt.iter().find(|t| **t as usize >= self.vocab) {
                return Err(LlmError::Input(format!(
                    "row {}: token id {t} is outside the vocabulary of {}",
                    r.tag, self.vocab
                )));
            }
            let ok = crate::decode::temperature::temperature_ok(s.temperature.into(), true)
                && s.top_p > 0.0
                && s.top_p <= 1.0
                && (0.0..1.0).contains(&s.min_p);
            if !ok {
                return Err(LlmError::Input(format!(
                    "row {}: bad sampling settings {s:?}",
                    r.tag
                )));
            }
        }
        Ok(())
    }

    /// Makes `joiners` free slots and room for a prompt of `p` positions followed by `m`
    /// draws (compacting and growing if need be); returns where the prompt starts. The write
    /// position is moved on to the prompt's end.
    fn make_room(&mut self, joiners: usize, p: usize, m: usize) -> usize {
        let (live, start, remaining) = self.live_extent();
        let limits = self.limits;
        let capacity_for = |rows: usize, cols: usize| {
            let b = bucketed(cols, limits.bucket);
            if rows * b <= limits.max_cells {
                b
            } else {
                cols
            }
        };
        let Some(st) = self.state.as_mut().filter(|_| live > 0) else {
            let cap = capacity_for(joiners, p + m);
            let mut cache = KvCache::new(self.shape, joiners, cap, &self.device);
            cache.advance(p);
            self.state = Some(State {
                cache,
                logits: Tensor::zeros([joiners, self.vocab], &self.device),
                slots: (0..joiners).map(|_| None).collect(),
            });
            return 0;
        };
        let free = st.slots.iter().filter(|s| s.is_none()).count();
        let slots = st.slots.len() + joiners.saturating_sub(free);
        let cols = st.cache.len().max(p) + m.max(remaining);
        let in_place = cols <= st.cache.capacity()
            && slots
                .checked_mul(st.cache.capacity())
                .is_some_and(|c| c <= limits.max_cells);
        if !in_place {
            st.compact(start);
            let cols = st.cache.len().max(p) + m.max(remaining);
            st.grow(live + joiners, capacity_for(live + joiners, cols));
        } else {
            st.grow(slots, st.cache.capacity());
        }
        let len = st.cache.len();
        if p > len {
            st.cache.advance(p - len);
        }
        st.cache.len() - p
    }

    /// Draws one token for every live row and feeds the rows that go on.
    ///
    /// # Errors
    /// When the tokens cannot be read back from the device.
    pub fn step(&mut self, model: &Llama) -> Result<Vec<Drawn>> {
        let Some(st) = self.state.as_mut() else {
            return Ok(Vec::new());
        };
        let (tokens, host) = st.draw()?;
        let mut out = Vec::new();
        let mut feed = vec![0f32; st.slots.len()];
        for (s, slot) in st.slots.iter_mut().enumerate() {
            let Some(row) = slot else { continue };
            let token = host[2 * s] as u32;
            row.remaining -= 1;
            let finished = if row.stop.contains(&token) {
                Some(Finish::Stop)
            } else if row.remaining == 0 {
                Some(Finish::Length)
            } else {
                feed[s] = 1.0;
                None
            };
            out.push(Drawn {
                tag: row.tag,
                token,
                log_prob: host[2 * s + 1],
                finished,
            });
            if finished.is_some() {
                *slot = None;
            }
        }
        let slots = st.slots.len();
        let live = feed.iter().filter(|f| **f > 0.0).count();
        if live == 0 {
            self.state = None;
            return Ok(out);
        }
        let feed = Tensor::<2>::from_data(TensorData::new(feed, [slots, 1]), &self.device);
        st.logits = model.forward_cached(tokens * feed.clone().int(), feed, &mut st.cache);
        if slots >= 8 && live * 2 <= slots {
            let start = st
                .slots
                .iter()
                .flatten()
                .map(|r| r.start)
                .min()
                .unwrap_or(0);
            st.compact(start);
        }
        Ok(out)
    }

    /// Ends the rows whose tag `gone` picks (their clients left); their slots are free at once.
    pub fn cancel(&mut self, gone: impl Fn(u64) -> bool) {
        let Some(st) = self.state.as_mut() else {
            return;
        };
        for slot in &mut st.slots {
            if slot.as_ref().is_some_and(|r| gone(r.tag)) {
                *slot = None;
            }
        }
        if st.slots.iter().all(Option::is_none) {
            self.state = None;
        }
    }
}

impl State {
    /// Samples every slot: the tokens `[slots, 1]` and, on the host, (token, log-prob) pairs.
    fn draw(&mut self) -> Result<(Tensor<2, Int>, Vec<f32>)> {
        let slots = self.slots.len();
        let device = self.logits.device();
        let plain = RowSampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        };
        let settings: Vec<RowSampling> = self
            .slots
            .iter()
            .map(|s| s.as_ref().map_or(plain, |r| r.sampling))
            .collect();
        let column = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(v, [slots, 1]), &device);
        let temps = column(settings.iter().map(|s| s.scoring_temperature()).collect());
        let lp = log_softmax(self.logits.clone() / temps, 1);
        let filtered = truncated_by_row(&lp, &settings);
        let u: Vec<f32> = self
            .slots
            .iter_mut()
            .map(|s| s.as_mut().map_or(0.5, |r| r.rng.next_f32()))
            .collect();
        let mut tokens = sample_rows_with(filtered, &u);
        let greedy: Vec<bool> = settings.iter().map(|s| s.temperature == 0.0).collect();
        if greedy.iter().any(|g| *g) {
            let g = Tensor::<2, Bool>::from_data(TensorData::new(greedy, [slots, 1]), &device);
            tokens = tokens.mask_where(g, lp.clone().argmax(1));
        }
        let log_probs = lp.gather(1, tokens.clone());
        let host = Tensor::cat(vec![tokens.clone().float(), log_probs], 1)
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| LlmError::Input(format!("reading tokens back: {e:?}")))?;
        Ok((tokens, host))
    }

    /// Drops the free slots and the positions before `start` (no live row reads them).
    fn compact(&mut self, start: usize) {
        let keep: Vec<usize> = (0..self.slots.len())
            .filter(|&s| self.slots[s].is_some())
            .collect();
        if keep.is_empty() {
            return;
        }
        self.cache.compact(&keep, start);
        let idx: Vec<i64> = keep.iter().map(|&s| s as i64).collect();
        let idx =
            Tensor::<1, Int>::from_data(TensorData::new(idx, [keep.len()]), &self.logits.device());
        self.logits = self.logits.clone().select(0, idx);
        let mut slots: Vec<Option<Row>> = std::mem::take(&mut self.slots)
            .into_iter()
            .flatten()
            .map(Some)
            .collect();
        for r in slots.iter_mut().flatten() {
            r.start -= start;
        }
        self.slots = slots;
    }

    /// Grows to `rows` slots and `capacity` positions.
    fn grow(&mut self, rows: usize, capacity: usize) {
        let b = self.slots.len();
        self.cache.grow(rows, capacity);
        if rows > b {
            let [_, v] = self.logits.dims();
            let pad = Tensor::<2>::zeros([rows - b, v], &self.logits.device());
            self.logits = Tensor::cat(vec![self.logits.clone(), pad], 0);
            self.slots.extend((b..rows).map(|_| None));
        }
    }
}

/// Applies each row's top-k / top-p / min-p to its row of `lp` (one pass per distinct setting).
fn truncated_by_row(lp: &Tensor<2>, settings: &[RowSampling]) -> Tensor<2> {
    let mut kinds: Vec<(usize, u32, u32)> = settings.iter().map(RowSampling::truncation).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let off = (0, 1f32.to_bits(), 0f32.to_bits());
    let [slots, vocab] = lp.dims();
    let mut out = lp.clone();
    for kind in kinds.into_iter().filter(|k| *k != off) {
        let (k, p, m) = (kind.0, f32::from_bits(kind.1), f32::from_bits(kind.2));
        let cut = truncate(lp.clone(), k, p, m);
        let rows: Vec<bool> = settings.iter().map(|s| s.truncation() == kind).collect();
        if rows.iter().all(|r| *r) {
            return cut;
        }
        let rows = Tensor::<2, Bool>::from_data(TensorData::new(rows, [slots, 1]), &lp.device());
        out = out.mask_where(rows.expand([slots, vocab]), cut);
    }
    out
}
