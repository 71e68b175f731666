//! The generation engine of `ember serve`: one thread that owns the model and its LoRA adapters
//! and answers queued requests.
//!
//! By default it batches continuously (`engine/continuous.rs`): a request joins the running
//! decode batch at the next step and each row leaves when it ends. With `--batching static` it
//! answers a batch at a time: requests waiting when the engine is free are taken together (up
//! to `max_rows` sampled rows) and grouped by what one call of the KV-cache sampler can share:
//! the model (base or adapter), the sampling settings and `n`. Each group runs as one batched
//! [`ember_llm::generate`] call to the largest `max_tokens` of its requests; each request's
//! choices are then cut to its own `max_tokens`. Either way a request with a `seed` runs in a
//! batch of its own, so its answer does not depend on what else was queued, and adapter loads
//! and unloads are queued too, taking effect between batches, in arrival order.
//!
//! Scoring (`echo`) runs a chunk of `--prefill-chunk-tokens` positions at a time between decode
//! steps or batches, the scoring requests taking turns (`engine/score.rs`).

mod continuous;
mod score;
mod weights;

use super::api::{ApiError, LoadLora, Params};
use axum::http::StatusCode;
use burn::tensor::Device;
use ember_engine::SplitMix64;
use ember_llm::cache::KvCache;
use ember_llm::{Llama, LlamaConfig, SamplingConfig, generate_observed};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, RwLock};
use tokio::sync::{mpsc, oneshot};

/// One generated choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Index of its prompt in the request.
    pub prompt: usize,
    /// Generated token ids (the end-of-sequence token included when one ended it).
    pub tokens: Vec<u32>,
    /// Log-prob of each token under the temperature-scaled distribution (before top-k/top-p),
    /// as the sampler drew it (temperature 0: the model's own distribution).
    pub log_probs: Vec<f32>,
    /// Ended by an end-of-sequence token (else by `max_tokens`).
    pub eos: bool,
}

/// A generation request, checked by the HTTP side.
#[derive(Debug)]
pub struct Job {
    /// The base model's name or an adapter's.
    pub model: String,
    /// Prompts as token ids (each non-empty, within the vocabulary and the context).
    pub prompts: Vec<Vec<u32>>,
    /// Sampling settings.
    pub params: Params,
    /// New tokens at most.
    pub max_tokens: usize,
    /// Where the answer goes: `n` choices per prompt, prompt-major.
    pub reply: oneshot::Sender<Result<Vec<Choice>, ApiError>>,
    /// A streaming request's tokens as they are drawn: `(choice, new tokens)` pairs, sent at
    /// every stop check before the answer (which still comes whole through `reply`).
    pub stream: Option<Deltas>,
}

/// Where a streaming job's new tokens go: `(choice, tokens)` pairs per decode step.
pub type Deltas = mpsc::UnboundedSender<Vec<(usize, Vec<u32>)>>;

impl Job {
    fn rows(&self) -> usize {
        self.prompts.len() * self.params.n
    }

    /// Its longest prompt.
    fn longest(&self) -> usize {
        self.prompts.iter().map(Vec::len).max().unwrap_or(0)
    }
}

/// What the queue carries.
#[derive(Debug)]
pub enum Msg {
    /// Generate.
    Generate(Job),
    /// Load a PEFT adapter under a name.
    Load(LoadLora, oneshot::Sender<Result<(), ApiError>>),
    /// Unload an adapter.
    Unload(String, oneshot::Sender<Result<(), ApiError>>),
    /// Replace the base model's weights with those at a path.
    UpdateWeights(String, oneshot::Sender<Result<(), ApiError>>),
    /// Score whole sequences under a model (`echo`): see [`Scores`].
    Score(
        String,
        Vec<Vec<u32>>,
        oneshot::Sender<Result<Vec<Scores>, ApiError>>,
    ),
}

/// A sequence scored under a model at temperature 1, for its tokens 1..len: each token's
/// log-prob, and the most likely token there with its log-prob (the prompt log-probs and top-1
/// alternatives of OpenAI's `echo` with `logprobs = 1`, what lm-eval-harness's log-likelihood
/// tasks read).
pub type Scores = Vec<(f32, u32, f32)>;

/// Where a scoring request's answer goes.
pub(crate) type ScoreReply = oneshot::Sender<Result<Vec<Scores>, ApiError>>;

