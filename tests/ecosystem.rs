//! What TRL and verl users bring: TensorBoard event files read back with PyPI `tbparse`,
//! `samples.jsonl`, TRL-style Python reward functions through Ember's adapter (a two-function
//! module; the math-verify example), and a chat-format dataset.

mod common;

use ember_tasks::reward::{ExternalReward, PythonSpec, RewardItem};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-eco-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A short run of the CPU recipe.
const SMALL: [&str; 8] = [
    "warmup.steps=200",
    "train.steps=6",
    "rollout.prompts_per_step=8",
    "rollout.samples_per_prompt=4",
    "task.eval_size=40",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.warmup_steps=2",
];

fn train(out: &Path, extra: &[String], flags: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.arg("train")
        .arg(root().join("recipes/arithmetic-cpu.toml"))
        .args(["--quiet", "--out"])
        .arg(out);
    for s in SMALL
        .iter()
        .map(|s| s.to_string())
        .chain(extra.iter().cloned())
    {
        c.args(["--set", &s]);
    }
    c.args(flags).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into()
}

fn rows(p: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// TRL-signature functions (printing, as users' functions do: the adapter keeps stdout for
/// the protocol): exact-match accuracy against `answer`; a brevity term that does not
/// apply (None) to completions of 4 characters or more; one that reads the extra column
/// `level`; one that divides by zero from its third call (the third step) on the rows of the
/// step's second prompt (`group` 1).
const MODULE: &str = r#"
print("a module that prints when imported")

def accuracy(prompts, completions, answer, **kwargs):
    print("debugging output, as reward functions often print")
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def brevity(prompts, completions, **kwargs):
    return [-0.1 * len(c) if len(c) < 4 else None for c in completions]

def columns(prompts, completions, level, **kwargs):
    return [float(x) for x in level]

CALLS = [0]

def explode(prompts, completions, group, **kwargs):
    CALLS[0] += 1
    return [1.0 / (g - 1) if CALLS[0] >= 3 else 0.0 for g in group]
"#;

fn module(dir: &Path) -> String {
    let p = dir.join("rewards.py");
    std::fs::write(&p, MODULE).unwrap();
    p.to_string_lossy().into()
}

/// The adapter scores a batch: the weighted sum of the functions that apply (TRL's nansum),
/// each function's values as a component, extra columns as keyword lists.
#[test]
fn python_adapter_weighted_sum_and_components() {
    let d = tmp("adapter");
    let m = module(&d);
    let spec = PythonSpec {
        functions: vec![
            format!("{m}:accuracy"),
            format!("{m}:brevity=0.5"),
            format!("{m}:columns=2"),
        ],
        python: "python3".into(),
        timeout_s: 30.0,
    };
    let mut program = ExternalReward::spawn(&spec.external().unwrap()).unwrap();
    let cols: Vec<serde_json::Map<String, serde_json::Value>> = [1, 0, 3]
        .iter()
        .map(|l| {
            serde_json::json!({ "level": l })
                .as_object()
                .unwrap()
                .clone()
        })
        .collect();
    let (completions, answers) = (["12", "7", "12345"], ["12", "8", "12345"]);
    let items: Vec<RewardItem> = (0..3)
        .map(|i| RewardItem {
            prompt: "q",
            completion: completions[i],
            answer: answers[i],
            group: i / 2,
            columns: &cols[i],
            messages: &[],
            completion_ids: &[],
        })
        .collect();
    let s = program.score(1, &items).unwrap();
    // accuracy [1, 0, 1]; brevity [-0.2, -0.1, None] × 0.5; columns [1, 0, 3] × 2.
    let want = [1.0 - 0.1 + 2.0, 0.0 - 0.05 + 0.0, 1.0 + 6.0];
    for (g, w) in s.rewards.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{:?} vs {want:?}", s.rewards);
    }
    let names: Vec<&str> = s.components.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["accuracy", "brevity", "columns"]);
    let brevity = &s.components[1].1;
    assert!(
        (brevity[0] + 0.2).abs() < 1e-6 && brevity[2].is_nan(),
        "{brevity:?}"
    );
}

