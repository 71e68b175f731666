//! The training side of the Tinker service: one thread owns every training client's LoRA
//! model, its accumulated gradients and its AdamW, and runs each client's requests in
//! `seq_id` order (the SDK sends request n + 1 before n is done, and the chunks of one
//! `forward_backward` in any order), holding a request until those before it have run.

use super::futures::{Futures, Outcome};
use super::loss::LossFn;
use super::pass::{Parsed, passes, run_pass};
use super::store;
use super::wire::{self, ForwardBackwardRequest};
use burn::module::Module;
use burn::optim::GradientsAccumulator;
use burn::tensor::{Device, Tensor};
use ember_llm::{Llama, LoraSettings};
use ember_train::{Optimizer, OptimizerConfig};
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// `create_model`'s `lora_config`.
#[derive(Debug, Clone, Deserialize)]
pub struct LoraRequest {
    /// Rank.
    pub rank: usize,
    /// Seed of the adapters' initialisation.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Adapters on the MLP projections.
    #[serde(default = "yes")]
    pub train_mlp: bool,
    /// Adapters on the attention projections.
    #[serde(default = "yes")]
    pub train_attn: bool,
    /// An adapter on the unembedding (not supported: logged and left out).
    #[serde(default = "yes")]
    pub train_unembed: bool,
}

fn yes() -> bool {
    true
}

/// `optim_step`'s `adam_params` (`torch.optim.AdamW` semantics).
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct AdamParams {
    /// Learning rate.
    pub learning_rate: f64,
    /// The rest, which the optimizer keeps between steps.
    #[serde(flatten)]
    pub settings: Adam,
}

/// AdamW's settings besides the learning rate, as `adam_params` names them (kept with a saved
/// state in `tinker.json`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Adam {
    /// β₁.
    #[serde(default = "b1")]
    pub beta1: f32,
    /// β₂.
    #[serde(default = "b2")]
    pub beta2: f32,
    /// ε.
    #[serde(default = "eps")]
    pub eps: f32,
    /// Decoupled weight decay.
    #[serde(default)]
    pub weight_decay: f32,
    /// Global gradient-norm bound (0: none).
    #[serde(default)]
    pub grad_clip_norm: f32,
}

impl Adam {
    /// Checks each value.
    fn check(&self) -> Result<(), String> {
        let ok = (0.0..1.0).contains(&self.beta1)
            && (0.0..1.0).contains(&self.beta2)
            && self.eps > 0.0
            && self.weight_decay >= 0.0
            && self.grad_clip_norm >= 0.0;
        ok.then_some(()).ok_or_else(|| {
            format!(
                "adam_params out of range ({self:?}): betas in [0, 1), eps > 0, weight_decay \
                 and grad_clip_norm >= 0"
            )
        })
    }

    /// Ember's optimizer with these settings.
    pub fn optimizer(&self) -> Optimizer {
        let config = OptimizerConfig::default()
            .with_betas(self.beta1, self.beta2)
            .with_epsilon(self.eps)
            .with_grad_clip(self.grad_clip_norm);
        OptimizerConfig {
            weight_decay: self.weight_decay,
            ..config
        }
        .init()
    }
}

fn b1() -> f32 {
    0.9
}
fn b2() -> f32 {
    0.95
}
fn eps() -> f32 {
    1e-12
}

/// What a training client asks, in its `seq_id` order.
pub enum Work {
    /// `forward_backward` (or `forward`, with `forward_only`).
    ForwardBackward(Box<ForwardBackwardRequest>),
    /// `optim_step`.
    Optim(AdamParams),
    /// `save_weights`: adapter and optimizer under a name.
    SaveState { name: String, overwrite: bool },
    /// `save_weights_for_sampler`: a named adapter, or an ephemeral one for a sampling session.
    SaveSampler(store::SamplerSave),
    /// `load_weights` into this client: the adapter, and the optimizer state when asked.
    Load { path: String, optimizer: bool },
    /// A request that could not be read: its `seq_id` still passes, with this error.
    Invalid(String),
}

/// A message to the trainer.
pub enum Op {
    /// `create_model`.
    Create {
        model_id: String,
        lora: LoraRequest,
        future: String,
    },
    /// `create_training_client_from_state`: a new client from a saved state.
    FromState {
        model_id: String,
        path: String,
        optimizer: bool,
        future: String,
    },
    /// A request of a training client.
    Step {
        model_id: String,
        seq_id: i64,
        work: Work,
        future: String,
    },
    /// A session ended (`sessions/{id}/finish`): its training clients are dropped.
    EndSession(String),
}

