//! LoRA: adapters leave the model unchanged at init, only adapters train, the adapter-off
//! forward is the frozen base (the KL reference), PEFT save → load round trips, merge matches.

mod common;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use common::*;
use ember_llm::left_pad;
use ember_llm::{LoraSettings, apply_lora, load, load_peft, merge, save_peft};
use ember_llm::{Scoring, adapter_param_count, target_paths};
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
    // B = 0 adds exactly nothing; the two passes still differ in rounding, since on the CPU a
    // pass without autodiff (the base here) computes attention's forward block by block through
    // Ember's softmax and a pass with trainable inputs through burn's fused op (both against
    // one reference in crates/ember-kernels/src/tests.rs).
    let at_init = vals(model.forward(toks.clone(), mask.clone()));
    let worst = max_abs_diff(&at_init, &before);
    assert!(worst < 1e-5, "B = 0 at init: {worst}");

    // One optimizer step on a log-prob objective.
    let (lp, _) = model.token_log_probs(toks.clone(), mask.clone(), 1.0, false, true);
    let grads = GradientsParams::from_grads(lp.sum().neg().backward(), &model);
    let mut opt = AdamConfig::new().init();
    let model = opt.step(1e-2, model, grads);
    let after = vals(model.forward(toks.clone(), mask.clone()));
    let moved = max_abs_diff(&after, &before);
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
    let off = vals(model.forward_with(toks.clone(), mask.clone(), false));
    let worst = max_abs_diff(&off, &before);
    assert!(worst < 1e-5, "adapters off: {worst}");

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
    let worst = max_abs_diff(&m, &after);
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

/// Every float parameter's gradient in `grads`, by parameter id.
fn all_grads<M: Module>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<(burn::module::ParamId, Vec<f32>)> {
    use burn::module::{ModuleVisitor, Param, ParamId};
    use burn::tensor::Tensor;
    struct Collect<'a>(&'a GradientsParams, Vec<(ParamId, Vec<f32>)>);
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.0.get::<D>(param.id) {
                self.1.push((param.id, vals(g)));
            }
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

/// The largest per-parameter relative difference ‖a − b‖∞ / ‖b‖∞ of two gradient sets of the
/// same model (same parameters in the same order).
fn grad_gap(
    a: &[(burn::module::ParamId, Vec<f32>)],
    b: &[(burn::module::ParamId, Vec<f32>)],
) -> f32 {
    assert_eq!(
        a.iter().map(|x| x.0).collect::<Vec<_>>(),
        b.iter().map(|x| x.0).collect::<Vec<_>>(),
        "the same parameters get gradients"
    );
    a.iter()
        .zip(b)
        .map(|((ia, ga), (ib, gb))| {
            assert_eq!(ia, ib);
            let scale = gb.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
            ga.iter()
                .zip(gb)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
                / scale
        })
        .fold(0f32, f32::max)
}

/// `rows` as an index tensor on the CPU test device.
fn idx(rows: &[i64]) -> burn::tensor::Tensor<1, burn::tensor::Int> {
    burn::tensor::Tensor::from_data(
        burn::tensor::TensorData::new(rows.to_vec(), [rows.len()]),
        &dev(),
    )
}