/// What users' reward code does that must not break the protocol: printing through a
/// subprocess (the real stdout), two files of the same name in different folders, a weighted
/// sum that overflows (an invalid sample, not a crash).
#[test]
fn python_adapter_survives_ordinary_user_code() {
    let d = tmp("adapter-user-code");
    for (sub, value) in [("a", "1.0"), ("b", "2.0")] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
        std::fs::write(
            d.join(sub).join("rewards.py"),
            format!(
                "import subprocess\n\
                 def f_{sub}(prompts, completions, **kw):\n\
                 \x20   subprocess.run(['echo', 'checking from {sub}'])\n\
                 \x20   return [{value} if c != 'huge' else 1e308 for c in completions]\n"
            ),
        )
        .unwrap();
    }
    let f = |sub: &str| format!("{}:f_{sub}", d.join(sub).join("rewards.py").display());
    let spec = PythonSpec {
        functions: vec![f("a"), f("b")],
        python: "python3".into(),
        timeout_s: 30.0,
    };
    let mut program = ExternalReward::spawn_python(&spec).unwrap();
    let none = serde_json::Map::new();
    let items: Vec<RewardItem> = ["x", "huge"]
        .iter()
        .map(|c| RewardItem {
            prompt: "q",
            completion: c,
            answer: "1",
            group: 0,
            columns: &none,
            messages: &[],
            completion_ids: &[],
        })
        .collect();
    let s = program.score(1, &items).unwrap();
    assert_eq!(s.rewards[0], 3.0);
    assert!(s.rewards[1].is_nan(), "1e308 + 1e308 overflows: invalid");
    assert_eq!(s.components.len(), 2);
}

/// A bad function spec is refused with the reason, before any step.
#[test]
fn python_adapter_refuses_a_missing_function() {
    let d = tmp("adapter-missing");
    let m = module(&d);
    let o = train(
        &d.join("run"),
        &[format!("reward.python.functions=[\"{m}:nope\"]")],
        &[],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("has no function 'nope'"), "{e}");
    // Before any work (no warm-up, no metrics), and named without the adapter's source.
    assert!(!d.join("run/metrics.jsonl").exists());
    assert!(
        e.contains("ember_reward.py") && !e.contains("import hashlib"),
        "{e}"
    );
}

