//! trackio over its HTTP API (`POST /api/bulk_log` of a local or self-hosted `trackio show`
//! server, the call trackio's own client makes): each row one log entry of the run, at its
//! step, the resolved recipe as the run's config on the first entry. Entries carry an id
//! (`log_id`) the server keeps once, so a retried request adds nothing twice.
//!
//! Settings: `TRACKIO_SERVER_URL` (default `http://127.0.0.1:7860`, where `trackio show`
//! listens; a `?write_token=` in it is taken as the token) and `TRACKIO_WRITE_TOKEN` (the
//! server's write token, sent as `X-Trackio-Write-Token`).

use super::base::{Client, End, Failure, RunInfo, Stamped, Tracker};
use super::http::Http;
use anyhow::{Result, bail};
use serde_json::{Map, Value, json};
use std::path::PathBuf;

/// Rows sent in one request.
const BATCH: usize = 256;

/// A trackio run.
pub(crate) struct Trackio {
    http: Http,
    /// `<server>/api/bulk_log`.
    url: String,
    server: String,
    token: Option<String>,
    project: String,
    run_name: String,
    config: Value,
    resumed: bool,
    state: PathBuf,
    run_id: String,
    /// The config still goes with the next entry.
    config_pending: bool,
}

impl Trackio {
    /// Reads the settings (a server URL that is not HTTP is an error).
    pub fn new(info: &RunInfo) -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let given = var("TRACKIO_SERVER_URL").unwrap_or_else(|| "http://127.0.0.1:7860".into());
        if !(given.starts_with("http://") || given.starts_with("https://")) {
            bail!("TRACKIO_SERVER_URL={given}: must start with http:// or https://");
        }
        let (server, query) = given.split_once('?').unwrap_or((&given, ""));
        let from_query = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("write_token="))
            .map(str::to_string);
        let server = server.trim_end_matches('/').to_string();
        let config = resolved_json(&info.resolved);
        Ok(Self {
            http: Http::new(None),
            url: format!("{server}/api/bulk_log"),
            server,
            token: var("TRACKIO_WRITE_TOKEN").or(from_query),
            project: info.project.clone(),
            run_name: info.run_name.clone(),
            config,
            resumed: info.resumed.is_some(),
            state: info.state_path(Tracker::Trackio),
            run_id: String::new(),
            config_pending: true,
        })
    }

    /// The run id of the earlier part of a resumed run on this server.
    fn saved_run_id(&self) -> Option<String> {
        let saved: Value = serde_json::from_slice(&std::fs::read(&self.state).ok()?).ok()?;
        (saved["server"].as_str()? == self.server)
            .then(|| saved["run_id"].as_str().map(str::to_string))?
    }
}

impl Client for Trackio {
    fn open(&mut self) -> Result<(), Failure> {
        if let Some(id) = self.resumed.then(|| self.saved_run_id()).flatten() {
            self.run_id = id;
            self.config_pending = false;
            return Ok(());
        }
        self.run_id = new_run_id();
        let saved = json!({ "server": self.server, "run_id": self.run_id });
        if let Some(dir) = self.state.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = crate::write::write_atomic(&self.state, saved.to_string().as_bytes()) {
            log::warn!("trackio: {e:#} (a resumed run will start a new trackio run)");
        }
        Ok(())
    }

    fn send(&mut self, rows: &[Stamped]) -> Result<usize, Failure> {
        let rows = &rows[..rows.len().min(BATCH)];
        let logs: Vec<Value> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut entry = json!({
                    "project": self.project,
                    "run": self.run_name,
                    "run_id": self.run_id,
                    "metrics": metrics(r),
                    "step": r.step,
                    // One entry a step: the server keeps the first, so a retried request, or
                    // a resumed run's steps after a crash, add nothing twice.
                    "log_id": format!("{}-{}", self.run_id, r.step),
                });
                if i == 0 && self.config_pending {
                    entry["config"] = self.config.clone();
                }
                entry
            })
            .collect();
        let body = json!({ "hf_token": null, "logs": logs });
        let token = self.token.as_deref().map(|t| ("x-trackio-write-token", t));
        self.http.json_with(&self.url, &body, token)?;
        self.config_pending = false;
        Ok(rows.len())
    }

    fn close(&mut self, _end: End) -> Result<(), Failure> {
        // trackio has no end of a run: every entry is committed when its request returns.
        Ok(())
    }
}

/// A row's scalars (its `step` is the entry's); the values that are not finite as the strings
/// trackio's server turns back into floats.
fn metrics(r: &Stamped) -> Map<String, Value> {
    r.row
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .map(|(k, v)| {
            let v = match serde_json::Number::from_f64(*v) {
                Some(n) => Value::Number(n),
                None if v.is_nan() => json!("NaN"),
                None if *v > 0.0 => json!("Infinity"),
                None => json!("-Infinity"),
            };
            (k.clone(), v)
        })
        .collect()
}

/// The resolved recipe as JSON (an object; empty when it does not parse).
fn resolved_json(resolved: &str) -> Value {
    resolved
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| serde_json::to_value(t).ok())
        .unwrap_or_else(|| json!({}))
}

/// A run id no other run shares: the time, the process and a counter, in hex.
fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}{:x}{n:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_carry_numbers_and_non_finite_values_as_strings() {
        let row = [
            ("step", 2.0),
            ("a/b", 0.25),
            ("c", f64::NAN),
            ("d", f64::NEG_INFINITY),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let m = metrics(&Stamped {
            step: 2,
            ms: 0,
            row,
        });
        assert_eq!(
            Value::Object(m),
            json!({ "a/b": 0.25, "c": "NaN", "d": "-Infinity" })
        );
        assert_eq!(
            resolved_json("name = \"x\"\n[train]\nlr = 0.5\n"),
            json!({ "name": "x", "train": { "lr": 0.5 } })
        );
        assert_ne!(new_run_id(), new_run_id());
    }
}
