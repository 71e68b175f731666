//! `ember serve --tinker` against the real `tinker` SDK (0.38.0, in the virtual environment
//! `scripts/fetch_assets.sh` makes): `tests/tinker_client.py` runs a user's calls on SmolLM2
//! (forward, forward_backward with every loss, optim_step, a batch split into chunks that
//! arrive out of order, seeded sampling from the trained weights, prompt log-probs,
//! save_state and a resume with the optimizer, a sampling client over a saved adapter, an
//! alias and an unknown name, close), and
//! this test checks what the SDK saw against Ember's own numbers: the base model's log-probs,
//! one AdamW update computed directly, and each loss's formula on the returned log-probs.

mod common;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor, TensorData};
use common::http::Running;
use ember_llm::{Llama, LoraSettings, Scoring};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// The log-probs of each datum `(tokens, targets)` under `model`, one row each.
fn log_probs(
    model: &Llama,
    datums: &[(Vec<i64>, Vec<i64>)],
    dev: &burn::tensor::Device,
) -> Vec<Tensor<2>> {
    datums
        .iter()
        .map(|(x, y)| {
            let n = x.len();
            let tokens = Tensor::<2, Int>::from_data(TensorData::new(x.clone(), [1, n]), dev);
            let targets = Tensor::<2, Int>::from_data(TensorData::new(y.clone(), [1, n]), dev);
            let mask = Tensor::<2>::ones([1, n], dev);
            let how = Scoring {
                temperature: 1.0,
                entropy: false,
                adapters: true,
            };
            model.target_log_probs(tokens, mask, targets, how).0
        })
        .collect()
}

fn host(t: &Tensor<2>) -> Vec<f32> {
    t.to_data().try_to_vec::<f32>().unwrap()
}

fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    eprintln!("{what}: max difference {worst:e}");
    assert!(worst <= tol, "{what}: {a:?} vs {b:?}");
}

/// What the SDK saw, from the client script run against a fresh server.
fn run_client(gguf: &Path, python: &Path, dir: &Path) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.args(["serve", "--model"]).arg(gguf).args([
        "--served-model-name",
        "smol",
        "--port",
        "0",
        "--device",
        "cpu",
        "--tinker",
        "--tinker-max-chunk",
        "2",
        "--api-key",
        "tml-ember-test",
        "--alias",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "--tinker-dir",
    ]);
    c.arg(dir.join("ck")).stderr(Stdio::inherit());
    let server = Running::spawn(c);
    let out = dir.join("out.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tinker_client.py");
    let o = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{}", server.port))
        .args(["smol"])
        .arg(&out)
        .env("TINKER_TELEMETRY", "0")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the SDK script failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // One SIGTERM ends the server (its trainer lets go of the engine's queue).
    let mut server = server;
    server.signal("-TERM");
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed().as_secs() < 120,
            "the server did not stop after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

