//! Mutation fuzzing, bounded and seeded so that it runs in every CI build: a small valid GGUF
//! model written here, the real SmolLM2 GGUF, the tiny safetensors checkpoint of the fixtures,
//! a directory's manifest and the main recipe are damaged in many random ways (bytes flipped, 64-bit fields overwritten, files cut short), and
//! every loader must answer each one with `Ok` or an error, never a panic. (An allocation
//! abort would kill the test process, which fails the test too.)

mod common;

use common::dev;
use ember_engine::SplitMix64;
use ember_llm::gguf::GgufFile;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-fuzz-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A GGUF string.
fn gstr(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// Metadata entries of a one-layer Llama (d_model 8, 2 heads, d_ff 16, 16 tokens).
fn metadata() -> Vec<Vec<u8>> {
    let kv = |key: &str, ty: u32, value: Vec<u8>| {
        let mut b = gstr(key);
        b.extend(ty.to_le_bytes());
        b.extend(value);
        b
    };
    let u32v = |v: u32| v.to_le_bytes().to_vec();
    let strs = |items: &[&str]| {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((items.len() as u64).to_le_bytes());
        for s in items {
            b.extend(gstr(s));
        }
        b
    };
    let tokens: Vec<String> = (b'a'..=b'p').map(|c| (c as char).to_string()).collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    vec![
        kv("general.architecture", 8, gstr("llama")),
        kv("llama.block_count", 4, u32v(1)),
        kv("llama.embedding_length", 4, u32v(8)),
        kv("llama.feed_forward_length", 4, u32v(16)),
        kv("llama.attention.head_count", 4, u32v(2)),
        kv("llama.attention.head_count_kv", 4, u32v(2)),
        kv("llama.context_length", 4, u32v(32)),
        kv("tokenizer.ggml.model", 8, gstr("gpt2")),
        kv("tokenizer.ggml.tokens", 9, strs(&tokens)),
        kv("tokenizer.ggml.merges", 9, strs(&[])),
        kv("tokenizer.ggml.eos_token_id", 4, u32v(1)),
        kv(
            "tokenizer.chat_template",
            8,
            gstr("{% for m in messages %}{{ m['content'] }}{% endfor %}"),
        ),
    ]
}

/// A valid GGUF file of the model, with f32 tensors (tied embeddings), and the length of its
/// header (everything before the tensor data).
fn tiny_gguf() -> (Vec<u8>, usize) {
    let tensors: [(&str, &[u64]); 11] = [
        ("token_embd.weight", &[8, 16]),
        ("blk.0.attn_norm.weight", &[8]),
        ("blk.0.attn_q.weight", &[8, 8]),
        ("blk.0.attn_k.weight", &[8, 8]),
        ("blk.0.attn_v.weight", &[8, 8]),
        ("blk.0.attn_output.weight", &[8, 8]),
        ("blk.0.ffn_norm.weight", &[8]),
        ("blk.0.ffn_gate.weight", &[8, 16]),
        ("blk.0.ffn_up.weight", &[8, 16]),
        ("blk.0.ffn_down.weight", &[16, 8]),
        ("output_norm.weight", &[8]),
    ];
    let kv = metadata();
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for e in &kv {
        b.extend(e);
    }
    let mut data = Vec::new();
    for (name, dims) in tensors {
        b.extend(gstr(name));
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(0u32.to_le_bytes());
        b.extend((data.len() as u64).to_le_bytes());
        let n: u64 = dims.iter().product();
        for i in 0..n {
            data.extend(((i % 7) as f32 * 0.05 - 0.1).to_le_bytes());
        }
        data.resize(data.len().div_ceil(32) * 32, 0);
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    let header = b.len();
    b.extend(data);
    (b, header)
}

/// `bytes` damaged in one of three ways, only within its first `span` bytes (the structure:
/// damaging weights only changes numbers).
fn mutate(bytes: &[u8], span: usize, rng: &mut SplitMix64) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let span = span.min(b.len()).max(1);
    match rng.below(3) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(span as u64) as usize;
                b[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let i = rng.below(span as u64) as usize;
            let v = match rng.below(4) {
                0 => u64::MAX,
                1 => 1 << (rng.below(63) + 1),
                2 => rng.next_u64(),
                _ => rng.below(300),
            };
            for (k, byte) in v.to_le_bytes().iter().enumerate() {
                if let Some(x) = b.get_mut(i + k) {
                    *x = *byte;
                }
            }
        }
        _ => b.truncate(rng.below(b.len() as u64) as usize),
    }
    b
}

