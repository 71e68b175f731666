//! Training over several processes: `mpirun -np 2` on loopback (oversubscribed on two cores)
//! runs the main job's recipe. Both ranks hold bit-identical parameters after every step
//! (`EMBER_DIST_CHECK_EVERY=1`), and the run equals one process's run on the whole batch; a rank
//! that stalls or dies ends the run with an error naming it, without a hang, and `--resume`
//! continues exactly. The launchers' environments are parsed in `crates/ember-dist`'s tests.
//!
//! The MPI tests build `ember` with `--features mpi` (Open MPI and libclang installed:
//! `.ci/run` installs them); where `mpirun` is missing they are skipped, unless
//! `EMBER_REQUIRE_MPI` is set (CI), where that is a failure.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const SETS: &[&str] = &[
    "--set",
    "warmup.steps=150",
    "--set",
    "task.eval_size=40",
    "--set",
    "train.eval_every=2",
    "--set",
    "train.checkpoint_every=1",
    "--set",
    "train.lr=3e-3",
    "--set",
    "train.recompute_old_log_probs=true",
    // Two mini-batches: the second's ratio moves off 1, so its spread (`actor/ratio_max`,
    // `_min`, `_std`) must be the whole batch's however the rows are split over ranks.
    "--set",
    "train.mini_batches=2",
];

fn steps(n: usize) -> [String; 2] {
    ["--set".into(), format!("train.steps={n}")]
}

/// The `ember` binary built with MPI, or None (skipped) where no MPI is installed.
fn mpi_binary() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(build_mpi_binary).as_deref()
}

fn build_mpi_binary() -> Option<PathBuf> {
    let have = Command::new("mpirun").arg("--version").output().is_ok();
    if !have {
        assert!(
            std::env::var_os("EMBER_REQUIRE_MPI").is_none(),
            "EMBER_REQUIRE_MPI is set but mpirun is missing (apt-get install openmpi-bin \
             libopenmpi-dev libclang-dev)"
        );
        eprintln!("skipped: no mpirun (apt-get install openmpi-bin libopenmpi-dev libclang-dev)");
        return None;
    }
    // The test's own binary tells the target directory and profile; the MPI build goes beside
    // it (only `ember-collectives` and the root package differ), is copied aside, and the
    // plain binary is put back for the tests that follow.
    let plain = PathBuf::from(env!("CARGO_BIN_EXE_ember"));
    let profile_dir = plain.parent().expect("the binary's folder");
    let target = profile_dir.parent().expect("the target directory");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let build = |features: &[&str]| {
        let mut c = Command::new(cargo);
        // What cargo sets for a test process is not the build's environment: build scripts
        // that watch those variables (ring's watch CARGO_PKG_NAME) would rebuild, here and
        // again in the next `cargo test`.
        let test_only = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ];
        for (k, _) in std::env::vars() {
            if test_only.iter().any(|p| k.starts_with(p)) {
                c.env_remove(k);
            }
        }
        c.args(["build", "--bin", "ember", "--target-dir"])
            .arg(target)
            .args(features)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if release {
            c.arg("--release");
        }
        let out = c.output().expect("running cargo");
        assert!(
            out.status.success(),
            "cargo build {features:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    build(&["--features", "mpi"]);
    let mpi = profile_dir.join("ember-mpi-test");
    std::fs::copy(&plain, &mpi).expect("copying the MPI build aside");
    build(&[]);
    Some(mpi)
}

fn mpirun(bin: &Path, args: &[String]) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["-np", "2", "--oversubscribe", "--bind-to", "none"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl", "self,tcp")
        .env("OMPI_MCA_btl_tcp_if_include", "lo")
        .env("OMPI_MCA_oob_tcp_if_include", "lo")
        .env("EMBER_DIST_CHECK_EVERY", "1")
        .arg(bin)
        .args(args);
    c
}

fn train_args(out: &Path, n: usize, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "recipes/arithmetic-cpu.toml", "--no-dashboard"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(SETS.iter().map(|s| s.to_string()));
    a.extend(steps(n));
    a.extend(["--out".to_string(), out.display().to_string()]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn run_ok(mut c: Command) -> String {
    let out = c
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("spawning");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "failed: {err}");
    err
}

fn rows(out: &Path) -> Vec<BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).expect("metrics.jsonl");
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object()
                .unwrap()
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect()
        })
        .collect()
}

