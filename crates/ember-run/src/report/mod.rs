//! Runs shown in the experiment trackers people already use, chosen with `--report-to` (TRL's
//! `report_to`, verl's `trainer.logger`): MLflow over its REST API, trackio over its HTTP API,
//! and verl's JSONL `file` format. Every row of `metrics.jsonl` reaches each tracker.
//!
//! Each tracker has a thread of its own behind a bounded queue, so a tracker that is down or
//! slow never stops or slows training: a failed request is retried with backoff, rows beyond the
//! bounds are dropped, the first failure is warned once, and the counts end in `summary.json`
//! (`report`). A resumed run continues the same tracker run (its id is kept in
//! `report/<tracker>.json` in the run directory).

mod base;
mod file;
mod http;
mod mlflow;
mod trackio;
mod worker;

use anyhow::Result;
use base::{Client, Row, RunInfo, Stamped, now_ms};
pub use base::{End, Tracker};
use std::path::Path;
pub use worker::Counts;
use worker::Worker;

/// Where a run reports (the `ember train` flags).
#[derive(Debug, Clone, Default)]
pub struct ReportTo {
    /// The trackers (none: only the run directory's own logs).
    pub trackers: Vec<Tracker>,
    /// The project (MLflow's experiment unless `MLFLOW_EXPERIMENT_NAME` is set; trackio's
    /// project; verl's `project_name`).
    pub project: Option<String>,
    /// The run's name in the trackers (default: the run directory's name).
    pub run_name: Option<String>,
}

impl ReportTo {
    /// Parses `--report-to` (comma-separated; `none` and `tensorboard` add nothing, `all` is
    /// every tracker).
    pub fn parse_trackers(list: &str) -> Result<Vec<Tracker>> {
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let add: Vec<Tracker> = match name {
                "none" | "tensorboard" => vec![],
                "all" => Tracker::ALL.to_vec(),
                _ => vec![name.parse()?],
            };
            for t in add {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }
}

/// The run's trackers, each on its own thread.
pub struct Reporter {
    workers: Vec<Worker>,
}

impl Reporter {
    /// Starts a worker for each tracker of `to` (none: an empty reporter). A tracker's settings
    /// are checked here (a malformed URL is an error before training starts); reaching it is
    /// not (a tracker that is down is retried in the background).
    pub fn start(
        to: &ReportTo,
        out: &Path,
        resolved: &str,
        resumed: Option<usize>,
    ) -> Result<Self> {
        let dir_name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "run".into());
        let info = RunInfo {
            out: out.to_path_buf(),
            project: to.project.clone().unwrap_or_else(|| "ember".into()),
            run_name: to.run_name.clone().unwrap_or(dir_name),
            resolved: resolved.to_string(),
            resumed,
        };
        // Every tracker's settings are checked before any thread starts.
        let mut clients: Vec<(&'static str, Box<dyn Client>)> = Vec::new();
        for &t in &to.trackers {
            let client: Box<dyn Client> = match t {
                Tracker::Mlflow => Box::new(mlflow::Mlflow::new(&info)?),
                Tracker::Trackio => Box::new(trackio::Trackio::new(&info)?),
                Tracker::File => Box::new(file::File::new(&info)?),
            };
            clients.push((t.name(), client));
        }
        let mut reporter = Self {
            workers: Vec::new(),
        };
        for (name, client) in clients {
            reporter
                .workers
                .push(Worker::spawn(name, client, worker::END_GRACE)?);
        }
        Ok(reporter)
    }

    /// Queues a row for every tracker (never blocks).
    pub fn push(&self, row: &Row) {
        if self.workers.is_empty() {
            return;
        }
        let ms = now_ms();
        let step = row.get("step").map_or(0, |s| *s as i64);
        for w in &self.workers {
            w.push(Stamped {
                step,
                ms,
                row: row.clone(),
            });
        }
    }

    /// Ends every tracker's run (sending what is queued, within a bounded wait) and returns
    /// each tracker's counts; a second call returns nothing.
    pub fn close(&mut self, end: End) -> Vec<(&'static str, Counts)> {
        let workers = std::mem::take(&mut self.workers);
        workers.iter().for_each(|w| w.end(end));
        workers.into_iter().map(|w| (w.name(), w.wait())).collect()
    }
}

impl Drop for Reporter {
    /// A run dropped without [`Reporter::close`] ended in an error.
    fn drop(&mut self) {
        self.close(End::Failed);
    }
}

/// The counts as `summary.json`'s `report` object.
pub fn counts_json(counts: &[(&'static str, Counts)]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, c) in counts {
        m.insert((*name).into(), c.to_json());
    }
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests;
