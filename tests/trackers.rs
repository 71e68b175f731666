//! Runs in the experiment trackers, each the real thing on loopback (PyPI packages in the
//! trackers' virtual environment that `scripts/fetch_assets.sh` makes): `mlflow server` over
//! its REST API, `trackio show` over its HTTP API, verl's JSONL `file` format, and a W&B
//! offline run written by `scripts/wandb_import.py` and read back record by record. Every row
//! of `metrics.jsonl` must reach each, through a stop and a `--resume`; a tracker that is down
//! must cost the run nothing but a warning and a count.

mod common;

use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

type Row = Map<String, Value>;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-trackers-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server process in a process group of its own, the whole group killed when the test ends
/// (`mlflow server` starts uvicorn and job workers that outlive a kill of the parent alone).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-9", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn get(url: &str) -> Option<Value> {
    let mut r = ureq::get(url).call().ok()?;
    r.body_mut().read_json().ok()
}

fn post(url: &str, body: &Value) -> Value {
    let mut r = ureq::post(url).send_json(body).unwrap();
    r.body_mut()
        .with_config()
        .limit(1 << 30)
        .read_json()
        .unwrap()
}

/// Waits until `url` answers 200 (the server's log on failure).
fn wait_for(url: &str, log: &Path, server: &mut Server) {
    let t = Instant::now();
    while !ureq::get(url).call().is_ok_and(|r| r.status() == 200) {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "the server exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "{url} did not come up"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn spawn(cmd: &mut Command, log: &Path) -> Server {
    let f = std::fs::File::create(log).unwrap();
    let child = cmd
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    Server(child)
}

/// `mlflow server` on a free port with a SQLite store in `dir`; its URL.
fn mlflow(venv: &Path, dir: &Path) -> (Server, String) {
    let port = free_port();
    let log = dir.join("mlflow.log");
    let mut s = spawn(
        Command::new(venv.join("bin/mlflow"))
            .args([
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--workers",
                "1",
            ])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.join("artifacts")),
        &log,
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_for(&format!("{url}/health"), &log, &mut s);
    (s, url)
}

const TRACKIO_TOKEN: &str = "ci-write-token";

/// `trackio show` on a free port with its data in `dir`; its URL.
fn trackio(venv: &Path, dir: &Path) -> (Server, String) {
    let port = free_port();
    let log = dir.join("trackio.log");
    let mut s = spawn(
        Command::new(venv.join("bin/trackio"))
            .args(["show", "--host", "127.0.0.1"])
            .env("TRACKIO_DIR", dir.join("trackio"))
            .env("GRADIO_SERVER_PORT", port.to_string())
            .env("GRADIO_NUM_PORTS", "1")
            .env("TRACKIO_WRITE_TOKEN", TRACKIO_TOKEN)
            .env("BROWSER", "true")
            .env("HF_HUB_OFFLINE", "1"),
        &log,
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_for(&format!("{url}/version"), &log, &mut s);
    (s, url)
}

/// A short run of the CPU recipe reporting to `trackers`, with `env` set.
fn train(out: &Path, flags: &[&str], env: &[(&str, String)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.arg("train")
        .arg(root().join("recipes/arithmetic-cpu.toml"))
        .args(["--quiet", "--out"])
        .arg(out);
    for s in [
        "warmup.steps=100",
        "train.steps=4",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=4",
        "task.eval_size=20",
        "train.eval_every=2",
        "train.checkpoint_every=2",
    ] {
        c.args(["--set", s]);
    }
    c.args(flags).env("NO_PROXY", "127.0.0.1");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into()
}

fn jsonl(p: &Path) -> Vec<Row> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `metrics.jsonl` as step → its other scalars (NaN for a null).
fn by_step(rows: &[Row]) -> BTreeMap<i64, BTreeMap<String, f64>> {
    rows.iter()
        .map(|r| {
            let step = r["step"].as_f64().unwrap() as i64;
            let vals = r
                .iter()
                .filter(|(k, _)| *k != "step")
                .map(|(k, v)| (k.clone(), num(v)))
                .collect();
            (step, vals)
        })
        .collect()
}

/// A JSON value as a number (the strings trackers write for the values that are not finite).
fn num(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap(),
        Value::String(s) if s == "Infinity" => f64::INFINITY,
        Value::String(s) if s == "-Infinity" => f64::NEG_INFINITY,
        _ => f64::NAN,
    }
}

fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// Every (step, key) of `want` is in `got` with the same value.
fn assert_all_reached(
    who: &str,
    want: &BTreeMap<i64, BTreeMap<String, f64>>,
    got: &BTreeMap<i64, BTreeMap<String, f64>>,
) {
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{who}: steps"
    );
    for (step, row) in want {
        for (k, v) in row {
            let g = got[step].get(k).copied();
            assert!(
                g.is_some_and(|g| same(g, *v)),
                "{who}: step {step} {k}: {g:?} != {v}"
            );
        }
    }
}

/// The MLflow run's history, step → key → value, read over the REST API.
fn mlflow_history(
    url: &str,
    run_id: &str,
    keys: &[String],
) -> BTreeMap<i64, BTreeMap<String, f64>> {
    let mut out: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    for k in keys {
        let q = format!(
            "{url}/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key={}",
            k.replace('/', "%2F").replace('@', "%40")
        );
        let h = get(&q).unwrap();
        for m in h["metrics"].as_array().into_iter().flatten() {
            let step = m["step"].as_i64().unwrap();
            let prev = out
                .entry(step)
                .or_default()
                .insert(k.clone(), num(&m["value"]));
            assert!(prev.is_none(), "mlflow: {k} logged twice at step {step}");
        }
    }
    out
}

type Steps = BTreeMap<i64, BTreeMap<String, f64>>;

/// MLflow: one run (the resumed part continued it), finished, the recipe as parameters, every
/// value at its step.
fn check_mlflow(mlflow_url: &str, out: &Path, want: &Steps) {
    let saved: Value =
        serde_json::from_slice(&std::fs::read(out.join("report/mlflow.json")).unwrap()).unwrap();
    let run_id = saved["run_id"].as_str().unwrap();
    let run = get(&format!(
        "{mlflow_url}/api/2.0/mlflow/runs/get?run_id={run_id}"
    ))
    .unwrap();
    assert_eq!(run["run"]["info"]["status"], "FINISHED");
    assert_eq!(run["run"]["info"]["run_name"], "ci-run");
    let params = run["run"]["data"]["params"].as_array().unwrap();
    assert!(
        params
            .iter()
            .any(|p| p["key"] == "train.steps" && p["value"] == "4"),
        "{params:?}"
    );
    let search = post(
        &format!("{mlflow_url}/api/2.0/mlflow/runs/search"),
        &json!({"experiment_ids": [saved["experiment_id"]]}),
    );
    assert_eq!(
        search["runs"].as_array().map(Vec::len),
        Some(1),
        "one MLflow run"
    );
    let mlflow_key = |k: &str| k.replace('@', "_");
    let keys: Vec<String> = want
        .values()
        .flat_map(|r| r.keys().map(|k| mlflow_key(k)))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let renamed: BTreeMap<i64, BTreeMap<String, f64>> = want
        .iter()
        .map(|(s, r)| (*s, r.iter().map(|(k, v)| (mlflow_key(k), *v)).collect()))
        .collect();
    assert_all_reached(
        "mlflow",
        &renamed,
        &mlflow_history(mlflow_url, run_id, &keys),
    );
}

/// trackio: the run's entries read back over its API.
fn check_trackio(trackio_url: &str, want: &Steps) {
    let logs = post(
        &format!("{trackio_url}/api/get_logs"),
        &json!({"project": "ember-ci", "run": "ci-run"}),
    );
    let got = by_step(
        logs["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                let mut r = l.as_object().unwrap().clone();
                r.remove("timestamp");
                r
            })
            .collect::<Vec<_>>()
            .as_slice(),
    );
    assert_all_reached("trackio", want, &got);
}