/// Training clients held at once; `create_model` past it is refused until a session ends.
pub const MAX_CLIENTS: usize = 64;

/// How far past the next request to run a request may arrive (the SDK sends a chunked batch's
/// chunks at once, and later requests before earlier ones finish).
const MAX_AHEAD: i64 = 4096;

/// One training client.
pub struct Client {
    pub(super) model: Llama,
    pub(super) lora: LoraSettings,
    acc: GradientsAccumulator<Llama>,
    pending_grads: bool,
    pub(super) optim: Optimizer,
    /// The settings `optim` was built with (none before the first `optim_step`).
    pub(super) adam: Option<Adam>,
    next_seq: i64,
    waiting: BTreeMap<i64, (Work, String)>,
}

impl Client {
    /// The gradients of `loss` added to those gathered since the last `optim_step`.
    pub(super) fn add_gradients(&mut self, loss: Tensor<1>) {
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &self.model);
        self.acc.accumulate(&self.model, grads);
        self.pending_grads = true;
    }

    pub(super) fn new(model: Llama, lora: LoraSettings) -> Self {
        Self {
            model,
            lora,
            acc: GradientsAccumulator::new(),
            pending_grads: false,
            optim: OptimizerConfig::default().init(),
            adam: None,
            next_seq: 1,
            waiting: BTreeMap::new(),
        }
    }
}

/// The trainer's state (lives on its thread).
pub struct Trainer {
    pub(super) base: Llama,
    pub(super) device: Device,
    pub(super) clients: HashMap<String, Client>,
    futures: Arc<Futures>,
    pub(super) store: store::Store,
    closing: Arc<AtomicBool>,
}

impl Trainer {
    /// A trainer over `base` (on an autodiff device), answering through `futures`.
    pub fn new(
        base: Llama,
        device: Device,
        futures: Arc<Futures>,
        store: store::Store,
        closing: Arc<AtomicBool>,
    ) -> Self {
        Self {
            base: base.no_grad(),
            device,
            clients: HashMap::new(),
            futures,
            store,
            closing,
        }
    }

    /// Runs until every sender is gone; once `closing` is set, what is queued fails at once.
    pub fn run(mut self, rx: std::sync::mpsc::Receiver<Op>) {
        while let Ok(op) = rx.recv() {
            if !self.closing.load(Ordering::SeqCst) {
                self.handle(op);
                continue;
            }
            let future = match op {
                Op::Create { future, .. } | Op::FromState { future, .. } => future,
                Op::Step { future, .. } => future,
                Op::EndSession(_) => continue,
            };
            let message = "the server is shutting down".to_string();
            self.futures.finish(
                &future,
                Outcome::Error {
                    message,
                    category: "server",
                },
            );
        }
    }

    fn handle(&mut self, op: Op) {
        match op {
            Op::Create {
                model_id,
                lora,
                future,
            } => {
                let out = catch_unwind(AssertUnwindSafe(|| self.create(&model_id, &lora)));
                let out = out.unwrap_or_else(|_| Err("internal error creating the model".into()));
                self.futures.finish(&future, answer(out));
            }
            Op::FromState {
                model_id,
                path,
                optimizer,
                future,
            } => {
                let out = catch_unwind(AssertUnwindSafe(|| {
                    self.create_from_state(&model_id, &path, optimizer)
                }));
                let out = out.unwrap_or_else(|_| Err(format!("internal error loading {path}")));
                self.futures.finish(&future, answer(out));
            }
            Op::Step {
                model_id,
                seq_id,
                work,
                future,
            } => self.enqueue(model_id, seq_id, work, future),
            Op::EndSession(session) => {
                let prefix = format!("{session}:train:");
                let ended: Vec<String> = self
                    .clients
                    .keys()
                    .filter(|id| id.starts_with(&prefix))
                    .cloned()
                    .collect();
                for id in ended {
                    self.drop_client(&id, "its session ended");
                }
            }
        }
    }

    /// Drops a client, failing the requests it holds (`why` says why).
    fn drop_client(&mut self, model_id: &str, why: &str) {
        if let Some(c) = self.clients.remove(model_id) {
            for (_, (_, future)) in c.waiting {
                let msg = format!("the training client {model_id} was dropped: {why}");
                self.futures.finish(&future, Outcome::user(msg));
            }
        }
    }

