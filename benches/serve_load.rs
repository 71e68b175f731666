//! A load test of `ember serve` on the loopback address, bounded in count and time.
//!
//!     cargo bench --bench serve_load [-- CLIENTS REQUESTS]      (defaults 16 and 96)
//!
//! Serves SmolLM2-135M-Instruct (the GGUF that `scripts/fetch_assets.sh` caches; or
//! `$EMBER_SMOLLM2_GGUF`) with `--max-queue 8`, then:
//! 1. **load**: CLIENTS threads send REQUESTS completions of mixed sizes (1–3 prompts, `n` 1–4,
//!    `max_tokens` 1–24), an eighth of them to a LoRA adapter loaded at start (`stable`) and an
//!    eighth to one that another thread loads and unloads all along (`churn`). Checked: every
//!    request gets exactly one answer (200 with `n` choices per prompt and an id no other answer
//!    has; 429; or 404 for `churn` while it is unloaded), and a 429 only comes while at least
//!    `--max-queue` requests were outstanding. Reported: latency
//!    percentiles of the 200s, rows per second, the server's peak resident memory (VmHWM).
//! 2. **SIGTERM under load**: CLIENTS requests sent, then SIGTERM: every request sent more than
//!    50 ms before the signal must be answered, 200 (or 429 if the queue was full: never
//!    taken), none lost or cut; the server must exit 0.
//!
//! Prints one JSON object (and exits 1 if a check fails).

use serde_json::{Value, json};
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAX_QUEUE: usize = 8;

/// One answered request: status, latency, rows asked, outstanding requests (the larger of the
/// counts when it was sent and when it was answered), answer id.
struct Outcome {
    churn: bool,
    status: u16,
    seconds: f64,
    rows: usize,
    outstanding: usize,
    id: Option<String>,
    choices_ok: bool,
}

fn model() -> PathBuf {
    if let Some(p) = std::env::var_os("EMBER_SMOLLM2_GGUF") {
        return p.into();
    }
    let cache = std::env::var_os("EMBER_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ember"),
        PathBuf::from,
    );
    cache.join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// `ember serve` on a free port; the process and its port.