/// A scoring request in progress (run a unit at a time by `engine/score.rs`).
pub(crate) struct ScoreJob {
    model: String,
    seqs: Vec<Vec<u32>>,
    reply: ScoreReply,
    /// The units left: ranges of `seqs` batched in one pass, or one long sequence.
    groups: VecDeque<Range<usize>>,
    /// The most positions of one unit.
    chunk: usize,
    /// The scores of the sequences done.
    out: Vec<Scores>,
    /// A long sequence in progress: its cache, the next position, its scores so far.
    long: Option<(KvCache, usize, Scores)>,
}

/// The names requests may use: the base model first, then the adapters (shared with the HTTP
/// side, which answers 404 for other names and lists these in `/v1/models`).
pub type Names = Arc<RwLock<Vec<String>>>;

/// Adapters an engine holds at once unless `--max-loras` says otherwise: each is a copy of the
/// adapted projections, so loads without a bound grew memory until the process aborted.
pub const DEFAULT_MAX_LORAS: usize = 32;

/// The engine's state (lives on its thread).
pub struct Engine {
    base_name: String,
    base: Llama,
    config: LlamaConfig,
    adapters: BTreeMap<String, Llama>,
    names: Names,
    stop_tokens: Vec<u32>,
    device: Device,
    max_rows: usize,
    max_cells: usize,
    max_loras: usize,
    context: usize,
    rng: SplitMix64,
    continuous: bool,
    /// Scoring requests in progress, taking turns one unit at a time (`engine/score.rs`).
    scoring: VecDeque<ScoreJob>,
    /// The most positions of one scoring unit (`--prefill-chunk-tokens`).
    chunk_tokens: usize,
}

/// The most positions one scoring unit runs between two decode steps by default: its
/// log-softmax is positions × vocabulary floats (256 × 49 152 × 4 bytes = 48 MiB for SmolLM2).
pub const DEFAULT_CHUNK_TOKENS: usize = 256;

/// What one batch may hold (`--max-batch`, `--max-batch-tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Sampled rows.
    pub max_rows: usize,
    /// Rows × KV-cache positions.
    pub max_cells: usize,
}

/// The base model an engine serves: its name, weights and config, and the tokens that end a
/// row.
pub struct Base {
    /// The name requests give it.
    pub name: String,
    /// The weights.
    pub model: Llama,
    /// Its configuration.
    pub config: LlamaConfig,
    /// The tokens that end a row.
    pub stop_tokens: Vec<u32>,
}

impl Engine {
    /// An engine over `base` on `device`, batching within `budget` per call; `names` lists the
    /// models it serves.
    pub fn new(base: Base, device: Device, budget: Budget, names: Names) -> Self {
        let Base {
            name: base_name,
            model: base,
            config,
            stop_tokens,
        } = base;
        let Budget {
            max_rows,
            max_cells,
        } = budget;
        if let Ok(mut n) = names.write() {
            *n = vec![base_name.clone()];
        }
        let context = base.max_positions();
        Self {
            base_name,
            base,
            config,
            adapters: BTreeMap::new(),
            names,
            stop_tokens,
            device,
            max_rows: max_rows.max(1),
            max_cells: max_cells.max(1),
            max_loras: DEFAULT_MAX_LORAS,
            context,
            rng: SplitMix64(0x5e7e_d5ee_d000_0001),
            continuous: true,
            scoring: VecDeque::new(),
            chunk_tokens: DEFAULT_CHUNK_TOKENS,
        }
    }

    /// Continuous batching (the default) or batch at a time (`false`).
    pub fn with_continuous_batching(self, on: bool) -> Self {
        Self {
            continuous: on,
            ..self
        }
    }

    /// Scoring units of at most `positions` positions (`--prefill-chunk-tokens`).
    pub fn with_chunk_tokens(self, positions: usize) -> Self {
        Self {
            chunk_tokens: positions.max(1),
            ..self
        }
    }

    /// The tokens that end a choice of a request with `p`: the model's end-of-sequence ids
    /// (unless `ignore_eos`) and the request's own, sorted.
    fn stops(&self, p: &Params) -> Vec<u32> {
        let mut stop = if p.ignore_eos {
            Vec::new()
        } else {
            self.stop_tokens.clone()
        };
        stop.extend(&p.stop_tokens);
        stop.sort_unstable();
        stop.dedup();
        stop
    }

    /// The served model `name` (the base or an adapter).
    fn model(&self, name: &str) -> Option<&Llama> {
        if name == self.base_name {
            Some(&self.base)
        } else {
            self.adapters.get(name)
        }
    }