/// Runs `f`, failing the test with `what` and the case number if it panics.
fn no_panic(what: &str, case: usize, f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        panic!("{what}: case {case} panicked (seeded: rerun reproduces it)");
    }
}

/// Everything a run does with a model file: directory, config, tokenizer, chat template,
/// weights.
fn load_everything(path: &Path) {
    if let Ok(f) = GgufFile::open(path) {
        let _ = ember_llm::config_from_gguf(&f);
        if let Ok(t) = ember_llm::Tokenizer::from_gguf(&f) {
            let _ = t.apply_chat_template(&[ember_llm::Message::new("user", "ab")], true);
            let _ = t.encode("abc");
        }
    }
    let _ = ember_llm::load(path, &dev());
}

#[test]
fn gguf_reader_survives_damaged_files() {
    let d = tmpdir("gguf");
    let p = d.join("m.gguf");
    let (good, header) = tiny_gguf();
    std::fs::write(&p, &good).unwrap();
    let loaded = ember_llm::load(&p, &dev()).expect("the undamaged file loads");
    assert_eq!(loaded.config.n_layers, 1);
    let mut rng = SplitMix64(0x6767_7566);
    for case in 0..1500 {
        std::fs::write(&p, mutate(&good, header, &mut rng)).unwrap();
        no_panic("GGUF", case, || load_everything(&p));
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn safetensors_loader_survives_damaged_files() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_llama");
    let d = tmpdir("st");
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), d.join(f)).unwrap();
    }
    let good = std::fs::read(src.join("model.safetensors")).unwrap();
    // The JSON header: its 8-byte length, then the header itself.
    let header = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let config = std::fs::read(src.join("config.json")).unwrap();
    let mut rng = SplitMix64(0x5354_5446);
    for case in 0..600 {
        std::fs::write(d.join("model.safetensors"), mutate(&good, header, &mut rng)).unwrap();
        let damaged_config = case % 4 == 0;
        if damaged_config {
            std::fs::write(
                d.join("config.json"),
                mutate(&config, config.len(), &mut rng),
            )
            .unwrap();
        }
        no_panic("safetensors", case, || {
            let _ = ember_llm::load(&d, &dev());
        });
        if damaged_config {
            std::fs::write(d.join("config.json"), &config).unwrap();
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn recipe_parser_survives_damaged_recipes() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes/arithmetic-cpu.toml"),
    )
    .unwrap();
    let mut rng = SplitMix64(0x7265_6369);
    for case in 0..3000 {
        let bytes = mutate(text.as_bytes(), text.len(), &mut rng);
        let damaged = String::from_utf8_lossy(&bytes).to_string();
        no_panic("recipe", case, || {
            if let Ok(ember::kinds::AnyRecipe::Llm(r)) = ember::kinds::parse_any(&damaged, &[]) {
                // What the job builds from a parsed recipe before any work.
                let _ = r.task.build();
                let _ = r.algorithm_parts();
                let _ = toml::to_string_pretty(&*r);
            }
        });
    }
}

/// A directory's `manifest.json` (checkpoints, `final/`, pushed weights), damaged 300 ways: its
/// strict and export checks answer `Ok` or an error, never panic, and never pass when a listed
/// file's recorded size or checksum no longer matches.
#[test]
fn manifest_checks_survive_damaged_manifests() {
    use ember_train::manifest::{MANIFEST, verify, verify_export};
    let d = tmpdir("manifest");
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(d.join("model.bpk"), vec![7u8; 4096]).unwrap();
    std::fs::write(d.join("sub/replay.json"), b"{\"rows\": []}").unwrap();
    ember_train::manifest::write(&d).unwrap();
    let good = std::fs::read(d.join(MANIFEST)).unwrap();
    let mut rng = SplitMix64(0x6d61_6e69);
    for case in 0..300 {
        let bad = mutate(&good, good.len(), &mut rng);
        std::fs::write(d.join(MANIFEST), &bad).unwrap();
        no_panic("manifest", case, || {
            let strict = verify(&d);
            let export = verify_export(&d);
            // A manifest that still parses to the same entries passes; any other passing one
            // would be a check that checks nothing.
            if strict.is_ok() || export.is_ok() {
                let same = serde_json::from_slice::<serde_json::Value>(&bad).ok()
                    == serde_json::from_slice::<serde_json::Value>(&good).ok();
                assert!(same, "case {case}: a damaged manifest passed");
            }
        });
    }
    std::fs::remove_dir_all(&d).ok();
}

