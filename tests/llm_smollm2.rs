//! SmolLM2-135M-Instruct (GGUF Q4_1) against `transformers` (fixture
//! `tests/fixtures/llm/smollm2.json`, made by `scripts/make_llm_fixtures.py`): tokenizer ids,
//! chat template, next-token logits, greedy decoding.

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_llm::gguf::GgufFile;
use ember_llm::{Message, SamplingConfig, Tokenizer, generate, load};

#[derive(serde::Deserialize)]
struct Prompt {
    text: String,
    ids: Vec<u32>,
    top_ids: Vec<usize>,
    top_logits: Vec<f32>,
    logsumexp: f32,
}

#[derive(serde::Deserialize)]
struct Chat {
    messages: Vec<Message>,
    rendered: String,
    ids: Vec<u32>,
    greedy: Vec<u32>,
    greedy_text: String,
}

#[derive(serde::Deserialize)]
struct Fixture {
    prompts: Vec<Prompt>,
    chat: Chat,
}

fn fixture() -> Fixture {
    serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/llm/smollm2.json"
        ))
        .unwrap(),
    )
    .unwrap()
}

/// Logits of the Q4_1 model agree with transformers' dequantized float model to this tolerance
/// (the weights are identical; the difference is f32 summation order over 30 layers).
const LOGIT_TOL: f32 = 2e-3;

#[test]
fn smollm2_matches_transformers() {
    let Some(path) = common::assets::smollm2() else {
        return;
    };
    let fx = fixture();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    for p in &fx.prompts {
        assert_eq!(
            tok.encode(&p.text).unwrap(),
            p.ids,
            "tokens of {:?}",
            p.text
        );
        assert_eq!(tok.decode(&p.ids, false).unwrap(), p.text);
    }
    let rendered = tok.apply_chat_template(&fx.chat.messages, true).unwrap();
    assert_eq!(rendered, fx.chat.rendered);
    assert_eq!(tok.encode(&rendered).unwrap(), fx.chat.ids);

    let loaded = load(&path, &dev()).unwrap();
    let model = &loaded.model;
    let mut worst = 0f32;
    for p in &fx.prompts {
        let n = p.ids.len();
        let ids: Vec<i64> = p.ids.iter().map(|x| i64::from(*x)).collect();
        let toks = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), &dev());
        let logits = model.forward(toks, Tensor::ones([1, n], &dev()));
        let v = logits.dims()[2];
        let last = vals(logits.slice([0..1, n - 1..n, 0..v]).reshape([v]));
        for (id, want) in p.top_ids.iter().zip(&p.top_logits) {
            worst = worst.max((last[*id] - want).abs());
        }
        let m = last.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + last.iter().map(|x| (x - m).exp()).sum::<f32>().ln();
        assert!(
            (lse - p.logsumexp).abs() < LOGIT_TOL,
            "logsumexp {lse} vs {}",
            p.logsumexp
        );
        let argmax = last
            .iter()
            .enumerate()
            .fold(0, |b, (i, x)| if *x > last[b] { i } else { b });
        assert_eq!(argmax, p.top_ids[0], "argmax of {:?}", p.text);
    }
    eprintln!("SmolLM2: max |logit − transformers| over top-64 = {worst:e}");
    assert!(worst < LOGIT_TOL, "logits differ by {worst}");

    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: fx.chat.greedy.len(),
        stop_tokens: tok.eos_ids.clone(),
        ..SamplingConfig::default()
    };
    let g = generate(model, std::slice::from_ref(&fx.chat.ids), &cfg, &dev()).unwrap();
    let ids = &g.response_ids()[0];
    assert_eq!(ids, &fx.chat.greedy);
    assert_eq!(tok.decode(ids, true).unwrap(), fx.chat.greedy_text);
}

#[test]
fn gguf_tokenizer_saved_as_tokenizer_json_reloads_identically() {
    let Some(path) = common::assets::smollm2() else {
        return;
    };
    let fx = fixture();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("ember-tok-{}", std::process::id()));
    tok.save(&dir).unwrap();
    let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
    assert_eq!(Some(jinja), tok.chat_template);
    let again = Tokenizer::from_hf_dir(&dir).unwrap();
    for p in &fx.prompts {
        assert_eq!(again.encode(&p.text).unwrap(), p.ids);
    }
    assert_eq!(
        again.apply_chat_template(&fx.chat.messages, true).unwrap(),
        fx.chat.rendered
    );
    assert_eq!(again.eos_ids, vec![2]);
    std::fs::remove_dir_all(&dir).ok();
}