    /// Serves the queue until every sender is gone (the server shut down) and the queue is
    /// empty.
    pub fn run(self, rx: mpsc::Receiver<Msg>) {
        if self.continuous {
            self.run_continuous(rx)
        } else {
            self.run_static(rx)
        }
    }

    /// [`run`](Self::run) a batch at a time: the requests waiting when the engine is free.
    fn run_static(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut pending: VecDeque<Msg> = VecDeque::new();
        loop {
            if pending.is_empty() && self.scoring.is_empty() {
                match rx.blocking_recv() {
                    Some(m) => pending.push_back(m),
                    None => return,
                }
            } else if pending.is_empty() {
                // Scoring in progress: a unit, unless a message has come.
                match rx.try_recv() {
                    Ok(m) => pending.push_back(m),
                    Err(_) => {
                        self.score_unit();
                        continue;
                    }
                }
            }
            // What else is waiting joins this round, up to a round's rows: the rest stays in
            // the bounded channel, so `--max-queue` keeps meaning what it says.
            let mut waiting: usize = pending
                .iter()
                .map(|m| match m {
                    Msg::Generate(j) => j.rows(),
                    _ => 0,
                })
                .sum();
            while waiting < self.max_rows {
                let Ok(m) = rx.try_recv() else { break };
                if let Msg::Generate(j) = &m {
                    waiting += j.rows();
                }
                pending.push_back(m);
            }
            // The generation requests before the first control message, up to `max_rows` rows
            // (at least one request), make this round; a control message runs after them.
            let mut jobs = Vec::new();
            let mut rows = 0;
            while let Some(m) = pending.pop_front() {
                match m {
                    Msg::Generate(j) => {
                        if !jobs.is_empty() && rows + j.rows() > self.max_rows {
                            pending.push_front(Msg::Generate(j));
                            break;
                        }
                        rows += j.rows();
                        jobs.push(j);
                    }
                    control if jobs.is_empty() => {
                        self.control(control);
                    }
                    control => {
                        pending.push_front(control);
                        break;
                    }
                }
            }
            self.answer(jobs);
            self.score_unit();
        }
    }

    fn control(&mut self, m: Msg) {
        match m {
            Msg::Load(req, reply) => {
                let _ = reply.send(self.load(&req));
            }
            Msg::Unload(name, reply) => {
                let _ = reply.send(self.unload(&name));
            }
            Msg::UpdateWeights(path, reply) => {
                let _ = reply.send(self.update_weights(&path));
            }
            // Run a unit at a time between decode steps (`score_unit`).
            Msg::Score(model, seqs, reply) => self.enqueue_score(model, seqs, reply),
            Msg::Generate(_) => {}
        }
    }

