//! What every handler of `ember serve` shares: the model's facts, the tokenizer, the served
//! names, the queue's sender and the limits.

use super::access::Access;
use super::api::ApiError;
use super::engine::{Budget, Msg, Names};
use axum::http::StatusCode;
use ember_llm::Tokenizer;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, oneshot};

/// The requests in flight and the answers given (`/metrics`, `metrics.rs`).
#[derive(Default)]
pub(crate) struct Load {
    pub(crate) inflight: Mutex<BTreeMap<u64, Instant>>,
    pub(crate) next: AtomicU64,
    /// Answers by status class: 1xx … 5xx.
    pub(crate) answered: [AtomicU64; 5],
}

/// What every handler shares.
pub struct AppState {
    /// The model.
    pub info: ModelInfo,
    pub(crate) tok: Arc<Tokenizer>,
    names: Names,
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    pub(crate) max_rows: usize,
    pub(crate) max_cells: usize,
    closing: AtomicBool,
    ids: AtomicU64,
    pub(crate) created: u64,
    /// Where the base model's current weights came from (`--model`, then each
    /// `update_weights_from_disk`), and their `weight_version` label if one was given.
    weights: RwLock<(String, Option<String>)>,
    /// Who may call what.
    pub(crate) access: Arc<Access>,
    /// The requests in flight and the answers given (`/metrics`).
    pub(crate) load: Load,
    /// The Tinker service, when `--tinker` is on.
    pub(crate) tinker: Option<Arc<crate::tinker::Service>>,
}

impl AppState {
    /// The state of a server over `info`.
    pub fn new(
        info: ModelInfo,
        tok: Arc<Tokenizer>,
        names: Names,
        tx: mpsc::Sender<Msg>,
        budget: Budget,
        access: Arc<Access>,
    ) -> Self {
        let Budget {
            max_rows,
            max_cells,
        } = budget;
        let info_root = info.root.clone();
        Self {
            info,
            tok,
            names,
            tx: Mutex::new(Some(tx)),
            max_rows,
            max_cells,
            closing: AtomicBool::new(false),
            ids: AtomicU64::new(0),
            created: now(),
            weights: RwLock::new((info_root, None)),
            access,
            load: Load::default(),
            tinker: None,
        }
    }

    /// With the Tinker service (`--tinker`).
    #[must_use]
    pub fn with_tinker(self, tinker: Option<Arc<crate::tinker::Service>>) -> Self {
        Self { tinker, ..self }
    }

    /// New requests get 503 from now on.
    pub fn begin_shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Drops the queue's sender, so the engine ends once it has answered what is queued.
    pub fn close_queue(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            *tx = None;
        }
    }

    /// Requests queued for the engine and not yet taken by it.
    pub(crate) fn waiting(&self) -> usize {
        self.tx
            .lock()
            .ok()
            .and_then(|t| t.as_ref().map(|tx| tx.max_capacity() - tx.capacity()))
            .unwrap_or(0)
    }

    pub(crate) fn sender(&self) -> Result<mpsc::Sender<Msg>, ApiError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(shutting_down());
        }
        self.tx
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .ok_or_else(shutting_down)
    }

    pub(crate) fn served(&self) -> Vec<String> {
        self.names.read().map(|n| n.clone()).unwrap_or_default()
    }

    /// The path and label of the base model's current weights.
    pub(crate) fn weights(&self) -> (String, Option<String>) {
        self.weights.read().map(|w| w.clone()).unwrap_or_default()
    }

    pub(crate) fn set_weights(&self, path: String, version: Option<String>) {
        if let Ok(mut w) = self.weights.write() {
            *w = (path, version);
        }
    }

    pub(crate) fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{:x}{:06x}",
            self.created,
            self.ids.fetch_add(1, Ordering::Relaxed)
        )
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// 503 while the server shuts down.
pub fn shutting_down() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        "the server is shutting down",
    )
}

/// What the HTTP side knows of the model.
pub struct ModelInfo {
    /// The base model's served name.
    pub base_name: String,
    /// Positions a prompt plus its new tokens may take.
    pub context: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Where the base weights were read from (`--model`; `root` in `/v1/models`).
    pub root: String,
    /// Sampling settings for requests that leave them out (`generation_config.json`).
    pub defaults: ember_llm::GenerationDefaults,
}

/// Sends a control message and waits for the engine's answer.
pub(crate) async fn control<T>(
    tx: &mpsc::Sender<Msg>,
    make: impl FnOnce(oneshot::Sender<Result<T, ApiError>>) -> Msg,
) -> Result<T, ApiError> {
    let (reply, rx) = oneshot::channel();
    tx.send(make(reply)).await.map_err(|_| shutting_down())?;
    rx.await.map_err(|_| shutting_down())?
}
