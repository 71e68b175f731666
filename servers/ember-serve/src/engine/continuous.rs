//! `ember serve --batching continuous` (the default): requests join the running decode batch
//! at the next step and each row leaves it when it ends ([`ember_llm::running`]), instead of
//! waiting for the batch before them to run to its longest row.
//!
//! Scheduling, in queue order at every decode step:
//! - a request for the running batch's model joins when its rows fit the row and KV-cache
//!   budgets (`--max-batch`, `--max-batch-tokens`, counting the rows still being prefilled);
//!   prompts of up to `--prefill-chunk-tokens` are prefilled together at that step, a longer one
//!   on its own a chunk per step (chunked prefill), so the decoding rows and the requests behind
//!   it wait one chunk at a time;
//! - a request for another model (base or adapter) waits until the running batch has drained;
//! - a request with a `seed` runs alone once the batch has drained, on the batch-at-a-time path,
//!   so that its answer does not depend on what else is being served;
//! - scoring (`echo`) runs a unit (`--prefill-chunk-tokens` positions) between two steps, the
//!   scoring requests taking turns (`engine/score.rs`); loads and unloads of adapters other
//!   than the one the batch decodes with run between two steps (a trainer's adapter push under
//!   a fresh name does not stop the rows in flight); a load in place of the batch's own
//!   adapter, its unload, and base-weight updates wait for the batch to drain, so every request
//!   taken before them is answered with the old weights and every one after with the new.