/// A run with Python rewards logs each function as `reward/<name>`; with correctness off the
/// step's reward mean is the weighted sum of the function means. Its TensorBoard event file,
/// read back with `tbparse` after a stop and a resume, holds every metric of `metrics.jsonl` at
/// the same steps, once each, and the sampled completions at the evaluation steps.
#[test]
fn python_rewards_and_tensorboard_through_a_resume() {
    let d = tmp("tb");
    let m = module(&d);
    let out = d.join("run");
    let extra = vec![
        "reward.correct=0".to_string(),
        format!("reward.python.functions=[\"{m}:accuracy\", \"{m}:brevity=0.5\"]"),
        "eval.samples=4".to_string(),
    ];
    let o = train(&out, &extra, &["--stop-after", "3"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = train(&out, &extra, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let metrics = rows(&out.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 7, "step 0 and six steps");
    for r in &metrics[1..] {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let (acc, brev, mean) = (
            f("reward/accuracy"),
            f("reward/brevity"),
            f("rollout/reward_mean"),
        );
        assert!(acc.is_finite() && brev <= 0.0, "{r:?}");
        // brevity is None for long completions, so the mean is over the rows it applies to;
        // arithmetic answers here are under 4 characters, so it applies to every row.
        assert!((mean - (acc + 0.5 * brev)).abs() < 1e-5, "{r:?}");
        assert!(f("actor/grad_norm") >= 0.0, "{r:?}");
    }
    assert!(
        metrics[1..]
            .iter()
            .any(|r| r["actor/grad_norm"].as_f64() > Some(0.0))
    );
    // Sampled evaluation at steps 2, 4, 6: pass@1 is mean@4 (unbiased), pass@k grows with k.
    for r in metrics
        .iter()
        .filter(|r| r.contains_key("eval/accuracy"))
        .skip(1)
    {
        let f = |k: &str| r[k].as_f64().unwrap();
        assert!((f("eval/pass@1") - f("eval/mean@4")).abs() < 1e-12, "{r:?}");
        assert!(f("eval/pass@1") <= f("eval/pass@2") && f("eval/pass@2") <= f("eval/pass@4"));
    }
    assert_eq!(
        metrics
            .iter()
            .filter(|r| r.contains_key("eval/pass@4"))
            .count(),
        3
    );
    // samples.jsonl: four rows a step, one per step after the resume too.
    let samples = rows(&out.join("samples.jsonl"));
    assert_eq!(samples.len(), 6 * 4);
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s["step"].as_u64(), Some(i as u64 / 4 + 1));
        for k in [
            "prompt",
            "completion",
            "answer",
            "reward",
            "advantage",
            "length",
            "stop_reason",
        ] {
            assert!(s.contains_key(k), "{k} missing: {s:?}");
        }
    }

    tensorboard_matches_metrics(&out, &metrics);
}

/// The run's TensorBoard event file, read back with `tbparse`, holds every metric of
/// `metrics.jsonl` at the same steps, once each, and the sampled completions at the evaluation
/// steps (skipped without the assets' Python environment).
fn tensorboard_matches_metrics(out: &Path, metrics: &[serde_json::Map<String, serde_json::Value>]) {
    let Some(python) = common::assets::cached("py/bin/python") else {
        return;
    };
    let dump = r#"
import json, sys
from tbparse import SummaryReader
r = SummaryReader(sys.argv[1])
s = r.scalars
t = r.text
print(json.dumps({
    "scalars": [[int(a), b, float(c)] for a, b, c in zip(s["step"], s["tag"], s["value"])],
    "text": [[int(a), b, str(c)] for a, b, c in zip(t["step"], t["tag"], t["value"])],
}))
"#;
    let o = Command::new(python)
        .args(["-c", dump])
        .arg(out.join("tensorboard"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut tb: Vec<(i64, String, f64)> = v["scalars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x[0].as_i64().unwrap(),
                x[1].as_str().unwrap().to_string(),
                x[2].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    tb.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut want: Vec<(i64, String, f64)> = metrics
        .iter()
        .flat_map(|r| {
            let step = r["step"].as_f64().unwrap() as i64;
            r.iter()
                .filter(|(k, _)| k.as_str() != "step")
                .map(move |(k, v)| (step, k.clone(), v.as_f64().unwrap_or(f64::NAN)))
        })
        .collect();
    want.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    assert_eq!(
        tb.len(),
        want.len(),
        "one scalar per metric per step, no duplicate"
    );
    for (g, w) in tb.iter().zip(&want) {
        assert_eq!((g.0, &g.1), (w.0, &w.1));
        let same = (g.2.is_nan() && w.2.is_nan())
            || (g.2 - f64::from(w.2 as f32)).abs() <= 1e-6 * w.2.abs().max(1.0);
        assert!(same, "{g:?} vs {w:?}");
    }
    let text: Vec<i64> = v["text"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[0].as_i64().unwrap())
        .collect();
    assert_eq!(text, [2, 4, 6], "sampled completions at each evaluation");
    assert!(
        v["text"][0][2]
            .as_str()
            .unwrap()
            .contains("| advantage | answer |")
    );
}

/// An error in a reward function stops the run with its traceback and the failing item, and
/// the last completed step's checkpoint stays.
#[test]
fn a_python_reward_error_names_the_item_and_keeps_the_checkpoint() {
    let d = tmp("explode");
    let m = module(&d);
    let out = d.join("run");
    // `explode` divides by zero at step 3. Checkpoints every step, so that step 2's is on disk.
    let o = Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("train")
        .arg(root().join("recipes/arithmetic-cpu.toml"))
        .args(["--quiet", "--out"])
        .arg(&out)
        .args(SMALL.iter().flat_map(|s| ["--set", s]))
        .args(["--set", "train.checkpoint_every=1"])
        .args([
            "--set",
            &format!("reward.python.functions=[\"{m}:explode\"]"),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("Traceback") && e.contains("ZeroDivisionError"),
        "{e}"
    );
    assert!(
        e.contains("reward function 'explode' raised on item 4 of step 3"),
        "{e}"
    );
    assert!(e.contains("--resume"), "{e}");
    assert!(out.join("checkpoints/step-00000002").is_dir(), "{e}");
    assert!(!out.join("checkpoints/step-00000003").exists(), "{e}");
}

/// The math-verify example (examples/rewards/gsm8k_math_verify.py) through the adapter, with
/// the Python environment `scripts/fetch_assets.sh` makes.
#[test]
fn math_verify_example_scores_gsm8k_answers() {
    let Some(python) = common::assets::cached("py/bin/python") else {
        return;
    };
    let ex = root().join("examples/rewards/gsm8k_math_verify.py");
    let spec = PythonSpec {
        functions: vec![
            format!("{}:accuracy", ex.display()),
            format!("{}:boxed=0.1", ex.display()),
        ],
        python: python.to_string_lossy().into(),
        timeout_s: 120.0,
    };
    let mut program = ExternalReward::spawn(&spec.external().unwrap()).unwrap();
    let none = serde_json::Map::new();
    let cases = [
        ("So she has \\boxed{18} eggs.", "18", 1.1),
        ("The answer is 17.", "18", 0.0),
        ("In total 1,234 dollars.", "1234", 1.0),
        ("\\boxed{3/4}", "0.75", 1.1),
    ];
    let items: Vec<RewardItem> = cases
        .iter()
        .enumerate()
        .map(|(i, (c, a, _))| RewardItem {
            prompt: "q",
            completion: c,
            answer: a,
            group: i,
            columns: &none,
            messages: &[],
            completion_ids: &[],
        })
        .collect();
    let s = program.score(1, &items).unwrap();
    for ((c, _, want), got) in cases.iter().zip(&s.rewards) {
        assert!((got - want).abs() < 1e-6, "{c}: {got} vs {want}");
    }
}

/// A chat dataset's conversation goes through the model's chat template as it is: a
/// `messages` line renders exactly as the same question asked through the recipe's system
/// prompt and `{question}` template.
#[test]
fn chat_messages_render_through_the_model_template() {
    if common::assets::smollm2().is_none() {
        return;
    }
    let text = std::fs::read_to_string(root().join("recipes/smollm2-lora-grpo.toml")).unwrap();
    let r = ember::llm::schema::parse(
        &text,
        &[
            "pretrained.template=\"{question}\"".into(),
            "pretrained.system=\"Be brief.\"".into(),
            "device=\"cpu\"".into(),
        ],
    )
    .unwrap();
    let device = ember::common::device::device("cpu").unwrap();
    let policy = ember::llm::build_policy(&r, &device).unwrap();
    let plain = ember_tasks::task::Example {
        prompt: "What is 2 + 2?".into(),
        answer: "4".into(),
        question: "What is 2 + 2?".into(),
        check: ember_tasks::reward::Check::Numeric,
        messages: Vec::new(),
        columns: serde_json::Map::new(),
    };
    let chat = ember_tasks::task::Example {
        messages: vec![
            ("system".into(), "Be brief.".into()),
            ("user".into(), "What is 2 + 2?".into()),
        ],
        ..plain.clone()
    };
    let a = policy.prompt_ids(&plain, 8).unwrap();
    let b = policy.prompt_ids(&chat, 8).unwrap();
    assert_eq!(a, b);
    let rendered = policy.decode(&b);
    assert!(
        rendered.contains("Be brief.") && rendered.contains("What is 2 + 2?"),
        "{rendered}"
    );
    // The conversation's own system prompt wins over the recipe's.
    let own = ember_tasks::task::Example {
        messages: vec![
            ("system".into(), "Answer in words.".into()),
            ("user".into(), "What is 2 + 2?".into()),
        ],
        ..plain
    };
    let c = policy.decode(&policy.prompt_ids(&own, 8).unwrap());
    assert!(
        c.contains("Answer in words.") && !c.contains("Be brief."),
        "{c}"
    );
}

/// Reinforce-Ada with Python reward functions: every round is scored (so the step's component
/// metrics are written once, from the first round, not refused as repeats in the second), and
/// the run completes with `reward/<name>` metrics and several rounds a step.
#[test]
fn reinforce_ada_with_python_rewards() {
    let d = tmp("ada-py");
    let m = module(&d);
    let out = d.join("run");
    let extra = vec![
        "algorithm=\"reinforce-ada\"".to_string(),
        "train.steps=3".to_string(),
        "reward.correct=0".to_string(),
        format!("reward.python.functions=[\"{m}:accuracy\"]"),
    ];
    let o = train(&out, &extra, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let metrics = rows(&out.join("metrics.jsonl"));
    let rl: Vec<_> = metrics
        .iter()
        .filter(|r| r.contains_key("rollout/ada_rounds"))
        .collect();
    assert_eq!(rl.len(), 3);
    for r in &rl {
        assert!(
            r["reward/accuracy"].as_f64().is_some_and(f64::is_finite),
            "{r:?}"
        );
        assert!(
            r["rollout/ada_reward_mean_drawn"].as_f64().is_some(),
            "{r:?}"
        );
    }
    assert!(
        rl.iter()
            .any(|r| r["rollout/ada_rounds"].as_f64() > Some(1.0))
    );
    std::fs::remove_dir_all(&d).ok();
}
