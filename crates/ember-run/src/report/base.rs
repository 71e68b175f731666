//! What the trackers' clients and their workers share: the trackers' names, how a run ended,
//! a stamped row, what a client knows of the run, why a request failed, and the client trait.

use anyhow::{Result, bail};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// One step's metrics, `area/name` → value (the run's row).
pub(crate) type Row = BTreeMap<String, f64>;

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long one request may take (a tracker that hangs holds its own thread only).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A tracker a run reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracker {
    /// An MLflow tracking server (`MLFLOW_TRACKING_URI`).
    Mlflow,
    /// A trackio server (`TRACKIO_SERVER_URL`).
    Trackio,
    /// verl's `file` logger: one JSON object a step in a JSONL file.
    File,
}

impl Tracker {
    /// Every tracker, as `--report-to` spells it.
    pub const ALL: [Tracker; 3] = [Tracker::Mlflow, Tracker::Trackio, Tracker::File];

    /// The name `--report-to` takes.
    pub fn name(self) -> &'static str {
        match self {
            Tracker::Mlflow => "mlflow",
            Tracker::Trackio => "trackio",
            Tracker::File => "file",
        }
    }
}

impl FromStr for Tracker {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        if let Some(t) = Tracker::ALL.into_iter().find(|t| t.name() == s) {
            return Ok(t);
        }
        match s {
            "wandb" => bail!(
                "--report-to wandb: Weights & Biases has no Rust client (and `wandb sync` no \
                 longer reads TensorBoard files): `python scripts/wandb_import.py <run dir>` \
                 writes a run's metrics.jsonl as a W&B run (offline unless WANDB_MODE says \
                 otherwise), which `wandb sync` uploads (docs: \"Experiment trackers\")"
            ),
            _ => bail!(
                "--report-to: unknown tracker `{s}` (known: mlflow, trackio, file, tensorboard \
                 (always written), none)"
            ),
        }
    }
}

/// What a tracker's client knows of the run.
pub(crate) struct RunInfo {
    /// The run directory.
    pub out: PathBuf,
    /// The project.
    pub project: String,
    /// The run's name.
    pub run_name: String,
    /// The resolved recipe (TOML): the run's parameters.
    pub resolved: String,
    /// The step of the checkpoint the run continues from.
    pub resumed: Option<usize>,
}

impl RunInfo {
    /// `report/<tracker>.json` in the run directory: what a resumed run needs to continue the
    /// same tracker run.
    pub fn state_path(&self, tracker: Tracker) -> PathBuf {
        self.out
            .join("report")
            .join(format!("{}.json", tracker.name()))
    }
}

/// How a run ended, as the trackers are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Every step ran.
    Finished,
    /// Stopped with a checkpoint (Ctrl-C, `--stop-after`): `--resume` continues it.
    Stopped,
    /// An error ended it.
    Failed,
}

/// A row with its step and the time it was logged.
pub(crate) struct Stamped {
    /// The row's `step`.
    pub step: i64,
    /// Milliseconds since the Unix epoch.
    pub ms: u64,
    /// The row (its `step` included).
    pub row: Row,
}

/// Why a request failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Worth another try (no answer, a timeout, a 5xx, 408, 429).
    Retry(String),
    /// The tracker refused the request itself (another 4xx): retrying the same rows would not
    /// help (a refused batch is retried a row at a time and the refused row dropped; a refused
    /// opening is retried with backoff).
    Reject(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Retry(m) | Failure::Reject(m) => f.write_str(m),
        }
    }
}

/// One tracker's client, called from its worker thread only.
pub(crate) trait Client: Send {
    /// Creates the tracker's run (or, resuming, reopens it); retried until it succeeds.
    fn open(&mut self) -> Result<(), Failure>;
    /// Sends the first rows of `rows` (at least one); returns how many it sent.
    fn send(&mut self, rows: &[Stamped]) -> Result<usize, Failure>;
    /// Marks the run ended.
    fn close(&mut self, end: End) -> Result<(), Failure>;
}
