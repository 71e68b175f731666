//! MLflow over its REST API (`/api/2.0/mlflow`): the experiment found or created by name, a run
//! created with the resolved recipe as its parameters, each row's scalars logged with
//! `runs/log-batch` (within its limits: 1000 metrics, 100 parameters a request), and the run's
//! end status (`FINISHED`, `KILLED` for a stop that `--resume` continues, `FAILED`).
//!
//! Settings are MLflow's own environment variables: `MLFLOW_TRACKING_URI` (an `http://` or
//! `https://` server; default `http://127.0.0.1:5000`, where `mlflow server` listens),
//! `MLFLOW_EXPERIMENT_NAME` (default: the project), `MLFLOW_TRACKING_TOKEN` (a bearer token) or
//! `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD` (basic authentication).

use super::base::{Client, End, Failure, RunInfo, Stamped, Tracker, now_ms};
use super::http::{Http, HttpError, basic_auth};
use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::path::PathBuf;

/// `runs/log-batch` takes at most this many metrics.
const MAX_METRICS: usize = 1000;
/// ... and this many parameters.
const MAX_PARAMS: usize = 100;
/// The longest parameter value MLflow stores (longer values are cut, with a mark).
const MAX_PARAM_VALUE: usize = 6000;
/// The longest parameter or metric key.
const MAX_KEY: usize = 250;

/// An MLflow run.
pub(crate) struct Mlflow {
    http: Http,
    /// The server, as given.
    uri: String,
    /// `<uri>/api/2.0/mlflow`.
    api: String,
    experiment: String,
    run_name: String,
    resolved: String,
    resumed: bool,
    state: PathBuf,
    run_id: Option<String>,
    experiment_id: String,
    /// The recipe's parameters are logged (or given up on).
    params_done: bool,
    /// The last step the tracker took (kept in the state file): a resumed run skips the rows
    /// that an earlier part sent after its last checkpoint.
    last_step: Option<i64>,
}

impl Mlflow {
    /// Reads the settings (a tracking URI that is not an HTTP server is an error).
    pub fn new(info: &RunInfo) -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let uri = var("MLFLOW_TRACKING_URI").unwrap_or_else(|| "http://127.0.0.1:5000".into());
        if !(uri.starts_with("http://") || uri.starts_with("https://")) {
            bail!(
                "MLFLOW_TRACKING_URI={uri}: Ember reports to an MLflow tracking server over its \
                 REST API, so the URI must start with http:// or https:// (start one with \
                 `mlflow server --host 127.0.0.1 --port 5000`)"
            );
        }
        let auth = match (
            var("MLFLOW_TRACKING_TOKEN"),
            var("MLFLOW_TRACKING_USERNAME"),
            var("MLFLOW_TRACKING_PASSWORD"),
        ) {
            (Some(t), _, _) => Some(format!("Bearer {t}")),
            (None, Some(u), Some(p)) => Some(basic_auth(&u, &p)),
            (None, Some(_), None) | (None, None, Some(_)) => bail!(
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD go together: set both, \
                 or neither"
            ),
            (None, None, None) => None,
        };
        let base = uri.trim_end_matches('/');
        Ok(Self {
            http: Http::new(auth),
            api: format!("{base}/api/2.0/mlflow"),
            uri: uri.clone(),
            experiment: var("MLFLOW_EXPERIMENT_NAME").unwrap_or_else(|| info.project.clone()),
            run_name: info.run_name.clone(),
            resolved: info.resolved.clone(),
            resumed: info.resumed.is_some(),
            state: info.state_path(Tracker::Mlflow),
            run_id: None,
            experiment_id: String::new(),
            params_done: false,
            last_step: None,
        })
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, HttpError> {
        self.http.json(&format!("{}/{path}", self.api), Some(body))
    }

