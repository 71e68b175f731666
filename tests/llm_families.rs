//! Model families beyond Llama/Qwen2 against the reference library: Qwen3 (per-head q/k norms),
//! Llama 3.x RoPE scaling, YaRN, linear scaling on a Mistral config; Hugging Face directories
//! as transformers 5 writes them (`rope_parameters`, `chat_template.jinja`). Fixtures: random tiny
//! checkpoints that `transformers` made from a config offline (`scripts/make_family_fixtures.py`),
//! with their logits and greedy continuations, and the same weights as GGUF files.

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_llm::{HfConfig, RopeScaling, SamplingConfig, Tokenizer, generate, load, save_hf};
use std::path::{Path, PathBuf};

/// A fresh directory under the system's temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("ember-fam-{tag}-{}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm")
        .join(name)
}

#[derive(serde::Deserialize)]
struct Fixture {
    tokens: Vec<Vec<i64>>,
    mask: Vec<Vec<f32>>,
    logits: Vec<Vec<Vec<f32>>>,
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
}

fn read_fixture(dir: &str) -> Fixture {
    let text = std::fs::read_to_string(fixture(dir).join("logits.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The largest |logit − reference| of `model` over the fixture's unmasked positions.
fn worst_logit_gap(model: &ember_llm::Llama, fx: &Fixture) -> f32 {
    let (b, t) = (fx.tokens.len(), fx.tokens[0].len());
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(fx.tokens.concat(), [b, t]), &dev());
    let mask = Tensor::<2>::from_data(TensorData::new(fx.mask.concat(), [b, t]), &dev());
    let logits = vals(model.forward(tokens, mask));
    let v = fx.logits[0][0].len();
    let mut worst = 0f32;
    for r in 0..b {
        for p in (0..t).filter(|&p| fx.mask[r][p] == 1.0) {
            for k in 0..v {
                worst = worst.max((logits[(r * t + p) * v + k] - fx.logits[r][p][k]).abs());
            }
        }
    }
    worst
}

/// Greedy continuations of the fixture's prompts (one batch, left-padded).
fn greedy(model: &ember_llm::Llama, fx: &Fixture) -> Vec<Vec<u32>> {
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: fx.greedy[0].len(),
        ..SamplingConfig::default()
    };
    let g = generate(model, &fx.prompts, &cfg, &dev()).unwrap();
    let [rows, n] = g.tokens.dims();
    let ids = vals(g.tokens.float());
    (0..rows)
        .map(|r| ids[r * n..(r + 1) * n].iter().map(|&x| x as u32).collect())
        .collect()
}

/// Loads `path` and checks logits (≤ 1e-4) and greedy ids against the fixture of `dir`.
fn check(path: &Path, dir: &str) -> ember_llm::Loaded {
    let loaded = load(path, &dev()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fx = read_fixture(dir);
    let worst = worst_logit_gap(&loaded.model, &fx);
    eprintln!("{}: max |logit − transformers| = {worst:e}", path.display());
    assert!(
        worst <= 1e-4,
        "{}: logits differ by {worst}",
        path.display()
    );
    assert_eq!(greedy(&loaded.model, &fx), fx.greedy, "{}", path.display());
    loaded
}

#[test]
fn qwen3_matches_transformers_from_safetensors_and_gguf() {
    let hf = check(&fixture("tiny_qwen3"), "tiny_qwen3");
    assert_eq!(hf.config.family, ember_llm::Family::Qwen3);
    assert!(hf.config.qk_norm && !hf.config.qkv_bias);
    assert_eq!(hf.config.head_dim(), 16, "explicit head_dim ≠ hidden/heads");
    let gguf = check(&fixture("tiny_qwen3.gguf"), "tiny_qwen3");
    assert_eq!(gguf.config.head_dim(), 16);
}

#[test]
fn llama3_rope_scaling_matches_transformers_from_safetensors_and_gguf() {
    let hf = check(&fixture("tiny_llama3"), "tiny_llama3");
    assert!(matches!(
        hf.config.rope_scaling,
        Some(RopeScaling::Llama3 { factor: 4.0, .. })
    ));
    // llama.cpp stores the scaling as per-frequency divisors (`rope_freqs.weight`).
    let gguf = check(&fixture("tiny_llama3.gguf"), "tiny_llama3");
    assert!(matches!(
        gguf.config.rope_scaling,
        Some(RopeScaling::Factors { .. })
    ));
    // Those divisors have no transformers form: export says so instead of writing a config
    // that would load with other frequencies.
    let dir = Scratch::new("gguf-export");
    let e = save_hf(&gguf.model, &gguf.config, &gguf.eos_ids, dir.path()).unwrap_err();
    assert!(e.to_string().contains("rope_scaling"), "{e}");
}

#[test]
fn yarn_and_linear_scaling_match_transformers() {
    let yarn = check(&fixture("tiny_yarn"), "tiny_yarn");
    assert!(matches!(
        yarn.config.rope_scaling,
        Some(RopeScaling::Yarn { factor: 4.0, .. })
    ));
    // A Mistral config without a sliding window is a Llama.
    let lin = check(&fixture("tiny_linear"), "tiny_linear");
    assert_eq!(lin.config.family, ember_llm::Family::Llama);
    assert_eq!(
        lin.config.rope_scaling,
        Some(RopeScaling::Linear { factor: 2.0 })
    );
}

#[test]
fn export_keeps_family_and_rope_scaling_for_transformers() {
    for name in ["tiny_qwen3", "tiny_llama3", "tiny_yarn"] {
        let loaded = load(&fixture(name), &dev()).unwrap();
        let dir = Scratch::new(name);
        save_hf(&loaded.model, &loaded.config, &loaded.eos_ids, dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let again = HfConfig::from_json(&text).unwrap().to_config().unwrap();
        assert_eq!(again, loaded.config, "{name}: config round trip");
        let back = load(dir.path(), &dev()).unwrap();
        let fx = read_fixture(name);
        assert!(worst_logit_gap(&back.model, &fx) <= 1e-4, "{name}");
    }
}

/// The transformers < 5 form of a config (`rope_theta` and `rope_scaling` at the top level,
/// `type` for `rope_type`) reads as the transformers 5 form does.
#[test]
fn rope_scaling_of_transformers_4_reads_like_rope_parameters() {
    let v5 = std::fs::read_to_string(fixture("tiny_llama3/config.json")).unwrap();
    let mut v4: serde_json::Value = serde_json::from_str(&v5).unwrap();
    let params = v4["rope_parameters"].take();
    v4.as_object_mut().unwrap().remove("rope_parameters");
    v4["rope_theta"] = params["rope_theta"].clone();
    let mut scaling = params.clone();
    scaling.as_object_mut().unwrap().remove("rope_theta");
    let kind = scaling
        .as_object_mut()
        .unwrap()
        .remove("rope_type")
        .unwrap();
    scaling["type"] = kind;
    v4["rope_scaling"] = scaling;
    let a = HfConfig::from_json(&v5).unwrap().to_config().unwrap();
    let b = HfConfig::from_json(&v4.to_string())
        .unwrap()
        .to_config()
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.rope_theta, 100.0);
}

#[test]
fn sliding_windows_cap_the_context_and_unsupported_families_are_named() {
    let base = std::fs::read_to_string(fixture("tiny_linear/config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&base).unwrap();
    v["sliding_window"] = 16.into();
    let cfg = HfConfig::from_json(&v.to_string())
        .unwrap()
        .to_config()
        .unwrap();
    assert_eq!(cfg.max_position_embeddings, 16);
    for (ty, arch) in [
        ("qwen3_moe", "Qwen3MoeForCausalLM"),
        ("mixtral", "MixtralForCausalLM"),
    ] {
        v["model_type"] = ty.into();
        v["architectures"] = serde_json::json!([arch]);
        let e = HfConfig::from_json(&v.to_string())
            .unwrap()
            .to_config()
            .unwrap_err()
            .to_string();
        assert!(e.contains(ty) && e.contains("mixture-of-experts"), "{e}");
    }
    let mut v: serde_json::Value = serde_json::from_str(&base).unwrap();
    v["rope_parameters"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
    let e = HfConfig::from_json(&v.to_string())
        .unwrap()
        .to_config()
        .unwrap_err()
        .to_string();
    assert!(e.contains("dynamic"), "{e}");
}

/// A word-level tokenizer directory with `tokenizer_config.json` holding `template_in_config`.
fn tokenizer_dir(template_in_config: serde_json::Value) -> Scratch {
    let dir = Scratch::new("tokenizer");
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hi": 1}, "unk_token": "<unk>"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
    let cfg = serde_json::json!({"chat_template": template_in_config, "eos_token": "hi"});
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn chat_templates_as_transformers_5_saves_them() {
    let user = [ember_llm::Message::new("user", "hello")];
    // The list form: the `default` entry.
    let listed = serde_json::json!([
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{% for m in messages %}[{{ m.content }}]{% endfor %}"}
    ]);
    let dir = tokenizer_dir(listed);
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.apply_chat_template(&user, false).unwrap(), "[hello]");
    // `chat_template.jinja` wins over the config's copy.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}<{{ m.content }}>{% endfor %}\
         {% if add_generation_prompt %}{% if enable_thinking is defined and not enable_thinking %}\
         <think></think>{% else %}<think>{% endif %}{% endif %}",
    )
    .unwrap();
    let mut tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(
        tok.apply_chat_template(&user, true).unwrap(),
        "<hello><think>"
    );
    // Template variables (Qwen3's `enable_thinking`) reach the template; the standard ones
    // cannot be overridden by them.
    tok.template_kwargs
        .insert("enable_thinking".into(), serde_json::Value::Bool(false));
    tok.template_kwargs
        .insert("messages".into(), serde_json::json!([]));
    assert_eq!(
        tok.apply_chat_template(&user, true).unwrap(),
        "<hello><think></think>"
    );
}

/// The fixtures exercise the scaling: the same weights with plain RoPE give other logits (the
/// positions reach past the original context of 16).
#[test]
fn the_fixtures_depend_on_their_rope_scaling() {
    for name in ["tiny_llama3", "tiny_yarn", "tiny_linear"] {
        let dir = Scratch::new(&format!("plain-{name}"));
        let src = fixture(name);
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        cfg["rope_parameters"]["rope_type"] = "default".into();
        std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
        std::fs::copy(
            src.join("model.safetensors"),
            dir.path().join("model.safetensors"),
        )
        .unwrap();
        let plain = load(dir.path(), &dev()).unwrap();
        assert_eq!(plain.config.rope_scaling, None);
        let gap = worst_logit_gap(&plain.model, &read_fixture(name));
        assert!(gap > 1e-2, "{name}: plain RoPE is only {gap} away");
    }
}

/// `generation_config.json`'s sampling settings, as a server's defaults: Qwen3's recommended
/// ones, greedy when `do_sample` is false, out-of-range values dropped.
#[test]
fn generation_config_sampling_defaults() {
    use ember_llm::GenerationDefaults;
    let qwen3 = serde_json::json!({"do_sample": true, "temperature": 0.6, "top_p": 0.95,
                                   "top_k": 20, "eos_token_id": [151645, 151643]});
    let d = GenerationDefaults::from_json(&qwen3);
    assert_eq!(
        d,
        GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            min_p: None
        }
    );
    let greedy = serde_json::json!({"do_sample": false, "temperature": 0.7});
    assert_eq!(
        GenerationDefaults::from_json(&greedy).temperature,
        Some(0.0)
    );
    let bad = serde_json::json!({"temperature": -1.0, "top_p": 1.5, "min_p": 1.0});
    assert_eq!(
        GenerationDefaults::from_json(&bad),
        GenerationDefaults::default()
    );
    // A directory's file is read at load; the fixtures' files name no sampling settings.
    let loaded = load(&fixture("tiny_qwen3"), &dev()).unwrap();
    assert_eq!(loaded.generation, GenerationDefaults::default());
}

/// The chat templates `trl` 1.16.0 ships (Qwen3 with and without thinking, Qwen2.5, Llama 3.1
/// and 3.2), read from the test venv, render as transformers renders them
/// (`tests/fixtures/llm/chat_templates.json`, from `scripts/make_template_fixtures.py`).
#[test]
fn real_chat_templates_render_as_transformers_renders_them() {
    let Some(py) = common::assets::cached("py") else {
        return;
    };
    let lib = std::fs::read_dir(py.join("lib")).unwrap();
    let site = lib
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.join("trl/chat_templates").is_dir())
        .expect("trl's chat templates in the test venv");
    assert!(
        site.join("trl-1.16.0.dist-info").is_dir(),
        "the fixtures are trl 1.16.0's"
    );
    let site = site.join("trl/chat_templates");
    let text = std::fs::read_to_string(fixture("chat_templates.json")).unwrap();
    let fx: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fx["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 11);
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"].as_str().unwrap();
        let template = std::fs::read_to_string(site.join(name)).unwrap();
        let messages: Vec<ember_llm::Message> =
            serde_json::from_value(case["messages"].clone()).unwrap();
        let special = &case["special"];
        let kwargs = case["kwargs"].as_object().unwrap();
        let rendered = ember_llm::render_chat_with(
            &template,
            &messages,
            case["add_generation_prompt"].as_bool().unwrap(),
            special["bos_token"].as_str(),
            special["eos_token"].as_str(),
            kwargs,
        )
        .unwrap();
        assert_eq!(
            rendered,
            case["text"].as_str().unwrap(),
            "case {i} ({name})"
        );
    }
    // Without a `date_string`, Llama 3.2's template asks `strftime_now` for today's date, as
    // transformers provides it, instead of its fixed fallback.
    let template = std::fs::read_to_string(site.join("llama3_2.jinja")).unwrap();
    let user = [ember_llm::Message::new("user", "Hi")];
    let text = ember_llm::render_chat_with(&template, &user, true, None, None, &Default::default())
        .unwrap();
    let today = chrono::Local::now().format("%d %b %Y").to_string();
    assert!(text.contains(&format!("Today Date: {today}\n")), "{text}");
}
