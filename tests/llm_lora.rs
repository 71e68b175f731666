//! LoRA: adapters leave the model unchanged at init, only adapters train, the adapter-off
//! forward is the frozen base (the KL reference), PEFT save → load round trips, merge matches.

mod common;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use common::*;
use ember_llm::left_pad;
use ember_llm::{LoraSettings, apply_lora, load, load_peft, merge, save_peft};
use ember_llm::{adapter_param_count, target_paths};
use std::path::Path;

fn tiny() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_llama")
}

#[test]
fn lora_trains_adapters_only_and_round_trips_through_peft() {
    let device = dev().autodiff();
    let base = load(&tiny(), &device).unwrap().model;
    let settings = LoraSettings {
        rank: 4,
        alpha: 8.0,
        targets: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
    };
    let model = apply_lora(base.clone(), &settings).unwrap();
    // r·(in + out) per target: q (64→64), v (64→32), down (112→64), 2 layers.
    assert_eq!(
        adapter_param_count(&model),
        2 * 4 * ((64 + 64) + (64 + 32) + (112 + 64))
    );
    assert_eq!(target_paths(&model, &settings.targets).len(), 6);
    let (toks, mask) = left_pad(&[vec![5, 17, 33, 61], vec![3, 9]], &device);
    let before = vals(base.forward(toks.clone(), mask.clone()));
    assert_eq!(
        vals(model.forward(toks.clone(), mask.clone())),
        before,
        "B = 0 at init"
    );

    // One optimizer step on a log-prob objective.
    let (lp, _) = model.token_log_probs(toks.clone(), mask.clone(), 1.0, false, true);
    let grads = GradientsParams::from_grads(lp.sum().neg().backward(), &model);
    let mut opt = AdamConfig::new().init();
    let model = opt.step(1e-2, model, grads);
    let after = vals(model.forward(toks.clone(), mask.clone()));
    let moved = after
        .iter()
        .zip(&before)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        moved > 1e-3,
        "the adapters did not change the output ({moved})"
    );
    // Base weights did not move; the adapter-off forward is still the base model.
    let q0 = |m: &ember_llm::Llama| vals(m.layers[0].self_attn.q_proj.weight.base());
    assert_eq!(q0(&model), q0(&base));
    assert_eq!(
        vals(model.layers[0].input_layernorm.gamma.val()),
        vals(base.layers[0].input_layernorm.gamma.val())
    );
    assert_eq!(
        vals(model.forward_with(toks.clone(), mask.clone(), false)),
        before
    );

    // PEFT layout: keys and shapes as `peft` writes them.
    let dir = std::env::temp_dir().join(format!("ember-peft-{}", std::process::id()));
    save_peft(&model, &settings, "tiny_llama", &dir).unwrap();
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let a = st
        .tensor("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight")
        .unwrap();
    assert_eq!(a.shape(), &[4, 112]);
    let b = st
        .tensor("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight")
        .unwrap();
    assert_eq!(b.shape(), &[32, 4]);
    assert_eq!(st.names().len(), 12);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(cfg["r"], 4);
    assert_eq!(cfg["lora_alpha"], 8.0);
    assert_eq!(cfg["peft_type"], "LORA");

    // Load onto a fresh base: identical outputs.
    let fresh = load(&tiny(), &device).unwrap().model;
    let (loaded, s2) = load_peft(fresh, &dir, &device).unwrap();
    assert_eq!(s2, settings);
    let reloaded = vals(loaded.forward(toks.clone(), mask.clone()));
    assert_eq!(reloaded, after);
    // Merging folds the adapters into the weights.
    let merged = merge(loaded);
    assert!(merged.layers[0].self_attn.q_proj.weight.adapter().is_none());
    let m = vals(merged.forward(toks, mask));
    let worst = m
        .iter()
        .zip(&after)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "merged differs by {worst}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn lora_settings_are_checked() {
    let base = load(&tiny(), &dev()).unwrap().model;
    let bad = LoraSettings {
        targets: vec!["qproj".into()],
        ..LoraSettings::default()
    };
    let e = apply_lora(base.clone(), &bad).unwrap_err().to_string();
    assert!(e.contains("unknown module `qproj`"), "{e}");
    let e = apply_lora(
        base.clone(),
        &LoraSettings {
            rank: 0,
            ..LoraSettings::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("lora.rank"), "{e}");
    let e = ember_llm::save_peft(
        &base,
        &LoraSettings::default(),
        "x",
        &std::env::temp_dir().join("ember-none"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no LoRA adapters"), "{e}");
    let e = load_peft(base.clone(), Path::new("/nonexistent-adapter"), &dev())
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
    let _ = base.num_params();
}

#[derive(serde::Deserialize)]
struct LogitsFixture {
    tokens: Vec<Vec<i64>>,
    mask: Vec<Vec<f32>>,
    logits: Vec<Vec<Vec<f32>>>,
}

#[test]
fn adapter_saved_by_peft_loads_and_matches_its_logits() {
    use burn::tensor::{Int, Tensor, TensorData};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_llama_peft");
    let base = load(&tiny(), &dev()).unwrap().model;
    let (model, settings) = load_peft(base, &dir, &dev()).unwrap();
    assert_eq!((settings.rank, settings.alpha), (4, 8.0));
    let fx: LogitsFixture =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    let (b, t) = (fx.tokens.len(), fx.tokens[0].len());
    let toks = Tensor::<2, Int>::from_data(TensorData::new(fx.tokens.concat(), [b, t]), &dev());
    let mask = Tensor::<2>::from_data(TensorData::new(fx.mask.concat(), [b, t]), &dev());
    let got = vals(model.forward(toks, mask));
    let v = fx.logits[0][0].len();
    let mut worst = 0f32;
    for r in 0..b {
        for p in 0..t {
            if fx.mask[r][p] > 0.0 {
                for k in 0..v {
                    worst = worst.max((got[(r * t + p) * v + k] - fx.logits[r][p][k]).abs());
                }
            }
        }
    }
    eprintln!("PEFT adapter: max |logit − peft| = {worst:e}");
    assert!(
        worst <= 1e-4,
        "logits with the PEFT adapter differ by {worst}"
    );
    // Saving it again writes what peft reads (set EMBER_KEEP_PEFT to keep it for
    // `scripts/make_llm_fixtures.py --check-ember-peft DIR`).
    let out = std::env::var_os("EMBER_KEEP_PEFT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("ember-peft-again-{}", std::process::id()))
        });
    save_peft(&model, &settings, "tiny_llama", &out).unwrap();
    let (again, _) = load_peft(load(&tiny(), &dev()).unwrap().model, &out, &dev()).unwrap();
    let (toks, mask) = left_pad(&[vec![5, 17, 33, 61]], &dev());
    assert_eq!(
        vals(again.forward(toks.clone(), mask.clone())),
        vals(model.forward(toks, mask))
    );
    if std::env::var_os("EMBER_KEEP_PEFT").is_none() {
        std::fs::remove_dir_all(&out).ok();
    }
}

/// The adapters are applied factored, x·W + s·(x·A)·B; their gradients must equal the chain rule
/// through the materialised weight W' = W + s·A·B: dA = s·dW'·Bᵀ and dB = s·Aᵀ·dW'.
#[test]
fn factored_adapters_have_the_gradients_of_the_materialised_weight() {
    use burn::tensor::Tensor;
    let device = dev().autodiff();
    let settings = LoraSettings {
        rank: 4,
        alpha: 8.0,
        targets: vec!["q_proj".into()],
    };
    let model = apply_lora(load(&tiny(), &device).unwrap().model, &settings).unwrap();
    let (toks, mask) = left_pad(&[vec![5, 17, 33, 61, 7], vec![3, 9, 12]], &device);
    // One step so that B ≠ 0 (B starts at zero).
    let (lp, _) = model.token_log_probs(toks.clone(), mask.clone(), 1.0, false, true);
    let grads = GradientsParams::from_grads(lp.sum().neg().backward(), &model);
    let model = AdamConfig::new().init().step(5e-2, model, grads);

    // Factored: gradients of A and B of layer 0's q_proj.
    let (lp, _) = model.token_log_probs(toks.clone(), mask.clone(), 0.7, false, true);
    let g = lp.clone().sum().neg().backward();
    let ad = model.layers[0].self_attn.q_proj.weight.adapter().unwrap();
    let (a, b, s) = (ad.a.val(), ad.b.val(), ad.scale);
    let da = a.grad(&g).unwrap();
    let db = b.grad(&g).unwrap();

    // Materialised: the same loss through W' as one trainable weight.
    let merged = merge(model.clone()).no_grad();
    let mut merged = merged;
    let w = merged.layers[0]
        .self_attn
        .q_proj
        .weight
        .clone()
        .set_require_grad(true);
    merged.layers[0].self_attn.q_proj.weight = w;
    let (lp2, _) = merged.token_log_probs(toks, mask, 0.7, false, true);
    let close = |x: Vec<f32>, y: Vec<f32>| {
        x.iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max)
    };
    assert!(close(vals(lp), vals(lp2.clone())) < 1e-5);
    let g2 = lp2.sum().neg().backward();
    let dw: Tensor<2> = merged.layers[0]
        .self_attn
        .q_proj
        .weight
        .val()
        .grad(&g2)
        .unwrap();
    let (a, b) = (a.inner(), b.inner());
    let da_ref = dw.clone().matmul(b.transpose()).mul_scalar(s);
    let db_ref = a.transpose().matmul(dw).mul_scalar(s);
    let (da, db, da_ref, db_ref) = (vals(da), vals(db), vals(da_ref), vals(db_ref));
    let scale = da_ref
        .iter()
        .chain(&db_ref)
        .fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 1e-3, "gradients too small to compare ({scale})");
    assert!(close(da, da_ref) <= 1e-4 * scale.max(1.0), "dA differs");
    assert!(close(db, db_ref) <= 1e-4 * scale.max(1.0), "dB differs");
}
