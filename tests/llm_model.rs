//! The LLM against the reference library: logits of random tiny Llama and Qwen2 checkpoints
//! saved by `transformers` (fixtures made by `scripts/make_llm_fixtures.py`), cached decoding
//! against the full forward, sampling log-probs against rescoring, export round trips.

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_llm::left_pad;
use ember_llm::{SamplingConfig, Scoring, generate, load};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm")
        .join(name)
}

#[derive(serde::Deserialize)]
struct LogitsFixture {
    tokens: Vec<Vec<i64>>,
    mask: Vec<Vec<f32>>,
    logits: Vec<Vec<Vec<f32>>>,
}

fn check_logits(name: &str) {
    let dir = fixture(name);
    let loaded = load(&dir, &dev()).expect("load tiny checkpoint");
    let fx: LogitsFixture =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    let (b, t) = (fx.tokens.len(), fx.tokens[0].len());
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(fx.tokens.concat(), [b, t]), &dev());
    let mask = Tensor::<2>::from_data(TensorData::new(fx.mask.concat(), [b, t]), &dev());
    let logits = vals(loaded.model.forward(tokens, mask));
    let v = fx.logits[0][0].len();
    let mut worst = 0f32;
    for r in 0..b {
        for p in 0..t {
            if fx.mask[r][p] == 0.0 {
                continue;
            }
            for k in 0..v {
                let d = (logits[(r * t + p) * v + k] - fx.logits[r][p][k]).abs();
                worst = worst.max(d);
            }
        }
    }
    eprintln!("{name}: max |logit − reference| = {worst:e}");
    assert!(
        worst <= 1e-4,
        "{name}: logits differ from transformers by {worst}"
    );
}

#[test]
fn tiny_llama_matches_transformers() {
    check_logits("tiny_llama");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_logits("tiny_qwen2");
}

/// The largest |sampler log-prob − rescored log-prob| over the response tokens of `g`, rescoring
/// prompt + response with a full forward at `temperature`.
fn rescoring_gap(model: &ember_llm::Llama, g: &ember_llm::Generation, temperature: f32) -> f32 {
    let (seq, mask) = g.sequences();
    let (lp, _) = model.token_log_probs(seq, mask, temperature, false, true);
    let [rows, total] = lp.dims();
    let new = g.tokens.dims()[1];
    let rescored = vals(lp.slice([0..rows, total - new..total]));
    let sampled = vals(g.log_probs.clone());
    let m = vals(g.mask.clone());
    rescored
        .iter()
        .zip(&sampled)
        .zip(&m)
        .filter(|(_, m)| **m > 0.0)
        .map(|((a, b), _)| (a - b).abs())
        .fold(0f32, f32::max)
}

#[test]
fn cached_decode_matches_full_forward_and_rescoring() {
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let model = &loaded.model;
    // Two prompts of different lengths (left padding), 3 samples each, sampled at T = 0.7.
    let prompts = vec![vec![5u32, 17, 33], vec![3u32, 9, 27, 81, 44, 12]];
    let cfg = SamplingConfig {
        temperature: 0.7,
        max_new_tokens: 9,
        n: 3,
        seed: 11,
        ..SamplingConfig::default()
    };
    let g = generate(model, &prompts, &cfg, &dev()).unwrap();
    assert_eq!(g.group_ids, vec![0, 0, 0, 1, 1, 1]);
    let worst = rescoring_gap(model, &g, 0.7);
    eprintln!("sampling vs rescoring: max |Δ log-prob| = {worst:e}");
    assert!(
        worst <= 1e-4,
        "sampler log-probs differ from rescoring by {worst}"
    );
    // Same seed, same samples; another seed, other samples.
    let again = generate(model, &prompts, &cfg, &dev()).unwrap();
    assert_eq!(g.response_ids(), again.response_ids());
    let other = generate(
        model,
        &prompts,
        &SamplingConfig {
            seed: 12,
            ..cfg.clone()
        },
        &dev(),
    )
    .unwrap();
    assert_ne!(g.response_ids(), other.response_ids());
}

