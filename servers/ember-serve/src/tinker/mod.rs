//! `ember serve --tinker`: the Tinker training API (the `tinker` SDK 0.38's wire protocol)
//! beside the OpenAI routes, so a loop written for Tinker's hosted service (sample, score,
//! `forward_backward`, `optim_step`, save) runs against a local model by changing its base URL
//! and key. The client owns the loop; the server owns the model, the LoRA weights, AdamW and
//! the sampler.
//!
//! - `wire.rs`: the protobuf messages and tensor codecs;
//! - `futures.rs`: request ids, long-polled results, retried submissions deduplicated;
//! - `trainer.rs`: the thread that owns the training clients and runs their requests in
//!   `seq_id` order; `pass.rs`: a request's datums in passes (shared prefixes scored once);
//!   `loss.rs`: the losses; `store.rs`: saved states and sampler adapters;
//! - `sample.rs`: `asample` on the engine's continuous batcher.
//!
//! Every route sits under `/api/v1/` and takes the key in `X-API-Key` (the SDK's header; it only
//! starts with keys beginning `tml-`).

mod futures;
mod loss;
mod pass;
mod sample;
mod store;
mod trainer;
mod wire;

use crate::api::ApiError;
use crate::engine::Msg;
use crate::state::AppState;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use burn::tensor::Device;
use futures::{Futures, Outcome, Poll};
use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::{Samplers, Store};
use tokio::sync::mpsc;
use trainer::{Op, Trainer, Work};

/// `ember serve --tinker`'s options.
#[derive(Debug, Clone, clap::Args)]
pub struct TinkerArgs {
    /// Serve the Tinker training API (the `tinker` SDK's protocol) under /api/v1.
    #[arg(long)]
    pub tinker: bool,
    /// Where `tinker://` checkpoints are written (`save_state`, `save_weights_for_sampler`).
    #[arg(long, default_value = "tinker-checkpoints")]
    pub tinker_dir: PathBuf,
    /// Another name for the served model, as NAME (repeatable): `create_model` and sampling
    /// accept it, so a loop that only takes names from its own model table runs on a local
    /// model of the same tokenizer family.
    #[arg(long = "alias", value_name = "NAME")]
    pub aliases: Vec<String>,
    /// Datums one `forward_backward` request may carry; the SDK splits larger batches into
    /// requests of at most this many.
    #[arg(long, default_value_t = 64)]
    pub tinker_max_chunk: usize,
}

/// How long `retrieve_future` holds a request before answering `try_again` (the SDK waits 45 s).
const POLL: Duration = Duration::from_secs(35);
/// How long a session may send no heartbeat before it ends (the SDK sends one every 10 s).
const SESSION_IDLE: Duration = Duration::from_secs(300);

/// Finished results kept for `retrieve_future`.
const RESULTS_KEPT: usize = 4096;

/// The Tinker service's shared state.
pub struct Service {
    futures: Arc<Futures>,
    trainer: Mutex<Option<std::sync::mpsc::Sender<Op>>>,
    samplers: Arc<Samplers>,
    store_dir: PathBuf,
    names: Vec<String>,
    max_chunk: usize,
    max_chunk_bytes: usize,
    closing: Arc<AtomicBool>,
    sessions: AtomicU64,
    stamp: u64,
    /// Each session's last sign of life (creation, heartbeat, a new training client).
    seen: Mutex<HashMap<String, std::time::Instant>>,
    /// Model id → (the base model name it was created with, LoRA rank when known).
    models: Mutex<HashMap<String, (String, Option<usize>)>>,
}

