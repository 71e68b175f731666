//! The kernel gym through its surfaces: `ember gym eval` on a file, `ember gym worker` as an
//! external environment (the JSON-lines protocol), and `ember gym serve` behind the remote
//! executor (two addresses, one of them dead; the key refused and accepted), each giving the same
//! verdicts as the gym in process.

mod common;

use ember_gym::{Executor, Job, Local, Verdict};
use ember_tasks::env::external::{ExternalEnv, ExternalEnvSpec};
use ember_tasks::env::kernel::{KernelGym, KernelGymSpec};
use ember_tasks::env::{Environment, Episode};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const EMBER: &str = env!("CARGO_BIN_EXE_ember");

const ADD: &str = "void vec_add(const float *a, const float *b, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}
";

const STATEFUL: &str = "static int calls;
void vec_add(const float *a, const float *b, float *out, int n) {
    calls++;
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}
";

#[test]
fn eval_prints_the_report_and_rewards() {
    let file = std::env::temp_dir().join(format!("ember-gym-eval-{}.c", std::process::id()));
    std::fs::write(&file, STATEFUL).unwrap();
    let out = Command::new(EMBER)
        .args(["gym", "eval", "--task", "vec_add", "--no-time"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "keeps_state");
    assert_eq!(v["reward"], 0.0);
    assert_eq!(v["hacking"], true);
    let bad = Command::new(EMBER)
        .args(["gym", "eval", "--task", "nope", "-"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no kernel task named \"nope\""));
}

#[test]
fn the_worker_speaks_the_environment_protocol() {
    let spec = ExternalEnvSpec {
        command: vec![
            EMBER.into(),
            "gym".into(),
            "worker".into(),
            "--spec".into(),
            r#"{"tasks": ["vec_add"], "hidden_shapes": 2}"#.into(),
            "--max-turns".into(),
            "2".into(),
        ],
        timeout_s: 120.0,
    };
    let mut remote = ExternalEnv::spawn(&spec).unwrap();
    let local_spec: KernelGymSpec =
        serde_json::from_str(r#"{"tasks": ["vec_add"], "hidden_shapes": 2}"#).unwrap();
    let mut local = KernelGym::new(&local_spec, 2).unwrap();
    let eps = [Episode { id: 3, seed: 11 }, Episode { id: 4, seed: 12 }];
    assert_eq!(remote.reset(&eps).unwrap(), local.reset(&eps).unwrap());
    let actions = vec![
        (3, format!("```c\n{ADD}```")),
        (4, format!("```c\n{STATEFUL}```")),
    ];
    let (a, b) = (
        remote.step(&actions).unwrap(),
        local.step(&actions).unwrap(),
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.info["correct"], y.info["correct"]);
        assert_eq!(x.info["hacking"], y.info["hacking"]);
        assert_eq!(x.done, y.done);
    }
    assert_eq!(a[0].info["correct"], 1.0);
    assert_eq!((a[1].info["hacking"], a[1].reward), (1.0, 0.0));
}

/// `ember gym serve` on a free port; returns the child and its address.
fn serve(key: Option<&str>) -> (Child, String) {
    serve_with(key, &[])
}

/// [`serve`] with more flags.
fn serve_with(key: Option<&str>, flags: &[&str]) -> (Child, String) {
    let mut c = Command::new(EMBER);
    c.args(["gym", "serve", "--listen", "127.0.0.1:0", "--workers", "2"])
        .args(flags);
    if let Some(k) = key {
        c.args(["--api-key-env", "GYM_TEST_KEY"])
            .env("GYM_TEST_KEY", k);
    }
    let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    (child, url)
}

/// Time a kernel's process spends without a core is not its time: the reference's loop that
/// then sleeps 5 ms a call (as a process waits for a core on a loaded machine) measures as the
/// loop. Timed by its wall-clock round trip it measured 0.007x, and could not pass 0.05 unless
/// the reference took 250 us; in CPU time it measures 0.48x here (a sleep's own cost).
#[test]
fn waiting_for_a_core_is_not_the_candidates_time() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gym");
    let walk = std::fs::read_to_string(dir.join("libc_walk.inc")).unwrap();
    let code = std::fs::read_to_string(dir.join("waits_for_a_core.c")).unwrap();
    let t = ember_gym::task("vec_add").unwrap();
    let cfg = ember_gym::EvalConfig::default();
    let r = ember_gym::evaluate(t, &format!("{walk}\n{code}"), 5, &cfg).unwrap();
    assert_eq!(r.verdict, Verdict::Ok, "{:?}", r.verdict);
    assert!(r.speedup.unwrap() > 0.05, "{r:?}");
}