/// `base` with LoRA (rank 4) on all seven projections, one Adam step into `exp`'s
/// log-likelihood, so that B ≠ 0 and the adapters' products reach the layers' inputs.
fn stepped_lora(base: ember_llm::Llama, exp: &ember_llm::actor::LlmExperience) -> ember_llm::Llama {
    let settings = LoraSettings {
        rank: 4,
        alpha: 8.0,
        targets: ember_llm::LORA_TARGETS
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    let lora = apply_lora(base, &settings).unwrap();
    let (lp, _) = lora.token_log_probs(exp.tokens.clone(), exp.mask.clone(), 1.0, false, true);
    let g = GradientsParams::from_grads(lp.sum().neg().backward(), &lora);
    AdamConfig::new().init().step(5e-2, lora, g)
}

/// A batch whose rows share prompts (three of prompt A, two of B, one alone), interleaved,
/// prompts of different lengths (left-padded) and response masks with holes (a multi-turn
/// layout: observation gaps and right padding).
fn shared_prompt_experience(device: &burn::tensor::Device) -> ember_llm::actor::LlmExperience {
    use burn::tensor::{Int, Tensor, TensorData};
    let a = [0, 5, 17, 33, 61];
    let b = [0, 0, 0, 3, 9];
    let c = [0, 0, 7, 8, 9];
    let prompts = [a, b, a, c, b, a];
    let responses: [[i64; 5]; 6] = [
        [11, 12, 13, 14, 15],
        [21, 22, 23, 0, 0],
        [31, 32, 33, 34, 35],
        [41, 42, 43, 44, 0],
        [51, 52, 53, 54, 55],
        [61, 62, 63, 64, 65],
    ];
    let holes: [[f32; 5]; 6] = [
        [1., 1., 0., 1., 1.],
        [1., 1., 1., 0., 0.],
        [1., 0., 0., 1., 1.],
        [1., 1., 1., 1., 0.],
        [1., 1., 1., 1., 1.],
        [1., 1., 1., 0., 1.],
    ];
    let (mut t, mut m) = (Vec::new(), Vec::new());
    for r in 0..6 {
        t.extend(prompts[r].iter().map(|x| *x as i64));
        t.extend(responses[r]);
        m.extend(prompts[r].iter().map(|x| if *x == 0 { 0f32 } else { 1.0 }));
        m.extend(holes[r]);
    }
    ember_llm::actor::LlmExperience {
        tokens: Tensor::<2, Int>::from_data(TensorData::new(t, [6, 10]), device),
        mask: Tensor::from_data(TensorData::new(m, [6, 10]), device),
        response_len: 5,
        temperature: 0.8,
        adapters: true,
    }
}

/// Shared-prefix scoring (each distinct prompt run once, responses attending to its keys and
/// values) equals scoring every row in full: log-probs, entropies, the loss and every gradient,
/// with LoRA on all seven projections (adapter gradients), with full weights (every weight's
/// gradient), with the adapters off (the reference), and the critic's values and gradients.
#[test]
fn shared_prefix_scoring_equals_the_unshared_pass() {
    use burn::tensor::{Tensor, TensorData};
    use ember_train::{Actor, Critic};
    let device = dev().autodiff();
    let exp = shared_prompt_experience(&device);
    let rows = [5, 0, 1, 3, 4, 2];
    let weights = Tensor::<2>::from_data(
        TensorData::new((0..30).map(|i| 0.3 + 0.1 * i as f32).collect(), [6, 5]),
        &device,
    );
    let check = |model: ember_llm::Llama, exp: &ember_llm::actor::LlmExperience| {
        let run = |shared: bool| {
            let m = model.clone().with_shared_prefix(shared);
            let s = m.score(exp, &rows, true);
            let ent = s.entropy.expect("entropy");
            let loss = (s.log_probs.clone() * weights.clone()).sum() + ent.clone().sum() * 0.5;
            let g = GradientsParams::from_grads(loss.clone().backward(), &m);
            (vals(s.log_probs), vals(ent), vals(loss), all_grads(&m, &g))
        };
        let (lp, ent, loss, g) = run(true);
        let (lp0, ent0, loss0, g0) = run(false);
        let gap =
            |x: &[f32], y: &[f32]| x.iter().zip(y).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            gap(&lp, &lp0) < 1e-5,
            "log-probs differ by {}",
            gap(&lp, &lp0)
        );
        assert!(
            gap(&ent, &ent0) < 1e-5,
            "entropies differ by {}",
            gap(&ent, &ent0)
        );
        assert!((loss[0] - loss0[0]).abs() <= 1e-5 * loss0[0].abs());
        assert!(!g0.is_empty());
        let rel = grad_gap(&g, &g0);
        assert!(rel <= 1e-5, "gradients differ by {rel} (relative)");
        g0.len()
    };
    let base = load(&tiny(), &device).unwrap().model;
    // Full weights: every parameter trains (embeddings, norms, every projection, the head).
    let full = check(base.clone(), &exp);
    assert!(full >= 2 * 9, "{full} parameters with gradients");
    // Qwen3: the per-head q/k norms in the shared pass too (and their gradients).
    let qwen3 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_qwen3");
    let full = check(load(&qwen3, &device).unwrap().model, &exp);
    assert!(full >= 2 * 11, "{full} parameters with gradients");
    let lora = stepped_lora(base, &exp);
    assert_eq!(
        check(lora.clone(), &exp),
        2 * 7 * 2,
        "A and B of 7 targets × 2 layers"
    );
    // The adapters off (the KL reference, scored without gradients).
    let reference = ember_llm::actor::LlmExperience {
        adapters: false,
        ..shared_prompt_experience(&dev())
    };
    let lp = |shared: bool| {
        let m = lora.clone().with_shared_prefix(shared).valid();
        vals(m.score(&reference, &rows, false).log_probs)
    };
    let (a, b) = (lp(true), lp(false));
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
    // Rows 1 and 3 leave the last response column and the first prompt columns unused: the
    // trimmed pass gives the full-width pass's log-probs up to the last used column, 0 after.
    let m = lora.clone().valid();
    let (lp_full, _) = m.last_log_probs(
        reference.tokens.clone().select(0, idx(&[1, 3])),
        reference.mask.clone().select(0, idx(&[1, 3])),
        5,
        Scoring {
            temperature: 0.8,
            entropy: false,
            adapters: false,
        },
    );
    let used = [1., 1., 1., 1., 0., 1., 1., 1., 1., 0.];
    let trimmed = vals(m.score(&reference, &[1, 3], false).log_probs);
    for ((x, y), u) in trimmed.iter().zip(vals(lp_full)).zip(used) {
        assert!((x - u * y).abs() < 1e-5, "{x} vs {y} (used {u})");
    }

    // The critic: values and gradients of the trunk's adapters and the head.
    let mut c = ember_llm::ValueModel::from_policy(lora.clone(), &device);
    let w = c.value_head.weight.val().ones_like().mul_scalar(0.1);
    c.value_head.weight = burn::module::Param::from_tensor(w);
    let critic = |shared: bool| {
        let mut c = c.clone();
        c.trunk = c.trunk.with_shared_prefix(shared);
        let v = c.values(&exp, &rows);
        let g = GradientsParams::from_grads((v.clone() * weights.clone()).sum().backward(), &c);
        (vals(v), all_grads(&c, &g))
    };
    let ((v, g), (v0, g0)) = (critic(true), critic(false));
    assert!(v.iter().zip(&v0).all(|(x, y)| (x - y).abs() < 1e-5));
    assert!(grad_gap(&g, &g0) <= 1e-5);
}