impl Service {
    /// Starts the trainer thread (which loads the model at `model` on `device`'s autodiff
    /// device) and returns the service.
    pub fn start(
        a: &TinkerArgs,
        model: &std::path::Path,
        base_name: &str,
        engine: mpsc::Sender<Msg>,
        device: &Device,
        max_body_bytes: usize,
    ) -> anyhow::Result<Self> {
        if a.tinker_max_chunk == 0 {
            anyhow::bail!("--tinker-max-chunk must be >= 1");
        }
        let futures = Arc::new(Futures::new(RESULTS_KEPT));
        let samplers = Arc::new(Samplers::new());
        samplers.register(base_name, base_name, None, false);
        let ad = device.clone().autodiff();
        let loaded = ember_llm::load(model, &ad)
            .map_err(|e| anyhow::anyhow!("loading {} for training: {e}", model.display()))?;
        let store = Store::new(
            a.tinker_dir.clone(),
            base_name.to_string(),
            engine,
            samplers.clone(),
        );
        let closing = Arc::new(AtomicBool::new(false));
        let t = Trainer::new(loaded.model, ad, futures.clone(), store, closing.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ember-tinker-trainer".into())
            .spawn(move || t.run(rx))?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut names = vec![base_name.to_string()];
        names.extend(a.aliases.iter().cloned());
        Ok(Self {
            futures,
            trainer: Mutex::new(Some(tx)),
            samplers,
            store_dir: a.tinker_dir.clone(),
            names,
            max_chunk: a.tinker_max_chunk,
            // The SDK's estimate of a chunk's size is its protobuf size; a margin for the
            // framing keeps every chunk under the body limit.
            max_chunk_bytes: max_body_bytes / 4 * 3,
            closing,
            sessions: AtomicU64::new(0),
            stamp,
            models: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `op` to the trainer; if it has stopped, `future` (the op's, if any) fails.
    fn send(&self, op: Op, future: Option<&str>) -> Result<(), ApiError> {
        let tx = lock(&self.trainer);
        let sent = tx.as_ref().is_some_and(|tx| tx.send(op).is_ok());
        if sent {
            return Ok(());
        }
        let message = "the trainer has stopped (the server is shutting down)";
        if let Some(id) = future {
            let category = "server";
            let out = Outcome::Error {
                message: message.into(),
                category,
            };
            self.futures.finish(id, out);
        }
        Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            message,
        ))
    }

    /// Stops the trainer once it has failed what it holds (at shutdown, so that the engine's
    /// queue closes).
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        lock(&self.trainer).take();
    }

    fn base_of(&self, name: &str) -> Result<(), ApiError> {
        if self.names.iter().any(|n| n == name) {
            Ok(())
        } else {
            Err(ApiError::bad(
                "base_model",
                format!(
                    "`{name}` is not served here (served: {})",
                    self.names.join(", ")
                ),
            ))
        }
    }
}

/// The Tinker routes (added to `ember serve`'s router when `--tinker` is on).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/v1/client/config", post(config))
        .route("/api/v1/create_session", post(create_session))
        .route("/api/v1/session_heartbeat", post(heartbeat))
        .route(
            "/api/v1/telemetry",
            post(|| async { Json(json!({"status": "accepted"})) }),
        )
        .route("/api/v1/sessions/{id}/finish", post(finish_session))
        .route(
            "/api/v1/healthz",
            get(|| async { Json(json!({"status": "ok"})) }),
        )
        .route("/api/v1/get_server_capabilities", get(capabilities))
        .route("/api/v1/create_model", post(create_model))
        .route("/api/v1/get_info", post(get_info))
        .route("/api/v1/forward_backward", post(forward_backward))
        .route("/api/v1/optim_step", post(optim_step))
        .route("/api/v1/save_weights", post(save_weights))
        .route("/api/v1/save_weights_for_sampler", post(save_for_sampler))
        .route("/api/v1/save_weights_external", post(save_external))
        .route("/api/v1/load_weights", post(load_weights))
        .route(
            "/api/v1/create_sampling_session",
            post(sample::create_session),
        )
        .route("/api/v1/samplers/{id}", get(sample::sampler_info))
        .route("/api/v1/asample", post(sample::asample))
        .route("/api/v1/retrieve_future", post(retrieve_future))
        .route(
            "/api/v1/training_runs/{id}/checkpoints",
            get(list_checkpoints),
        )
        .route("/api/v1/weights_info", post(weights_info))
}

use axum::Json;

/// The service, or 404 when `--tinker` is off.
fn service(st: &AppState) -> Result<&Service, ApiError> {
    st.tinker.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "the Tinker API is off: start the server with --tinker",
        )
    })
}