/// `ember gym serve` with extra flags, for the HTTP layer's shared tests.
fn gym_server(flags: &[&str]) -> common::http::Running {
    let mut c = Command::new(EMBER);
    c.args(["gym", "serve", "--listen", "127.0.0.1:0", "--workers", "2"])
        .args(flags);
    common::http::Running::spawn(c)
}

fn evaluate_body(code: &str, cpu_s: u64) -> String {
    serde_json::json!({"task": "vec_add", "code": code, "seed": 1, "hidden_shapes": 1,
        "cpu_s": cpu_s})
    .to_string()
}

/// The HTTP layer's promises, as `tests/serve.rs` checks them on `ember serve`: heads and
/// bodies cut when slow (408) or large (413), at most --max-connections served, each client's
/// share (429), the key on every route but `/health`, and a second signal that exits at once
/// while an evaluation is still running.
#[test]
fn gym_serve_keeps_the_http_layers_promises() {
    let quick = evaluate_body(ADD, 5);
    let target = common::http::Target {
        start: &gym_server,
        get: "/v1/tasks",
        post: "/v1/evaluate",
        quick_body: &quick,
    };
    common::http::every_promise(&target);
    // A kernel that spins for seconds a call: the evaluation outlives both signals (and its
    // harness dies with the server).
    let spin = "void vec_add(const float *a, const float *b, float *out, int n) {
    volatile double x = 0.0;
    for (long k = 0; k < 3000000000L; k++) x += 1.0;
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}
";
    common::http::a_second_signal_exits_at_once(&target, &evaluate_body(spin, 10));
}

/// Twelve evaluations sent at once by three clients (as a trainer's batch through `[env]
/// remote`), with two clients dribbling their bodies: `/health` is answered meanwhile, and every
/// evaluation gets the verdict the gym gives in process.
#[test]
fn gym_serve_answers_a_batch_under_load() {
    use std::io::Write;
    let server = gym_server(&["--body-read-timeout", "5"]);
    let port = server.port;
    let kernels = [ADD, STATEFUL, "void vec_add(int n) {"];
    let want: Vec<&str> = kernels
        .iter()
        .map(|c| {
            let t = ember_gym::task("vec_add").unwrap();
            let cfg = ember_gym::EvalConfig {
                hidden_shapes: 1,
                ..Default::default()
            };
            ember_gym::evaluate(t, c, 1, &cfg).unwrap().verdict.name()
        })
        .collect();
    std::thread::scope(|s| {
        let batch: Vec<_> = (0..12)
            .map(|i| {
                let body = evaluate_body(kernels[i % 3], 5);
                s.spawn(move || (i, common::http::post(port, "/v1/evaluate", &body)))
            })
            .collect();
        let mut slow = Vec::new();
        for _ in 0..2 {
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let head = common::http::head("/v1/evaluate", 100, false);
            c.write_all(format!("{head}{{").as_bytes()).unwrap();
            slow.push(c);
        }
        let t = std::time::Instant::now();
        assert_eq!(common::http::get(port, "/health", None).0, 200);
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        for h in batch {
            let (i, (code, body)) = h.join().unwrap();
            assert_eq!(code, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["verdict"], want[i % 3], "evaluation {i}: {body}");
            if want[i % 3] == "ok" {
                assert!(v["speedup"].as_f64().unwrap() > 0.0, "{body}");
            }
        }
        for mut c in slow {
            let text = common::http::answer(&mut c, std::time::Duration::from_secs(30));
            assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
        }
    });
}