    /// The experiment's id, created when missing.
    fn experiment_id(&self) -> Result<String, Failure> {
        let name = url_escape(&self.experiment);
        let url = format!(
            "{}/experiments/get-by-name?experiment_name={name}",
            self.api
        );
        match self.http.json(&url, None) {
            Ok(v) => return id(&v["experiment"]["experiment_id"]),
            Err(e) if e.body["error_code"] != "RESOURCE_DOES_NOT_EXIST" => return Err(e.into()),
            Err(_) => {}
        }
        match self.post("experiments/create", &json!({ "name": self.experiment })) {
            Ok(v) => id(&v["experiment_id"]),
            // Created meanwhile by another run.
            Err(e) if e.body["error_code"] == "RESOURCE_ALREADY_EXISTS" => {
                id(&self.http.json(&url, None)?["experiment"]["experiment_id"])
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Reopens the run an earlier part of a resumed run recorded (false: there is none for
    /// this server, or it is gone).
    fn reopen(&mut self) -> Result<bool, Failure> {
        let Some(saved) = std::fs::read(&self.state)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        else {
            return Ok(false);
        };
        let (Some(uri), Some(run_id)) = (saved["tracking_uri"].as_str(), saved["run_id"].as_str())
        else {
            return Ok(false);
        };
        if uri != self.uri {
            return Ok(false);
        }
        match self.post(
            "runs/update",
            &json!({ "run_id": run_id, "status": "RUNNING" }),
        ) {
            Ok(_) => {}
            Err(e)
                if e.status == Some(404) || e.body["error_code"] == "RESOURCE_DOES_NOT_EXIST" =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        self.run_id = Some(run_id.to_string());
        self.experiment_id = saved["experiment_id"].as_str().unwrap_or_default().into();
        self.last_step = saved["last_step"].as_i64();
        self.params_done = true;
        Ok(true)
    }

    /// Creates the run and records its id in the run directory at once (a retry never makes a
    /// second run).
    fn create(&mut self) -> Result<(), Failure> {
        let experiment_id = self.experiment_id()?;
        let tags: Vec<Value> = [
            ("mlflow.runName", self.run_name.as_str()),
            ("mlflow.source.name", "ember"),
            ("mlflow.source.type", "LOCAL"),
        ]
        .iter()
        .map(|(k, v)| json!({ "key": k, "value": v }))
        .collect();
        let body = json!({
            "experiment_id": experiment_id,
            "run_name": self.run_name,
            "start_time": now_ms(),
            "tags": tags,
        });
        let v = self.post("runs/create", &body)?;
        self.run_id = Some(id(&v["run"]["info"]["run_id"])?);
        self.experiment_id = experiment_id;
        self.save_state();
        Ok(())
    }

    /// Writes the run's id, experiment and last step to `report/mlflow.json`.
    fn save_state(&self) {
        let saved = json!({
            "tracking_uri": self.uri,
            "experiment_id": self.experiment_id,
            "run_id": self.run_id,
            "last_step": self.last_step,
        });
        if let Some(dir) = self.state.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = crate::write::write_atomic(&self.state, saved.to_string().as_bytes()) {
            log::warn!("mlflow: {e:#} (a resumed run may start a new MLflow run)");
        }
    }

    /// Logs the recipe as the run's parameters, each key once; a refusal is warned and given
    /// up on (the metrics matter more).
    fn log_params(&mut self) -> Result<(), Failure> {
        let run_id = self.run_id.clone().unwrap_or_default();
        for chunk in params(&self.resolved).chunks(MAX_PARAMS) {
            let body = json!({ "run_id": run_id, "params": chunk });
            match self.post("runs/log-batch", &body).map_err(Failure::from) {
                Ok(_) => {}
                Err(Failure::Reject(m)) => {
                    log::warn!("mlflow: the recipe's parameters were refused ({m})");
                    break;
                }
                Err(f) => return Err(f),
            }
        }
        self.params_done = true;
        Ok(())
    }
}

impl Client for Mlflow {
    fn open(&mut self) -> Result<(), Failure> {
        if self.run_id.is_none() && !(self.resumed && self.reopen()?) {
            self.create()?;
        }
        if !self.params_done {
            self.log_params()?;
        }
        Ok(())
    }

    fn send(&mut self, rows: &[Stamped]) -> Result<usize, Failure> {
        // Rows an earlier part of a resumed run sent already (it crashed after them).
        let known = rows
            .iter()
            .take_while(|r| self.last_step.is_some_and(|l| r.step <= l))
            .count();
        if known > 0 {
            return Ok(known);
        }
        let run_id = self.run_id.clone().unwrap_or_default();
        let (mut metrics, mut taken) = (Vec::new(), 0);
        for r in rows {
            let m = row_metrics(r);
            if taken > 0 && metrics.len() + m.len() > MAX_METRICS {
                break;
            }
            metrics.extend(m);
            taken += 1;
        }
        // A row of more than MAX_METRICS scalars goes in several requests.
        for chunk in metrics.chunks(MAX_METRICS) {
            let body = json!({ "run_id": run_id, "metrics": chunk });
            self.post("runs/log-batch", &body)?;
        }
        self.last_step = rows[..taken].last().map(|r| r.step).max(self.last_step);
        self.save_state();
        Ok(taken)
    }

    fn close(&mut self, end: End) -> Result<(), Failure> {
        let status = match end {
            End::Finished => "FINISHED",
            End::Stopped => "KILLED",
            End::Failed => "FAILED",
        };
        let body = json!({ "run_id": self.run_id, "status": status, "end_time": now_ms() });
        self.post("runs/update", &body)?;
        Ok(())
    }
}

/// A row's scalars as MLflow metrics (its `step` is the metrics' step, not a metric).
fn row_metrics(r: &Stamped) -> Vec<Value> {
    r.row
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .map(|(k, v)| json!({ "key": key(k), "value": number(*v), "timestamp": r.ms, "step": r.step }))
        .collect()
}

/// A value as MLflow's JSON takes it: protobuf's JSON spells the non-finite doubles as strings.
fn number(v: f64) -> Value {
    match v {
        v if v.is_nan() => json!("NaN"),
        v if v == f64::INFINITY => json!("Infinity"),
        v if v == f64::NEG_INFINITY => json!("-Infinity"),
        v => json!(v),
    }
}

/// A key in MLflow's alphabet (letters, digits, `_ - . / :` and spaces; others become `_`), at
/// most [`MAX_KEY`] characters.
fn key(k: &str) -> String {
    let k: String = k
        .chars()
        .map(|c| match c.is_alphanumeric() || "_-./: ".contains(c) {
            true => c,
            false => '_',
        })
        .collect();
    // MLflow refuses keys that read as unsafe paths: empty parts, `.` or `..`, a leading `/`.
    let parts: Vec<String> = k
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| match p {
            "." | ".." => p.replace('.', "_"),
            p => p.to_string(),
        })
        .collect();
    parts.join("/").chars().take(MAX_KEY).collect()
}

/// The resolved recipe flattened to `table.key = value` parameters (values as TOML writes
/// them, cut at [`MAX_PARAM_VALUE`] characters).
fn params(resolved: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if let Ok(table) = resolved.parse::<toml::Table>() {
        flatten("", &toml::Value::Table(table), &mut out);
    }
    let mut seen = std::collections::BTreeSet::new();
    out.into_iter()
        .map(|(k, v)| (key(&k), v))
        .filter(|(k, _)| seen.insert(k.clone()))
        .map(|(k, v)| json!({ "key": k, "value": cut(&v) }))
        .collect()
}

fn flatten(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let name = match prefix.is_empty() {
                    true => k.clone(),
                    false => format!("{prefix}.{k}"),
                };
                flatten(&name, v, out);
            }
        }
        toml::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

fn cut(v: &str) -> String {
    match v.chars().count() > MAX_PARAM_VALUE {
        true => v.chars().take(MAX_PARAM_VALUE - 3).collect::<String>() + "...",
        false => v.to_string(),
    }
}

/// An id MLflow answered (a string).
fn id(v: &Value) -> Result<String, Failure> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| Failure::Retry(format!("mlflow answered without an id ({v})")))
}

/// Percent-encodes a query value (RFC 3986's unreserved characters kept).
fn url_escape(s: &str) -> String {
    s.bytes()
        .map(
            |b| match b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                true => (b as char).to_string(),
                false => format!("%{b:02X}"),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_values_and_params_fit_mlflow() {
        assert_eq!(key("eval/pass@1"), "eval/pass_1");
        assert_eq!(key("timing_s/gen"), "timing_s/gen");
        assert_eq!(key("/a//b/../c/"), "a/b/__/c");
        assert_eq!(number(f64::NAN), json!("NaN"));
        assert_eq!(number(f64::NEG_INFINITY), json!("-Infinity"));
        assert_eq!(number(0.5), json!(0.5));
        let p =
            params("name = \"x\"\n[train]\nlr = 0.001\nsteps = 3\n[task]\nops = [\"+\", \"-\"]\n");
        let got: Vec<(String, String)> = p
            .iter()
            .map(|v| {
                (
                    v["key"].as_str().unwrap().into(),
                    v["value"].as_str().unwrap().into(),
                )
            })
            .collect();
        let want = [
            ("name", "x"),
            ("task.ops", "[\"+\", \"-\"]"),
            ("train.lr", "0.001"),
            ("train.steps", "3"),
        ];
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0.as_str(), g.1.as_str()), w);
        }
        assert_eq!(cut(&"a".repeat(7000)).chars().count(), MAX_PARAM_VALUE);
        assert_eq!(url_escape("my exp/1"), "my%20exp%2F1");
    }
}