/// The real SmolLM2-135M GGUF (from `scripts/fetch_assets.sh`), damaged in place: bits flipped
/// and 64-bit fields overwritten within its first 3 MiB (the metadata: 49 152 tokens, their
/// merges and types, the chat template; then the tensor directory), each damage undone before
/// the next. Every case goes through the directory, config, tokenizer and chat template (the
/// weights are the tiny file's business above: loading 135 M parameters per case would take
/// minutes).
#[test]
fn real_gguf_header_survives_damage() {
    let Some(real) = common::assets::smollm2() else {
        return;
    };
    let d = tmpdir("real-gguf");
    let p = d.join("smollm2.gguf");
    std::fs::copy(&real, &p).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    let span = len.min(3 << 20);
    let mut rng = SplitMix64(0x5245_414c);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    use std::io::{Read, Seek, SeekFrom, Write};
    for case in 0..120 {
        // One patch: 1 byte with a flipped bit, or 8 bytes of a hostile u64.
        let at = rng.below(span - 8);
        let mut old = [0u8; 8];
        file.seek(SeekFrom::Start(at)).unwrap();
        file.read_exact(&mut old).unwrap();
        let mut new = old;
        if rng.below(2) == 0 {
            new[0] ^= 1 << rng.below(8);
        } else {
            let v = match rng.below(3) {
                0 => u64::MAX,
                1 => 1 << (rng.below(63) + 1),
                _ => rng.next_u64(),
            };
            new = v.to_le_bytes();
        }
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&new).unwrap();
        file.flush().unwrap();
        no_panic("real GGUF", case, || {
            if let Ok(f) = GgufFile::open(&p) {
                let _ = ember_llm::config_from_gguf(&f);
                if let Ok(t) = ember_llm::Tokenizer::from_gguf(&f) {
                    let _ = t.apply_chat_template(&[ember_llm::Message::new("user", "2+2?")], true);
                    let _ = t.encode("What is 2 + 2?");
                }
            }
        });
        file.seek(SeekFrom::Start(at)).unwrap();
        file.write_all(&old).unwrap();
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A loader call answering its error's text.
type Loader = Box<dyn FnOnce() -> String + Send>;

/// Calls `f` in a thread: its answer, or None when it has not answered within 20 s (a reader
/// blocked on a FIFO).
fn within_20s(f: impl FnOnce() -> String + Send + 'static) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20)).ok()
}

/// A FIFO named as a GGUF model, as a checkpoint's weights or tokenizer, or as a JSONL dataset
/// is refused at once with an error naming it (opening one for reading used to wait for a
/// writer forever).
#[cfg(unix)]
#[test]
fn fifo_paths_are_refused_not_waited_on() {
    let d = tmpdir("fifo");
    let mkfifo = |p: &Path| {
        let ok = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfifo {}", p.display());
    };
    let fifo = d.join("pipe");
    mkfifo(&fifo);
    let weights = d.join("weights");
    let tokenizer = d.join("tokenizer");
    for (dir, pipe) in [
        (&weights, "model.safetensors"),
        (&tokenizer, "tokenizer.json"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_llama");
        for f in ["config.json", "model.safetensors"] {
            if f != pipe {
                std::fs::copy(src.join(f), dir.join(f)).unwrap();
            }
        }
        mkfifo(&dir.join(pipe));
    }
    let (f1, f2) = (fifo.clone(), fifo.clone());
    let cases: Vec<(&str, Loader)> = vec![
        (
            "gguf",
            Box::new(move || format!("{:?}", GgufFile::open(&f1).err())),
        ),
        (
            "weights",
            Box::new(move || format!("{:?}", ember_llm::load(&weights, &dev()).err())),
        ),
        (
            "tokenizer",
            Box::new(move || {
                format!(
                    "{:?}",
                    ember_llm::Tokenizer::for_checkpoint(&tokenizer).err()
                )
            }),
        ),
        (
            "jsonl",
            Box::new(move || format!("{:?}", ember_tasks::task::JsonlData::load(&f2).err())),
        ),
    ];
    for (what, f) in cases {
        let answer = within_20s(f).unwrap_or_else(|| panic!("{what}: still waiting on the FIFO"));
        assert!(
            answer.contains("FIFO") || answer.contains("not a regular file"),
            "{what}: {answer}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// An `[offline]` dataset in its three shapes, damaged 1000 ways, plus hand-made hostile
/// lines: the reader answers `Ok` or an error naming `file:line`, never panics, and a dataset it
/// accepts holds only rewards the engine counts (within ±1e9) or `null`.
#[test]
fn offline_dataset_reader_survives_damaged_files() {
    let d = tmpdir("offline");
    let p = d.join("data.jsonl");
    let good = concat!(
        r#"{"prompt": "1+2=", "responses": [{"response": "3", "reward": 1.0}, {"response": "4", "reward": 0.0, "truncated": true}]}"#,
        "\n",
        r#"{"prompt": "2+2=", "response": "4", "reward": 1.0, "answer": "4"}"#,
        "\n",
        r#"{"prompt": "2+2=", "response": "5", "reward": null}"#,
        "\n",
        r#"{"prompt": "3+3=", "chosen": "6", "rejected": "7", "chosen_reward": 0.5}"#,
        "\n"
    );
    let check = |case: usize| {
        if let Ok(groups) = ember::offline::data::load(&p) {
            for g in &groups {
                assert!(!g.responses.is_empty(), "case {case}: an empty group");
                for s in &g.responses {
                    let ok = s
                        .reward
                        .is_none_or(|r| ember_engine::is_valid_reward(r.into()));
                    assert!(ok, "case {case}: reward {:?} was accepted", s.reward);
                }
                let _ = ember::offline::data::keep_first(vec![g.clone()], 1);
            }
        }
    };
    let hostile = [
        r#"{"prompt": "1+2=", "responses": [{"response": "3", "reward": 1e300}]}"#,
        r#"{"prompt": "1+2=", "responses": [{"response": "3", "reward": 5e9}, {"response": "4", "reward": 0}]}"#,
        r#"{"prompt": "1+2=", "responses": [{"response": "3", "reward": -1e39}]}"#,
        r#"{"prompt": "1+2=", "response": "3", "reward": 1e300}"#,
        r#"{"prompt": "1+2=", "chosen": "3", "rejected": "4", "rejected_reward": -1e300}"#,
        r#"{"prompt": "1+2=", "responses": [{"response": "3", "reward": "1"}]}"#,
        r#"{"prompt": "", "response": "3", "reward": 1}"#,
        r#"[1, 2]"#,
        r#"{"prompt": 7, "response": "3", "reward": 1}"#,
    ];
    for (case, line) in hostile.iter().enumerate() {
        std::fs::write(&p, format!("{good}{line}\n")).unwrap();
        no_panic("offline", case, || check(case));
    }
    let mut rng = SplitMix64(0x6f66_666c);
    for case in 0..1000 {
        std::fs::write(&p, mutate(good.as_bytes(), good.len(), &mut rng)).unwrap();
        no_panic("offline", case, || check(case));
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A checkpoint's `replay.json`, damaged 600 ways: it loads only when every stored group still
/// fits the run (token ids, lengths, finite log-probs and rewards, steps), never panics.
#[test]
fn replay_buffer_reader_survives_damaged_files() {
    use ember::llm::replay::{Limits, REPLAY, Replay, StoredGroup};
    let d = tmpdir("replay");
    let cfg = ember_engine::ReplayConfig::default();
    let mut buffer = ember_engine::ReplayBuffer::default();
    for step in 1..=3 {
        let group = StoredGroup {
            prompt: vec![1, 2, 3],
            responses: vec![vec![4, 5], vec![6]],
            log_probs: vec![vec![-0.5, -1.25], vec![-2.0]],
            rewards: vec![Some(1.0), None],
            truncated: vec![false, true],
        };
        buffer.push(&cfg, step, group);
    }
    let limits = Limits {
        step: 3,
        vocab: 16,
        context: 8,
        max_new: 2,
        samples: 2,
    };
    Replay { cfg, buffer }.save(&d).unwrap();
    let fresh = || Replay {
        cfg,
        buffer: ember_engine::ReplayBuffer::default(),
    };
    let back = fresh()
        .load(&d, &limits)
        .expect("the undamaged buffer loads");
    assert_eq!(back.buffer.len(), 3);
    let good = std::fs::read(d.join(REPLAY)).unwrap();
    let mut rng = SplitMix64(0x7265_706c);
    let mut loaded = 0;
    for case in 0..600 {
        std::fs::write(d.join(REPLAY), mutate(&good, good.len(), &mut rng)).unwrap();
        no_panic("replay", case, || {
            if let Ok(mut r) = fresh().load(&d, &limits) {
                loaded += 1;
                let _ = r.buffer.draw(&cfg, 2);
            }
        });
    }
    // Flips inside digits or names mostly make the file unreadable; some stay valid.
    assert!(loaded < 600, "every damaged buffer loaded");
    std::fs::remove_dir_all(&d).ok();
}

/// A run's `plop.json` (the recorded PLoP choice `ember eval` applies), damaged 600 ways: the
/// choice applied is always `plop_count` distinct known projection types, or an error.
#[test]
fn plop_choice_reader_survives_damaged_files() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes/smollm2-lora-grpo.toml"),
    )
    .unwrap();
    let sets = ["pretrained.lora.targets=\"plop\"".to_string()];
    let Ok(ember::kinds::AnyRecipe::Llm(r)) = ember::kinds::parse_any(&text, &sets) else {
        panic!("the PLoP recipe parses");
    };
    let d = tmpdir("plop");
    let good = br#"{"targets": ["q_proj", "v_proj", "down_proj"], "scores": {"q_proj": 1.5}, "per_layer": [{"q_proj": 1.5}], "prompts": 4, "tokens": 40}"#;
    std::fs::write(d.join(ember::llm::plop::FILE), good).unwrap();
    let known = ember_llm::LORA_TARGETS;
    let targets = |r: &ember::llm::schema::Recipe| -> Vec<String> {
        let t = toml::to_string(&r.pretrained.as_ref().unwrap().lora).unwrap();
        let v: toml::Value = toml::from_str(&t).unwrap();
        v["targets"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    };
    let applied = ember::llm::plop::apply_recorded(&r, &d).expect("the undamaged choice applies");
    assert_eq!(targets(&applied), ["q_proj", "v_proj", "down_proj"]);
    let mut rng = SplitMix64(0x706c_6f70);
    for case in 0..600 {
        std::fs::write(
            d.join(ember::llm::plop::FILE),
            mutate(good, good.len(), &mut rng),
        )
        .unwrap();
        no_panic("plop", case, || {
            if let Ok(a) = ember::llm::plop::apply_recorded(&r, &d) {
                let t = targets(&a);
                let mut u = t.clone();
                u.sort();
                u.dedup();
                assert!(
                    t.len() == 3 && u.len() == 3 && t.iter().all(|x| known.contains(&x.as_str())),
                    "case {case}: applied {t:?}"
                );
            }
        });
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A checkpoint's `model.bpk` written by a run from before manifests (so nothing checks its
/// bytes first), damaged 300 ways: reading the record and applying it to the model answers `Ok`
/// or an error, never a panic.
#[test]
fn model_records_survive_damage_without_a_manifest() {
    use burn::module::Module;
    use burn::store::ModuleRecord;
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_llama");
    let model = ember_llm::load(&src, &dev()).unwrap().model;
    let d = tmpdir("record");
    let p = d.join("model.bpk");
    model.clone().into_record().save(&p).unwrap();
    let good = std::fs::read(&p).unwrap();
    assert!(
        model
            .clone()
            .try_load_record(ModuleRecord::load(&p).unwrap())
            .is_ok()
    );
    let mut rng = SplitMix64(0x6270_6b21);
    for case in 0..300 {
        std::fs::write(&p, mutate(&good, good.len().min(4096), &mut rng)).unwrap();
        no_panic("model record", case, || {
            if let Ok(rec) = ModuleRecord::load(&p) {
                let _ = model.clone().try_load_record(rec);
            }
        });
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A Parquet dataset (pyarrow's snappy file of `tests/fixtures/data/`), damaged 400 ways: the
/// reader answers `Ok` or an error naming the file, never a panic.
#[test]
fn parquet_reader_survives_damaged_files() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data");
    let good = std::fs::read(src.join("chat-snappy.parquet")).unwrap();
    let d = tmpdir("parquet");
    let p = d.join("data.parquet");
    let keys = ember_tasks::task::JsonlKeys {
        prompt: None,
        answer: Some("solution".into()),
    };
    std::fs::write(&p, &good).unwrap();
    assert!(ember_tasks::task::JsonlData::load_with(&p, &keys).is_ok());
    let mut rng = SplitMix64(0x7061_7271);
    for case in 0..400 {
        // Half the cases damage the footer (the schema and row-group directory), half anywhere.
        let bad = if case % 2 == 0 {
            let mut b = good.clone();
            b.reverse();
            let mut m = mutate(&b, 600, &mut rng);
            m.reverse();
            m
        } else {
            mutate(&good, good.len(), &mut rng)
        };
        std::fs::write(&p, bad).unwrap();
        no_panic("parquet", case, || {
            if let Err(e) = ember_tasks::task::JsonlData::load_with(&p, &keys) {
                assert!(e.to_string().contains("data.parquet"), "case {case}: {e}");
            }
        });
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A `datasets` folder (`tests/fixtures/data/saved`'s first Arrow shard), its Arrow file damaged
/// 400 ways: the reader answers `Ok` or an error naming the file, never a panic.
#[test]
fn arrow_reader_survives_damaged_files() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data/saved");
    let good = std::fs::read(src.join("data-00000-of-00002.arrow")).unwrap();
    let d = tmpdir("arrow");
    let state = r#"{"_data_files": [{"filename": "data.arrow"}]}"#;
    std::fs::write(d.join("state.json"), state).unwrap();
    let p = d.join("data.arrow");
    let keys = ember_tasks::task::JsonlKeys {
        prompt: None,
        answer: Some("solution".into()),
    };
    std::fs::write(&p, &good).unwrap();
    assert!(ember_tasks::task::JsonlData::load_with(&d, &keys).is_ok());
    let mut rng = SplitMix64(0x6172_726f);
    for case in 0..400 {
        // Half the cases damage the schema message at the start, half anywhere.
        let span = if case % 2 == 0 { 600 } else { good.len() };
        std::fs::write(&p, mutate(&good, span, &mut rng)).unwrap();
        no_panic("arrow", case, || {
            if let Err(e) = ember_tasks::task::JsonlData::load_with(&d, &keys) {
                assert!(e.to_string().contains("data.arrow"), "case {case}: {e}");
            }
        });
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A `datasets` folder whose `state.json` names one file twice, or whose `.arrow` file is a
/// link to a file outside the folder, is refused naming the problem: the first used to read the
/// file once per mention (200 000 mentions: 3.2 GB), the second followed the link and showed the
/// target's first bytes and size in its error.
#[cfg(unix)]
#[test]
fn arrow_folders_name_each_file_once_and_keep_inside() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data/saved");
    let good = std::fs::read(src.join("data-00000-of-00002.arrow")).unwrap();
    let keys = ember_tasks::task::JsonlKeys {
        prompt: None,
        answer: Some("solution".into()),
    };
    let d = tmpdir("arrow-twice");
    std::fs::write(d.join("data.arrow"), &good).unwrap();
    let twice = r#"{"_data_files": [{"filename": "data.arrow"}, {"filename": "data.arrow"}]}"#;
    std::fs::write(d.join("state.json"), twice).unwrap();
    let e = ember_tasks::task::JsonlData::load_with(&d, &keys).unwrap_err();
    assert!(
        e.to_string()
            .contains(r#"`_data_files` names "data.arrow" twice"#),
        "{e}"
    );
    // A link inside the folder is read; one out of it is refused without reading the target.
    let once = r#"{"_data_files": [{"filename": "link.arrow"}]}"#;
    std::fs::write(d.join("state.json"), once).unwrap();
    std::os::unix::fs::symlink(d.join("data.arrow"), d.join("link.arrow")).unwrap();
    assert!(ember_tasks::task::JsonlData::load_with(&d, &keys).is_ok());
    let outside = tmpdir("arrow-outside");
    std::fs::write(outside.join("secret.arrow"), b"SECRET BYTES").unwrap();
    std::fs::remove_file(d.join("link.arrow")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.arrow"), d.join("link.arrow")).unwrap();
    let e = ember_tasks::task::JsonlData::load_with(&d, &keys)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a link to a file outside the dataset's folder"),
        "{e}"
    );
    assert!(!e.contains("SECRET") && !e.contains("12 bytes"), "{e}");
    std::fs::remove_dir_all(&d).ok();
    std::fs::remove_dir_all(&outside).ok();
}
