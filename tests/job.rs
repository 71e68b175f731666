//! The RL job through the `ember` binary: resume equality, Ctrl-C, the external reward protocol
//! with a real subprocess, other tasks, and bad inputs.

mod common;

use ember_tasks::reward::{ExternalReward, ExternalSpec, RewardItem};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn recipe() -> String {
    root()
        .join("recipes/arithmetic-cpu.toml")
        .to_string_lossy()
        .into()
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-job-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A small budget: warm-up long enough for non-zero rewards, a few RL steps.
const SMALL: [&str; 12] = [
    "warmup.steps=200",
    "train.steps=6",
    "rollout.prompts_per_step=8",
    "task.eval_size=40",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.warmup_steps=2",
    "train.kl_coef=0.01",
    "train.recompute_old_log_probs=true",
    "train.epochs=2",
    "train.mini_batches=2",
    "rollout.samples_per_prompt=4",
];

/// The recipe's own warm-up, for tests that need rewards to differ within groups from the first
/// steps: after [`SMALL`]'s 200 warm-up steps the policy solves about 2 % of the problems, and
/// whether its first groups hold any correct answer at all depends on the float summation order
/// of the build's kernels.
const FULL_WARMUP: &str = "warmup.steps=900";

fn train(out: &Path, extra: &[&str], flags: &[&str]) -> Output {
    train_recipe(&recipe(), out, extra, flags)
}

/// The CPU recipe with its `[task]` table replaced by `task` (written next to `out`).
fn variant(out: &Path, task: &str) -> String {
    let text = std::fs::read_to_string(recipe()).unwrap();
    let start = text.find("[task]").unwrap();
    let end = start + text[start..].find("\n[warmup]").unwrap();
    let new = format!("{}[task]\n{task}\n{}", &text[..start], &text[end..]);
    let p = out.with_extension("toml");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, new).unwrap();
    p.to_string_lossy().into()
}

fn train_recipe(recipe: &str, out: &Path, extra: &[&str], flags: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.args(["train", recipe, "--quiet", "--out"]).arg(out);
    for s in SMALL.iter().chain(extra) {
        c.args(["--set", s]);
    }
    c.args(flags).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into()
}