/// A KV cache that grows as positions are written (`KvCache::growing_to`) decodes as one
/// preallocated at the full length: the same logits at every step; and batched sampling whose
/// cache grows (8-position buckets, 50 new tokens from room for 32) keeps its log-probs equal
/// to rescoring.
#[test]
fn a_growing_cache_decodes_as_a_preallocated_one() {
    use ember_llm::cache::KvCache;
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let model = &loaded.model;
    let ids = |v: &[i64]| {
        let n = v.len();
        Tensor::<2, Int>::from_data(TensorData::new(v.to_vec(), [2, n / 2]), &dev())
    };
    let prompt = ids(&[5, 17, 33, 4, 3, 9, 27, 81]);
    let decode = |mut cache: KvCache| {
        let mut out = vec![vals(model.forward_cached(
            prompt.clone(),
            Tensor::ones([2, 4], &dev()),
            &mut cache,
        ))];
        for s in 0..7i64 {
            let tok = ids(&[(s * 7 + 3) % 50, (s * 11 + 5) % 50]);
            out.push(vals(model.forward_cached(
                tok,
                Tensor::ones([2, 1], &dev()),
                &mut cache,
            )));
        }
        (out, cache.capacity())
    };
    let shape = model.cache_shape();
    let (want, full) = decode(KvCache::new(shape, 2, 11, &dev()));
    let (got, grown) = decode(KvCache::new(shape, 2, 5, &dev()).growing_to(11, 1));
    assert_eq!((full, grown), (11, 11));
    for (a, b) in want.iter().zip(&got) {
        assert!(max_abs_diff(a, b) <= 1e-6, "{}", max_abs_diff(a, b));
    }
    let prompts = vec![vec![5u32, 17, 33], vec![3u32, 9, 27, 81, 44, 12]];
    let cfg = SamplingConfig {
        temperature: 0.7,
        max_new_tokens: 50,
        n: 3,
        seed: 11,
        cache_bucket: 8,
        stop_tokens: vec![],
        ..SamplingConfig::default()
    };
    let g = generate(model, &prompts, &cfg, &dev()).unwrap();
    assert_eq!(g.tokens.dims()[1], 50);
    let worst = rescoring_gap(model, &g, 0.7);
    assert!(
        worst <= 1e-4,
        "sampler log-probs differ from rescoring by {worst}"
    );
}

#[test]
fn greedy_cached_logits_equal_full_forward_logits() {
    let loaded = load(&fixture("tiny_qwen2"), &dev()).unwrap();
    let model = &loaded.model;
    let prompts = vec![vec![8u32, 16, 24], vec![1u32, 2, 3, 4, 5]];
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: 6,
        ..SamplingConfig::default()
    };
    let g = generate(model, &prompts, &cfg, &dev()).unwrap();
    // Greedy: each token is the argmax of the full forward's logits at the previous position.
    let (seq, mask) = g.sequences();
    let [rows, total] = seq.dims();
    let logits = model.forward(seq.clone(), mask);
    let v = logits.dims()[2];
    let argmax = vals(
        logits
            .slice([0..rows, 0..total - 1, 0..v])
            .argmax(2)
            .float()
            .reshape([rows, total - 1]),
    );
    let toks = vals(seq.float());
    let new = g.tokens.dims()[1];
    for r in 0..rows {
        for j in total - new..total {
            assert_eq!(
                argmax[r * (total - 1) + j - 1],
                toks[r * total + j],
                "row {r} position {j}"
            );
        }
    }
}

/// Greedy decoding (temperature 0) reports its log-probs at `scoring_temperature()` = 1, and a
/// trainer rescoring at that temperature agrees with them (the RL job rescores this way).
#[test]
fn greedy_log_probs_agree_with_rescoring_at_the_scoring_temperature() {
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let model = &loaded.model;
    let prompts = vec![vec![5u32, 17, 33], vec![3u32, 9]];
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: 6,
        ..SamplingConfig::default()
    };
    assert_eq!(cfg.scoring_temperature(), 1.0);
    let g = generate(model, &prompts, &cfg, &dev()).unwrap();
    let worst = rescoring_gap(model, &g, cfg.scoring_temperature());
    assert!(
        worst <= 1e-4,
        "greedy log-probs differ from rescoring by {worst}"
    );
    // Log-probs of the model's own distribution, not the ≈ 0 of a near-zero temperature.
    let sampled = vals(g.log_probs.clone());
    assert!(sampled.iter().any(|x| *x < -1e-2), "{sampled:?}");
}

#[test]
fn stop_tokens_truncation_and_top_k() {
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let model = &loaded.model;
    let prompts = vec![vec![5u32, 17]];
    // Find the greedy continuation, then stop on its third token.
    let greedy = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: 5,
        ..SamplingConfig::default()
    };
    let g = generate(model, &prompts, &greedy, &dev()).unwrap();
    let ids = g.response_ids()[0].clone();
    assert_eq!(ids.len(), 5);
    assert_eq!(g.truncated, vec![true]);
    let stop = SamplingConfig {
        stop_tokens: vec![ids[2]],
        ..greedy.clone()
    };
    let s = generate(model, &prompts, &stop, &dev()).unwrap();
    let first = ids.iter().position(|t| *t == ids[2]).unwrap();
    assert_eq!(s.response_ids()[0], ids[..=first].to_vec());
    assert_eq!(s.truncated, vec![false]);
    // top-k = 1 at any temperature is greedy.
    let k1 = SamplingConfig {
        temperature: 1.3,
        top_k: 1,
        seed: 3,
        ..greedy.clone()
    };
    assert_eq!(
        generate(model, &prompts, &k1, &dev())
            .unwrap()
            .response_ids()[0],
        ids
    );
    // A tiny top-p keeps only the most likely token too.
    let p = SamplingConfig {
        temperature: 1.0,
        top_p: 1e-6,
        seed: 4,
        ..greedy.clone()
    };
    assert_eq!(
        generate(model, &prompts, &p, &dev())
            .unwrap()
            .response_ids()[0],
        ids
    );
    let mp = SamplingConfig {
        temperature: 1.0,
        min_p: 0.999,
        seed: 5,
        ..greedy
    };
    assert_eq!(
        generate(model, &prompts, &mp, &dev())
            .unwrap()
            .response_ids()[0],
        ids
    );
}