    /// Groups `jobs` into sampler calls and answers each.
    fn answer(&mut self, jobs: Vec<Job>) {
        // (model, settings, n, seed or a unique index for seeded requests) → jobs
        let mut groups: Vec<(String, Vec<Job>)> = Vec::new();
        for (i, j) in jobs.into_iter().enumerate() {
            let p = &j.params;
            let key = format!(
                "{}|{:08x}|{:08x}|{}|{:08x}|{}|{:?}|{}|{}",
                j.model,
                p.temperature.to_bits(),
                p.top_p.to_bits(),
                p.top_k,
                p.min_p.to_bits(),
                p.n,
                p.stop_tokens,
                p.ignore_eos,
                match p.seed {
                    Some(s) => format!("seed{s}#{i}"),
                    None => "-".into(),
                }
            );
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(j),
                None => groups.push((key, vec![j])),
            }
        }
        // Each group in sampler calls within the row, KV-cache and context budgets: a call
        // runs every row to its longest prompt plus its largest max_tokens. Requests whose
        // client has gone (a timeout, a closed connection) are not generated.
        for (_, group) in groups {
            let mut call: Vec<Job> = Vec::new();
            let (mut rows, mut prompt, mut new) = (0, 0, 0);
            for j in group.into_iter().filter(|j| !j.reply.is_closed()) {
                let (r, p, n) = (
                    rows + j.rows(),
                    prompt.max(j.longest()),
                    new.max(j.max_tokens),
                );
                let fits =
                    r <= self.max_rows && r * (p + n) <= self.max_cells && p + n <= self.context;
                if !call.is_empty() && !fits {
                    self.run_group(std::mem::take(&mut call));
                    (rows, prompt, new) = (j.rows(), j.longest(), j.max_tokens);
                } else {
                    (rows, prompt, new) = (r, p, n);
                }
                call.push(j);
            }
            if !call.is_empty() {
                self.run_group(call);
            }
        }
    }

    fn run_group(&mut self, group: Vec<Job>) {
        let first = &group[0];
        let p = first.params.clone();
        let seed = p.seed.unwrap_or_else(|| self.rng.next_u64());
        let Some(model) = self.model(&first.model) else {
            // Unloaded while the request waited.
            let served = self.names.read().map(|n| n.clone()).unwrap_or_default();
            for j in group {
                let _ = j.reply.send(Err(ApiError::no_model(&j.model, &served)));
            }
            return;
        };
        let stop = self.stops(&p);
        let cfg = SamplingConfig {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            max_new_tokens: group.iter().map(|j| j.max_tokens).max().unwrap_or(1),
            stop_tokens: stop.clone(),
            n: p.n,
            seed,
            ..SamplingConfig::default()
        };
        let streaming = group.iter().any(|j| j.stream.is_some());
        let cfg = SamplingConfig {
            stop_check_every: if streaming { 1 } else { cfg.stop_check_every },
            ..cfg
        };
        let prompts: Vec<Vec<u32>> = group.iter().flat_map(|j| j.prompts.clone()).collect();
        let device = self.device.clone();
        let out = catch_unwind(AssertUnwindSafe(|| {
            let mut observe = relay(&group, &stop);
            let g = generate_observed(model, &prompts, &cfg, &device, Some(&mut observe))?;
            let ids = g.response_ids();
            let lps = g.log_probs.clone().try_into_vec_as::<f32>().map_err(|e| {
                ember_llm::LlmError::Input(format!("reading log-probs back: {e:?}"))
            })?;
            Ok::<_, ember_llm::LlmError>((ids, lps, g.log_probs.dims()[1]))
        }));
        let (ids, lps, width) = match out {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                for j in group {
                    let _ = j.reply.send(Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        format!("generation failed: {e}"),
                    )));
                }
                return;
            }
            Err(_) => {
                log::error!("generation panicked; the server goes on");
                for j in group {
                    let _ = j.reply.send(Err(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "server_error",
                        "generation failed (a panic in the sampler; the server goes on)",
                    )));
                }
                return;
            }
        };
        let mut row = 0;
        for j in group {
            let mut choices = Vec::with_capacity(j.rows());
            for prompt in 0..j.prompts.len() {
                for _ in 0..p.n {
                    let all = &ids[row];
                    let keep = all.len().min(j.max_tokens);
                    let tokens = all[..keep].to_vec();
                    let eos = tokens
                        .last()
                        .is_some_and(|t| stop.contains(t) && keep == all.len());
                    let log_probs = lps[row * width..row * width + keep].to_vec();
                    choices.push(Choice {
                        prompt,
                        tokens,
                        log_probs,
                        eos,
                    });
                    row += 1;
                }
            }
            let _ = j.reply.send(Ok(choices));
        }
    }
}

/// The observer of a sampler call over `group`: each streaming job gets its choices' new tokens
/// (up to its own `max_tokens`, through the first stop token); generation ends early once no
/// job's client is left.
fn relay<'a>(group: &'a [Job], stop: &'a [u32]) -> impl FnMut(&[Vec<u32>]) -> bool + 'a {
    // Row → (job, choice); rows are prompt-major in job order.
    let owners: Vec<(usize, usize)> = group
        .iter()
        .enumerate()
        .flat_map(|(j, job)| (0..job.rows()).map(move |c| (j, c)))
        .collect();
    let mut sent = vec![0usize; owners.len()];
    let mut ended = vec![false; owners.len()];
    move |fresh: &[Vec<u32>]| {
        let mut out: Vec<Vec<(usize, Vec<u32>)>> = vec![Vec::new(); group.len()];
        for (row, toks) in fresh.iter().enumerate() {
            let Some(&(j, c)) = owners.get(row) else {
                continue;
            };
            let mut new = Vec::new();
            for &t in toks {
                if ended[row] || sent[row] >= group[j].max_tokens {
                    break;
                }
                new.push(t);
                sent[row] += 1;
                ended[row] = stop.contains(&t);
            }
            if !new.is_empty() && group[j].stream.is_some() {
                out[j].push((c, new));
            }
        }
        for (job, deltas) in group.iter().zip(out) {
            if let (Some(tx), false) = (&job.stream, deltas.is_empty()) {
                let _ = tx.send(deltas);
            }
        }
        group.iter().any(|j| !j.reply.is_closed())
    }
}