use super::{Choice, Engine, Job, Msg};
use crate::api::ApiError;
use axum::http::StatusCode;
use ember_llm::running::{Drawn, Finish, Limits, Prefill, RowSampling, RowSpec, Running};
use std::collections::{BTreeMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use tokio::sync::mpsc;

/// A request being answered: its choices so far.
struct Active {
    job: Job,
    choices: Vec<Choice>,
    open: usize,
}

/// The running batch and whom its rows belong to.
#[derive(Default)]
struct Batch {
    model: String,
    running: Option<Running>,
    /// Row tag → (request id, choice index).
    rows: BTreeMap<u64, (u64, usize)>,
    active: BTreeMap<u64, Active>,
    next_tag: u64,
    next_job: u64,
    /// Joiners whose prompts are being prefilled a chunk at a time (in the order they came);
    /// rows that come later may join beside them while they all fit.
    prefills: Vec<Prefill>,
}

impl Batch {
    /// Rows decoding, or joiners being prefilled.
    fn live(&self) -> bool {
        self.decoding() || !self.prefills.is_empty()
    }

    fn decoding(&self) -> bool {
        self.running.as_ref().is_some_and(|r| !r.is_empty())
    }
}

impl Engine {
    /// Serves the queue with continuous batching until every sender is gone and nothing is
    /// left to answer.
    pub fn run_continuous(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut pending: VecDeque<Msg> = VecDeque::new();
        let mut batch = Batch::default();
        loop {
            if pending.is_empty() && !batch.live() && self.scoring.is_empty() {
                match rx.blocking_recv() {
                    Some(m) => pending.push_back(m),
                    None => return,
                }
            }
            // Taken from the bounded channel only as far as a batch's rows, so that
            // `--max-queue` keeps meaning what it says.
            while pending.len() < self.max_rows {
                let Ok(m) = rx.try_recv() else { break };
                pending.push_back(m);
            }
            let joiners = self.schedule(&mut pending, &mut batch);
            self.join(&mut batch, joiners);
            self.prefill_chunks(&mut batch);
            self.decode(&mut batch);
            self.score_unit();
        }
    }

    /// Takes from the front of `pending` what can run now; returns the rows that join.
    fn schedule(&mut self, pending: &mut VecDeque<Msg>, batch: &mut Batch) -> Vec<RowSpec> {
        let mut joiners: Vec<RowSpec> = Vec::new();
        while let Some(front) = pending.front() {
            let busy = batch.live() || !joiners.is_empty();
            match front {
                Msg::Generate(j) if j.reply.is_closed() => {
                    pending.pop_front();
                }
                Msg::Generate(j) if j.params.seed.is_some() || !self.continuous_for(&j.model) => {
                    if busy {
                        break;
                    }
                    if let Some(Msg::Generate(j)) = pending.pop_front() {
                        self.answer(vec![j]);
                    }
                }
                Msg::Generate(j) => {
                    if busy && j.model != batch.model {
                        break;
                    }
                    let mut sizes: Vec<(usize, usize)> = joiners
                        .iter()
                        .map(|r| (r.prompt.len(), r.max_tokens))
                        .chain(batch.prefills.iter().flat_map(Prefill::sizes))
                        .collect();
                    for p in &j.prompts {
                        sizes.extend(std::iter::repeat_n((p.len(), j.max_tokens), j.params.n));
                    }
                    let fits = self
                        .running_for(batch, &j.model)
                        .is_some_and(|r| r.fits(&sizes));
                    let Some(Msg::Generate(j)) = (if fits || !busy {
                        pending.pop_front()
                    } else {
                        None
                    }) else {
                        break;
                    };
                    if fits {
                        joiners.extend(self.enlist(batch, j));
                    } else {
                        // Larger than a batch's budgets: the batch-at-a-time path splits it.
                        self.answer(vec![j]);
                    }
                }
                // Scoring, and loading or unloading an adapter the batch is not decoding with,
                // run between two steps: a pushed adapter reaches the engine without stopping
                // the rows in flight.
                Msg::Score(..) => {
                    if let Some(m) = pending.pop_front() {
                        self.control(m);
                    }
                }
                Msg::Load(req, _) if req.lora_name != batch.model => {
                    if let Some(m) = pending.pop_front() {
                        self.control(m);
                    }
                }
                Msg::Unload(name, _) if *name != batch.model => {
                    if let Some(m) = pending.pop_front() {
                        self.control(m);
                    }
                }
                _ if busy => break,
                _ => {
                    if let Some(m) = pending.pop_front() {
                        self.control(m);
                    }
                }
            }
        }
        joiners
    }

    /// Whether requests for `model` can be batched continuously (a served name that is not a
    /// Mixture-of-LoRA model; unknown names are answered by the batch-at-a-time path).
    fn continuous_for(&self, model: &str) -> bool {
        self.continuous
            && self
                .model(model)
                .is_some_and(|m| ember_llm::mixtures(m).is_empty())
    }

    /// The running batch, made anew for `model` when none is decoding.
    fn running_for<'a>(&self, batch: &'a mut Batch, model: &str) -> Option<&'a Running> {
        if !batch.live() && (batch.model != model || batch.running.is_none()) {
            let limits = Limits {
                max_rows: self.max_rows,
                max_cells: self.max_cells,
                bucket: 64,
            };
            batch.model = model.to_string();
            batch.running = self
                .model(model)
                .and_then(|m| Running::new(m, limits, &self.device).ok());
        }
        batch.running.as_ref()
    }

    /// Registers `job` as answered by the batch; its rows, to join.
    fn enlist(&mut self, batch: &mut Batch, job: Job) -> Vec<RowSpec> {
        let p = &job.params;
        let stop = self.stops(p);
        let sampling = RowSampling {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
        };
        let id = batch.next_job;
        batch.next_job += 1;
        let mut rows = Vec::with_capacity(job.rows());
        let mut choices = Vec::with_capacity(job.rows());
        for (i, prompt) in job.prompts.iter().enumerate() {
            for _ in 0..p.n {
                let tag = batch.next_tag;
                batch.next_tag += 1;
                batch.rows.insert(tag, (id, choices.len()));
                choices.push(Choice {
                    prompt: i,
                    tokens: Vec::new(),
                    log_probs: Vec::new(),
                    eos: false,
                });
                rows.push(RowSpec {
                    tag,
                    prompt: prompt.clone(),
                    max_tokens: job.max_tokens,
                    stop_tokens: stop.clone(),
                    sampling,
                    seed: self.rng.next_u64(),
                });
            }
        }
        let open = rows.len();
        batch.active.insert(id, Active { job, choices, open });
        rows
    }

    /// Sets up the prefill of `joiners` (their requests fail if that does); it runs a chunk
    /// of `--prefill-chunk-tokens` columns per step ([`Self::prefill_chunk`]).
    fn join(&mut self, batch: &mut Batch, joiners: Vec<RowSpec>) {
        if joiners.is_empty() {
            return;
        }
        // Prompts of up to a chunk are prefilled together (in one chunk, this step); a longer
        // one on its own (with the rows that share it), so that it holds back no other.
        let chunk = self.chunk_tokens;
        let (short, long): (Vec<RowSpec>, Vec<RowSpec>) =
            joiners.into_iter().partition(|r| r.prompt.len() <= chunk);
        let mut groups: Vec<Vec<RowSpec>> = vec![short];
        for r in long {
            match groups[1..].iter_mut().find(|g| g[0].prompt == r.prompt) {
                Some(g) => g.push(r),
                None => groups.push(vec![r]),
            }
        }
        for rows in groups.into_iter().filter(|g| !g.is_empty()) {
            let tags: Vec<u64> = rows.iter().map(|r| r.tag).collect();
            let Some(running) = batch.running.as_mut() else {
                return fail(batch, &tags, "no running batch");
            };
            match running.begin(rows) {
                Ok(p) => batch.prefills.extend(p),
                Err(e) => fail(batch, &tags, &format!("generation failed: {e}")),
            }
        }
    }

    /// A chunk of every pending prefill ([`Self::prefill_chunk`]).
    fn prefill_chunks(&mut self, batch: &mut Batch) {
        for pre in std::mem::take(&mut batch.prefills) {
            self.prefill_chunk(batch, pre);
        }
    }

    /// The next chunk of a prefill, and its rows' admission once it is whole (dropped when
    /// every one of their clients has gone). A prompt of up to one chunk joins in the step it
    /// arrives, as before chunking.
    fn prefill_chunk(&mut self, batch: &mut Batch, mut pre: Prefill) {
        let tags = pre.tags();
        let owners: Vec<u64> = tags
            .iter()
            .filter_map(|t| batch.rows.get(t).map(|(id, _)| *id))
            .collect();
        if owners
            .iter()
            .all(|id| batch.active.get(id).is_none_or(|a| a.job.reply.is_closed()))
        {
            batch.rows.retain(|_, (id, _)| !owners.contains(id));
            batch.active.retain(|id, _| !owners.contains(id));
            return;
        }
        let (Some(model), Some(running)) = (self.model(&batch.model), batch.running.as_mut())
        else {
            return fail(batch, &tags, "the model was unloaded");
        };
        let chunk = self.chunk_tokens;
        let step = catch_unwind(AssertUnwindSafe(|| {
            running.prefill(model, &mut pre, chunk);
            if pre.is_done() {
                running.finish(pre).map(|()| None)
            } else {
                Ok(Some(pre))
            }
        }));
        match step {
            Ok(Ok(left)) => batch.prefills.extend(left),
            Ok(Err(e)) => fail(batch, &tags, &format!("generation failed: {e}")),
            Err(_) => {
                log::error!("prefill panicked; the server goes on");
                batch.running = None;
                let all: Vec<u64> = batch.rows.keys().copied().collect();
                fail(batch, &all, "generation failed (a panic in the sampler)");
            }
        }
    }

    /// One decode step: each live row's token goes to its request (and its stream); finished
    /// requests are answered; rows whose client has gone are dropped.
    fn decode(&mut self, batch: &mut Batch) {
        if !batch.decoding() {
            return;
        }
        let gone: Vec<u64> = batch
            .active
            .iter()
            .filter(|(_, a)| a.job.reply.is_closed())
            .map(|(id, _)| *id)
            .collect();
        if !gone.is_empty() {
            let rows = &batch.rows;
            if let Some(r) = batch.running.as_mut() {
                r.cancel(|t| rows.get(&t).is_some_and(|(id, _)| gone.contains(id)));
            }
            batch.rows.retain(|_, (id, _)| !gone.contains(id));
            batch.active.retain(|id, _| !gone.contains(id));
        }
        let (Some(model), Some(running)) = (self.model(&batch.model), batch.running.as_mut())
        else {
            return;
        };
        let drawn = match catch_unwind(AssertUnwindSafe(|| running.step(model))) {
            Ok(Ok(d)) => d,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => format!("generation failed: {e}"),
                    _ => "generation failed (a panic in the sampler; the server goes on)".into(),
                };
                log::error!("{why}");
                batch.running = None;
                let all: Vec<u64> = batch.rows.keys().copied().collect();
                return fail(batch, &all, &why);
            }
        };
        deliver(batch, drawn);
    }
}