/// Hostile model directories: a sharded index naming a file outside the model directory, a
/// config declaring absurd sizes, and a chat template that would run for ever are errors.
#[test]
fn hostile_model_files_are_errors() {
    let dir = std::env::temp_dir().join(format!("ember-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for shard in ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors"] {
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            format!("{{\"weight_map\": {{\"w\": {shard:?}}}}}"),
        )
        .unwrap();
        let e = ember_llm::SafetensorsSource::open_dir(&dir)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a file name inside"), "{shard}: {e}");
    }
    let cfg = ember_llm::LlamaConfig::new(ember_llm::Family::Llama, 32, 8, 16, 1 << 40, 2, 2);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("num_hidden_layers"), "{e}");
    let endless = "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}";
    let t0 = std::time::Instant::now();
    let e = ember_llm::render_chat(endless, &[], false, None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("fuel"), "{e}");
    assert!(t0.elapsed().as_secs_f64() < 30.0);
    // A template's malformed `strftime_now` format is an error naming it, not a panic.
    let e = ember_llm::render_chat("{{ strftime_now('%Q %') }}", &[], false, None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`%Q %` is not a strftime format"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_inputs_are_clear_errors() {
    // A max_new_tokens so large that prompt + it wraps around is an error, not a panic.
    {
        let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
        let cfg = SamplingConfig {
            max_new_tokens: usize::MAX,
            ..SamplingConfig::default()
        };
        let e = generate(&loaded.model, &[vec![5u32, 17]], &cfg, &dev())
            .unwrap_err()
            .to_string();
        assert!(e.contains("exceeds the context"), "{e}");
    }
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let m = &loaded.model;
    let cfg = SamplingConfig::default();
    let e = generate(m, &[], &cfg, &dev()).unwrap_err().to_string();
    assert!(e.contains("no prompts"), "{e}");
    let e = generate(m, &[vec![]], &cfg, &dev())
        .unwrap_err()
        .to_string();
    assert!(e.contains("prompt 0 is empty"), "{e}");
    let e = generate(m, &[vec![1; 60]], &cfg, &dev())
        .unwrap_err()
        .to_string();
    assert!(e.contains("exceeds the context of 64"), "{e}");
    let e = generate(m, &[vec![500]], &cfg, &dev())
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let e = generate(m, &[vec![1]], &SamplingConfig { top_p: 0.0, ..cfg }, &dev())
        .unwrap_err()
        .to_string();
    assert!(e.contains("top_p"), "{e}");
    let e = load(Path::new("/nonexistent/model"), &dev())
        .unwrap_err()
        .to_string();
    assert!(e.contains("nonexistent"), "{e}");
    let tmp = std::env::temp_dir().join(format!("ember-bad-config-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let base = std::fs::read_to_string(fixture("tiny_llama/config.json")).unwrap();
    for (from, to, expect) in [
        (
            "\"model_type\": \"llama\"",
            "\"model_type\": \"gpt2\"",
            "`gpt2` is not supported",
        ),
        (
            "\"hidden_act\": \"silu\"",
            "\"hidden_act\": \"gelu\"",
            "hidden_act",
        ),
        ("\"vocab_size\": 96", "\"vocab_size\": 97", "shape"),
    ] {
        std::fs::write(tmp.join("config.json"), base.replace(from, to)).unwrap();
        std::fs::copy(
            fixture("tiny_llama/model.safetensors"),
            tmp.join("model.safetensors"),
        )
        .unwrap();
        let e = load(&tmp, &dev()).unwrap_err().to_string();
        assert!(e.contains(expect), "{from} → {to}: {e}");
    }
    std::fs::write(tmp.join("config.json"), "{ not json").unwrap();
    assert!(
        load(&tmp, &dev())
            .unwrap_err()
            .to_string()
            .contains("config.json")
    );
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn export_to_hf_and_reload_gives_the_same_logits() {
    let loaded = load(&fixture("tiny_qwen2"), &dev()).unwrap();
    let out = std::env::temp_dir().join(format!("ember-export-{}", std::process::id()));
    ember_llm::save_hf(&loaded.model, &loaded.config, &loaded.eos_ids, &out).unwrap();
    let again = load(&out, &dev()).unwrap();
    assert_eq!(again.config, loaded.config);
    let (toks, mask) = left_pad(&[vec![4, 8, 15, 16, 23, 42]], &dev());
    let a = vals(loaded.model.forward(toks.clone(), mask.clone()));
    let b = vals(again.model.forward(toks, mask));
    assert_eq!(a, b);
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn inverse_cdf_sampler_draws_from_the_distribution() {
    use ember_engine::SplitMix64;
    use ember_llm::sample_rows;
    // p = [0.1, 0.2, 0.3, 0.4, 0] (last entry −inf): 4000 rows of one draw each.
    let p = [0.1f32, 0.2, 0.3, 0.4];
    let rows = 4000;
    let mut lp = Vec::new();
    for _ in 0..rows {
        lp.extend(p.iter().map(|x| x.ln()));
        lp.push(f32::NEG_INFINITY);
    }
    let lp = Tensor::<2>::from_data(TensorData::new(lp, [rows, 5]), &dev());
    let draws = vals(sample_rows(lp, &mut SplitMix64(9)).float());
    for (k, want) in p.iter().enumerate() {
        let freq = draws.iter().filter(|d| **d as usize == k).count() as f32 / rows as f32;
        // 4 standard errors of a binomial proportion at n = 4000.
        let se = (want * (1.0 - want) / rows as f32).sqrt();
        assert!(
            (freq - want).abs() < 4.0 * se,
            "token {k}: {freq} vs {want}"
        );
    }
    assert!(draws.iter().all(|d| *d < 4.0), "a −inf token was drawn");
}

#[test]
fn sharded_safetensors_load_like_a_single_file() {
    let src = fixture("tiny_llama");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let dir = std::env::temp_dir().join(format!("ember-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        std::fs::write(
            dir.join(&file),
            safetensors::tensor::serialize(views, None).unwrap(),
        )
        .unwrap();
        for n in part {
            map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let a = load(&src, &dev()).unwrap().model;
    let b = load(&dir, &dev()).unwrap().model;
    let (toks, mask) = left_pad(&[vec![4, 8, 15, 16, 23, 42]], &dev());
    assert_eq!(
        vals(a.forward(toks.clone(), mask.clone())),
        vals(b.forward(toks, mask))
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Mixed precision (`Precision::Bf16`, autocast style): logits stay f32 and within bf16
/// rounding of the f32 model's; cached bf16 decoding matches the bf16 full forward; the
/// parameters, their gradients and so the optimizer state stay f32.
#[test]
fn bf16_autocast_matches_f32_within_bf16_rounding() {
    use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
    use burn::tensor::DType;
    use ember_train::Precision;
    let dir = fixture("tiny_llama");
    let f32_model = load(&dir, &dev()).unwrap().model;
    let bf16_model = load(&dir, &dev())
        .unwrap()
        .model
        .with_precision(Precision::Bf16);
    let (toks, mask) = left_pad(&[vec![4, 8, 15, 16, 23, 42], vec![7, 9, 11]], &dev());
    let a = f32_model.forward(toks.clone(), mask.clone());
    let b = bf16_model.forward(toks.clone(), mask.clone());
    assert_eq!(
        b.dtype(),
        DType::F32,
        "logits must be f32 under mixed precision"
    );
    let (a, b) = (vals(a), vals(b));
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    // bf16 keeps 8 significant bits (relative rounding 2^-9 per product input).
    eprintln!("bf16 vs f32 logits: max |diff| {d:.2e}, max |logit| {scale:.2e}");
    assert!(d > 0.0, "bf16 path was not taken");
    assert!(
        d < 0.03 * scale.max(1.0),
        "bf16 vs f32 logits differ by {d} (scale {scale})"
    );

    // Cached decoding under bf16 against the bf16 full forward.
    let prompts = vec![vec![4u32, 8, 15, 16], vec![23, 42]];
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: 5,
        ..SamplingConfig::default()
    };
    let g = generate(&bf16_model, &prompts, &cfg, &dev()).unwrap();
    let (seq, seq_mask) = g.sequences();
    let (lp, _) = bf16_model.token_log_probs(seq, seq_mask, 1.0, false, true);
    let [rows, t] = lp.dims();
    let n = g.tokens.dims()[1];
    let rescored = vals(lp.slice([0..rows, t - n..t]) * g.mask.clone());
    let sampled = vals(g.log_probs.clone() * g.mask.clone());
    let d = rescored
        .iter()
        .zip(&sampled)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    eprintln!("bf16 cached decode vs bf16 rescoring: max |diff| {d:.2e}");
    assert!(
        d < 0.05,
        "bf16 cached decode vs full forward log-probs differ by {d}"
    );

    // One training step: f32 gradients and parameters.
    let ad = dev().autodiff();
    let model = load(&dir, &ad)
        .unwrap()
        .model
        .with_precision(Precision::Bf16);
    let (toks, mask) = left_pad(&[vec![4, 8, 15, 16, 23, 42]], &ad);
    let (lp, _) = model.token_log_probs(toks, mask, 1.0, false, true);
    assert_eq!(lp.dtype(), DType::F32);
    let loss = lp.sum().neg();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let mut optim: ModuleOptimizer = AdamWConfig::new().init();
    let model = optim.step(1e-3, model, grads);
    let w = model.embed_tokens.weight.val();
    assert_eq!(w.dtype(), DType::F32, "parameters must stay f32");
    assert!(vals(w).iter().all(|x| x.is_finite()));
    assert_eq!(model.precision(), Precision::Bf16);
}

/// The fused attention op (multi-token passes) gives the explicit path's logits, cached
/// decoding after a fused prefill gives the same tokens and log-probs, and gradients flow.
#[test]
fn fused_attention_matches_the_explicit_path() {
    let dir = fixture("tiny_llama");
    let plain = load(&dir, &dev()).unwrap().model;
    let fused = load(&dir, &dev()).unwrap().model.with_fused_attention(true);
    assert!(fused.fused_attention());
    let (toks, mask) = left_pad(&[vec![4, 8, 15, 16, 23, 42], vec![7, 9, 11]], &dev());
    let a = vals(plain.forward(toks.clone(), mask.clone()));
    let b = vals(fused.forward(toks, mask));
    let d = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(d < 1e-4, "fused vs explicit logits differ by {d}");
    let prompts = vec![vec![4u32, 8, 15, 16], vec![23, 42]];
    let cfg = SamplingConfig {
        temperature: 1.0,
        seed: 4,
        max_new_tokens: 5,
        ..SamplingConfig::default()
    };
    let g1 = generate(&plain, &prompts, &cfg, &dev()).unwrap();
    let g2 = generate(&fused, &prompts, &cfg, &dev()).unwrap();
    assert_eq!(g1.response_ids(), g2.response_ids());
    let (x, y) = (vals(g1.log_probs), vals(g2.log_probs));
    let d = x
        .iter()
        .zip(&y)
        .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
    assert!(d < 1e-4, "sampler log-probs differ by {d}");
    let ad = dev().autodiff();
    let model = load(&dir, &ad).unwrap().model.with_fused_attention(true);
    let (toks, mask) = left_pad(&[vec![4, 8, 15, 16, 23, 42]], &ad);
    let (lp, _) = model.token_log_probs(toks, mask, 1.0, false, true);
    let grads = lp.sum().backward();
    let g = model.layers[0]
        .self_attn
        .q_proj
        .weight
        .grad(&grads)
        .unwrap();
    assert!(
        vals(g.abs().sum())
            .iter()
            .all(|x| *x > 0.0 && x.is_finite())
    );
}

/// `chosen_log_probs` (gather − logsumexp) against hand-worked log-softmax values (the numbers
/// come from `math.log`/`math.exp` in Python, shown in the comments), with temperature, entropy
/// and a far-out logit.
#[test]
fn chosen_log_probs_match_hand_worked_log_softmax() {
    use ember_llm::chosen_log_probs;
    // Rows: [1, 2, 3] and [-1000, 0, 5]; targets per position.
    let logits = Tensor::<3>::from_data(
        TensorData::new(vec![1.0f32, 2.0, 3.0, -1000.0, 0.0, 5.0], [1, 2, 3]),
        &dev(),
    );
    let pick =
        |t: [i64; 2]| Tensor::<2, Int>::from_data(TensorData::new(t.to_vec(), [1, 2]), &dev());
    // T = 1: log softmax([1,2,3]) = [-2.4076060, -1.4076060, -0.4076060]; entropy 0.8323956.
    let (lp, h) = chosen_log_probs(logits.clone(), pick([0, 2]), 1.0, true);
    assert_close(&vals(lp), &[-2.407_605_96, -0.006_715_348_5], 1e-5);
    // Entropy of softmax([-1000, 0, 5]) = 0.0401 (p = [0, 0.0066929, 0.9933071]).
    let h2 =
        -(0.006_692_850_9f64 * 0.006_692_850_9f64.ln() + 0.993_307_149f64 * 0.993_307_149f64.ln());
    assert_close(&vals(h.unwrap()), &[0.832_395_58, h2], 1e-5);
    // T = 2: log softmax([0.5, 1, 1.5]) = [-1.6802697, -1.1802697, -0.6802697]; entropy 1.0201913.
    // T = 0.5: log softmax([-2000, 0, 10]) = [-2010.0000454, -10.0000454, -4.54e-5].
    let (lp2, h2) = chosen_log_probs(
        logits.clone().slice([0..1, 0..1, 0..3]),
        pick([1, 0]).slice([0..1, 0..1]),
        2.0,
        true,
    );
    assert_close(&vals(lp2), &[-1.180_269_67], 1e-5);
    assert_close(&vals(h2.unwrap()), &[1.020_191_34], 1e-5);
    let (lp3, _) = chosen_log_probs(
        logits.slice([0..1, 1..2, 0..3]),
        pick([0, 1]).slice([0..1, 0..1]),
        0.5,
        false,
    );
    assert_close(&vals(lp3), &[-2_010.000_045], 1e-2);
}

/// `last_log_probs` scores only the last n tokens (head and softmax on n positions) and equals
/// the matching columns of the whole-sequence `token_log_probs`, with entropy.
#[test]
fn last_log_probs_equal_the_tail_of_token_log_probs() {
    let model = ember_llm::load(&fixture("tiny_llama"), &dev())
        .unwrap()
        .model;
    let (toks, mask) = left_pad(&[vec![5, 17, 33, 61, 7, 2], vec![3, 9, 12]], &dev());
    let (all, all_h) = model.token_log_probs(toks.clone(), mask.clone(), 0.8, true, true);
    let (tail, tail_h) = model.last_log_probs(
        toks,
        mask,
        2,
        Scoring {
            temperature: 0.8,
            entropy: true,
            adapters: true,
        },
    );
    let cut = |t: burn::tensor::Tensor<2>| vals(t.slice([0..2, 3..5]));
    let exp: Vec<f64> = cut(all).iter().map(|x| f64::from(*x)).collect();
    assert_close(&vals(tail), &exp, 1e-5);
    let exp_h: Vec<f64> = cut(all_h.unwrap()).iter().map(|x| f64::from(*x)).collect();
    assert_close(&vals(tail_h.unwrap()), &exp_h, 1e-5);
}

/// With n > 1 samples per prompt, each distinct prompt is prefilled once and its KV cache rows
/// repeated: the samples must equal those of the same prompts listed n times with n = 1 (each
/// row prefilled on its own), same seed.
#[test]
fn shared_prompt_prefill_matches_per_row_prefill() {
    let model = load(&fixture("tiny_llama"), &dev()).unwrap().model;
    let prompts = vec![vec![5u32, 17, 33], vec![3u32], vec![61u32, 7]];
    let cfg = SamplingConfig {
        temperature: 1.0,
        max_new_tokens: 6,
        n: 3,
        seed: 11,
        ..SamplingConfig::default()
    };
    let shared = generate(&model, &prompts, &cfg, &dev()).unwrap();
    let listed: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), 3))
        .collect();
    let one = SamplingConfig { n: 1, ..cfg };
    let per_row = generate(&model, &listed, &one, &dev()).unwrap();
    assert_eq!(shared.group_ids, vec![0, 0, 0, 1, 1, 1, 2, 2, 2]);
    assert_eq!(shared.response_ids(), per_row.response_ids());
    let lp: Vec<f64> = vals(per_row.log_probs)
        .iter()
        .map(|x| f64::from(*x))
        .collect();
    assert_close(&vals(shared.log_probs), &lp, 1e-5);
    assert_eq!(
        vals(shared.prompt_mask),
        vals(per_row.prompt_mask),
        "prompt columns"
    );
}

/// Gradients of the summed `token_log_probs` (gather − logsumexp, GQA without repeated K/V,
/// flipped RoPE) against burn's `log_softmax` + `gather` on the full logits, and a central
/// finite difference through the attention projections.
#[test]
fn token_log_prob_gradients_match_log_softmax_and_finite_differences() {
    use burn::tensor::activation::log_softmax;
    let device = dev().autodiff();
    let model = load(&fixture("tiny_llama"), &device).unwrap().model;
    let (toks, mask) = left_pad(&[vec![5, 17, 33, 61, 7, 2], vec![3, 9, 12]], &device);
    let [b, t] = toks.dims();
    let ours = |m: &ember_llm::Llama| {
        let (lp, _) = m.token_log_probs(toks.clone(), mask.clone(), 0.9, false, true);
        (lp * mask.clone().slice([0..b, 1..t])).sum()
    };
    let reference = |m: &ember_llm::Llama| {
        let logits = m.forward(toks.clone(), mask.clone());
        let v = logits.dims()[2];
        let lp = log_softmax(logits.slice([0..b, 0..t - 1, 0..v]) / 0.9, 2);
        let picked = lp
            .gather(2, toks.clone().slice([0..b, 1..t]).reshape([b, t - 1, 1]))
            .reshape([b, t - 1]);
        (picked * mask.clone().slice([0..b, 1..t])).sum()
    };
    let (a, r) = (ours(&model), reference(&model));
    assert_close(&vals(a.clone()), &[f64::from(vals(r.clone())[0])], 1e-4);
    let (ga, gr) = (a.backward(), r.backward());
    let w = |m: &ember_llm::Llama| m.layers[0].self_attn.q_proj.weight.val();
    let k = |m: &ember_llm::Llama| m.layers[1].self_attn.k_proj.weight.val();
    for (name, p) in [("q_proj", w(&model)), ("k_proj", k(&model))] {
        let (x, y) = (vals(p.grad(&ga).unwrap()), vals(p.grad(&gr).unwrap()));
        let y: Vec<f64> = y.iter().map(|v| f64::from(*v)).collect();
        eprintln!(
            "{name}: |grad| max {:e}",
            y.iter().fold(0f64, |m, v| m.max(v.abs()))
        );
        assert_close(&x, &y, 1e-4);
    }
    // Central difference on one q_proj and one k_proj entry (f64 accumulation of f32 sums).
    let base = load(&fixture("tiny_llama"), &dev()).unwrap().model;
    let (toks2, mask2) = left_pad(&[vec![5, 17, 33, 61, 7, 2], vec![3, 9, 12]], &dev());
    let loss = |m: &ember_llm::Llama| {
        let (lp, _) = m.token_log_probs(toks2.clone(), mask2.clone(), 0.9, false, true);
        let lp = vals(lp * mask2.clone().slice([0..b, 1..t]));
        lp.iter().map(|x| f64::from(*x)).sum::<f64>()
    };
    for (layer, which, idx) in [(0usize, "q", 37usize), (1, "k", 5)] {
        let eps = 1e-2f32;
        let shifted = |delta: f32| {
            let mut m = base.clone();
            let lin = if which == "q" {
                &mut m.layers[layer].self_attn.q_proj
            } else {
                &mut m.layers[layer].self_attn.k_proj
            };
            let wv = lin.weight.val();
            let dims = wv.dims();
            let mut data = vals(wv);
            data[idx] += delta;
            let t = burn::tensor::Tensor::<2>::from_data(
                burn::tensor::TensorData::new(data, dims),
                &dev(),
            );
            lin.weight = burn::module::Param::from_tensor(t);
            loss(&m)
        };
        let fd = (shifted(eps) - shifted(-eps)) / (2.0 * f64::from(eps));
        let p = if which == "q" { w(&model) } else { k(&model) };
        let g = f64::from(vals(p.grad(&ga).unwrap())[idx]);
        eprintln!("{which}_proj[{idx}] layer {layer}: autodiff {g:.5}, finite difference {fd:.5}");
        assert!((g - fd).abs() <= 2e-2 * g.abs().max(0.1), "{g} vs {fd}");
    }
}

/// Projections fold the batch into the rows of one product (`rows_linear`), so a weight's
/// gradient is one `[d_in, rows]·[rows, d_out]` product. With 16 positions per row (where burn's
/// own `linear` would keep a batched product over a broadcast weight), the gradient of a
/// two-row batch must equal the sum of the two rows' gradients, each taken alone.
#[test]
fn weight_gradients_of_a_batch_are_the_sum_of_its_rows() {
    let device = dev().autodiff();
    let model = load(&fixture("tiny_llama"), &device).unwrap().model;
    let rows: Vec<Vec<u32>> = vec![
        (0..16).map(|i| (i * 7 + 3) % 60 + 1).collect(),
        (0..16).map(|i| (i * 11 + 5) % 60 + 1).collect(),
    ];
    let grad_of = |rs: &[Vec<u32>]| {
        let (toks, mask) = left_pad(rs, &device);
        let (lp, _) = model.token_log_probs(toks, mask, 1.0, false, true);
        let g = lp.sum().backward();
        let w = |m: &ember_llm::Llama| m.layers[0].mlp.up_proj.weight.val();
        let o = |m: &ember_llm::Llama| m.layers[1].self_attn.o_proj.weight.val();
        (
            vals(w(&model).grad(&g).unwrap()),
            vals(o(&model).grad(&g).unwrap()),
        )
    };
    let (up, o) = grad_of(&rows);
    let (up0, o0) = grad_of(&rows[..1]);
    let (up1, o1) = grad_of(&rows[1..]);
    for (name, both, a, b) in [("up_proj", up, up0, up1), ("o_proj", o, o0, o1)] {
        let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| f64::from(x + y)).collect();
        let scale = sum.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(
            scale > 1e-3,
            "{name}: gradient too small to compare ({scale})"
        );
        let err = both
            .iter()
            .zip(&sum)
            .fold(0f64, |m, (x, y)| m.max((f64::from(*x) - y).abs()));
        assert!(err <= 1e-5 * scale.max(1.0), "{name}: max error {err}");
    }
}

#[test]
fn finished_rows_leave_the_decode_batch_without_changing_what_is_drawn() {
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let model = &loaded.model;
    // Three prompts of different lengths, 4 samples each; two stop tokens end rows at
    // different steps, and a check after every step drops them as soon as a quarter are done.
    let prompts = vec![
        vec![5u32, 17, 33],
        vec![3u32, 9, 27, 81, 44, 12],
        vec![7u32],
    ];
    // A prompt bucket keeps a multiple of 8 rows (finished rows fill it, masked).
    for (temperature, top_k, prompt_bucket) in [(1.3, 0, 0), (0.9, 20, 0), (0.0, 0, 0), (1.3, 0, 4)]
    {
        let cfg = SamplingConfig {
            temperature,
            top_k,
            prompt_bucket,
            max_new_tokens: 24,
            n: 4,
            seed: 5,
            stop_tokens: vec![3, 7, 11, 40],
            stop_check_every: 1,
            ..SamplingConfig::default()
        };
        let shrunk = generate(model, &prompts, &cfg, &dev()).unwrap();
        // An observer keeps every row in the batch to the end.
        let mut keep_all = |_: &[Vec<u32>]| true;
        let whole =
            ember_llm::generate_observed(model, &prompts, &cfg, &dev(), Some(&mut keep_all))
                .unwrap();
        let ids = shrunk.response_ids();
        assert_eq!(ids, whole.response_ids(), "T = {temperature}");
        assert_eq!(shrunk.truncated, whole.truncated);
        assert_eq!(shrunk.tokens.dims(), whole.tokens.dims());
        let vec = |t: &Tensor<2>| t.clone().try_into_vec_as::<f32>().unwrap();
        assert_eq!(vec(&shrunk.mask), vec(&whole.mask));
        let gap = vec(&shrunk.log_probs)
            .iter()
            .zip(vec(&whole.log_probs))
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(gap <= 1e-5, "log-prob gap {gap} at T = {temperature}");
        // Rows did finish early, and the shrunk batch computed fewer positions.
        let [rows, steps] = whole.tokens.dims();
        assert_eq!(whole.decode_positions, rows * steps);
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        assert!(lengths.iter().any(|l| *l < steps), "{lengths:?}");
        assert!(
            shrunk.decode_positions < whole.decode_positions,
            "{} of {}",
            shrunk.decode_positions,
            whole.decode_positions
        );
        assert!(shrunk.decode_positions >= lengths.iter().sum::<usize>());
        assert!(rescoring_gap(model, &shrunk, cfg.scoring_temperature()) <= 1e-4);
    }
}

/// `target_log_probs` with the next tokens as targets equals `token_log_probs` (right padding,
/// two rows of different lengths), and a target that is not the next token is scored at its
/// own position.
#[test]
fn target_log_probs_equal_next_token_scoring() {
    let loaded = load(&fixture("tiny_llama"), &dev()).unwrap();
    let model = &loaded.model;
    let rows = [vec![5i64, 17, 33, 8, 2], vec![3i64, 9, 27, 0, 0]];
    let mask_rows = [[1.0f32, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]];
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(rows.concat(), [2, 5]), &dev());
    let mask = Tensor::<2>::from_data(TensorData::new(mask_rows.concat(), [2, 5]), &dev());
    let how = Scoring {
        temperature: 1.0,
        entropy: false,
        adapters: true,
    };
    let (next, _) = model.token_log_probs(tokens.clone(), mask.clone(), 1.0, false, true);
    let mut shifted: Vec<i64> = rows
        .iter()
        .flat_map(|r| r[1..].iter().copied().chain([0]))
        .collect();
    let targets = Tensor::<2, Int>::from_data(TensorData::new(shifted.clone(), [2, 5]), &dev());
    let (lp, _) = model.target_log_probs(tokens.clone(), mask.clone(), targets, how);
    let (next, lp) = (vals(next), vals(lp));
    for (r, len) in [(0usize, 5usize), (1, 3)] {
        for p in 0..len - 1 {
            let d = (lp[r * 5 + p] - next[r * 4 + p]).abs();
            assert!(d <= 1e-5, "row {r} position {p}: {d}");
        }
    }
    // Another target at position 1 of row 0: its log-prob differs, the others do not move.
    shifted[1] = 40;
    let targets = Tensor::<2, Int>::from_data(TensorData::new(shifted, [2, 5]), &dev());
    let (other, _) = model.target_log_probs(tokens, mask, targets, how);
    let other = vals(other);
    assert!((other[1] - lp[1]).abs() > 1e-3);
    assert!((other[0] - lp[0]).abs() <= 1e-6 && (other[2] - lp[2]).abs() <= 1e-6);
}

/// `shared_token_log_probs` (each distinct prompt run once) equals `token_log_probs` on the same
/// rows, in values and in the gradient of the embedding: two prompts of different lengths
/// (left-padded to 4 columns), three rows on the first and one on the second, responses of
/// different lengths (right-padded).
#[test]
fn shared_token_log_probs_equal_the_unshared_pass() {
    let ad = dev().autodiff();
    let model = load(&fixture("tiny_llama"), &ad).unwrap().model;
    let rows: [[i64; 7]; 4] = [
        [5, 17, 33, 8, 2, 9, 0],
        [5, 17, 33, 8, 40, 0, 0],
        [5, 17, 33, 8, 7, 7, 3],
        [0, 0, 12, 6, 30, 31, 0],
    ];
    let masks: [[f32; 7]; 4] = [
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0],
        [1.0; 7],
        [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    ];
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(rows.concat(), [4, 7]), &ad);
    let mask = Tensor::<2>::from_data(TensorData::new(masks.concat(), [4, 7]), &ad);
    let how = Scoring {
        temperature: 1.0,
        entropy: true,
        adapters: true,
    };
    // Each position counts where it and the token it predicts are both real.
    let m = mask.clone().slice([0..4, 1..7]) * mask.clone().slice([0..4, 0..6]);
    let run = |shared: bool| {
        let (lp, ent) = if shared {
            model.shared_token_log_probs(tokens.clone(), mask.clone(), 4, how)
        } else {
            model.token_log_probs(tokens.clone(), mask.clone(), 1.0, true, true)
        };
        let grads = (lp.clone() * m.clone()).sum().backward();
        let g = model.embed_tokens.weight.grad(&grads).unwrap();
        (
            vals(lp * m.clone()),
            vals(ent.unwrap() * m.clone()),
            g.into_data().try_to_vec::<f32>().unwrap(),
        )
    };
    let (a, b) = (run(true), run(false));
    for (what, x, y) in [
        ("log-probs", &a.0, &b.0),
        ("entropies", &a.1, &b.1),
        ("embedding gradient", &a.2, &b.2),
    ] {
        let worst = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        eprintln!("shared vs unshared {what}: {worst:e}");
        assert!(worst <= 1e-5, "{what}: {worst}");
    }
}