/// A JSON body read into `T` (unknown fields ignored), or 400 naming the problem.
fn body<T: for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad("body", format!("request body: {e}")))
}

fn future_reply(id: &str, model_id: Option<&str>) -> Response {
    let mut v = json!({"request_id": id});
    if let Some(m) = model_id {
        v["model_id"] = m.into();
    }
    Json(v).into_response()
}

async fn config(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let s = service(&st)?;
    Ok(Json(json!({
        "pjwt_auth_enabled": false,
        "use_pyqwest_transport": false,
        "proto_compress_fwdbwd": false,
        "fwdbwd_max_chunk_len": s.max_chunk,
        "fwdbwd_max_chunk_bytes_count": s.max_chunk_bytes,
    }))
    .into_response())
}

async fn create_session(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let n = s.sessions.fetch_add(1, Ordering::Relaxed);
    let id = format!("s{:x}-{n}", s.stamp);
    s.seen(&id)?;
    Ok(Json(json!({"session_id": id, "type": "create_session"})).into_response())
}

#[derive(Deserialize)]
struct Heartbeat {
    session_id: String,
}

/// `session_heartbeat` (every 10 s from the SDK): the session stays; sessions silent for
/// [`SESSION_IDLE`] end, and their training clients are dropped.
async fn heartbeat(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: Heartbeat = body(&b)?;
    check_session(&r.session_id)?;
    s.seen(&r.session_id)?;
    Ok(Json(json!({"type": "session_heartbeat"})).into_response())
}

impl Service {
    /// Marks `session` alive now, and ends the sessions silent for [`SESSION_IDLE`] (a script
    /// that died without `close()`).
    fn seen(&self, session: &str) -> Result<(), ApiError> {
        let now = std::time::Instant::now();
        let idle: Vec<String> = {
            let mut seen = lock(&self.seen);
            seen.insert(session.to_string(), now);
            let idle = seen
                .iter()
                .filter(|(_, t)| now.duration_since(**t) > SESSION_IDLE)
                .map(|(id, _)| id.clone())
                .collect();
            seen.retain(|_, t| now.duration_since(*t) <= SESSION_IDLE);
            idle
        };
        for id in idle {
            log::info!("session {id} sent no heartbeat for {SESSION_IDLE:?}: it ends");
            self.end(id)?;
        }
        Ok(())
    }

    /// Ends `session`: its models, sampling sessions and training clients are dropped.
    fn end(&self, session: String) -> Result<(), ApiError> {
        let prefix = format!("{session}:");
        lock(&self.models).retain(|m, _| !m.starts_with(&prefix));
        self.samplers.end_session(&prefix);
        lock(&self.seen).remove(&session);
        self.send(Op::EndSession(session), None)
    }
}

async fn capabilities(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let models: Vec<Value> = s
        .names
        .iter()
        .map(|n| {
            json!({"model_name": n, "max_context_length": st.info.context,
                   "trainable": true, "sampleable": true})
        })
        .collect();
    Ok(Json(json!({"supported_models": models})).into_response())
}

/// `sessions/{id}/finish`: the session's training clients are dropped (their saved states
/// stay on disk).
async fn finish_session(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let s = service(&st)?;
    s.end(id)?;
    Ok(Json(json!({})).into_response())
}

#[derive(Deserialize)]
struct CreateModel {
    session_id: String,
    model_seq_id: u64,
    base_model: String,
    lora_config: Option<trainer::LoraRequest>,
    #[serde(default)]
    optimizer_config: Option<Value>,
}

fn check_session(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            "session_id",
            format!("bad session id `{id}`"),
        ))
    }
}