/// Hands drawn tokens to their requests; answers the requests whose rows have all ended.
fn deliver(batch: &mut Batch, drawn: Vec<Drawn>) {
    let mut deltas: BTreeMap<u64, Vec<(usize, Vec<u32>)>> = BTreeMap::new();
    for d in drawn {
        let Some(&(id, c)) = batch.rows.get(&d.tag) else {
            continue;
        };
        let Some(a) = batch.active.get_mut(&id) else {
            continue;
        };
        let choice = &mut a.choices[c];
        choice.tokens.push(d.token);
        choice.log_probs.push(d.log_prob);
        if a.job.stream.is_some() {
            deltas.entry(id).or_default().push((c, vec![d.token]));
        }
        if let Some(f) = d.finished {
            choice.eos = f == Finish::Stop;
            a.open -= 1;
            batch.rows.remove(&d.tag);
        }
    }
    for (id, d) in deltas {
        if let Some(tx) = batch.active.get(&id).and_then(|a| a.job.stream.as_ref()) {
            let _ = tx.send(d);
        }
    }
    let done: Vec<u64> = batch
        .active
        .iter()
        .filter(|(_, a)| a.open == 0)
        .map(|(id, _)| *id)
        .collect();
    for id in done {
        if let Some(a) = batch.active.remove(&id) {
            let _ = a.job.reply.send(Ok(a.choices));
        }
    }
}

/// Answers the requests owning the rows `tags` with a server error and forgets them.
fn fail(batch: &mut Batch, tags: &[u64], why: &str) {
    let ids: Vec<u64> = tags
        .iter()
        .filter_map(|t| batch.rows.get(t).map(|(id, _)| *id))
        .collect();
    for id in ids {
        if let Some(a) = batch.active.remove(&id) {
            let _ = a.job.reply.send(Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                why.to_string(),
            )));
        }
    }
    let active = &batch.active;
    batch.rows.retain(|_, (id, _)| active.contains_key(id));
    if let Some(r) = batch.running.as_mut() {
        let rows = &batch.rows;
        r.cancel(|t| !rows.contains_key(&t));
    }
}
