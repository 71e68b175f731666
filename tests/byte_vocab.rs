//! The tiny policy on text outside the arithmetic characters: `[model] vocab = "bytes"` trains
//! on a JSONL dataset of words (which the character vocabulary refuses, naming the fix) and
//! exports a byte-level tokenizer with the model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-bytes-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Letters counted: prompts of words, numeric answers.
fn dataset(dir: &Path) -> PathBuf {
    let words = [
        "ab", "abc", "über", "Größe", "ß", "naïve", "zebra", "ok", "héllo", "x", "wörter", "été",
    ];
    let mut text = String::new();
    for i in 0..60 {
        let w = words[i % words.len()].repeat(1 + i / words.len());
        text += &serde_json::json!({"question": format!("count: {w}"),
                                    "answer": w.chars().count()})
        .to_string();
        text.push('\n');
    }
    let p = dir.join("words.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

fn train(out: &Path, data: &Path, vocab: &str) -> Output {
    let task = format!(
        "task={{kind=\"jsonl\", path={:?}, eval_size=6}}",
        data.display()
    );
    let model = format!("model.vocab=\"{vocab}\"");
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.arg("train")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/arithmetic-cpu.toml"))
        .args(["--quiet", "--out"])
        .arg(out);
    for s in [
        task.as_str(),
        model.as_str(),
        "warmup.steps=5",
        "train.steps=2",
        "rollout.prompts_per_step=4",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=4",
        "train.eval_every=2",
    ] {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

#[test]
fn byte_vocabulary_trains_on_any_text_and_exports_its_tokenizer() {
    let d = tmp("run");
    let data = dataset(&d);
    let chars = train(&d.join("chars"), &data, "chars");
    let err = String::from_utf8_lossy(&chars.stderr);
    assert!(
        !chars.status.success(),
        "the character vocabulary took words"
    );
    assert!(err.contains("vocab = \"bytes\""), "{err}");
    let out = d.join("bytes");
    let o = train(&out, &data, "bytes");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let samples = std::fs::read_to_string(out.join("samples.jsonl")).unwrap();
    assert!(samples.contains("count: "), "{samples}");
    let resolved = std::fs::read_to_string(out.join("recipe.resolved.toml")).unwrap();
    assert!(resolved.contains("vocab = \"bytes\""), "{resolved}");
    let tok = std::fs::read_to_string(out.join("final/tokenizer.json")).unwrap();
    assert!(
        tok.contains("ByteLevel"),
        "the exported tokenizer is not byte-level"
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("final/config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["vocab_size"], 259);
    std::fs::remove_dir_all(&d).ok();
}