async fn create_model(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let req: CreateModel = body(&b)?;
    check_session(&req.session_id)?;
    s.seen(&req.session_id)?;
    s.base_of(&req.base_model)?;
    let lora = req
        .lora_config
        .ok_or_else(|| ApiError::bad("lora_config", "only LoRA training clients are supported"))?;
    if lora.rank == 0 || lora.rank > 1024 {
        return Err(ApiError::bad(
            "lora_config.rank",
            "rank must be in 1..=1024",
        ));
    }
    let kind = req.optimizer_config.as_ref().and_then(|o| o.get("type"));
    if let Some(kind) = kind.filter(|k| *k != "adamw") {
        return Err(ApiError::bad(
            "optimizer_config",
            format!("optimizer {kind} is not supported (adamw is)"),
        ));
    }
    let model_id = format!("{}:train:{}", req.session_id, req.model_seq_id);
    let (id, fresh) = s.futures.open(Some(format!("create {model_id}")));
    if fresh {
        lock(&s.models).insert(model_id.clone(), (req.base_model.clone(), Some(lora.rank)));
        let op = Op::Create {
            model_id: model_id.clone(),
            lora,
            future: id.clone(),
        };
        s.send(op, Some(&id))?;
    }
    Ok(future_reply(&id, Some(&model_id)))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Deserialize)]
struct ModelRef {
    model_id: String,
}

async fn get_info(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let req: ModelRef = body(&b)?;
    let known = lock(&s.models).get(&req.model_id).cloned();
    let Some((name, rank)) = known else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no training client `{}`", req.model_id),
        ));
    };
    Ok(Json(json!({
        "type": "get_info",
        "model_id": req.model_id,
        "model_data": {"arch": "llama", "model_name": name, "tokenizer_id": name},
        "is_lora": true,
        "lora_rank": rank,
        "model_name": name,
    }))
    .into_response())
}

/// Queues `work` as request `seq_id` of `model_id` (a retried submission gets the first id).
fn step(s: &Service, model_id: &str, seq_id: i64, work: Work) -> Result<Response, ApiError> {
    let (id, fresh) = s.futures.open(Some(format!("{model_id}#{seq_id}")));
    if fresh {
        let op = Op::Step {
            model_id: model_id.to_string(),
            seq_id,
            work,
            future: id.clone(),
        };
        s.send(op, Some(&id))?;
    }
    Ok(future_reply(&id, Some(model_id)))
}

async fn forward_backward(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    b: Bytes,
) -> Result<Response, ApiError> {
    let s = service(&st)?;
    if headers.contains_key(header::CONTENT_ENCODING) {
        return Err(ApiError::bad(
            "body",
            "compressed forward_backward bodies are not supported",
        ));
    }
    let req = wire::ForwardBackwardRequest::decode(&b[..]).map_err(|e| {
        ApiError::bad(
            "body",
            format!("forward_backward: not a ForwardBackwardRequest: {e}"),
        )
    })?;
    let (model_id, seq_id) = (req.model_id.clone(), i64::from(req.seq_id));
    let work = if req.data.len() > s.max_chunk {
        Work::Invalid(format!(
            "{} datums in one request; this server takes at most {} (--tinker-max-chunk)",
            req.data.len(),
            s.max_chunk
        ))
    } else {
        Work::ForwardBackward(Box::new(req))
    };
    step(s, &model_id, seq_id, work)
}

#[derive(Deserialize)]
struct Seq {
    model_id: String,
    seq_id: i64,
}

async fn optim_step(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: Seq = body(&b)?;
    let v: Value = body(&b)?;
    let work = match v
        .get("adam_params")
        .map(|p| serde_json::from_value(p.clone()))
    {
        Some(Ok(p)) => Work::Optim(p),
        Some(Err(e)) => Work::Invalid(format!("adam_params: {e}")),
        None => Work::Invalid("optim_step: only adam_params (AdamW) is supported".into()),
    };
    step(s, &r.model_id, r.seq_id, work)
}

async fn save_weights(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: Seq = body(&b)?;
    let v: Value = body(&b)?;
    let work = match v.get("path").and_then(Value::as_str) {
        Some(name) => Work::SaveState {
            name: name.to_string(),
            overwrite: v.get("overwrite").and_then(Value::as_bool).unwrap_or(false),
        },
        None => Work::Invalid("save_weights needs a path (the checkpoint's name)".into()),
    };
    step(s, &r.model_id, r.seq_id, work)
}