/// Per-layer activation checkpointing (`Llama::with_checkpointing`) gives the plain backward's
/// log-probs, entropies and every gradient, unshared and shared-prefix, with full weights
/// (embeddings, norms, every projection and the tied head; Llama and Qwen3) and with LoRA on all
/// seven projections; a no-grad pass is never checkpointed.
#[test]
fn checkpointed_layers_give_the_plain_gradients() {
    use burn::tensor::{Tensor, TensorData};
    use ember_train::Actor;
    let device = dev().autodiff();
    let exp = shared_prompt_experience(&device);
    let rows = [5, 0, 1, 3, 4, 2];
    let weights = Tensor::<2>::from_data(
        TensorData::new((0..30).map(|i| 0.3 - 0.05 * i as f32).collect(), [6, 5]),
        &device,
    );
    let run = |model: &ember_llm::Llama, checkpoint: bool, shared: bool| {
        let m = model
            .clone()
            .with_shared_prefix(shared)
            .with_checkpointing(checkpoint);
        let mut s = m.score(&exp, &rows, true);
        assert_eq!(s.recompute.is_some(), checkpoint);
        let recompute = s.recompute.take();
        let ent = s.entropy.expect("entropy");
        let loss = (s.log_probs.clone() * weights.clone()).sum() + ent.clone().sum() * 0.5;
        let grads = loss.backward();
        let g = match recompute {
            Some(r) => r.finish(grads),
            None => GradientsParams::from_grads(grads, &m),
        };
        (vals(s.log_probs), vals(ent), all_grads(&m, &g))
    };
    let check = |model: &ember_llm::Llama| {
        for shared in [false, true] {
            let (lp, ent, g) = run(model, true, shared);
            let (lp0, ent0, g0) = run(model, false, shared);
            assert!(max_abs_diff(&lp, &lp0) < 1e-5, "shared {shared}: log-probs");
            assert!(
                max_abs_diff(&ent, &ent0) < 1e-5,
                "shared {shared}: entropies"
            );
            let rel = grad_gap(&g, &g0);
            assert!(
                rel <= 1e-4,
                "shared {shared}: gradients differ by {rel} (relative)"
            );
        }
        run(model, false, false).2.len()
    };
    let base = load(&tiny(), &device).unwrap().model;
    assert!(check(&base) >= 2 * 9, "every weight trains");
    let qwen3 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_qwen3");
    assert!(check(&load(&qwen3, &device).unwrap().model) >= 2 * 11);
    let lora = stepped_lora(base, &exp);
    assert_eq!(check(&lora), 2 * 7 * 2, "A and B of 7 targets × 2 layers");
    // Without autodiff (rescoring) the pass keeps nothing for a backward.
    let plain = lora.with_checkpointing(true).valid();
    let reference = shared_prompt_experience(&dev());
    assert!(plain.score(&reference, &rows, false).recompute.is_none());
}
