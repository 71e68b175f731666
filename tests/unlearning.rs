//! The unlearning job end to end: after the supervised stage the model knows the facts;
//! gradient ascent and the leave-one-out teacher ensemble make it forget the forget facts and
//! keep the retain facts, RULE makes it refuse; the supervised stage and the forget stage
//! (ReRULE's hard prompts, the ensemble's teachers) resume exactly; bad recipes are named.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ember-unlearning-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&p).ok();
    p
}

fn train(out: &Path, sets: &[&str], flags: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.arg("train")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/unlearning-cpu.toml"))
        .args(["--quiet", "--out"])
        .arg(out);
    for s in sets {
        c.args(["--set", s]);
    }
    c.args(flags).output().unwrap()
}

fn after(out: &Path) -> (serde_json::Value, serde_json::Value) {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    (s["learned"].clone(), s["after"].clone())
}

/// Seed 0 (the study's three seeds are in docs/src/unlearning.md): the learned model answers
/// ≥ 0.9 of both sets; gradient ascent and the ensemble bring forget accuracy below 0.4 with
/// retain accuracy ≥ 0.9; RULE refuses ≥ 0.3 of the forget prompts and keeps retain ≥ 0.9.
#[test]
fn methods_forget_the_forget_facts_and_keep_the_rest() {
    for method in ["gradient_ascent", "loo_ensemble", "rule"] {
        let out = tmp(method);
        let m = format!("forget.method=\"{method}\"");
        let o = train(&out, &[&m], &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (learned, a) = after(&out);
        let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
        eprintln!("{method}: learned {learned}, after {a}");
        assert!(f(&learned, "forget/accuracy") >= 0.9 && f(&learned, "retain/accuracy") >= 0.9);
        assert!(f(&a, "retain/accuracy") >= 0.9, "{method}: {a}");
        if method == "rule" {
            assert!(f(&a, "forget/refusal") >= 0.3, "{a}");
        } else {
            assert!(f(&a, "forget/accuracy") < 0.4, "{method}: {a}");
            assert!(f(&a, "forget/exposure") < 2.0, "{method}: {a}");
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

/// Stopped in the supervised stage (the ensemble's teachers mid-training) or in ReRULE's RL
/// steps (its hard prompts held), a resumed run logs the uninterrupted run's metrics.
#[test]
fn both_stages_resume_exactly() {
    for (method, stop) in [("loo_ensemble", "150"), ("rerule", "420")] {
        let m = format!("forget.method=\"{method}\"");
        let sets = [m.as_str(), "learn.steps=400", "forget.steps=40"];
        let whole = tmp(&format!("whole-{method}"));
        assert!(train(&whole, &sets, &[]).status.success());
        let part = tmp(&format!("part-{method}"));
        let o = train(&part, &sets, &["--stop-after", stop]);
        assert_eq!(
            o.status.code(),
            Some(130),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = train(&part, &sets, &["--resume"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            common::metric_rows(&part),
            common::metric_rows(&whole),
            "{method}"
        );
        for d in [whole, part] {
            std::fs::remove_dir_all(d).ok();
        }
    }
}

#[test]
fn unlearning_recipe_errors_name_the_key() {
    let cases: [(&[&str], &str); 6] = [
        (&["facts.people=1"], "facts.people"),
        (&["facts.forget_share=0.9"], "facts.forget_share"),
        (&["forget.method=\"erase\""], "erase"),
        (&["forget.teachers=1"], "forget.teachers"),
        (&["forget.steering_steps=500"], "forget.steering_steps"),
        (&["learn.lr=0"], "learn.lr"),
    ];
    for (sets, want) in cases {
        let out = tmp("bad");
        let o = train(&out, sets, &[]);
        assert!(!o.status.success(), "{sets:?} was accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{sets:?}: {err}");
        assert!(!out.exists(), "{sets:?} created the run directory");
    }
}