/// Every metric of `a` that is a number of the run (not a time, not the world's own) equals
/// `b`'s: counts and rewards exactly, the rest within 1e-5 relative (the sums of two ranks'
/// gradients round differently from one process's) or 1e-6 absolute: a few f32 steps at 1, the
/// size of an on-policy ratio's spread and its KL, which are rounding differences themselves.
fn assert_same_run(a: &[BTreeMap<String, f64>], b: &[BTreeMap<String, f64>]) {
    assert_eq!(a.len(), b.len(), "rows");
    let own =
        |k: &str| k.starts_with("timing_s/") || k.starts_with("perf/") || k.starts_with("dist/");
    for (ra, rb) in a.iter().zip(b) {
        let keys = |r: &BTreeMap<String, f64>| -> Vec<String> {
            r.keys().filter(|k| !own(k)).cloned().collect()
        };
        assert_eq!(keys(ra), keys(rb), "keys of step {:?}", ra.get("step"));
        for k in keys(ra) {
            let (x, y) = (ra[&k], rb[&k]);
            let exact = k.starts_with("rollout/") || k.starts_with("reward/") || k == "step";
            let tol = if exact {
                0.0
            } else {
                1e-5 * x.abs().max(y.abs()) + 1e-6
            };
            assert!(
                (x - y).abs() <= tol,
                "step {:?} {k}: {x} vs {y}",
                ra.get("step")
            );
        }
    }
}