fn start(model: &Path, allowed: &Path) -> (Child, u16) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--model"])
        .arg(model)
        .args([
            "--served-model-name",
            "smol",
            "--port",
            "0",
            "--device",
            "cpu",
        ])
        .args(["--max-queue", &MAX_QUEUE.to_string(), "--enable-admin"])
        .arg("--allowed-path")
        .arg(allowed)
        .arg("--adapter")
        .arg(format!("stable={}", allowed.join("adapter").display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting ember serve");
    let mut line = String::new();
    let out = child.stdout.take().expect("stdout");
    BufReader::new(out)
        .read_line(&mut line)
        .expect("reading the port");
    let port = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (child, port)
}

/// A zero-initialised LoRA adapter (rank 4 on q and v) for SmolLM2 in `dir`.
fn adapter(model: &Path, dir: &Path) {
    let device = burn::tensor::Device::default();
    let loaded = ember_llm::load(model, &device).expect("loading the model");
    let settings = ember_llm::LoraSettings {
        rank: 4,
        alpha: 8.0,
        targets: vec!["q_proj".into(), "v_proj".into()],
    };
    let m = ember_llm::apply_lora(loaded.model, &settings).expect("LoRA");
    ember_llm::save_peft(&m, &settings, "smol", dir).expect("writing the adapter");
}

fn post(agent: &ureq::Agent, port: u16, path: &str, body: &Value) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{port}{path}");
    match agent.post(&url).send_json(body) {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            (status, serde_json::from_str(&text).unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// Request `k`'s body: its size and target drawn from `k`.
fn request(k: usize) -> (Value, usize) {
    let prompts = 1 + k % 3;
    let n = [1, 2, 4][k / 3 % 3];
    let model = match k % 8 {
        3 => "stable",
        7 => "churn",
        _ => "smol",
    };
    let prompt: Vec<String> = (0..prompts)
        .map(|p| format!("Request {k}, part {p}: count from {} upwards.", k * 7 + p))
        .collect();
    let max_tokens = [1, 8, 24][k % 3];
    let body = json!({"model": model, "prompt": prompt, "n": n,
        "max_tokens": max_tokens, "temperature": 1.0, "seed": k});
    (body, prompts * n)
}

/// One client's share of `total` requests (every `clients`-th, from `first`).
fn client(
    port: u16,
    first: usize,
    clients: usize,
    total: usize,
    live: &AtomicUsize,
) -> Vec<Outcome> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into();
    let mut out = Vec::new();
    for k in (first..total).step_by(clients) {
        let (body, rows) = request(k);
        let outstanding = live.fetch_add(1, Ordering::SeqCst) + 1;
        let t = Instant::now();
        let (status, v) = post(&agent, port, "/v1/completions", &body);
        // (The server decided between the two counts: the larger bounds what it saw.)
        let outstanding = outstanding.max(live.fetch_sub(1, Ordering::SeqCst));
        let choices = v["choices"].as_array().map_or(0, Vec::len);
        out.push(Outcome {
            churn: body["model"] == "churn",
            status,
            seconds: t.elapsed().as_secs_f64(),
            rows,
            outstanding,
            id: v["id"].as_str().map(str::to_string),
            choices_ok: status != 200 || choices == rows,
        });
    }
    out
}

/// Loads and unloads the adapter until `stop`; how many loads succeeded.
fn churn(port: u16, dir: &Path, stop: &AtomicBool) -> usize {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let path = dir.display().to_string();
    let mut loads = 0;
    while !stop.load(Ordering::SeqCst) {
        let body = json!({"lora_name": "churn", "lora_path": path});
        loads += usize::from(post(&agent, port, "/v1/load_lora_adapter", &body).0 == 200);
        std::thread::sleep(Duration::from_millis(2000));
        let body = json!({"lora_name": "churn"});
        post(&agent, port, "/v1/unload_lora_adapter", &body);
        std::thread::sleep(Duration::from_millis(100));
    }
    loads
}

fn peak_memory_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Phase 1; its report and whether its checks held.
fn load_phase(port: u16, pid: u32, dir: &Path, clients: usize, total: usize) -> (Value, bool) {
    let live = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let (outcomes, loads) = std::thread::scope(|s| {
        let churner = s.spawn(|| churn(port, dir, &stop));
        let hs: Vec<_> = (0..clients)
            .map(|c| {
                let live = &live;
                s.spawn(move || client(port, c, clients, total, live))
            })
            .collect();
        let all: Vec<Outcome> = hs
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect();
        stop.store(true, Ordering::SeqCst);
        (all, churner.join().unwrap_or(0))
    });
    let wall = t.elapsed().as_secs_f64();
    let count = |c: u16| outcomes.iter().filter(|o| o.status == c).count();
    let stray_404 = outcomes
        .iter()
        .filter(|o| o.status == 404 && !o.churn)
        .count();
    let ids: Vec<&String> = outcomes.iter().filter_map(|o| o.id.as_ref()).collect();
    let unique = ids.iter().collect::<HashSet<_>>().len();
    let mut lat: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.status == 200)
        .map(|o| o.seconds)
        .collect();
    lat.sort_by(f64::total_cmp);
    let rows: usize = outcomes
        .iter()
        .filter(|o| o.status == 200)
        .map(|o| o.rows)
        .sum();
    let early_429 = outcomes
        .iter()
        .filter(|o| o.status == 429 && o.outstanding < MAX_QUEUE)
        .count();
    let other = outcomes.len() - count(200) - count(429) - count(404);
    let ok = outcomes.len() == total
        && other == 0
        && unique == ids.len()
        && early_429 == 0
        && stray_404 == 0
        && outcomes.iter().all(|o| o.choices_ok);
    let report = json!({
        "requests": total, "clients": clients, "answered_200": count(200),
        "answered_429": count(429), "answered_404_churn_unloaded": count(404) - stray_404,
        "answered_404_other": stray_404,
        "other_or_lost": other, "duplicate_ids": ids.len() - unique,
        "429_below_max_queue": early_429, "adapter_loads": loads,
        "latency_s": {"p50": percentile(&lat, 0.5), "p90": percentile(&lat, 0.9),
            "p99": percentile(&lat, 0.99), "max": lat.last()},
        "rows_per_s": rows as f64 / wall, "wall_s": wall,
        "server_peak_rss_mib": peak_memory_mib(pid),
    });
    (report, ok)
}

/// Phase 2: `clients` requests in flight, then SIGTERM; its report and whether it held.
fn sigterm_phase(mut server: Child, port: u16, clients: usize) -> (Value, bool) {
    let sent: Arc<Mutex<Vec<(Instant, u16)>>> = Arc::default();
    let signal_at = std::thread::scope(|s| {
        for c in 0..clients {
            let sent = sent.clone();
            s.spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let (mut body, _) = request(c);
                body["max_tokens"] = json!(24);
                body["model"] = json!("smol");
                let t = Instant::now();
                let (status, _) = post(&agent, port, "/v1/completions", &body);
                if let Ok(mut v) = sent.lock() {
                    v.push((t, status));
                }
            });
        }
        std::thread::sleep(Duration::from_millis(400));
        let at = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &server.id().to_string()])
            .status();
        at
    });
    let exit = server.wait().ok().and_then(|s| s.code());
    let v = sent.lock().map(|v| v.clone()).unwrap_or_default();
    let before: Vec<u16> = v
        .iter()
        .filter(|(t, _)| *t + Duration::from_millis(50) < signal_at)
        .map(|(_, s)| *s)
        .collect();
    let count = |c: u16| before.iter().filter(|&&s| s == c).count();
    // Taken requests are answered; a 429 (the queue was full) was never taken.
    let ok = exit == Some(0) && count(200) + count(429) == before.len();
    let report = json!({"sent_before_signal": before.len(), "answered_200": count(200),
        "refused_429_queue_full": count(429), "sent_after_signal": v.len() - before.len(),
        "exit_code": exit});
    (report, ok)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (clients, total) = (
        args.first().copied().unwrap_or(16),
        args.get(1).copied().unwrap_or(96),
    );
    let model = model();
    if !model.exists() {
        eprintln!(
            "{} is missing: run scripts/fetch_assets.sh",
            model.display()
        );
        std::process::exit(2);
    }
    let dir = std::env::temp_dir().join(format!("ember-serve-load-{}", std::process::id()));
    adapter(&model, &dir.join("adapter"));
    let (server, port) = start(&model, &dir);
    let (load, load_ok) = load_phase(port, server.id(), &dir.join("adapter"), clients, total);
    let (term, term_ok) = sigterm_phase(server, port, clients);
    let report = json!({"load": load, "sigterm": term, "checks_held": load_ok && term_ok});
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    std::fs::remove_dir_all(&dir).ok();
    if !(load_ok && term_ok) {
        std::process::exit(1);
    }
}