#[test]
fn the_tinker_sdk_trains_samples_and_resumes_against_ember() {
    let (Some(gguf), Some(python)) = (
        common::assets::smollm2(),
        common::assets::cached("tinker-py/bin/python"),
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ember-tinker-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = run_client(&gguf, &python, &dir);
    let models = serde_json::json!(["smol", "HuggingFaceTB/SmolLM2-135M-Instruct"]);
    assert_eq!(out["models"], models);
    assert_eq!(out["alias_model"], "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert!(
        out["unknown_model"]
            .as_str()
            .unwrap()
            .contains("is not served here")
    );
    assert_eq!(out["info_model"], "smol");

    // The fresh adapter (B = 0) leaves the base model: its log-probs are Ember's own.
    let ad = burn::tensor::Device::flex().autodiff();
    let base = ember_llm::load(&gguf, &ad).unwrap().model.no_grad();
    let datums: Vec<(Vec<i64>, Vec<i64>)> = out["datums"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (ints(&d[0]), ints(&d[1])))
        .collect();
    let weights: Vec<Vec<f32>> = out["datums"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| floats(&d[2]))
        .collect();
    let lp0: Vec<Vec<f32>> = log_probs(&base, &datums, &ad).iter().map(host).collect();
    let seen: Vec<Vec<f32>> = out["forward_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    for (i, (a, b)) in seen.iter().zip(&lp0).enumerate() {
        assert_close(&format!("forward log-probs, datum {i}"), a, b, 1e-4);
    }
    // loss:sum = −Σ w·log π, negative weights included.
    let ce: f32 = -seen
        .iter()
        .zip(&weights)
        .flat_map(|(l, w)| l.iter().zip(w).map(|(a, b)| a * b))
        .sum::<f32>();
    assert!((out["forward_loss"].as_f64().unwrap() as f32 - ce).abs() <= 1e-3 * ce.abs().max(1.0));

    // One SFT step computed here: the same adapters (seed 3, rank 8, α 32, every projection),
    // −Σ w·log π, AdamW at lr 1e-3 with β (0.9, 0.95) and ε 1e-8.
    ad.seed(3);
    let lora = LoraSettings {
        rank: 8,
        alpha: 32.0,
        ..LoraSettings::default()
    };
    let model = ember_llm::apply_lora(base, &lora).unwrap();
    let sft_w = [weights[0].clone(), vec![1.0; 3]];
    let lp = log_probs(&model, &datums, &ad);
    let loss = lp
        .iter()
        .zip(&sft_w)
        .map(|(l, w)| {
            let w = Tensor::<2>::from_data(TensorData::new(w.clone(), [1, w.len()]), &ad);
            l.clone().mul(w).sum().neg()
        })
        .reduce(|a, b| a + b)
        .unwrap();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let mut optim = ember_train::OptimizerConfig::default()
        .with_betas(0.9, 0.95)
        .with_epsilon(1e-8)
        .init();
    let (model, _) = optim.step(1e-3, model, grads);
    let after: Vec<Vec<f32>> = log_probs(&model, &datums, &ad).iter().map(host).collect();
    let seen: Vec<Vec<f32>> = out["after_one_step"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    for (i, (a, b)) in seen.iter().zip(&after).enumerate() {
        assert_close(&format!("log-probs after one step, datum {i}"), a, b, 1e-3);
    }
    let losses = floats(&out["sft_losses"]);
    assert!(losses[4] < 0.5 * losses[0], "SFT did not learn: {losses:?}");

    check_losses(&out);
    check_sampling_and_saves(&out, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each RL loss equals its formula on the log-probs the server returned, with the script's
/// sampler log-probs q and advantages.
fn check_losses(out: &Value) {
    let q = floats(&out["rl_q"]);
    let a = [0.0f32, 1.0, -1.0, 2.0, 0.5];
    let rl = &out["rl"];
    let lp = floats(&rl["importance_sampling"]["logprobs"]);
    let r: Vec<f32> = lp.iter().zip(&q).map(|(l, q)| (l - q).exp()).collect();
    let sum = |f: &dyn Fn(usize) -> f32| -(0..5).map(f).sum::<f32>();
    let expected = [
        ("importance_sampling", sum(&|i| r[i] * a[i])),
        (
            "ppo",
            sum(&|i| (r[i] * a[i]).min(r[i].clamp(0.9, 1.05) * a[i])),
        ),
        ("cispo", sum(&|i| r[i].clamp(0.0, 4.0) * a[i] * lp[i])),
        (
            "dro",
            sum(&|i| a[i] * lp[i] - 0.25 * (lp[i] - q[i]).powi(2)),
        ),
        // GSPO: one ratio for the sequence, exp(mean log r), clipped to [0.9, 1.1].
        ("gspo", {
            let s = ((0..5).map(|i| lp[i] - q[i]).sum::<f32>() / 5.0).exp();
            sum(&|i| (s * a[i]).min(s.clamp(0.9, 1.1) * a[i]))
        }),
    ];
    for (name, want) in expected {
        let got = rl[name]["loss"].as_f64().unwrap() as f32;
        eprintln!("{name}: loss:sum {got} (formula {want})");
        assert!(
            (got - want).abs() <= 1e-3 * want.abs().max(1.0),
            "{name}: {got} vs {want}"
        );
    }
    let refused = out["refused"].as_str().unwrap();
    assert!(
        refused.contains("loss_fn `stable_reinforce` is not supported"),
        "{refused}"
    );
    // Five datums in chunks of two, the first chunk sent last: every datum in its place.
    // Two datums sharing their prompt (scored once) equal each scored alone.
    for i in 0..2 {
        let (a, b) = (&out["shared_together"][i], &out["shared_alone"][i]);
        assert_close("a shared-prompt datum", &floats(a), &floats(b), 1e-5);
    }
    let chunked = out["chunked"].as_array().unwrap();
    assert_eq!(chunked.len(), 5);
    for c in chunked {
        assert_close("a chunked datum", &floats(c), &lp, 1e-5);
    }
}

fn check_sampling_and_saves(out: &Value, dir: &Path) {
    let samples = out["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2);
    for s in samples {
        let n = s[0].as_array().unwrap().len();
        let lps = floats(&s[1]);
        assert!((1..=6).contains(&n) && lps.len() == n);
        assert!(lps.iter().all(|v| *v <= 0.0 && v.is_finite()));
        // 6 tokens: the length ended it; fewer: the end-of-sequence token.
        assert_eq!(s[2], if n == 6 { "length" } else { "stop" });
    }
    assert_eq!(out["same_seed_same_tokens"], true);
    // Prompt log-probs (None first) equal the trained model's forward log-probs of the same
    // datum (both after the SFT steps).
    let p = out["prompt_logprobs"].as_array().unwrap();
    assert!(p[0].is_null());
    let p: Vec<f32> = p[1..].iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let lp = floats(&out["rl"]["importance_sampling"]["logprobs"]);
    assert_close("prompt log-probs", &p, &lp[..4], 1e-3);
    // save_state, then one step; the resumed client's step is the same.
    assert_eq!(out["step_after_save"], out["step_after_resume"]);
    let listed = serde_json::json!(["sampler_weights/sampler-1", "weights/ckpt-1"]);
    assert_eq!(out["checkpoints"], listed);
    assert_eq!(
        out["weights_info"],
        serde_json::json!(["smol", 8, true, true])
    );
    let saved = out["saved_path"].as_str().unwrap();
    let rel = saved.strip_prefix("tinker://").unwrap();
    let ck = dir.join("ck").join(rel);
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optim.bpk",
    ] {
        assert!(ck.join(f).is_file(), "{} has no {f}", ck.display());
    }
    let n = out["from_path_tokens"].as_array().unwrap().len();
    assert!((1..=6).contains(&n));
}