/// The final weights of two runs, tensor by tensor, within `tol`.
fn assert_same_weights(a: &Path, b: &Path, tol: f32) {
    let read = |d: &Path| std::fs::read(d.join("final/model.safetensors")).expect("final weights");
    let (ba, bb) = (read(a), read(b));
    let (ta, tb) = (
        safetensors::SafeTensors::deserialize(&ba).unwrap(),
        safetensors::SafeTensors::deserialize(&bb).unwrap(),
    );
    let mut names = ta.names();
    names.sort();
    assert!(!names.is_empty());
    for name in names {
        let (x, y) = (ta.tensor(name).unwrap(), tb.tensor(name).unwrap());
        assert_eq!(x.shape(), y.shape(), "{name}");
        let f = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let worst = f(x.data())
            .iter()
            .zip(f(y.data()))
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(worst <= tol, "{name}: differs by {worst}");
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-dist-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The main job's recipe on two ranks equals the one-process run, row by row and in its final
/// weights (1e-6), with both ranks' parameters checked identical, bit for bit, after every step
/// (a rank that diverged would end the run with an error); only rank 0 wrote the directory.
#[test]
fn two_ranks_train_as_one_process_does() {
    let Some(bin) = mpi_binary() else { return };
    let (one, two) = (scratch("one"), scratch("two"));
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.args(train_args(&one, 4, &["--quiet"]));
    run_ok(c);
    let err = run_ok(mpirun(bin, &train_args(&two, 4, &[])));
    assert!(err.contains("2 ranks over mpi"), "{err}");
    let (a, b) = (rows(&one), rows(&two));
    assert_same_run(&a, &b);
    assert!(
        b[1..]
            .iter()
            .all(|r| r.get("dist/params_checked") == Some(&1.0))
    );
    assert!(
        b[1..].iter().any(|r| r["actor/grad_norm"] > 0.0),
        "the run learned nothing"
    );
    assert_same_weights(&one, &two, 1e-6);
    let world: serde_json::Value =
        serde_json::from_slice(&std::fs::read(two.join("world.json")).unwrap()).unwrap();
    assert_eq!(world["ranks"], 2);
    let _ = std::fs::remove_dir_all(&one);
    let _ = std::fs::remove_dir_all(&two);
}

/// The pid of rank `rank` among `mpirun`'s children.
fn rank_pid(mpirun: u32, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let mine = env.split(|b| *b == 0).any(|v| v == want.as_bytes());
        if ppid == Some(mpirun) && mine {
            return Some(pid);
        }
    }
    None
}

/// Starts a 2-rank run of 6 steps, waits for step 2's row, sends `signal` to rank 1 and returns
/// how the run ended (status, stderr, seconds after the signal).
fn interrupt_rank_one(bin: &Path, out: &Path, signal: &str) -> (bool, String, f64) {
    let mut c = mpirun(bin, &train_args(out, 6, &[]));
    c.env("EMBER_DIST_TIMEOUT", "5")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("mpirun");
    let start = Instant::now();
    let reached = || rows_if_any(out).len() > 2;
    while !reached() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the run never reached step 2"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = rank_pid(child.id(), 1).expect("rank 1's process");
    let sent = Instant::now();
    let ok = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
    assert!(ok.is_ok_and(|s| s.success()));
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if sent.elapsed() > Duration::from_secs(90) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let _ = child.kill();
            panic!("the run hung after rank 1 got {signal}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.success(), err, sent.elapsed().as_secs_f64())
}

fn rows_if_any(out: &Path) -> Vec<String> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A stalled rank (SIGSTOP: alive, silent, as a hung kernel or a full disk leaves it) is named
/// with the step by rank 0's watchdog within the timeout, every process ends, the checkpoints
/// are intact, and `--resume` continues to the same numbers as an uninterrupted run. A killed
/// rank (SIGKILL) ends the run at once, MPI's launcher naming it, and the run resumes the same.
#[test]
fn a_stalled_or_dead_rank_is_named_without_a_hang_and_the_run_resumes_exactly() {
    let Some(bin) = mpi_binary() else { return };
    let (whole, cut) = (scratch("whole"), scratch("cut"));
    run_ok(mpirun(bin, &train_args(&whole, 6, &["--quiet"])));
    let (ok, err, secs) = interrupt_rank_one(bin, &cut, "-STOP");
    assert!(!ok, "the run succeeded with a stalled rank");
    assert!(
        err.contains("rank(s) 1 did not reach") || err.contains("rank(s) 1 stopped inside"),
        "{err}"
    );
    assert!(err.contains("of step"), "{err}");
    assert!(secs < 60.0, "{secs} s to notice");
    let err = run_ok(mpirun(bin, &train_args(&cut, 6, &["--resume"])));
    assert!(err.contains("resuming from"), "{err}");
    assert_same_run(&rows(&whole), &rows(&cut));
    assert_same_weights(&whole, &cut, 1e-6);
    let _ = std::fs::remove_dir_all(&cut);
    let (ok, err, secs) = interrupt_rank_one(bin, &cut, "-KILL");
    assert!(!ok, "the run succeeded with a dead rank");
    assert!(err.contains("rank 1"), "{err}");
    assert!(secs < 60.0, "{secs} s to notice");
    run_ok(mpirun(bin, &train_args(&cut, 6, &["--resume"])));
    assert_same_run(&rows(&whole), &rows(&cut));
    assert_same_weights(&whole, &cut, 1e-6);
    let _ = std::fs::remove_dir_all(&whole);
    let _ = std::fs::remove_dir_all(&cut);
}

/// Launcher variables without an engine built in are refused with what to do, and
/// `--dist none` runs the process alone.
#[test]
fn a_launch_this_binary_cannot_join_says_what_to_build() {
    let out = scratch("refused");
    let run = |dist: &str| {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(train_args(&out, 1, &["--quiet", "--dist", dist]))
            .env("RANK", "1")
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap()
    };
    let o = run("auto");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("torchrun started 2 processes") && err.contains("--features"),
        "{err}"
    );
    let o = run("none");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(train_args(&out, 1, &["--quiet", "--overwrite"]))
        .env("RANK", "3")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "h")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 3 in a world of 2"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Rank 0 of two, whose peer's checksum is `peer` (or the same as its own).
struct Peer(Option<Vec<u8>>);

impl ember_dist::Collective for Peer {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn engine(&self) -> &'static str {
        "test"
    }
    fn all_reduce_sum(
        &self,
        buf: Vec<f32>,
        _: ember_dist::At,
    ) -> Result<Vec<f32>, ember_dist::DistError> {
        Ok(buf.iter().map(|x| 2.0 * x).collect())
    }
    fn all_gather(
        &self,
        bytes: Vec<u8>,
        _: ember_dist::At,
    ) -> Result<Vec<Vec<u8>>, ember_dist::DistError> {
        let peer = self.0.clone().unwrap_or_else(|| bytes.clone());
        Ok(vec![bytes, peer])
    }
    fn broadcast(
        &self,
        bytes: Vec<u8>,
        _: ember_dist::At,
    ) -> Result<Vec<u8>, ember_dist::DistError> {
        Ok(bytes)
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

fn peer_world(peer: Option<Vec<u8>>) -> ember_dist::World {
    let launch = ember_dist::Launch {
        size: 2,
        local_size: 2,
        ..ember_dist::Launch::single()
    };
    ember_dist::World::new(std::sync::Arc::new(Peer(peer)), launch).unwrap()
}

/// The ranks' parameter check names a peer whose parameters differ, and passes equal ones;
/// rank 0's broadcast of its parameters leaves them as they are.
#[test]
fn diverged_ranks_are_named_and_rank_zero_broadcasts_its_weights() {
    let device = ember::common::device::device("cpu").unwrap().autodiff();
    let m = burn::nn::LinearConfig::new(3, 2).init(&device);
    assert!(m.weight.is_require_grad());
    ember_train::check_identical(&peer_world(None), &m).unwrap();
    let e = ember_train::check_identical(&peer_world(Some(vec![1, 2, 3, 4])), &m)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank(s) 1 hold other trained parameters"), "{e}");
    let before: Vec<f32> = m.weight.val().into_data().try_into_vec().unwrap();
    let m = ember_train::broadcast_trained(&peer_world(None), m).unwrap();
    let after: Vec<f32> = m.weight.val().into_data().try_into_vec().unwrap();
    assert_eq!(before, after);
    assert!(m.weight.is_require_grad());
}