async fn save_for_sampler(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: Seq = body(&b)?;
    let v: Value = body(&b)?;
    let session = v
        .get("sampling_session_seq_id")
        .and_then(Value::as_u64)
        .map(|n| format!("{}:sample:{n}", session_of(&r.model_id)));
    let save = store::SamplerSave {
        name: v.get("path").and_then(Value::as_str).map(String::from),
        session,
    };
    step(s, &r.model_id, r.seq_id, Work::SaveSampler(save))
}

/// The session part of a model id `SESSION:train:N`.
fn session_of(model_id: &str) -> &str {
    model_id.split(":train:").next().unwrap_or(model_id)
}

async fn save_external(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: Seq = body(&b)?;
    let msg = "save_weights_external is not supported: save_state writes a PEFT adapter under \
               --tinker-dir that loads anywhere";
    step(s, &r.model_id, r.seq_id, Work::Invalid(msg.into()))
}

#[derive(Deserialize)]
struct LoadWeights {
    path: String,
    #[serde(default)]
    optimizer: bool,
    model_id: Option<String>,
    seq_id: Option<i64>,
    session_id: Option<String>,
    model_seq_id: Option<u64>,
}

async fn load_weights(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: LoadWeights = body(&b)?;
    if let (Some(model_id), Some(seq_id)) = (&r.model_id, r.seq_id) {
        let work = Work::Load {
            path: r.path,
            optimizer: r.optimizer,
        };
        return step(s, model_id, seq_id, work);
    }
    let (Some(session), Some(n)) = (r.session_id, r.model_seq_id) else {
        return Err(ApiError::bad(
            "model_id",
            "load_weights needs model_id and seq_id, or session_id and model_seq_id",
        ));
    };
    check_session(&session)?;
    let model_id = format!("{session}:train:{n}");
    let (id, fresh) = s.futures.open(Some(format!("create {model_id}")));
    if fresh {
        let base = s.names.first().cloned().unwrap_or_default();
        lock(&s.models).insert(model_id.clone(), (base, None));
        let op = Op::FromState {
            model_id: model_id.clone(),
            path: r.path,
            optimizer: r.optimizer,
            future: id.clone(),
        };
        s.send(op, Some(&id))?;
    }
    Ok(future_reply(&id, Some(&model_id)))
}

/// `GET training_runs/{id}/checkpoints` (`RestClient.list_checkpoints`, `tinker checkpoint
/// list`): the saves under `--tinker-dir`.
async fn list_checkpoints(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let list = store::list(&s.store_dir, &id).map_err(|e| ApiError::bad("training_run_id", e))?;
    Ok(Json(json!({"checkpoints": list, "cursor": null})).into_response())
}

#[derive(Deserialize)]
struct WeightsInfo {
    tinker_path: String,
}

/// `POST weights_info` (`RestClient.get_weights_info_by_tinker_path`).
async fn weights_info(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: WeightsInfo = body(&b)?;
    let base = s.names.first().cloned().unwrap_or_default();
    let info = store::info(&s.store_dir, &base, &r.tinker_path)
        .map_err(|e| ApiError::bad("tinker_path", e))?;
    Ok(Json(info).into_response())
}

#[derive(Deserialize)]
struct Retrieve {
    request_id: String,
}

async fn retrieve_future(State(st): State<Arc<AppState>>, b: Bytes) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: Retrieve = body(&b)?;
    Ok(match s.futures.poll(&r.request_id, POLL).await {
        Poll::Ready(Outcome::Json(v)) => Json(v).into_response(),
        Poll::Ready(Outcome::Proto(bytes)) => {
            ([(header::CONTENT_TYPE, "application/x-protobuf")], bytes).into_response()
        }
        Poll::Ready(Outcome::Error { message, category }) => {
            Json(json!({"error": message, "category": category})).into_response()
        }
        Poll::Pending => Json(json!({
            "type": "try_again", "request_id": r.request_id, "queue_state": "active"
        }))
        .into_response(),
        Poll::Unknown => Json(json!({
            "error": format!("no request `{}` (unknown, or its result was dropped)", r.request_id),
            "category": "user"
        }))
        .into_response(),
    })
}