#[test]
fn serve_and_the_remote_executor_agree_with_the_local_gym() {
    let (mut child, url) = serve(Some("s3cret"));
    let t = ember_gym::task("vec_add").unwrap();
    let cfg = ember_gym::EvalConfig {
        time: true,
        hidden_shapes: 2,
        ..Default::default()
    };
    let jobs: Vec<Job> = [ADD, STATEFUL, "void vec_add(int n) {"]
        .iter()
        .map(|c| Job {
            task: t,
            code: c.to_string(),
            seed: 9,
        })
        .collect();
    let dead = "http://127.0.0.1:9".to_string();
    let remote =
        ember::gym::remote::Remote::with_key(&[dead, url.clone()], cfg.clone(), Some("s3cret"));
    let local = Local(cfg.clone());
    for (i, job) in jobs.iter().enumerate() {
        let (r, l) = (
            remote.evaluate(job, 0).unwrap(),
            local.evaluate(job, 0).unwrap(),
        );
        assert_eq!(r.verdict.name(), l.verdict.name(), "job {i}");
        assert_eq!(r.shapes, l.shapes);
    }
    let ok = remote.evaluate(&jobs[0], 1).unwrap();
    assert_eq!(ok.verdict, Verdict::Ok);
    assert!(ok.speedup.unwrap() > 0.0);
    let unkeyed = ember::gym::remote::Remote::with_key(&[url], cfg, None);
    let err = unkeyed.evaluate(&jobs[0], 0).unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Hostile kernels (`tests/fixtures/gym/`, each headed by what it tries) gain nothing: those
/// that leave their process's bounds get their verdict, and those that only cheat inside it
/// measure as what they honestly compute (the bounds are orders of magnitude from the cheat:
/// the cache, the copied result and the scaled times claimed 1 000–4 700×).
#[test]
fn hostile_kernels_gain_nothing() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gym");
    let walk = std::fs::read_to_string(dir.join("libc_walk.inc")).unwrap();
    let cfg = ember_gym::EvalConfig::default();
    for (file, task, want) in [
        ("libc_system.c", "vec_add", Some("sandbox_violation")),
        ("exit_early.c", "vec_add", Some("crashed")),
        ("ifunc.c", "vec_add", Some("runs_at_load")),
        ("got_section.c", "matmul", Some("rejected")),
        ("include_comment.c", "vec_add", Some("rejected")),
        ("include_after_comment.c", "vec_add", Some("rejected")),
        ("hex_shapes.c", "vec_add", Some("shape_specialised")),
        ("forged_lines.c", "vec_add", None),
        ("heap_reference.c", "matmul", None),
        ("stack_cache.c", "matmul", None),
        ("timing_arrays.c", "vec_add", None),
        ("coverage_patch.c", "matmul_bias_relu", None),
        ("lib_fd_redirect.c", "matmul_bias_relu", None),
        ("slow_reference.c", "vec_add", Some("inconsistent_runs")),
    ] {
        let mut code = std::fs::read_to_string(dir.join(file)).unwrap();
        if code.contains("libc_sym(") {
            code = format!("{walk}\n{code}");
        }
        let t = ember_gym::task(task).unwrap();
        let r = ember_gym::evaluate(t, &code, 5, &cfg).unwrap();
        match want {
            Some(name) => {
                assert_eq!(r.verdict.name(), name, "{file}: {:?}", r.verdict);
                assert_eq!(ember_gym::RewardConfig::default().reward(&r), 0.0, "{file}");
            }
            None if r.verdict == Verdict::Ok => {
                assert!(r.speedup.unwrap() < 20.0, "{file}: {:?}", r.speedup);
                if task == "matmul_bias_relu" {
                    assert!(r.coverage.unwrap() < 0.5, "{file}: {:?}", r.coverage);
                }
            }
            None => assert_eq!(ember_gym::RewardConfig::default().reward(&r), 0.0, "{file}"),
        }
    }
}