/// A model named by Hub id (`ORG/NAME/FILE`) is found in the Hugging Face cache
/// (`HF_HUB_CACHE`, a snapshot whose file links to a blob, as `huggingface_hub` writes it) and
/// answers as the same file given by path; a missing one names the command that downloads it.
#[test]
fn a_model_by_hub_id_comes_from_the_huggingface_cache() {
    let Some(model) = common::assets::smollm2() else {
        return;
    };
    let hub = std::env::temp_dir().join(format!("ember-hf-hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&hub);
    let repo = hub.join("models--HuggingFaceTB--smol-gguf");
    let snap = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    std::os::unix::fs::symlink(&model, snap.join("smol.gguf")).unwrap();
    let generate = |spec: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["generate", "--model", spec, "--prompt", "1, 2, 3,"])
            .args(["--max-new-tokens", "4", "--device", "cpu"])
            .env("HF_HUB_CACHE", &hub)
            // A Hub where nothing listens: the download fails at once, here and offline alike.
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            .output()
            .unwrap()
    };
    let by_path = generate(model.to_str().unwrap());
    let by_id = generate("HuggingFaceTB/smol-gguf/smol.gguf");
    assert!(
        by_id.status.success(),
        "{}",
        String::from_utf8_lossy(&by_id.stderr)
    );
    assert_eq!(by_id.stdout, by_path.stdout);
    assert!(!by_id.stdout.is_empty());
    let missing = generate("HuggingFaceTB/other@v2");
    let e = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(
        e.contains("huggingface-cli download HuggingFaceTB/other --revision v2"),
        "{e}"
    );
    assert!(e.contains(&hub.display().to_string()), "{e}");
    assert!(e.contains("downloading it failed"), "{e}");
    std::fs::remove_dir_all(&hub).ok();
}

/// `ember serve`'s loading: the GGUF file's Q4_1 projections and Q8_0 head kept as blocks,
/// which decoding steps read; greedy decoding still gives transformers' tokens, and a decoding
/// step's logits equal the f32 weights' to [`LOGIT_TOL`].
#[test]
fn smollm2_decodes_from_its_gguf_blocks() {
    let Some(path) = common::assets::smollm2() else {
        return;
    };
    let fx = fixture();
    let model = ember_llm::load_with_blocks(&path, &dev()).unwrap().model;
    // 30 layers of Q4_1 projections (6 bits a weight as held) and the Q8_0 head (9 bits).
    let mib = model.block_bytes() as f64 / (1 << 20) as f64;
    assert!((100.0..120.0).contains(&mib), "{mib} MiB of blocks");
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: fx.chat.greedy.len(),
        stop_tokens: vec![2],
        ..SamplingConfig::default()
    };
    let g = generate(&model, std::slice::from_ref(&fx.chat.ids), &cfg, &dev()).unwrap();
    assert_eq!(&g.response_ids()[0], &fx.chat.greedy);
    let step = |m: &ember_llm::Llama| {
        let ids: Vec<i64> = fx.chat.ids.iter().map(|x| i64::from(*x)).collect();
        let n = ids.len();
        let mut cache = ember_llm::cache::KvCache::new(m.cache_shape(), 1, n + 1, &dev());
        let toks = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, n]), &dev());
        m.forward_cached(toks, Tensor::ones([1, n], &dev()), &mut cache);
        let next = Tensor::<2, Int>::from_data(
            TensorData::new(vec![fx.chat.greedy[0] as i64], [1, 1]),
            &dev(),
        );
        vals(m.forward_cached(next, Tensor::ones([1, 1], &dev()), &mut cache))
    };
    let (a, b) = (step(&model), step(&model.clone().without_blocks()));
    let worst = max_abs_diff(&a, &b);
    eprintln!("SmolLM2 decoding step: max |logit(blocks) − logit(f32)| = {worst:e}");
    assert!(worst < LOGIT_TOL, "{worst}");
}