/// verl's file: `{"step", "data"}` lines, one a row.
fn check_file(verl: &Path, want: &Steps) {
    let lines = jsonl(verl);
    let got = by_step(
        &lines
            .iter()
            .map(|l| {
                let mut r = l["data"].as_object().unwrap().clone();
                r.insert("step".into(), l["step"].clone());
                r
            })
            .collect::<Vec<_>>(),
    );
    assert_all_reached("file", want, &got);
}

/// W&B, offline: the run imported by the script, its history read back from the `.wandb` file.
fn check_wandb(venv: &Path, d: &Path, out: &Path, want: &Steps) {
    let o = Command::new(venv.join("bin/python"))
        .arg(root().join("scripts/wandb_import.py"))
        .arg(out)
        .args(["--project", "ember-ci"])
        .env("WANDB_MODE", "offline")
        .env("WANDB_SILENT", "true")
        .env("WANDB_CONFIG_DIR", d.join("wandb-config"))
        .env("WANDB_CACHE_DIR", d.join("wandb-cache"))
        .env("WANDB_DATA_DIR", d.join("wandb-data"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    let file = std::fs::read_dir(out.join("wandb"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("offline-run-"))
        .flat_map(|e| std::fs::read_dir(e.path()).unwrap().flatten())
        .find(|e| e.file_name().to_string_lossy().ends_with(".wandb"))
        .unwrap()
        .path();
    let o = Command::new(venv.join("bin/python"))
        .arg(root().join("tests/wandb_history.py"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let got = by_step(
        &String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| {
                let mut r: Row = serde_json::from_str(l).unwrap();
                r.retain(|k, _| !k.starts_with('_') || k == "_step");
                let step = r.remove("_step").unwrap();
                r.insert("step".into(), step);
                r
            })
            .collect::<Vec<_>>(),
    );
    assert_all_reached("wandb", want, &got);
}

#[test]
fn every_row_reaches_mlflow_trackio_verl_and_wandb_through_a_resume() {
    let Some(venv) = common::assets::cached("trackers-py") else {
        return;
    };
    let d = tmp("all");
    let ((_m, mlflow_url), (_t, trackio_url)) = (mlflow(&venv, &d), trackio(&venv, &d));
    let out = d.join("run");
    let verl = d.join("verl").join("metrics.jsonl");
    let env = [
        ("MLFLOW_TRACKING_URI", mlflow_url.clone()),
        ("TRACKIO_SERVER_URL", trackio_url.clone()),
        ("TRACKIO_WRITE_TOKEN", TRACKIO_TOKEN.to_string()),
        ("VERL_FILE_LOGGER_PATH", verl.display().to_string()),
    ];
    let flags = [
        "--report-to",
        "mlflow,trackio,file",
        "--project",
        "ember-ci",
        "--run-name",
        "ci-run",
    ];
    let o = train(&out, &[&flags[..], &["--stop-after", "2"]].concat(), &env);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = train(&out, &[&flags[..], &["--resume"]].concat(), &env);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("WARN"), "{}", stderr(&o));
    let rows = jsonl(&out.join("metrics.jsonl"));
    assert_eq!(rows.len(), 5, "step 0 and four steps");
    let want = by_step(&rows);
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    for t in ["mlflow", "trackio", "file"] {
        assert_eq!(
            summary["report"][t],
            json!({"rows_sent": 2, "failed_requests": 0, "rows_dropped": 0}),
            "{t}: the resumed part's rows (steps 3 and 4)"
        );
    }

    check_mlflow(&mlflow_url, &out, &want);
    check_trackio(&trackio_url, &want);
    check_file(&verl, &want);
    check_wandb(&venv, &d, &out, &want);
    std::fs::remove_dir_all(&d).ok();
}

/// Trackers that are down (nothing listens) cost the run a warning and a count; a tracker's
/// malformed setting is refused before training starts.
#[test]
fn a_tracker_that_is_down_costs_the_run_nothing_but_a_count() {
    let d = tmp("down");
    let out = d.join("run");
    let closed = format!("http://127.0.0.1:{}", free_port());
    let env = [
        ("MLFLOW_TRACKING_URI", closed.clone()),
        ("TRACKIO_SERVER_URL", closed),
    ];
    let o = train(&out, &["--report-to", "mlflow,trackio"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = jsonl(&out.join("metrics.jsonl")).len() as u64;
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    for t in ["mlflow", "trackio"] {
        let c = &summary["report"][t];
        assert_eq!(
            (c["rows_sent"].as_u64(), c["rows_dropped"].as_u64()),
            (Some(0), Some(rows)),
            "{t}: {c}"
        );
        assert!(c["failed_requests"].as_u64() >= Some(1), "{t}: {c}");
        let warned = stderr(&o).matches(&format!("{t}: ")).count();
        assert_eq!(
            warned,
            2,
            "{t}: the first failure and the final count, once each:\n{}",
            stderr(&o)
        );
    }

    let o = train(
        &d.join("run2"),
        &["--report-to", "mlflow"],
        &[("MLFLOW_TRACKING_URI", "file:./mlruns".into())],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("must start with http:// or https://"),
        "{}",
        stderr(&o)
    );
    assert!(!d.join("run2/metrics.jsonl").exists());
    let o = train(&d.join("run3"), &["--report-to", "mlflow,wandb"], &[]);
    assert!(
        stderr(&o).contains("scripts/wandb_import.py"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&d).ok();
}