    fn room(&self, model_id: &str) -> Result<(), String> {
        if self.clients.len() >= MAX_CLIENTS && !self.clients.contains_key(model_id) {
            return Err(format!(
                "{MAX_CLIENTS} training clients are held, the most this server keeps: close a \
                 session (ServiceClient.close) to free its clients"
            ));
        }
        Ok(())
    }

    fn create(&mut self, model_id: &str, req: &LoraRequest) -> Result<serde_json::Value, String> {
        self.room(model_id)?;
        let mut targets = Vec::new();
        if req.train_attn {
            targets.extend(["q_proj", "k_proj", "v_proj", "o_proj"]);
        }
        if req.train_mlp {
            targets.extend(["gate_proj", "up_proj", "down_proj"]);
        }
        if targets.is_empty() {
            return Err("lora_config: train_attn and train_mlp are both false".into());
        }
        if req.train_unembed {
            log::warn!(
                "{model_id}: train_unembed is not supported (Ember's LoRA adapts the seven \
                 projections): the unembedding stays frozen"
            );
        }
        // α = 32 at every rank, as Tinker's LoRA ("LoRA Without Regret", Schulman et al. 2025).
        let lora = LoraSettings {
            rank: req.rank,
            alpha: 32.0,
            targets: targets.into_iter().map(String::from).collect(),
        };
        if let Some(seed) = req.seed {
            self.device.seed(seed);
        }
        let model = ember_llm::apply_lora(self.base.clone(), &lora).map_err(|e| e.to_string())?;
        self.clients
            .insert(model_id.to_string(), Client::new(model, lora));
        Ok(json!({"model_id": model_id, "type": "create_model"}))
    }

    fn create_from_state(
        &mut self,
        model_id: &str,
        path: &str,
        optimizer: bool,
    ) -> Result<serde_json::Value, String> {
        self.room(model_id)?;
        let client = self.store.load_client(&self.base, path, optimizer)?;
        self.clients.insert(model_id.to_string(), client);
        Ok(json!({"model_id": model_id, "path": path, "type": "load_weights"}))
    }

    fn enqueue(&mut self, model_id: String, seq_id: i64, work: Work, future: String) {
        let Some(c) = self.clients.get_mut(&model_id) else {
            let msg = format!("no training client `{model_id}` (create_model first)");
            self.futures.finish(&future, Outcome::user(msg));
            return;
        };
        if seq_id < c.next_seq || seq_id - c.next_seq > MAX_AHEAD {
            let msg = format!(
                "seq_id {seq_id} of {model_id}: the next to run is {} (at most {MAX_AHEAD} may \
                 wait for it)",
                c.next_seq
            );
            self.futures.finish(&future, Outcome::user(msg));
            return;
        }
        c.waiting.insert(seq_id, (work, future));
        loop {
            let Some(c) = self.clients.get_mut(&model_id) else {
                return;
            };
            let Some((work, future)) = c.waiting.remove(&c.next_seq) else {
                return;
            };
            c.next_seq += 1;
            let out = catch_unwind(AssertUnwindSafe(|| self.run_work(&model_id, work)));
            let Ok(out) = out else {
                // A panic may leave the client half-updated: it is dropped, with what waits.
                let message = format!("internal error; the training client {model_id} was dropped");
                let category = "server";
                self.futures
                    .finish(&future, Outcome::Error { message, category });
                self.drop_client(&model_id, "an earlier request failed inside the server");
                return;
            };
            self.futures.finish(&future, out);
        }
    }

    fn run_work(&mut self, model_id: &str, work: Work) -> Outcome {
        let out = match work {
            Work::ForwardBackward(req) => {
                return self
                    .forward_backward(model_id, &req)
                    .unwrap_or_else(Outcome::user);
            }
            Work::Optim(p) => self.optim_step(model_id, p),
            Work::SaveState { name, overwrite } => self.save_state(model_id, &name, overwrite),
            Work::SaveSampler(s) => self.save_sampler(model_id, s),
            Work::Load { path, optimizer } => {
                let client = self.store.load_client(&self.base, &path, optimizer);
                client.and_then(|new| self.replace(model_id, new, &path))
            }
            Work::Invalid(e) => Err(e),
        };
        answer(out)
    }