/// Stopping at step 3 and resuming gives the same metrics, step for step, as an uninterrupted
/// run: model, AdamW moments, RNG state and the KL reference all come back from disk. The
/// recipe's own warm-up, so that the steps have rewards to compare.
#[test]
fn resume_equals_uninterrupted_run() {
    let (a, b) = (tmp("resume-a"), tmp("resume-b"));
    let o = train(&a, &[FULL_WARMUP], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = train(&b, &[FULL_WARMUP], &["--stop-after", "3"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(b.join("checkpoints/step-00000003/model.bpk").exists());
    assert!(b.join("checkpoints/step-00000003/optim.bpk").exists());
    // A second run into the same directory without --resume is refused; nothing is lost.
    let o = train(&b, &[FULL_WARMUP], &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    // Resuming with a different recipe is refused.
    let o = train(&b, &[FULL_WARMUP, "train.lr=0.5"], &["--resume"]);
    assert!(stderr(&o).contains("recipe differs"), "{}", stderr(&o));
    // One flipped bit in the model record: refused by name (it used to load as garbage
    // weights and exit 0), and resumable once the file is whole again.
    let model = b.join("checkpoints/step-00000003/model.bpk");
    let whole = std::fs::read(&model).unwrap();
    let mut flipped = whole.clone();
    flipped[whole.len() / 2] ^= 0x10;
    std::fs::write(&model, &flipped).unwrap();
    let o = train(&b, &[FULL_WARMUP], &["--resume"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("model.bpk is damaged"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&model, &whole).unwrap();
    let o = train(&b, &[FULL_WARMUP], &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (ra, rb) = (common::metric_rows(&a), common::metric_rows(&b));
    assert_eq!(ra.len(), 7);
    let rewards: f64 = ra
        .iter()
        .filter_map(|r| r.get("rollout/reward_mean")?.as_f64())
        .sum();
    assert!(
        rewards > 0.0,
        "the test needs non-zero rewards to mean anything"
    );
    assert_eq!(ra, rb, "resumed metrics differ from the uninterrupted run");
    for f in ["curves.png", "metrics.csv", "final/model.safetensors"] {
        assert!(b.join(f).exists(), "{f} missing");
    }
    eval_matches_last(&b, &ra);
    final_damage_is_named(&b);
    std::fs::remove_dir_all(&a).ok();
    std::fs::remove_dir_all(&b).ok();
}

/// The pipelined rollout (`rollout.max_staleness = 1`): the first step's rollout is the
/// synchronous run's (drawn first, with the same weights), every later one is one update old
/// (`staleness/*`), π_old is recomputed and the mismatch correction weighs the sampler's
/// log-probs against it; a stop at step 3 saves the rollout in flight (`pipeline.json`), and
/// the resumed run equals the uninterrupted one.
#[test]
fn pipelined_rollouts_are_one_step_stale_and_resume_exactly() {
    let (sync, a, b) = (tmp("k0"), tmp("k1-a"), tmp("k1-b"));
    let k1 = ["rollout.max_staleness=1"];
    for (out, extra, flags) in [(&sync, &[][..], &[][..]), (&a, &k1[..], &[][..])] {
        let o = train(out, extra, flags);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = train(&b, &k1, &["--stop-after", "3"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(b.join("checkpoints/step-00000003/pipeline.json").exists());
    let o = train(&b, &k1, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (r0, ra, rb) = (
        common::metric_rows(&sync),
        common::metric_rows(&a),
        common::metric_rows(&b),
    );
    assert_eq!(ra, rb, "resumed metrics differ from the uninterrupted run");
    assert_eq!(r0[1]["rollout/reward_mean"], ra[1]["rollout/reward_mean"]);
    for (i, r) in ra.iter().enumerate().skip(1) {
        let want = if i == 1 { 0.0 } else { 1.0 };
        assert_eq!(r["staleness/max"].as_f64(), Some(want), "row {i}");
        assert!(r.contains_key("mismatch/is_weight_mean"), "row {i}");
    }
    assert!(r0[2]["staleness/max"].as_f64() == Some(0.0));
    for d in [&sync, &a, &b] {
        std::fs::remove_dir_all(d).ok();
    }
}

/// `final/` carries a manifest: a flipped bit in its weights makes `ember eval` fail naming the
/// file (it used to evaluate the damaged weights and exit 0); a file added to it is allowed.
fn final_damage_is_named(run: &Path) {
    let eval = || {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .arg("eval")
            .arg(run)
            .output()
            .unwrap()
    };
    std::fs::write(run.join("final/README.md"), "notes").unwrap();
    let o = eval();
    assert!(o.status.success(), "{}", stderr(&o));
    let weights = run.join("final/model.safetensors");
    let whole = std::fs::read(&weights).unwrap();
    let mut flipped = whole.clone();
    flipped[whole.len() - 9] ^= 0x04;
    std::fs::write(&weights, &flipped).unwrap();
    let o = eval();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("model.safetensors is damaged"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&weights, &whole).unwrap();
}

/// `ember eval` scores the final model as the run's last evaluation did.
fn eval_matches_last(run: &Path, rows: &[serde_json::Map<String, serde_json::Value>]) {
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("eval")
        .arg(run)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let last = rows.last().unwrap()["eval/accuracy"].as_f64().unwrap();
    assert!(
        (v["accuracy"].as_f64().unwrap() - last).abs() < 1e-9,
        "{v} vs {last}"
    );
}

/// Ctrl-C (SIGINT) finishes the step, writes a checkpoint and exits with 130.
#[test]
fn ctrl_c_writes_a_checkpoint() {
    stop_by_signal("INT", 130);
}

/// SIGTERM (schedulers, `docker stop`) and SIGHUP (a closed terminal) do the same, exiting with
/// 128 + the signal number; while the run holds its directory, a second run there is refused.
#[test]
fn sigterm_and_sighup_write_a_checkpoint() {
    stop_by_signal("TERM", 143);
    stop_by_signal("HUP", 129);
}

/// SIGTERM during a warm-up that would take for ever (2^62 steps) ends it at its next step with
/// the signal's exit status; the warm-up used to ignore the signal until it finished.
#[test]
fn sigterm_stops_a_warm_up() {
    let out = tmp("sigwarm");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["train", &recipe(), "--quiet", "--out"])
        .arg(&out)
        .args(["--set", "warmup.steps=4611686018427387904"])
        .args(["--set", "task.eval_size=4"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !out.join("recipe.resolved.toml").exists() {
        assert!(t0.elapsed().as_secs() < 60, "the run never started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t1 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t1.elapsed().as_secs() > 60 {
            child.kill().ok();
            panic!("the warm-up ignored SIGTERM for 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(143), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("stopped during the warm-up after"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&out).ok();
}

fn stop_by_signal(signal: &str, code: i32) {
    let out = tmp(&format!("sig{signal}"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["train", &recipe(), "--out"])
        .arg(&out)
        .args([
            "--set",
            "warmup.steps=10",
            "--set",
            "train.steps=100000",
            "--set",
            "task.eval_size=10",
            "--set",
            "train.eval_every=1000",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(err).lines();
    for line in lines.by_ref() {
        if line.unwrap().contains("step    2/") {
            break;
        }
    }
    if signal == "TERM" {
        let o = train(&out, &[], &["--overwrite"]);
        assert!(stderr(&o).contains("another process"), "{}", stderr(&o));
    }
    let st = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(code), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("--resume")), "{rest:?}");
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            out.join("checkpoints")
                .join(latest.trim())
                .join("state.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(state["step"].as_u64().unwrap() >= 2, "{state}");
    std::fs::remove_dir_all(&out).ok();
}

fn script() -> String {
    root()
        .join("tests/fixtures/reward/length_reward.py")
        .to_string_lossy()
        .into()
}

/// An error mid-run (here the reward program dies at step 3) writes the checkpoint of the last
/// completed step before the process exits, so `--resume` continues from step 2 instead of the
/// run being lost (the recipe checkpoints only at the end).
#[test]
fn an_error_mid_run_keeps_the_last_completed_step() {
    let out = tmp("midrun");
    // Answers two requests with zeros, then exits.
    let program = "import sys, json\n\
                   for i, line in enumerate(sys.stdin):\n    \
                   if i == 2: sys.exit(4)\n    \
                   n = len(json.loads(line)['items'])\n    \
                   print(json.dumps({'rewards': [0.0] * n}), flush=True)";
    let external = format!(
        "reward.external={{command=[\"python3\", \"-c\", {program:?}], weight=1.0, timeout_s=30}}"
    );
    let o = train(
        &out,
        &[
            "warmup.steps=5",
            "train.steps=6",
            "train.checkpoint_every=0",
            "task.eval_size=5",
            &external,
        ],
        &[],
    );
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("step 3 failed") && e.contains("checkpoint of step 2") && e.contains("--resume"),
        "{e}"
    );
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-00000002");
    // Synchronous: the failed step's rollout was drawn in it, so it is redrawn, not saved.
    assert!(!out.join("checkpoints/step-00000002/pipeline.json").exists());
    let rows = common::metric_rows(&out);
    assert_eq!(rows.last().unwrap()["step"], 2.0);
    std::fs::remove_dir_all(&out).ok();
}

/// The same with the pipeline (`rollout.max_staleness = 1`): the checkpoint after the error
/// puts back the rollout the failed step took, drops the one it drew, and rewinds the RNG, so
/// the resumed run equals a run without the error.
#[test]
fn an_error_mid_run_rewinds_the_pipeline() {
    let dir = tmp("midrun-k1");
    std::fs::create_dir_all(&dir).unwrap();
    // Fails at its third request unless the marker exists (it leaves one): a second process,
    // the resumed run's, answers them all.
    let program = "import sys, json, os\n\
                   m = sys.argv[1]\n\
                   for i, line in enumerate(sys.stdin):\n    \
                   if i == 2 and not os.path.exists(m): open(m, 'w').close(); sys.exit(4)\n    \
                   items = json.loads(line)['items']\n    \
                   print(json.dumps({'rewards': [len(x['completion']) % 2 for x in items]}), \
                   flush=True)";
    let run = |out: &Path, marker: &Path, flags: &[&str]| {
        let external = format!(
            "reward.external={{command=[\"python3\", \"-c\", {program:?}, {:?}], weight=1.0, \
             timeout_s=30}}",
            marker.display().to_string()
        );
        let sets = [
            "train.checkpoint_every=0",
            "rollout.max_staleness=1",
            &external,
        ];
        train(out, &sets, flags)
    };
    let (failed, clean) = (dir.join("failed"), dir.join("clean"));
    let present = dir.join("present");
    std::fs::write(&present, "").unwrap();
    let o = run(&clean, &present, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&failed, &dir.join("marker"), &[]);
    assert!(
        stderr(&o).contains("checkpoint of step 2"),
        "{}",
        stderr(&o)
    );
    assert!(
        failed
            .join("checkpoints/step-00000002/pipeline.json")
            .exists()
    );
    let o = run(&failed, &dir.join("marker"), &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::metric_rows(&clean), common::metric_rows(&failed));
    std::fs::remove_dir_all(&dir).ok();
}

/// A reward program that answers only `null` trains nothing: each such step says so on stderr
/// (the run used to end with exit status 0 and no word), and the rows count every sample invalid.
#[test]
fn steps_without_a_valid_reward_are_said() {
    let out = tmp("allnull");
    let program = "import sys, json\n\
                   for line in sys.stdin:\n    \
                   n = len(json.loads(line)['items'])\n    \
                   print(json.dumps({'rewards': [None] * n}), flush=True)";
    let external = format!(
        "reward.external={{command=[\"python3\", \"-c\", {program:?}], weight=1.0, timeout_s=30}}"
    );
    let o = train(
        &out,
        &[
            "warmup.steps=2",
            "train.steps=2",
            "task.eval_size=5",
            "rollout.prompts_per_step=4",
            &external,
        ],
        &[],
    );
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    for step in [1, 2] {
        let said = format!("step {step}: none of its 16 rewards is valid");
        assert!(e.contains(&said), "{e}");
    }
    let invalid: Vec<_> = common::metric_rows(&out)
        .iter()
        .filter_map(|r| r.get("rollout/invalid_rewards")?.as_f64())
        .collect();
    assert_eq!(invalid, [16.0, 16.0]);
    std::fs::remove_dir_all(&out).ok();
}

/// The JSON-lines protocol with a real subprocess: lengths back, NaN for the first item.
#[test]
fn external_reward_round_trip() {
    let spec = ExternalSpec {
        command: vec!["python3".into(), script()],
        weight: 1.0,
        timeout_s: 30.0,
    };
    let mut ext = ExternalReward::spawn(&spec).unwrap();
    let no_columns: &'static serde_json::Map<String, serde_json::Value> = Box::leak(Box::default());
    let items = |c: &[&'static str]| -> Vec<RewardItem<'static>> {
        c.iter()
            .map(|s| RewardItem {
                prompt: "1+1=",
                completion: s,
                answer: "2",
                group: 0,
                columns: no_columns,
                messages: &[],
                completion_ids: &[],
            })
            .collect()
    };
    for step in 0..3 {
        let v = ext
            .score(step, &items(&["x", "ab", "abcd"]))
            .unwrap()
            .rewards;
        assert!(v[0].is_nan());
        assert_eq!(&v[1..], &[2.0, 4.0]);
    }
    // Timeouts, crashes and missing programs are errors that name the command.
    let slow = ExternalSpec {
        command: vec![
            "python3".into(),
            "-c".into(),
            "import time; time.sleep(30)".into(),
        ],
        weight: 1.0,
        timeout_s: 0.5,
    };
    let e = ExternalReward::spawn(&slow)
        .unwrap()
        .score(1, &items(&["a"]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no answer within 0.5 s") && e.contains("time.sleep"),
        "{e}"
    );
    // A program that never reads: a request larger than the pipe (64 KiB) cannot be written,
    // and the timeout covers that too (it used to hang for ever).
    let deaf = ExternalSpec {
        command: vec![
            "python3".into(),
            "-c".into(),
            "import time; time.sleep(30)".into(),
        ],
        ..slow.clone()
    };
    let long: &'static str = Box::leak("x".repeat(100_000).into_boxed_str());
    let t0 = std::time::Instant::now();
    let e = ExternalReward::spawn(&deaf)
        .unwrap()
        .score(1, &items(&[long, long]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no answer within 0.5 s"), "{e}");
    assert!(t0.elapsed().as_secs_f64() < 10.0);
    // A timeout too large for a duration is an error, not a panic.
    let huge = ExternalSpec {
        timeout_s: 1e300,
        ..slow.clone()
    };
    let e = ExternalReward::spawn(&huge).err().unwrap().to_string();
    assert!(e.contains("timeout_s"), "{e}");
    let crash = ExternalSpec {
        command: vec![
            "python3".into(),
            "-c".into(),
            "import sys; sys.exit(3)".into(),
        ],
        ..slow.clone()
    };
    let mut c = ExternalReward::spawn(&crash).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let e = c.score(1, &items(&["a"])).unwrap_err().to_string();
    assert!(e.contains("sys.exit(3)"), "{e}");
    let missing = ExternalSpec {
        command: vec!["/no/such/reward-program".into()],
        ..slow
    };
    let e = ExternalReward::spawn(&missing).err().unwrap().to_string();
    assert!(e.contains("cannot start") && e.contains("/no/such"), "{e}");
}

/// A run with the external reward: the NaN sample is masked and counted every step, the run
/// completes, and the external mean is logged.
#[test]
fn nan_rewards_are_masked_and_counted() {
    let out = tmp("nan");
    let cmd = format!("reward.external.command=[\"python3\", \"{}\"]", script());
    let o = train(
        &out,
        &[
            "train.steps=2",
            "train.checkpoint_every=0",
            "reward.correct=0.0",
            &cmd,
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&out);
    assert_eq!(r.len(), 3);
    for row in &r[1..] {
        assert_eq!(
            row["rollout/invalid_rewards"].as_f64(),
            Some(1.0),
            "{row:?}"
        );
        assert!(row["reward/external_mean"].as_f64().unwrap() > 0.0);
        assert!(row["rollout/reward_mean"].as_f64().unwrap().is_finite());
        assert!(row["actor/pg_loss"].as_f64().unwrap().is_finite());
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn countdown_and_format_reward_run() {
    let out = tmp("countdown");
    let o = train(
        &out,
        &[
            "task.kind=countdown",
            "task.digits=2",
            "train.steps=2",
            "rollout.max_new_tokens=8",
        ],
        &[],
    );
    assert!(
        stderr(&o).contains("task.digits applies to kind = arithmetic"),
        "{}",
        stderr(&o)
    );
    let cd = variant(&out, "kind = \"countdown\"\neval_size = 20");
    let o = train_recipe(
        &cd,
        &out,
        &[
            "train.steps=2",
            "rollout.max_new_tokens=8",
            "reward.format=0.5",
            "reward.overlong={max_len = 8, cache_len = 4}",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&out);
    assert_eq!(r.len(), 3);
    assert!(r[2].contains_key("reward/format_mean"), "{:?}", r[2]);
    // BNPO's decomposition: correctness and format as two terms, each its own Beta
    // normalisation (the update fails without the terms in the batch); the overlong penalty
    // is not a term and is refused up front.
    let bnpo = [
        "train.steps=2",
        "rollout.max_new_tokens=8",
        "reward.format=0.5",
        "algorithm=bnpo",
        "advantage={kind = \"bnpo\", decompose = true}",
    ];
    let o = train_recipe(&cd, &out, &bnpo, &["--overwrite"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::metric_rows(&out).len(), 3);
    let o = train_recipe(
        &cd,
        &out,
        &[&bnpo[..], &["reward.overlong={max_len = 8, cache_len = 4}"]].concat(),
        &[],
    );
    assert!(
        stderr(&o).contains("decompose = true with reward.overlong"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&out).ok();
    std::fs::remove_file(&cd).ok();
}

fn fails_with(task: Option<&str>, extra: &[&str], needles: &[&str]) {
    let out = tmp("bad");
    let o = match task {
        Some(t) => train_recipe(&variant(&out, t), &out, extra, &[]),
        None => train(&out, extra, &[]),
    };
    let e = stderr(&o);
    assert!(!o.status.success(), "{extra:?} should fail");
    for n in needles {
        assert!(e.contains(n), "{extra:?}: {n:?} not in {e}");
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn bad_inputs_get_clear_errors() {
    // Finite but huge learning rates are refused before anything is written (they used to fill
    // every kept checkpoint with non-finite weights).
    for (set, says) in [
        (
            "train.lr=1e300",
            "train.lr = 1e300 must be a finite number in (0, 1]",
        ),
        (
            "warmup.lr=2",
            "warmup.lr = 2 must be a finite number in (0, 1]",
        ),
    ] {
        fails_with(None, &[set], &[says]);
    }
    fails_with(
        None,
        &["algorithm=ppo", "critic={lr=1e300}"],
        &["critic.lr = 1e300"],
    );
    // Prompt longer than the context: 7 prompt tokens + 60 new > 64 positions.
    fails_with(
        None,
        &["rollout.max_new_tokens=60"],
        &["exceeds the model's context of 64", "max_new_tokens = 60"],
    );
    // Arguments that are not UTF-8, and numbers too large for their type, are usage errors
    // (exit 2), never a panic.
    {
        use std::os::unix::ffi::OsStrExt;
        let o = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["train", &recipe(), "--set"])
            .arg(std::ffi::OsStr::from_bytes(b"train.lr=\xff"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("invalid UTF-8"), "{}", stderr(&o));
        let o = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["generate", "--model", "m", "--prompt", "p"])
            .args(["--max-new-tokens", "99999999999999999999999"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--max-new-tokens"), "{}", stderr(&o));
    }
    // Missing data file, empty dataset, text the tiny vocabulary cannot encode.
    let dir = tmp("data");
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.jsonl");
    let jsonl = |p: &Path| {
        format!(
            "kind = \"jsonl\"\neval_size = 4\npath = \"{}\"",
            p.display()
        )
    };
    fails_with(
        Some(&jsonl(&missing)),
        &[],
        &["cannot read dataset", "missing.jsonl"],
    );
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    fails_with(Some(&jsonl(&empty)), &[], &["empty.jsonl is empty"]);
    let text = dir.join("text.jsonl");
    let lines: String = (0..30)
        .map(|i| {
            format!(
                "{{\"question\": \"What is {i} plus one?\", \"answer\": \"#### {}\"}}\n",
                i + 1
            )
        })
        .collect();
    std::fs::write(&text, lines).unwrap();
    fails_with(
        Some(&jsonl(&text)),
        &[],
        &["not in the vocabulary", "[pretrained]"],
    );
    // One bad line among 300 good ones is found before the run starts (not at the step that
    // first draws it, which stopped every resumed run there), and nothing is written.
    let one_bad = dir.join("one_bad.jsonl");
    let mut lines: String = (0..300)
        .map(|i| format!("{{\"prompt\": \"{i}+1=\", \"answer\": \"{}\"}}\n", i + 1))
        .collect();
    lines += "{\"prompt\": \"7 plus 1=\", \"answer\": \"8\"}\n";
    std::fs::write(&one_bad, lines).unwrap();
    let out = tmp("one-bad");
    let o = train_recipe(&variant(&out, &jsonl(&one_bad)), &out, &[], &[]);
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("checking the task's prompts") && e.contains("7 plus 1"),
        "{e}"
    );
    assert!(!out.join("metrics.jsonl").exists());
    // Missing model file.
    let recipe_text = format!(
        "name = \"x\"\n[pretrained]\npath = \"{}\"\n[task]\neval_size = 4\n[rollout]\n\
         prompts_per_step = 2\nsamples_per_prompt = 2\ntemperature = 1.0\nmax_new_tokens = 4\n\
         [train]\nsteps = 1\nlr = 1e-4\n",
        dir.join("nope.gguf").display()
    );
    let rp = dir.join("r.toml");
    std::fs::write(&rp, recipe_text).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["train", rp.to_str().unwrap(), "--quiet", "--out"])
        .arg(dir.join("run"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nope.gguf"), "{}", stderr(&o));
    // A missing recipe, and `--resume` with nothing to resume.
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["train", "no-such-recipe.toml"])
        .output()
        .unwrap();
    assert!(stderr(&o).contains("no-such-recipe.toml"), "{}", stderr(&o));
    let o = train(&dir.join("fresh"), &[], &["--resume"]);
    assert!(stderr(&o).contains("no checkpoint"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

/// The SmolLM2 LoRA recipe at a micro budget: stop after one step, resume, and match the
/// uninterrupted run (the checkpoint holds only the adapters and their AdamW state); the final
/// adapter is written in PEFT layout and `ember eval` reproduces the last evaluation.
#[test]
fn lora_policy_checkpoints_and_resumes() {
    lora_resume("lora", &[], &["model.bpk"], &|_| {});
}

/// `targets = "plop"`: the run scores the model on its prompts, keeps the choice in plop.json
/// (the three lowest of `ember plop`'s scores, which it also prints), puts the adapters there
/// (the PEFT config names them), resumes and evaluates with it; a damaged plop.json is named.
#[test]
fn lora_plop_placement_checkpoints_and_resumes() {
    lora_resume(
        "lora-plop",
        &["pretrained.lora.targets=\"plop\""],
        &["model.bpk"],
        &|run: &Path| {
            let choice: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(run.join("plop.json")).unwrap())
                    .unwrap();
            let targets: Vec<String> = choice["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
            assert_eq!(targets.len(), 3);
            let scores = choice["scores"].as_object().unwrap();
            assert_eq!(scores.len(), 7);
            let mut by: Vec<(f64, &String)> = scores
                .iter()
                .map(|(k, v)| (v.as_f64().unwrap(), k))
                .collect();
            assert!(by.iter().all(|(x, _)| x.is_finite() && *x > 0.0));
            by.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut lowest: Vec<&String> = by[..3].iter().map(|(_, k)| *k).collect();
            lowest.sort();
            let mut sorted = targets.clone();
            sorted.sort();
            assert_eq!(lowest, sorted.iter().collect::<Vec<_>>());
            let peft: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(run.join("final/adapter_config.json")).unwrap(),
            )
            .unwrap();
            let mut modules: Vec<String> = peft["target_modules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
            modules.sort();
            assert_eq!(modules, sorted);
            // A damaged choice is refused with the file's name.
            std::fs::write(
                run.join("plop.json"),
                choice.to_string().replace(&targets[0], "w_proj"),
            )
            .unwrap();
            let o = Command::new(env!("CARGO_BIN_EXE_ember"))
                .arg("eval")
                .arg(run)
                .output()
                .unwrap();
            assert!(!o.status.success());
            assert!(stderr(&o).contains("plop.json"), "{}", stderr(&o));
            // A new run in the directory scores again; it never takes an earlier run's file.
            let o = Command::new(env!("CARGO_BIN_EXE_ember"))
                .args([
                    "train",
                    &root()
                        .join("recipes/smollm2-lora-grpo.toml")
                        .to_string_lossy(),
                ])
                .args(["--quiet", "--overwrite", "--out"])
                .arg(run)
                .args([
                    "--set",
                    &format!(
                        "pretrained.path=\"{}\"",
                        common::assets::smollm2().unwrap().display()
                    ),
                ])
                .args([
                    "--set",
                    "pretrained.lora.targets=\"plop\"",
                    "--set",
                    "train.steps=1",
                ])
                .args([
                    "--set",
                    "task.eval_size=2",
                    "--set",
                    "rollout.prompts_per_step=2",
                ])
                .args([
                    "--set",
                    "rollout.samples_per_prompt=2",
                    "--set",
                    "rollout.max_new_tokens=4",
                ])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", stderr(&o));
            let again: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(run.join("plop.json")).unwrap())
                    .unwrap();
            assert_eq!(again["targets"], choice["targets"]);
        },
    );
}

/// The same with PPO + PACT: the critic (a copy of the policy with its own adapters and a value
/// head) is checkpointed as adapters and head only, and the resumed run matches.
#[test]
fn lora_critic_checkpoints_and_resumes() {
    lora_resume(
        "lora-ppo",
        &["algorithm=\"ppo-pact\""],
        &["model.bpk", "critic.bpk"],
        &|_| {},
    );
}

fn lora_resume(tag: &str, extra: &[&str], small: &[&str], check: &dyn Fn(&Path)) {
    let Some(gguf) = common::assets::smollm2() else {
        return;
    };
    let recipe: String = root()
        .join("recipes/smollm2-lora-grpo.toml")
        .to_string_lossy()
        .into();
    let path = format!("pretrained.path=\"{}\"", gguf.display());
    let sets = [
        path.as_str(),
        "train.steps=2",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=4",
        "task.eval_size=3",
        "train.eval_every=1",
        "pretrained.lora.targets=[\"q_proj\", \"v_proj\"]",
    ];
    let run = |out: &Path, flags: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
        c.args(["train", &recipe, "--quiet", "--out"]).arg(out);
        for s in sets.iter().chain(extra) {
            c.args(["--set", s]);
        }
        c.args(flags).output().unwrap()
    };
    let (a, b) = (tmp(&format!("{tag}-a")), tmp(&format!("{tag}-b")));
    let o = run(&a, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&b, &["--stop-after", "1"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = run(&b, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (ra, rb) = (common::metric_rows(&a), common::metric_rows(&b));
    assert_eq!(ra.len(), 3);
    assert_eq!(
        ra, rb,
        "resumed LoRA metrics differ from the uninterrupted run"
    );
    // Adapters only: far smaller than the 135M-parameter model.
    for f in small {
        let size = std::fs::metadata(b.join("checkpoints/step-00000002").join(f))
            .unwrap()
            .len();
        // The whole model would be 540 MB; rank-8 adapters on three projection types of 30
        // layers (and their Adam moments in optim.bpk) are a few MB.
        assert!(
            size < 16_000_000,
            "{f} of {size} bytes holds more than adapters"
        );
    }
    assert!(b.join("final/adapter_model.safetensors").exists());
    eval_matches_last(&b, &ra);
    check(&b);
    std::fs::remove_dir_all(&a).ok();
    std::fs::remove_dir_all(&b).ok();
}

/// Static shapes: with `rollout.shape_bucket = 16` prompts and responses are padded to
/// multiples of 16 before rescoring and training; the first step's metrics (rewards,
/// advantages, losses, KL, clip fraction: all taken before the optimizer step) equal those of
/// the unpadded run. The evaluation after the step is left out: Adam turns float-rounding
/// differences of near-zero gradients into visible parameter differences.
#[test]
fn shape_buckets_leave_the_step_unchanged() {
    let (a, b) = (tmp("bucket-0"), tmp("bucket-16"));
    let sets = [
        "train.steps=1",
        "train.checkpoint_every=0",
        "train.epochs=1",
        "train.mini_batches=1",
    ];
    let o = train(&a, &sets, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = train(&b, &[&sets[..], &["rollout.shape_bucket=16"]].concat(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (ra, rb) = (common::metric_rows(&a), common::metric_rows(&b));
    assert_eq!(ra.len(), 2);
    for (k, v) in ra[1].iter().filter(|(k, _)| *k != "eval/accuracy") {
        let (x, y) = (v.as_f64().unwrap(), rb[1][k].as_f64().unwrap());
        assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{k}: {x} vs {y}");
    }
    std::fs::remove_dir_all(&a).ok();
    std::fs::remove_dir_all(&b).ok();
}

/// The micro Llama of the padding tests, seeded.
fn micro_llama(seed: u64) -> ember_llm::Llama {
    let device = common::dev();
    device.seed(seed);
    ember_llm::LlamaConfig::new(ember_llm::Family::Llama, 20, 16, 32, 2, 4, 2)
        .with_max_position_embeddings(64)
        .init(&device)
}

/// Largest absolute difference of two equal-length slices.
fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `SamplingConfig::prompt_bucket`: the prompt batch is left-padded to a bucket multiple
/// (the prefill shape), and the sampled tokens and their log-probs are those of the unpadded
/// batch.
#[test]
fn prompt_bucket_leaves_sampling_unchanged() {
    use ember_llm::{SamplingConfig, generate};
    let device = common::dev();
    let model = micro_llama(3);
    let prompts = vec![vec![1u32, 4, 6, 8, 3], vec![1, 9]];
    let cfg = SamplingConfig {
        temperature: 1.0,
        max_new_tokens: 6,
        n: 2,
        seed: 9,
        ..SamplingConfig::default()
    };
    let g = generate(&model, &prompts, &cfg, &device).unwrap();
    let bucketed = SamplingConfig {
        prompt_bucket: 16,
        ..cfg
    };
    let p = generate(&model, &prompts, &bucketed, &device).unwrap();
    assert_eq!(g.prompt_tokens.dims()[1], 5);
    assert_eq!(p.prompt_tokens.dims()[1], 16);
    assert_eq!(p.response_ids(), g.response_ids());
    let d = max_abs_diff(&common::vals(g.log_probs), &common::vals(p.log_probs));
    assert!(d < 1e-4, "log-probs differ by {d}");
}

/// `Generation::padded`: bucket-multiple shapes, and the log-probs of the real response tokens
/// under rescoring are those of the unpadded sequences.
#[test]
fn padded_generation_rescores_identically() {
    use ember_llm::actor::LlmExperience;
    use ember_llm::{SamplingConfig, generate};
    let device = common::dev();
    let model = micro_llama(2);
    let prompts = vec![vec![1u32, 4, 6, 8, 3], vec![1, 9]];
    let cfg = SamplingConfig {
        temperature: 1.0,
        max_new_tokens: 7,
        n: 2,
        seed: 5,
        stop_tokens: vec![2],
        ..SamplingConfig::default()
    };
    let g = generate(&model, &prompts, &cfg, &device).unwrap();
    let p = g.clone().padded(16);
    assert_eq!(p.prompt_tokens.dims()[1] % 16, 0);
    assert_eq!(p.tokens.dims()[1], 16);
    assert_eq!(p.response_ids(), g.response_ids());
    let score = |g: &ember_llm::Generation| {
        let (tokens, mask) = g.sequences();
        LlmExperience {
            tokens,
            mask,
            response_len: g.tokens.dims()[1],
            temperature: 1.0,
            adapters: true,
        }
        .score_all(&model)
    };
    let n = g.tokens.dims()[1];
    let rows = g.tokens.dims()[0];
    let want = common::vals(score(&g) * g.mask.clone());
    let got = common::vals((score(&p) * p.mask.clone()).slice([0..rows, 0..n]));
    let d = max_abs_diff(&want, &got);
    assert!(d < 1e-5, "{d}");
    let sampler = common::vals(g.log_probs.clone());
    let d = max_abs_diff(&want, &sampler);
    assert!(d < 1e-4, "rescoring vs sampler {d}");
}

/// `ember warmup`: every bucketed prompt width and response width of the recipe, each pass
/// timed by phase, the report written as JSON; bad options and image recipes are refused.
#[test]
fn warmup_runs_the_recipe_shapes() {
    let d = tmp("warmup");
    std::fs::create_dir_all(&d).unwrap();
    let json = d.join("warmup.json");
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["warmup", &recipe(), "--quiet", "--passes", "2", "--json"])
        .arg(&json)
        .args([
            "--set",
            "rollout.shape_bucket=8",
            "--set",
            "rollout.prompts_per_step=4",
        ])
        .args([
            "--set",
            "rollout.max_new_tokens=12",
            "--set",
            "task.eval_size=8",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["rollout_rows"], 4 * 8);
    // Responses of up to 12 tokens in buckets of 8: widths 8 and 16.
    assert_eq!(r["response_widths"], serde_json::json!([8, 16]));
    let widths = r["prompt_widths"].as_array().unwrap();
    assert!(!widths.is_empty());
    assert!(
        widths.iter().all(|w| w.as_u64().unwrap() % 8 == 0),
        "{widths:?}"
    );
    let passes = r["passes"].as_array().unwrap();
    assert_eq!(passes.len(), 2);
    for p in passes {
        for k in ["generate_s", "train_s", "eval_s"] {
            assert!(p[k].as_f64().unwrap() > 0.0, "{k} in {p}");
        }
        let parts: f64 = ["generate_s", "rescore_s", "train_s", "eval_s"]
            .iter()
            .map(|k| p[*k].as_f64().unwrap())
            .sum();
        assert!(p["total_s"].as_f64().unwrap() >= parts * 0.999);
    }
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["warmup", &recipe(), "--passes", "0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--passes must be at least 1"),
        "{}",
        stderr(&o)
    );
    // The presets with extra passes (a critic, PACT's rescoring, BASIS's prompt features) and
    // replay warm up too; replay's extra row counts are named in the notes.
    for alg in ["ppo-pact", "basis", "rerule"] {
        let o = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["warmup", &recipe(), "--quiet", "--passes", "1", "--json"])
            .arg(&json)
            .args(["--set", &format!("algorithm={alg}")])
            .args([
                "--set",
                "rollout.prompts_per_step=4",
                "--set",
                "task.eval_size=8",
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{alg}: {}", stderr(&o));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let notes = r["notes"].to_string();
        assert_eq!(
            notes.contains("replayed groups"),
            alg == "rerule",
            "{notes}"
        );
    }
    let flow = format!("{}/recipes/digits-flow.toml", env!("CARGO_MANIFEST_DIR"));
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["warmup", &flow])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("covers LLM recipes"), "{}", stderr(&o));
    std::fs::remove_dir_all(&d).ok();
}

/// A second stop signal exits at once and kills the reward program: here one that never
/// answers and would otherwise outlive the run (it ignores end-of-input while it sleeps).
#[cfg(unix)]
#[test]
fn a_second_signal_kills_the_reward_program() {
    let out = tmp("sig-twice");
    let pid_file = out.with_extension("pid");
    let _ = std::fs::remove_file(&pid_file);
    let program = format!(
        "import os, sys, time\nfor line in sys.stdin:\n    open({:?}, 'w').write(str(os.getpid()))\n    time.sleep(600)\n",
        pid_file.to_string_lossy()
    );
    let external =
        format!("reward.external={{command=[\"python3\", \"-c\", {program:?}], timeout_s=1000}}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["train", &recipe(), "--quiet", "--out"])
        .arg(&out)
        .args(["--set", "warmup.steps=10", "--set", "task.eval_size=10"])
        .args(["--set", &external])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&pid_file)
            && let Ok(p) = p.trim().parse::<u32>()
        {
            break p;
        }
        assert!(
            t0.elapsed().as_secs() < 120,
            "the reward program never got a request"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let kill = |sig: &str| {
        let st = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    };
    kill("-TERM");
    std::thread::sleep(std::time::Duration::from_millis(300));
    kill("-TERM");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    // Gone (or a zombie about to be reaped by init) within a few seconds.
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    let t1 = std::time::Instant::now();
    while alive() && t1.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!alive(), "the reward program {pid} outlived the run");
    std::fs::remove_dir_all(&out).ok();
    let _ = std::fs::remove_file(&pid_file);
}

/// Reinforce-Ada (`algorithm = "reinforce-ada"`): every step draws at least one round of 8
/// responses per prompt, at most 4 rounds; the batch keeps `samples_per_prompt` = 4 of each
/// prompt (fewer only for a prompt that never got a mixed pool); `rollout.reinforce_ada`
/// enables it under another preset with its own settings; bad settings are named; a stopped
/// run resumes exactly.
#[test]
fn reinforce_ada_draws_in_rounds_and_keeps_n() {
    let out = tmp("ada");
    let o = train(&out, &["algorithm=reinforce-ada"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&out);
    let rl: Vec<_> = r
        .iter()
        .filter(|x| x.contains_key("rollout/ada_rounds"))
        .collect();
    assert_eq!(rl.len(), 6);
    for x in &rl {
        let rounds = x["rollout/ada_rounds"].as_f64().unwrap();
        let drawn = x["rollout/ada_samples_drawn"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&rounds), "{rounds}");
        assert!(drawn >= 64.0 && drawn <= 64.0 * rounds, "{drawn}");
        assert!(x["rollout/tokens_drawn"].as_f64().unwrap() >= drawn);
    }
    // Stopped after step 3 and resumed, the run retraces the uninterrupted one.
    let part = tmp("ada-part");
    let o = train(&part, &["algorithm=reinforce-ada"], &["--stop-after", "3"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = train(&part, &["algorithm=reinforce-ada"], &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::metric_rows(&part), r);
    let pf = tmp("ada-pf");
    let o = train(
        &pf,
        &["rollout.reinforce_ada={mode=\"positive_focused\", max_rounds=2, round_repeat=3}"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&pf);
    for x in r.iter().filter(|x| x.contains_key("rollout/ada_rounds")) {
        assert!(x["rollout/ada_rounds"].as_f64().unwrap() <= 2.0);
        assert!(x["rollout/ada_samples_drawn"].as_f64().unwrap() <= 48.0);
    }
    let bad = train(
        &tmp("ada-bad"),
        &["rollout.reinforce_ada={max_rounds=0}"],
        &[],
    );
    assert!(
        stderr(&bad).contains("reinforce_ada.max_rounds"),
        "{}",
        stderr(&bad)
    );
    let bad = train(
        &tmp("ada-dapo"),
        &["algorithm=dapo", "rollout.reinforce_ada={}"],
        &[],
    );
    assert!(
        stderr(&bad).contains("use one of the two"),
        "{}",
        stderr(&bad)
    );
}

/// PPO with a learned critic: the critic's metrics are logged, its weights and optimizer are in
/// every checkpoint, a run stopped at step 3 resumes to the same metrics (PACT's weights
/// included), and critic settings that do not fit the algorithm are refused by name.
#[test]
fn ppo_critic_logs_checkpoints_and_resumes() {
    let out = tmp("ppo");
    let args = [
        "algorithm=ppo-pact",
        "critic={lr=3e-3, warmup_steps=1}",
        FULL_WARMUP,
    ];
    let o = train(&out, &args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&out);
    let steps: Vec<_> = r
        .iter()
        .filter(|x| x.contains_key("critic/vf_loss"))
        .collect();
    assert_eq!(steps.len(), 6);
    for x in &steps {
        for k in [
            "critic/vf_explained_var",
            "critic/vf_clipfrac",
            "critic/pact_weight_mean",
            "critic/grad_norm",
        ] {
            assert!(x[k].as_f64().unwrap().is_finite(), "{k}");
        }
        assert_eq!(x["critic/lr"].as_f64(), Some(3e-3));
    }
    // The critic-only warm-up step leaves the actor alone.
    assert!(!steps[0].contains_key("actor/pg_loss"));
    assert!(steps[1].contains_key("actor/pg_loss"));
    // Values start at the zero head and move once the returns do (the sign of the last step's
    // mean depends on the trajectory: the critic may overshoot returns near 0).
    assert_eq!(steps[0]["critic/values_mean"].as_f64(), Some(0.0));
    assert!(steps[5]["critic/values_mean"].as_f64().unwrap().abs() > 1e-3);
    let ckpt = out.join("checkpoints/step-00000006");
    for f in ["critic.bpk", "critic_optim.bpk", "model.bpk"] {
        assert!(ckpt.join(f).is_file(), "{f}");
    }
    let part = tmp("ppo-part");
    let o = train(&part, &args, &["--stop-after", "3"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = train(&part, &args, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::metric_rows(&part), r);
    fails_with(
        None,
        &["critic={lr=1e-3}"],
        &["[critic] applies to", "\"grpo\""],
    );
    fails_with(
        None,
        &["advantage={kind=\"gae\"}"],
        &["needs a critic's values", "\"ppo\""],
    );
    fails_with(
        None,
        &["algorithm=ppo", "advantage={kind=\"rloo\"}"],
        &["must stay \"gae\""],
    );
    fails_with(
        None,
        &["algorithm=ppo", "critic={value_clip=-1}"],
        &["critic.value_clip"],
    );
    fails_with(
        None,
        &["algorithm=ppo", "critic={warmup_steps=6}"],
        &["critic.warmup_steps = 6 leaves no step"],
    );
    for d in [out, part] {
        std::fs::remove_dir_all(d).ok();
    }
}

/// ReRULE-style replay: hard groups of the first half are stored, replayed later beside the
/// fresh rows with importance weights against their stored log-probs, the buffer is in every
/// checkpoint, and a run stopped at step 3 resumes to the same metrics.
#[test]
fn rerule_replays_stored_groups_and_resumes() {
    let out = tmp("rerule");
    // 6 steps: admission on steps 1–3, replay on steps 3–6 (from 0.25 × 6 = 1.5 steps done),
    // 0.5 × 8 prompts = 4 groups a step.
    // Replay admits groups whose rewards differ: 400 warm-up steps, since after 200 the tiny
    // model answers nothing right on some CPUs (where the warm-up ends depends on the GEMM
    // kernels: on an AVX2-only machine, held-out accuracy 0.0 after 200 steps, 0.1 after 400).
    let args = [
        "algorithm=rerule",
        "replay={ratio=0.5, max_mean_reward=0.9, capacity=6}",
        "warmup.steps=400",
    ];
    let o = train(&out, &args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&out);
    let steps: Vec<_> = r
        .iter()
        .filter(|x| x.contains_key("replay/admitted"))
        .collect();
    assert_eq!(steps.len(), 6);
    let get = |x: &serde_json::Map<String, serde_json::Value>, k: &str| x[k].as_f64().unwrap();
    assert_eq!(get(steps[0], "replay/replayed_groups"), 0.0);
    assert!(steps[..3].iter().any(|x| get(x, "replay/admitted") > 0.0));
    assert!(steps[3..].iter().all(|x| get(x, "replay/admitted") == 0.0));
    assert!(steps.iter().all(|x| get(x, "replay/buffer_groups") <= 6.0));
    let replayed: f64 = steps.iter().map(|x| get(x, "replay/replayed_groups")).sum();
    assert!(replayed > 0.0);
    for x in steps
        .iter()
        .filter(|x| get(x, "replay/replayed_groups") > 0.0)
    {
        assert!(get(x, "replay/mean_age") >= 1.0);
        assert!(get(x, "mismatch/is_weight_mean").is_finite());
    }
    let ckpt = out.join("checkpoints/step-00000006/replay.json");
    let buffer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ckpt).unwrap()).unwrap();
    assert!(buffer["admitted"].as_u64().unwrap() > 0);
    let part = tmp("rerule-part");
    let o = train(&part, &args, &["--stop-after", "3"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = train(&part, &args, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::metric_rows(&part), r);
    // A damaged buffer file is named, not a panic.
    let part2 = tmp("rerule-bad");
    let o = train(&part2, &args, &["--stop-after", "4"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let bad = part2.join("checkpoints/step-00000004/replay.json");
    std::fs::write(&bad, r#"{"entries":[{"step":1,"replays":0,"group":{"prompt":[1],"responses":[[2]],"log_probs":[[]],"rewards":[1.0],"truncated":[false]}}],"admitted":1,"evicted":0}"#).unwrap();
    let o = train(&part2, &args, &["--resume"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("replay.json is damaged"), "{e}");
    // A buffer written bad (its manifest agreeing) is named by the buffer's own check.
    ember_train::manifest::write(&part2.join("checkpoints/step-00000004")).unwrap();
    let o = train(&part2, &args, &["--resume"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("replay.json: group 0: a response without tokens"),
        "{e}"
    );
    fails_with(None, &["algorithm=remax", "replay={}"], &["ReMax"]);
    fails_with(None, &["replay={admit_until=2}"], &["replay.admit_until"]);
    fails_with(
        None,
        &["algorithm=rerule", "rollout.samples_per_prompt=1"],
        &["must be >= 2"],
    );
    fails_with(
        None,
        &[
            "algorithm=dapo",
            "advantage={kind=\"basis\"}",
            "rollout.samples_per_prompt=1",
        ],
        &["dynamic sampling"],
    );
    for d in [out, part, part2] {
        std::fs::remove_dir_all(d).ok();
    }
}

/// BASIS trains with one response per prompt and logs its baseline; `ember value-mse` reports
/// every estimator's error against the Monte-Carlo values.
#[test]
fn basis_single_rollout_and_value_mse() {
    let out = tmp("basis");
    let args = [
        "algorithm=basis",
        "rollout.samples_per_prompt=1",
        "rollout.prompts_per_step=16",
    ];
    let o = train(&out, &args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = common::metric_rows(&out);
    let v: Vec<f64> = r
        .iter()
        .filter_map(|x| x.get("advantage/basis_value_mean")?.as_f64())
        .collect();
    assert_eq!(v.len(), 6);
    assert!(v.iter().all(|x| (0.0..=1.0).contains(x)), "{v:?}");
    // A group estimator still needs two samples.
    fails_with(None, &["rollout.samples_per_prompt=1"], &["must be >= 2"]);
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["value-mse", &recipe(), "--prompts", "12", "--mc", "8"])
        .args(["--set", "warmup.steps=100", "--bandwidths", "0.5,2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "mse_reinforce_pp_batch_mean",
        "mse_group_mean_8",
        "mc_noise",
        "mean_value",
    ] {
        let x = j[k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&x), "{k} = {x}");
    }
    assert_eq!(j["mse_basis_by_bandwidth"].as_object().unwrap().len(), 2);
    std::fs::remove_dir_all(out).ok();
}

/// `ember rollouts` writes the warmed-up policy's own scored samples; the offline job trains on
/// them with every objective (pairwise ones see pairs, group ones groups), logs its metrics,
/// resumes exactly, and names a bad data file or an unusable one.
/// SFT on TRL's prompt-completion lines (each prompt's best rollout, no rewards): the token-mean
/// NLL falls (the last 10 of 60 steps below 0.75 of the first 10), and a stopped run resumes
/// exactly.
fn sft_on_prompt_completion_lines(dir: &Path, rollouts: &str) {
    let data = dir.join("prompt-completion.jsonl");
    let mut text = String::new();
    for line in rollouts.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let best = v["responses"]
            .as_array()
            .unwrap()
            .iter()
            .max_by(|a, b| {
                let r = |x: &serde_json::Value| x["reward"].as_f64().unwrap_or(-1.0);
                r(a).total_cmp(&r(b))
            })
            .unwrap();
        let row = serde_json::json!({"prompt": v["prompt"], "completion": best["response"]});
        text += &format!("{row}\n");
    }
    std::fs::write(&data, text).unwrap();
    let out = dir.join("sft");
    let offline = format!(
        "offline={{data=\"{}\", objective={{kind=\"sft\"}}, batch=4}}",
        data.display()
    );
    let o = train(
        &out,
        &[
            &offline,
            "train.kl_coef=0",
            "warmup.steps=20",
            "train.steps=60",
            "train.eval_every=60",
            "train.checkpoint_every=60",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let loss: Vec<f64> = common::metric_rows(&out)
        .iter()
        .filter_map(|r| r.get("offline/loss").and_then(|x| x.as_f64()))
        .collect();
    assert_eq!(loss.len(), 60);
    let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    let (first, last) = (mean(&loss[..10]), mean(&loss[50..]));
    assert!(last < 0.75 * first, "NLL {first} -> {last}");
    // Stopped after 3 of 6 steps and resumed: the same metrics as the uninterrupted run.
    let args = [offline.as_str(), "train.kl_coef=0", "warmup.steps=20"];
    resumes_exactly(&dir.join("sft-a"), &dir.join("sft-b"), &args);
}

/// A file of one scored response per prompt (each prompt's first rollout): the objectives whose
/// baseline is the step's (TOPR, and REC, OPMD, AsymRE with `pool = "batch"`) or A-LoL's
/// fitted value head train on it; A-LoL's and REC's group baselines are refused by name.
fn one_response_per_prompt(dir: &Path, rollouts: &str) {
    let data = dir.join("one-each.jsonl");
    let mut text = String::new();
    for line in rollouts.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let first = &v["responses"][0];
        let row = serde_json::json!({"prompt": v["prompt"], "response": first["response"],
            "reward": first["reward"]});
        text += &format!("{row}\n");
    }
    std::fs::write(&data, text).unwrap();
    let set = |obj: &str| {
        format!(
            "offline={{data=\"{}\", objective={obj}, batch=4}}",
            data.display()
        )
    };
    for obj in [
        "{kind=\"topr\", baseline={constant=0.5}}",
        "{kind=\"rec\", pool=\"batch\"}",
        "{kind=\"asym_re\", pool=\"batch\"}",
        "{kind=\"a_lol\", value=\"head\"}",
    ] {
        let out = dir.join(format!("one-{}", obj.len()));
        let o = train(
            &out,
            &[&set(obj), "train.kl_coef=0", "warmup.steps=20"],
            &[],
        );
        assert!(o.status.success(), "{obj}: {}", stderr(&o));
        let r = common::metric_rows(&out);
        let n = r.iter().filter(|x| x.contains_key("offline/loss")).count();
        assert_eq!(n, 6, "{obj}");
    }
    for obj in ["{kind=\"a_lol\"}", "{kind=\"rec\"}"] {
        let out = dir.join(format!("one-refused-{}", obj.len()));
        let o = train(&out, &[&set(obj), "train.kl_coef=0", "warmup.steps=2"], &[]);
        assert!(!o.status.success(), "{obj}");
        let e = stderr(&o);
        assert!(
            e.contains("no prompt has two responses with valid rewards"),
            "{obj}: {e}"
        );
    }
}

/// A run stopped after 3 steps and resumed ends with the uninterrupted run's metrics.
fn resumes_exactly(a: &Path, b: &Path, args: &[&str]) {
    assert!(train(a, args, &[]).status.success());
    assert_eq!(
        train(b, args, &["--stop-after", "3"]).status.code(),
        Some(130)
    );
    let o = train(b, args, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(common::metric_rows(a), common::metric_rows(b));
}

#[test]
fn offline_objectives_train_on_rollouts_and_resume() {
    let dir = tmp("offline");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("sub/data.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["rollouts", &recipe(), "--prompts", "24", "--out"])
        .arg(&data)
        .args([
            "--set",
            FULL_WARMUP,
            "--set",
            "rollout.samples_per_prompt=4",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["responses"], 96);
    let lines = std::fs::read_to_string(&data).unwrap();
    assert_eq!(lines.lines().count(), 24);
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert!(first["prompt"].as_str().unwrap().ends_with('='));
    assert_eq!(first["responses"].as_array().unwrap().len(), 4);
    let offline = |obj: &str| {
        format!(
            "offline={{data=\"{}\", objective={obj}, batch=4}}",
            data.display()
        )
    };
    for (obj, key) in [
        ("{kind=\"dpo\"}", "preference/accuracy"),
        ("{kind=\"ipo\"}", "preference/margin"),
        ("{kind=\"simpo\"}", "preference/loss"),
        ("{kind=\"rpo_sq\"}", "preference/loss"),
        ("{kind=\"rpo_bwd_kl\"}", "preference/loss"),
        ("{kind=\"rpo_fwd_kl\"}", "preference/margin"),
        ("{kind=\"a_lol\"}", "actor/is_weight_mean"),
        ("{kind=\"a_lol_seq\"}", "actor/is_weight_mean"),
        ("{kind=\"a_lol_kl\"}", "actor/alol_kl"),
        ("{kind=\"reinforce_loo\"}", "actor/pg_loss"),
        ("{kind=\"sft\"}", "actor/pg_loss"),
        ("{kind=\"topr\"}", "actor/topr_tapered_frac"),
        ("{kind=\"rec\", importance_sampling=true}", "actor/clipfrac"),
        ("{kind=\"opmd\", k2_coef=0.1}", "actor/pg_loss"),
        ("{kind=\"asym_re\"}", "actor/pg_loss"),
    ] {
        let out = dir.join(format!(
            "run-{}",
            key.replace('/', "-") + &obj.len().to_string()
        ));
        // Each objective's metrics are checked, not its learning: a short warm-up will do.
        let o = train(
            &out,
            &[&offline(obj), "train.kl_coef=0", "warmup.steps=20"],
            &[],
        );
        assert!(o.status.success(), "{obj}: {}", stderr(&o));
        let r = common::metric_rows(&out);
        let steps: Vec<_> = r
            .iter()
            .filter(|x| x.contains_key("offline/loss"))
            .collect();
        assert_eq!(steps.len(), 6, "{obj}");
        assert!(
            steps.iter().all(|x| x[key].as_f64().unwrap().is_finite()),
            "{obj}: {key}"
        );
        assert!(out.join("final").exists());
    }
    sft_on_prompt_completion_lines(&dir, &lines);
    one_response_per_prompt(&dir, &lines);
    // Stopped after 3 steps and resumed: the same metrics as the uninterrupted run.
    let (a, b) = (dir.join("a"), dir.join("b"));
    let args = [
        offline("{kind=\"dpo\", beta=0.2}"),
        "train.kl_coef=0".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    resumes_exactly(&a, &b, &args);
    // RPO's ablations: the first k responses per prompt, and all pairs. summary.json counts
    // what a step draws from, as computed here from the file.
    let (mut pairs2, mut best_worst, mut all_pairs) = (0, 0, 0);
    for line in lines.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let all: Vec<Option<f64>> = v["responses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["reward"].as_f64())
            .collect();
        let first = |k: usize| -> Vec<f64> { all.iter().take(k).flatten().copied().collect() };
        let differ = |k: usize| first(k).windows(2).any(|w| w[0] != w[1]);
        pairs2 += usize::from(differ(2));
        best_worst += usize::from(differ(4));
        let r = first(4);
        all_pairs += r
            .iter()
            .map(|a| r.iter().filter(|&&b| *a > b).count())
            .sum::<usize>();
    }
    assert!(best_worst > 0 && all_pairs > best_worst, "{lines}");
    for (i, (extra, draws)) in [
        ("", best_worst),
        ("responses=2, ", pairs2),
        ("pairs=\"all\", ", all_pairs),
    ]
    .into_iter()
    .enumerate()
    {
        let out = dir.join(format!("ablation-{i}"));
        let set = format!(
            "offline={{data=\"{}\", objective={{kind=\"rpo_bwd_kl\"}}, {extra}batch=4}}",
            data.display()
        );
        if draws == 0 {
            fails_with(None, &[&set], &["no prompt has two responses"]);
            continue;
        }
        let o = train(&out, &[&set, "train.kl_coef=0"], &[]);
        assert!(o.status.success(), "{extra}: {}", stderr(&o));
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["draws"], draws, "{extra}");
    }
    fails_with(
        None,
        &["offline={data=\"x.jsonl\", objective={kind=\"dpo\"}, responses=1}"],
        &["offline.responses = 1 must be at least 2"],
    );
    fails_with(
        None,
        &["offline={data=\"x.jsonl\", objective={kind=\"a_lol\"}, pairs=\"all\"}"],
        &["applies to the pairwise objectives"],
    );
    // A bad line is named with its file and line; data without pairs is refused.
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"prompt\": \"1+1=\", \"response\": \"2\", \"reward\": 1}\n{oops\n",
    )
    .unwrap();
    let set = format!(
        "offline={{data=\"{}\", objective={{kind=\"dpo\"}}}}",
        bad.display()
    );
    fails_with(None, &[&set], &["bad.jsonl:2: not JSON"]);
    std::fs::write(
        &bad,
        "{\"prompt\": \"1+1=\", \"response\": \"2\", \"reward\": 1}\n",
    )
    .unwrap();
    fails_with(
        None,
        &[&set],
        &["no prompt has two responses with different rewards"],
    );
    fails_with(
        None,
        &["offline={data=\"x.jsonl\", objective={kind=\"dpo\", beta=0}}"],
        &["preference.beta"],
    );
    // scripts/fuzz_set.py, 2026-12-03: β = 2^63 − 1 trained (every pair's sigmoid saturated).
    fails_with(
        None,
        &["offline={data=\"x.jsonl\", objective={kind=\"dpo\", beta=9223372036854775807}}"],
        &["preference.beta", "must be in (0, 1e6]"],
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// One prompt with 4 200 scored responses: an A-LoL step over all of them (two draws, 8 400
/// rows) runs in micro-batches: the trainer peaks near 50 MB, where one pass over
/// every row held 0.7 GB (8.2 GB with 20 000 responses and four draws); `pairs =
/// "all"` over the same file (2 100² = 4.4 M pairs) is refused by name instead of listing them.
#[test]
fn one_prompt_with_thousands_of_responses_stays_bounded() {
    let dir = tmp("one-prompt");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("one.jsonl");
    let responses: Vec<serde_json::Value> = (0..4200)
        .map(|i| serde_json::json!({"response": format!("{}", i % 97), "reward": i % 2}))
        .collect();
    let line = serde_json::json!({"prompt": "12+34=", "responses": responses});
    std::fs::write(&data, format!("{line}\n")).unwrap();
    let set = |objective: &str| {
        format!(
            "offline={{data=\"{}\", objective={{kind=\"{objective}\"}}, batch=2}}",
            data.display()
        )
    };
    let out = dir.join("run");
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.args(["train", &recipe(), "--quiet", "--out"]).arg(&out);
    for s in SMALL
        .iter()
        .copied()
        .chain(["train.steps=1", "warmup.steps=2", "task.eval_size=4"])
        .chain([set("a_lol").as_str()])
    {
        c.args(["--set", s]);
    }
    let mut child = c.stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let hwm_kib = || -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
        l.split_whitespace().nth(1)?.parse().ok()
    };
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(hwm_kib().unwrap_or(0));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        peak > 0 && peak < 200 * 1024,
        "peak resident memory {peak} KiB"
    );
    fails_with(
        None,
        &[&set("dpo"), "offline.pairs=\"all\""],
        &["makes 4410000 pairs", "offline.responses"],
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The offline job with SmolLM2 + LoRA: the reference is the same weights with adapters off
/// (nothing extra written), DPO and A-LoL train on a three-prompt file, and the first DPO
/// step's implicit reward gap is 0 (policy = reference at the start).
#[test]
fn offline_lora_policy_uses_adapters_off_reference() {
    let Some(gguf) = common::assets::smollm2() else {
        return;
    };
    let dir = tmp("offline-lora");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("d.jsonl");
    std::fs::write(
        &data,
        concat!(
            r#"{"prompt": "What is 2 + 3?", "responses": [{"response": "5", "reward": 1}, {"response": "6", "reward": 0}]}"#,
            "\n",
            r#"{"prompt": "What is 4 + 4?", "chosen": "8", "rejected": "9"}"#,
            "\n",
            r#"{"prompt": "What is 7 + 1?", "response": "8", "reward": 1}"#,
            "\n",
            r#"{"prompt": "What is 7 + 1?", "response": "6", "reward": 0}"#,
            "\n",
        ),
    )
    .unwrap();
    let recipe: String = root()
        .join("recipes/smollm2-lora-grpo.toml")
        .to_string_lossy()
        .into();
    for obj in ["{kind=\"dpo\"}", "{kind=\"a_lol\"}"] {
        let out = dir.join(format!("run-{}", obj.len()));
        let o = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["train", &recipe, "--quiet", "--out"])
            .arg(&out)
            .args(["--set", &format!("pretrained.path=\"{}\"", gguf.display())])
            .args(["--set", "train.steps=2", "--set", "task.eval_size=2"])
            .args([
                "--set",
                "train.eval_every=2",
                "--set",
                "rollout.max_new_tokens=4",
            ])
            .args(["--set", "pretrained.lora.targets=[\"q_proj\", \"v_proj\"]"])
            .args([
                "--set",
                &format!(
                    "offline={{data=\"{}\", objective={obj}, batch=2}}",
                    data.display()
                ),
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{obj}: {}", stderr(&o));
        assert!(!out.join("reference.bpk").exists());
        assert!(out.join("final/adapter_model.safetensors").exists());
        let r = common::metric_rows(&out);
        if obj.contains("dpo") {
            let margin = r[1]["preference/margin"].as_f64().unwrap();
            assert!(margin.abs() < 1e-4, "first step's margin {margin}");
        }
        assert!(r[2]["offline/loss"].as_f64().unwrap().is_finite());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `ember plop`: the seven scores as a table (lowest first, the chosen marked) and as JSON,
/// `--count` honoured; the tiny model and a count outside 1..=7 are refused by name.
#[test]
fn plop_command_prints_scores() {
    let recipe = root().join("recipes/arithmetic-cpu.toml");
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("plop")
        .arg(&recipe)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("[pretrained]"), "{}", stderr(&o));
    let Some(gguf) = common::assets::smollm2() else {
        return;
    };
    let recipe = root().join("recipes/smollm2-lora-grpo.toml");
    let path = format!("pretrained.path=\"{}\"", gguf.display());
    let plop = |flags: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .arg("plop")
            .arg(&recipe)
            .args(["--set", &path, "--prompts", "8"])
            .args(flags)
            .output()
            .unwrap()
    };
    let o = plop(&["--json", "--count", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(c["targets"].as_array().unwrap().len(), 2);
    assert_eq!(c["prompts"], 8);
    assert_eq!(c["per_layer"].as_array().unwrap().len(), 30);
    let o = plop(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(
        table.lines().filter(|l| l.starts_with('*')).count(),
        3,
        "{table}"
    );
    assert!(table.contains("targets = ["), "{table}");
    let o = plop(&["--count", "8"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("plop_count"), "{}", stderr(&o));
}

/// LANPO with SmolLM2 + LoRA: each group is its 2 samples from scratch, then 2 feedback samples
/// whose contexts reflect on those attempts in order (Reward-Agnostic Reflection); no context
/// holds the reference answer beyond the attempt it shows; the experience pool is in the
/// checkpoint, and a run stopped after step 2 and resumed equals the uninterrupted run, pool
/// and feedback metrics included.
#[test]
fn lanpo_reflects_on_the_groups_attempts_and_resumes_with_its_pool() {
    let Some(gguf) = common::assets::smollm2() else {
        return;
    };
    let dir = tmp("lanpo");
    let recipe: String = root()
        .join("recipes/lanpo-smollm2.toml")
        .to_string_lossy()
        .into();
    let path = format!("pretrained.path=\"{}\"", gguf.display());
    let run = |out: &Path, flags: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
        c.args(["train", &recipe, "--quiet", "--out"]).arg(out);
        for s in [
            path.as_str(),
            "train.steps=3",
            "train.eval_every=3",
            "task.eval_size=2",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=6",
            "lanpo.lesson_max_tokens=8",
            "train.log_samples=8",
            "pretrained.lora.targets=[\"q_proj\", \"v_proj\"]",
        ] {
            c.args(["--set", s]);
        }
        c.args(flags).output().unwrap()
    };
    let (a, b) = (dir.join("a"), dir.join("b"));
    let o = run(&a, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&b, &["--stop-after", "2"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(b.join("checkpoints/step-00000002/lanpo_pool.json").exists());
    let o = run(&b, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (ra, rb) = (common::metric_rows(&a), common::metric_rows(&b));
    assert_eq!(ra, rb, "resumed metrics differ from the uninterrupted run");
    for (step, r) in ra.iter().enumerate().skip(1) {
        assert_eq!(r["lanpo/reflected"].as_f64(), Some(1.0), "step {step}");
        assert_eq!(r["lanpo/pool_problems"].as_f64(), Some(2.0 * step as f64));
    }
    let samples: Vec<serde_json::Value> = std::fs::read_to_string(a.join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text = |s: &serde_json::Value, k: &str| s[k].as_str().unwrap_or_default().to_string();
    let mut checked = 0;
    for group in samples.chunks(4) {
        let fb: Vec<bool> = group.iter().map(|s| s.get("feedback").is_some()).collect();
        assert_eq!(fb, [false, false, true, true]);
        let fresh = [text(&group[0], "completion"), text(&group[1], "completion")];
        for (s, attempt) in group[2..].iter().zip(&fresh) {
            let context = text(s, "feedback");
            let rest = context.replace(attempt.trim(), "");
            let answer = text(s, "answer");
            let leaked = rest
                .split(|c: char| !c.is_alphanumeric())
                .any(|w| w == answer);
            assert!(!leaked, "the answer {answer} in {context:?}");
            if fresh.iter().all(|f| !f.trim().is_empty()) {
                assert!(
                    context.contains(&format!("\n{}\n", attempt.trim())),
                    "{context:?}"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "no group had two non-empty attempts to reflect on"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// REINFORCE++ with its k1 KL in the reward (Hu 2025 eq. 4) keeps the starting policy as the
/// reference without a KL term in the loss: the run trains, the reward's KL is logged (zero at
/// the first step, where the sampler is the reference, then positive), and the loss has none.
#[test]
fn reinforce_plus_plus_takes_its_kl_in_the_reward_alone() {
    let out = tmp("rpp-kl");
    let extra = [
        "train.kl_coef=0",
        "advantage={kind=\"reinforce_plus_plus\", kl_coef=0.05}",
        FULL_WARMUP,
    ];
    let o = train(&out, &extra, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = common::metric_rows(&out);
    let kl: Vec<f64> = rows[1..]
        .iter()
        .map(|r| r["advantage/kl_in_reward"].as_f64().unwrap())
        .collect();
    assert!(kl[0].abs() < 1e-4, "{kl:?}");
    assert!(kl[1..].iter().any(|k| *k > 1e-6), "{kl:?}");
    assert!(rows.iter().all(|r| r.get("actor/kl_loss").is_none()));
    std::fs::remove_dir_all(&out).ok();
}