    fn client(&mut self, model_id: &str) -> Result<&mut Client, String> {
        self.clients
            .get_mut(model_id)
            .ok_or_else(|| format!("no training client `{model_id}`"))
    }

    fn replace(
        &mut self,
        model_id: &str,
        new: Client,
        path: &str,
    ) -> Result<serde_json::Value, String> {
        let c = self.client(model_id)?;
        if new.lora != c.lora {
            return Err(format!(
                "{path} holds a LoRA of rank {} on {:?}; this client's is rank {} on {:?}",
                new.lora.rank, new.lora.targets, c.lora.rank, c.lora.targets
            ));
        }
        // Without the saved optimizer state the moments start again, for the new weights.
        c.model = new.model;
        c.acc = GradientsAccumulator::new();
        c.pending_grads = false;
        c.optim = new.optim;
        c.adam = new.adam;
        Ok(json!({"path": path, "type": "load_weights"}))
    }

    /// One request's datums in passes of at most [`PASS_TOKENS`](super::pass::PASS_TOKENS) cells: log-probs, the loss,
    /// and (unless `forward_only`) the gradients added to the client's.
    fn forward_backward(
        &mut self,
        model_id: &str,
        req: &ForwardBackwardRequest,
    ) -> Result<Outcome, String> {
        let loss = LossFn::parse(&req.loss_fn, &req.loss_fn_config_v2)?;
        let vocab = self.base.vocab_size();
        let context = self.base.max_positions();
        let datums = req
            .data
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Parsed::read(d, &loss, vocab, context).map_err(|e| format!("datum {i}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if datums.is_empty() {
            return Err("forward_backward: no datums".into());
        }
        let device = self.device.clone();
        let c = self.client(model_id)?;
        let mut log_probs = Vec::with_capacity(datums.len());
        let mut loss_sum = 0.0f64;
        for pass in passes(&datums) {
            let (lp, sum) = run_pass(c, &datums[pass], &loss, &device, req.forward_only)?;
            log_probs.extend(lp);
            loss_sum += sum;
        }
        let out = wire::ForwardBackwardOutput {
            loss_fn_output_type: "ArrayRecord".into(),
            loss_fn_outputs: vec![wire::record_of("logprobs", &log_probs)],
            metrics: HashMap::from([("loss:sum".to_string(), loss_sum)]),
        };
        Ok(Outcome::Proto(out.encode_to_vec()))
    }

    fn optim_step(&mut self, model_id: &str, p: AdamParams) -> Result<serde_json::Value, String> {
        if !(p.learning_rate.is_finite() && p.learning_rate >= 0.0) {
            return Err(format!("learning_rate {} must be >= 0", p.learning_rate));
        }
        p.settings.check()?;
        let c = self.client(model_id)?;
        if c.adam != Some(p.settings) {
            // A change of β, ε, decay or the clip bound keeps the moments: the new AdamW
            // takes the old one's state.
            let state = c.optim.to_record();
            c.optim = p.settings.optimizer().load_record(state);
            c.adam = Some(p.settings);
        }
        if !c.pending_grads {
            return Ok(json!({"type": "optim_step", "metrics": {}}));
        }
        let grads = c.acc.grads();
        c.pending_grads = false;
        let model = c.model.clone();
        let (model, report) = c.optim.step(p.learning_rate, model, grads);
        c.model = model;
        Ok(json!({
            "type": "optim_step",
            "metrics": {"grad_norm:mean": report.grad_norm, "applied:mean": f64::from(u8::from(report.applied))}
        }))
    }

    fn save_state(
        &mut self,
        model_id: &str,
        name: &str,
        overwrite: bool,
    ) -> Result<serde_json::Value, String> {
        let c = self
            .clients
            .get(model_id)
            .ok_or("no such training client")?;
        let path = self.store.save_state(model_id, name, c, overwrite)?;
        Ok(json!({"path": path, "type": "save_weights"}))
    }

    fn save_sampler(
        &mut self,
        model_id: &str,
        s: store::SamplerSave,
    ) -> Result<serde_json::Value, String> {
        let c = self
            .clients
            .get(model_id)
            .ok_or("no such training client")?;
        let model = c.model.valid();
        let lora = c.lora.clone();
        self.store.save_sampler(model_id, &model, &lora, s)
    }
}

fn answer(out: Result<serde_json::Value, String>) -> Outcome {
    match out {
        Ok(v) => Outcome::Json(v),
        Err(e) => Outcome::user(e),
    }
}
