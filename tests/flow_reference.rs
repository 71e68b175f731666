//! The image job's reference options (issue: Flow-GRPO at reference fidelity): flow_grpo's
//! global-std advantages, zero-advantage filtering and closed-form KL, and DDPO's JPEG
//! compressibility reward.

mod common;

use burn::module::{Lora, Module, ParamGroup};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Distribution, Int, Tensor};
use common::*;
use ember::flow::images::{global_std_stats, jpeg_kb, varied_groups};
use ember_engine::*;
use ember_flow::{FlowDitConfig, FlowExperience, Guidance, flow_matching_loss, sde_coefs, sigmas};
use ember_train::Actor;
use std::path::Path;
use std::process::Command;

/// flow_grpo's KL (train_sd3.py, `beta > 0`) by hand on a micro DiT with LoRA adapters moved
/// off zero: per step, mean over pixels of (a_v·(v_on − v_off))² / (2σ_t²), since the two means
/// share a_x·x; the actor's `score` returns it beside the same log-probs; with the adapters at
/// their zero init it is 0.
#[test]
fn closed_form_kl_by_hand() {
    let device = Device::flex().autodiff();
    device.seed(3);
    let base = FlowDitConfig::new()
        .with_d_model(16)
        .with_layers(1)
        .with_heads(2)
        .with_mlp_ratio(2)
        .init(&device)
        .unwrap();
    let x = || Tensor::<2>::random([2, 784], Distribution::Normal(0.0, 1.0), &device);
    let labels = Tensor::<1, Int>::from_ints([3, 8], &device);
    // A few flow-matching steps, first of the whole model (adaLN-Zero starts with a zero
    // velocity, which no adapter could change), then of the adapters alone.
    let fit = |mut m: ember_flow::FlowDit| {
        let mut opt: ModuleOptimizer = AdamWConfig::new().init();
        for _ in 0..3 {
            let loss = flow_matching_loss(
                &m,
                x(),
                x(),
                Tensor::from_floats([0.3, 0.7], &device),
                labels.clone(),
            );
            let g = GradientsParams::from_grads(loss.backward(), &m);
            m = opt.step(5e-2, m, g);
        }
        m
    };
    let base = fit(base);
    let paths = base.lora_paths(&["q_proj".into(), "fc1".into(), "fc2".into()]);
    let lora = base
        .no_grad()
        .apply_lora(Lora::new(4, 8.0).set_param_group(ParamGroup::from_paths(paths)));
    let coefs = sde_coefs(&sigmas(3, 1.0), 0.7).unwrap();
    let latents = vec![x(), x(), x(), x()];
    let mut exp =
        FlowExperience::from_trajectory(&latents, &coefs, &[0, 1, 2], labels.clone(), 1.0);
    exp.closed_form_kl = true;
    let zero = vals(exp.closed_form_kl(&lora, &[0, 1]));
    assert!(zero.iter().all(|k| k.abs() < 1e-12), "{zero:?}");
    let m = fit(lora);
    let kl = vals(exp.closed_form_kl(&m, &[0, 1]));
    let scored = m.score(&exp, &[0, 1], false);
    assert_eq!(vals(scored.kl.unwrap()), kl);
    assert_eq!(
        vals(scored.log_probs),
        vals(exp.log_probs(&m, &[0, 1], true))
    );
    for row in 0..2 {
        for (j, c) in coefs.iter().enumerate() {
            let xin = latents[j].clone().narrow(0, row, 1);
            let t = Tensor::<1>::from_floats([c.sigma], &device);
            let y = labels.clone().narrow(0, row, 1);
            let on = vals(m.forward_with(xin.clone(), t.clone(), y.clone(), true));
            let off = vals(m.forward_with(xin, t, y, false));
            let want = on
                .iter()
                .zip(&off)
                .map(|(a, b)| (f64::from(c.a_v) * f64::from(a - b)).powi(2))
                .sum::<f64>()
                / 784.0
                / (2.0 * f64::from(c.noise).powi(2));
            let got = f64::from(kl[row * 3 + j]);
            assert!(want > 0.0, "the adapters moved");
            assert!(
                (got - want).abs() <= 1e-4 * want.max(1e-8),
                "row {row} step {j}: {got} vs {want}"
            );
        }
    }
}

/// A micro DiT fitted a few flow-matching steps (so its velocity is not adaLN-Zero's 0), with
/// rank-4 adapters on q, fc1 and fc2 moved off their zero init.
fn micro_with_moved_adapters(device: &Device) -> ember_flow::FlowDit {
    device.seed(5);
    let m = FlowDitConfig::new()
        .with_d_model(16)
        .with_layers(1)
        .with_heads(2)
        .with_mlp_ratio(2)
        .init(device)
        .unwrap();
    let x = || Tensor::<2>::random([4, 784], Distribution::Normal(0.0, 1.0), device);
    let labels = Tensor::<1, Int>::from_ints([1, 4, 7, 10], device);
    let fit = |mut m: ember_flow::FlowDit| {
        let mut opt: ModuleOptimizer = AdamWConfig::new().init();
        for _ in 0..3 {
            let t = Tensor::from_floats([0.2, 0.4, 0.6, 0.8], device);
            let loss = flow_matching_loss(&m, x(), x(), t, labels.clone());
            let g = GradientsParams::from_grads(loss.backward(), &m);
            m = opt.step(5e-2, m, g);
        }
        m
    };
    let m = fit(m);
    let paths = m.lora_paths(&["q_proj".into(), "fc1".into(), "fc2".into()]);
    fit(m
        .no_grad()
        .apply_lora(Lora::new(4, 8.0).set_param_group(ParamGroup::from_paths(paths))))
}

/// The gradient of every adapter factor of Σ f(model), flattened in module order.
fn adapter_grads(m: &ember_flow::FlowDit, loss: Tensor<1>) -> Vec<f32> {
    let g = GradientsParams::from_grads(loss.backward(), m);
    let mut out = Vec::new();
    for b in &m.blocks {
        for l in [&b.q_proj, &b.fc1, &b.fc2] {
            let a = l.weight.adapter().unwrap();
            out.extend(vals(g.get::<2>(a.a.id).unwrap()));
            out.extend(vals(g.get::<2>(a.b.id).unwrap()));
        }
    }
    out
}

/// Guidance w with the unconditional branch detached: d/dθ Σ(sg[v_u] + w(v_c − sg[v_u])) =
/// w·d/dθ Σv_c; kept, the gradient is w·dΣv_c + (1 − w)·dΣv_u (by linearity), checked against
/// separate conditional and unconditional passes; the values are equal either way.
#[test]
fn unconditional_branch_detached() {
    let device = Device::flex().autodiff();
    let m = micro_with_moved_adapters(&device);
    device.seed(9);
    let x = Tensor::<2>::random([3, 784], Distribution::Normal(0.0, 1.0), &device);
    let t = Tensor::<1>::from_floats([0.3, 0.6, 0.9], &device);
    let y = Tensor::<1, Int>::from_ints([2, 5, 8], &device);
    let null = Tensor::<1, Int>::full([3], m.null_class() as i64, &device);
    let w = 3.0f32;
    let guided = |detach_uncond: bool| {
        let g = Guidance {
            scale: w,
            detach_uncond,
        };
        m.guided_with(x.clone(), t.clone(), y.clone(), g, true)
    };
    assert_eq!(vals(guided(true)), vals(guided(false)));
    let g_det = adapter_grads(&m, guided(true).sum());
    let g_all = adapter_grads(&m, guided(false).sum());
    let g_c = adapter_grads(&m, m.forward(x.clone(), t.clone(), y.clone()).sum());
    let g_u = adapter_grads(&m, m.forward(x.clone(), t.clone(), null).sum());
    let scale = g_c.iter().fold(0f32, |a, &b| a.max(b.abs()));
    assert!(scale > 1e-3, "the adapters have gradients: {scale}");
    let mut differ = 0f32;
    for i in 0..g_c.len() {
        let want_det = w * g_c[i];
        let want_all = w * g_c[i] + (1.0 - w) * g_u[i];
        assert!((g_det[i] - want_det).abs() <= 1e-4 * scale, "detached {i}");
        assert!((g_all[i] - want_all).abs() <= 1e-4 * scale, "kept {i}");
        differ = differ.max((g_det[i] - g_all[i]).abs());
    }
    assert!(differ > 1e-3 * scale, "the two gradients differ");
}

/// bf16 products (autocast): the velocity within bf16's rounding of the f32 one (relative
/// error of the largest component ≤ 3 %, and not bit-equal: the products did run in bf16),
/// f32 out, the precision kept by `valid()`, and adapter gradients within 5 % in norm.
#[test]
fn bf16_products_track_f32() {
    let device = Device::flex().autodiff();
    let m = micro_with_moved_adapters(&device);
    let h = m.clone().with_precision(ember_train::Precision::Bf16);
    assert_eq!(h.valid().precision(), ember_train::Precision::Bf16);
    device.seed(11);
    let x = Tensor::<2>::random([3, 784], Distribution::Normal(0.0, 1.0), &device);
    let t = Tensor::<1>::from_floats([0.2, 0.5, 0.95], &device);
    let y = Tensor::<1, Int>::from_ints([0, 6, 10], &device);
    for adapters in [true, false] {
        let a = m.forward_with(x.clone(), t.clone(), y.clone(), adapters);
        let b = h.forward_with(x.clone(), t.clone(), y.clone(), adapters);
        assert_eq!(b.dtype(), burn::tensor::DType::F32);
        let (a, b) = (vals(a), vals(b));
        let scale = a.iter().fold(0f32, |s, &v| s.max(v.abs()));
        let err = a
            .iter()
            .zip(&b)
            .fold(0f32, |s, (p, q)| s.max((p - q).abs()));
        assert!(scale > 1e-2, "non-trivial velocity {scale}");
        assert!(err <= 3e-2 * scale, "adapters {adapters}: {err} vs {scale}");
        assert!(err > 0.0, "bf16 rounding shows");
    }
    let ga = adapter_grads(
        &m,
        m.forward(x.clone(), t.clone(), y.clone())
            .powi_scalar(2)
            .sum(),
    );
    let gb = adapter_grads(&h, h.forward(x, t, y).powi_scalar(2).sum());
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let diff: Vec<f32> = ga.iter().zip(&gb).map(|(a, b)| a - b).collect();
    assert!(
        norm(&diff) <= 0.05 * norm(&ga),
        "{} vs {}",
        norm(&diff),
        norm(&ga)
    );
}

/// The engine takes a closed-form KL instead of its estimator: β·token-mean(kl), no reference
/// log-probs needed (by hand: kl [[0.2, 0.4], [0.6, 0.0]] with the last step masked gives
/// mean 0.4; with β = 0.5 and zero advantages the loss is 0.2).
#[test]
fn engine_uses_a_given_kl() {
    let d = dev();
    let zeros = Tensor::<2>::zeros([2, 2], &d);
    let cfg = ActorLossConfig {
        policy: PolicyLossKind::Vanilla,
        agg: LossAgg::TokenMean,
        kl: Some(KlLoss {
            estimator: KlEstimator::K3,
            coef: 0.5,
        }),
        ..ActorLossConfig::default()
    };
    let mask = t2(&[&[1.0, 1.0], &[1.0, 0.0]]);
    let norm = AggNorm::of_mask(&mask);
    let input = ActorInput {
        policy: PolicyLossInput {
            log_probs: zeros.clone(),
            old_log_probs: zeros.clone(),
            advantages: zeros,
            mask,
            ref_log_probs: None,
        },
        entropy: None,
        rollout_log_probs: None,
        kl: Some(t2(&[&[0.2, 0.4], &[0.6, 0.0]])),
    };
    let (loss, metrics) = actor_loss(&cfg, &input, norm).unwrap();
    assert!((vals(loss)[0] - 0.2).abs() < 1e-6);
    assert!((metrics.to_host()["actor/kl_loss"] - 0.4).abs() < 1e-6);
}

/// flow_grpo `PerPromptStatTracker(global_std=True)` by hand: rewards [1, 2, 3, 4] in groups
/// [0, 0, 1, 1]: group means 1.5 and 3.5, std of all four (population) √1.25 = 1.118034, so
/// A = ±0.5 / (1.118034 + 1e-4) = ±0.447174; through the engine's GRPO estimator as the flow job
/// configures it (ε = 1e-4, population std) with those statistics. Without them, each group's
/// own std (0.5) gives ±0.5 / 0.5001 = ±0.9998.
#[test]
fn global_std_matches_flow_grpo_by_hand() {
    let rewards = [1.0f32, 2.0, 3.0, 4.0];
    let groups = [0usize, 0, 1, 1];
    let (m, s) = global_std_stats(&rewards, &groups);
    assert_eq!(m, vec![1.5, 1.5, 3.5, 3.5]);
    assert!(s.iter().all(|x| (x - 1.118_034).abs() < 1e-6), "{s:?}");
    let cfg = AdvantageConfig::new(AdvantageKind::Grpo {
        epsilon: 1e-4,
        std: StdKind::Population,
        scale_by_std: true,
    });
    let batch = || {
        RolloutBatch::new(
            Tensor::<2>::ones([4, 3], &dev()),
            Tensor::from_floats(rewards.as_slice(), &dev()),
            &groups,
        )
        .unwrap()
    };
    let global = batch()
        .with_group_stats(
            Tensor::from_floats(m.as_slice(), &dev()),
            Tensor::from_floats(s.as_slice(), &dev()),
        )
        .unwrap();
    let a = vals(compute_advantages(&cfg, &global, 0).unwrap().advantages);
    let want = 0.5 / (1.118_034 + 1e-4);
    for (i, x) in a.iter().enumerate() {
        let sign = if (i / 3) % 2 == 0 { -1.0 } else { 1.0 };
        assert!((x - sign * want).abs() < 1e-5, "{a:?}");
    }
    let own = vals(compute_advantages(&cfg, &batch(), 0).unwrap().advantages);
    assert!((own[3] - 0.5 / 0.5001).abs() < 1e-5, "{own:?}");
}

/// Zero-advantage filtering keeps the samples of groups whose rewards differ.
#[test]
fn groups_with_equal_rewards_are_dropped() {
    let keep = varied_groups(&[0.5, 0.5, 0.1, 0.3, 1.0, 1.0], &[0, 0, 1, 1, 2, 2]);
    assert_eq!(keep, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
}

/// The JPEG size: a valid JPEG of the image (decoded back within JPEG's error), a blank image
/// far smaller than noise, strokes in between, pixels outside [0, 1] clamped, a wrong size
/// refused.
#[test]
fn jpeg_size_of_digits() {
    let blank = vec![0.0f32; 784];
    let mut state = 12345u32;
    let noise: Vec<f32> = (0..784)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32
        })
        .collect();
    // A "1": a vertical bar of ink.
    let bar: Vec<f32> = (0..784)
        .map(|i| {
            f32::from(u8::from(
                (12..16).contains(&(i % 28)) && (4..24).contains(&(i / 28)),
            ))
        })
        .collect();
    let (b, n, s) = (
        jpeg_kb(&blank).unwrap(),
        jpeg_kb(&noise).unwrap(),
        jpeg_kb(&bar).unwrap(),
    );
    assert!(b < s && s < n, "blank {b} < bar {s} < noise {n}");
    assert!(n > 2.0 * b, "noise {n} vs blank {b}");
    let over: Vec<f32> = bar.iter().map(|x| x * 3.0 - 1.0).collect();
    assert_eq!(jpeg_kb(&over).unwrap(), s, "clamped to [0, 1]");
    assert!(jpeg_kb(&[0.0; 10]).is_err());
    // Decode what the encoder wrote (re-encoded here the same way): the bar comes back.
    let bytes: Vec<u8> = bar.iter().map(|p| (p * 255.0) as u8).collect();
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 95)
        .encode(&bytes, 28, 28, image::ExtendedColorType::L8)
        .unwrap();
    assert_eq!(out.len() as f32 / 1000.0, s);
    let back = image::load_from_memory(&out).unwrap().to_luma8();
    let worst = back
        .as_raw()
        .iter()
        .zip(&bytes)
        .map(|(a, b)| (i32::from(*a) - i32::from(*b)).abs())
        .max()
        .unwrap();
    assert!(worst <= 48, "largest pixel error {worst}");
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The options in a run: a reward that is 0 for every sample with zero-advantage filtering
/// drops every sample and skips the update (`rollout/dropped_fraction` 1,
/// `actor/no_update_steps` 1, for more than the three steps after which non-finite losses
/// stop a run); global std and the closed-form KL with the JPEG reward train and
/// log `reward/jpeg_kb`, `eval/jpeg_kb` and `actor/kl_loss`; the refused combinations are
/// named.
#[test]
fn flow_job_takes_the_reference_options() {
    if common::assets::digit_classifier().is_none() || common::assets::mnist_digits().is_none() {
        return;
    }
    let recipe = root().join("recipes/digits-flow.toml");
    let micro: Vec<&str> = FLOW_MICRO
        .iter()
        .copied()
        .chain(["algorithm=\"flow-grpo\""])
        .collect();
    let run = |tag: &str, extra: &[&str]| {
        let out = std::env::temp_dir().join(format!("ember-flowref-{tag}-{}", std::process::id()));
        let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
        c.args([
            "train",
            recipe.to_str().unwrap(),
            "--quiet",
            "--overwrite",
            "--out",
        ])
        .arg(&out);
        for s in micro.iter().chain(extra) {
            c.args(["--set", s]);
        }
        (c.output().unwrap(), out)
    };
    let (o, out) = run(
        "drop",
        &[
            "reward.class_prob=0",
            "rl.drop_zero_advantage=true",
            "rl.steps=4",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // All reward weights 0 (on purpose here): the run says that nothing trains.
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(said.contains("are all 0: every reward is 0"), "{said}");
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for r in &rows[1..] {
        assert_eq!(r["rollout/dropped_fraction"], 1.0);
        assert_eq!(r["actor/no_update_steps"], 1.0);
        assert!(r.get("actor/skipped_steps").is_none());
    }
    std::fs::remove_dir_all(&out).ok();
    let (o, out) = run(
        "jpeg",
        &[
            "reward.class_prob=0",
            "reward.jpeg_size=-1",
            "rl.global_std=true",
            "rl.kl_coef=0.01",
            "rl.kl_form=\"closed_form\"",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let kb = last["reward/jpeg_kb"].as_f64().unwrap();
    assert!(kb > 0.2 && kb < 2.0, "{kb}");
    assert!(last["eval/jpeg_kb"].as_f64().unwrap() > 0.2);
    assert_eq!(last["rollout/dropped_fraction"], 0.0);
    let kl = last["actor/kl_loss"].as_f64().unwrap();
    assert!(kl.is_finite() && kl >= 0.0, "closed-form KL {kl}");
    // `ember eval` of the run (pretrained again, as the run did without the cache, plus the
    // last checkpoint's adapters) gives the run's final evaluation exactly.
    let eval = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .arg("eval")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let o = eval(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    for k in ["accuracy", "class_prob", "diversity", "entropy", "jpeg_kb"] {
        assert_eq!(e[k], summary["after"][k], "{k}");
    }
    let o = eval(&["--eval-size", "1"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("2..=10000"));
    std::fs::remove_dir_all(&out).ok();
    for (set, flag, want) in [
        ("algorithm=\"loop\"", "rl.global_std=true", "rl.global_std"),
        (
            "algorithm=\"ram\"",
            "rl.drop_zero_advantage=true",
            "rl.drop_zero_advantage",
        ),
        (
            "rl.kl_coef=0",
            "rl.kl_form=\"closed_form\"",
            "needs rl.kl_coef > 0",
        ),
        (
            "sampler.guidance=1",
            "rl.detach_uncond=true",
            "rl.detach_uncond",
        ),
        ("rl.ram_ema=0.9", "rl.steps=2", "rl.ram_ema applies"),
        ("algorithm=\"ram\"", "rl.ram_ema=1", "rl.ram_ema = 1"),
    ] {
        let (o, out) = run("bad", &[set, flag]);
        assert!(!o.status.success(), "{set} {flag} was accepted");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(want), "{set}: {e}");
        std::fs::remove_dir_all(&out).ok();
    }
}

/// RAM with v_old from the adapters' moving average (`rl.ram_ema`): the average is written
/// into every checkpoint (`ram_ema.bpk`) and read back, so a run stopped after 2 of 3 steps and
/// resumed logs what the uninterrupted run logs; the loss differs from v_old = the current
/// weights from the second step on (the average lags); bf16 products run on the CPU too.
#[test]
fn ram_ema_checkpoints_and_resumes() {
    if common::assets::digit_classifier().is_none() || common::assets::mnist_digits().is_none() {
        return;
    }
    let recipe = root().join("recipes/digits-flow.toml");
    let train = |tag: &str, extra: &[&str], flags: &[&str]| {
        let out = std::env::temp_dir().join(format!("ember-ramema-{tag}-{}", std::process::id()));
        let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
        c.args(["train", recipe.to_str().unwrap(), "--quiet", "--out"])
            .arg(&out)
            .args(flags);
        for s in FLOW_MICRO
            .iter()
            .chain(&["algorithm=\"ram\"", "rl.steps=3"])
            .chain(extra)
        {
            c.args(["--set", s]);
        }
        (c.output().unwrap(), out)
    };
    let metrics = |out: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let ema = ["rl.ram_ema=0.9"];
    let (o, full) = train("full", &ema, &["--overwrite"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, plain) = train("plain", &[], &["--overwrite"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (o, part) = train("part", &ema, &["--overwrite", "--stop-after", "2"]);
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ckpt = part.join("checkpoints/step-00000002");
    assert!(ckpt.join("ram_ema.bpk").is_file());
    let (o, _) = train("part", &ema, &["--resume"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, b, c) = (metrics(&full), metrics(&part), metrics(&plain));
    assert_eq!(a.len(), 4);
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for (k, v) in x.as_object().unwrap() {
            if k.starts_with("perf/") || k.starts_with("timing_s/") {
                continue;
            }
            let (p, q) = (v.as_f64().unwrap(), y[k].as_f64().unwrap());
            // (Float noise: means of group-normalised advantages are ~1e-8.)
            assert!((p - q).abs() <= 1e-6 * p.abs().max(0.1), "{k}: {p} vs {q}");
        }
    }
    let loss = |m: &[serde_json::Value], i: usize| m[i]["actor/ram_loss"].as_f64().unwrap();
    assert_eq!(
        loss(&a, 1),
        loss(&c, 1),
        "step 1: the average starts at the weights"
    );
    assert_ne!(loss(&a, 3), loss(&c, 3), "step 3: the average lags");
    // A damaged average is named.
    std::fs::write(ckpt.join("ram_ema.bpk"), b"junk").unwrap();
    std::fs::write(part.join("checkpoints/latest"), "step-00000002").unwrap();
    let (o, _) = train("part", &ema, &["--resume"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("ram_ema.bpk"), "{e}");
    // bf16 products on the CPU (emulated there; the path GPU runs take).
    let (o, half) = train("bf16", &["precision=\"bf16\""], &["--overwrite"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let h = metrics(&half);
    assert!(loss(&h, 1).is_finite() && (loss(&h, 1) - loss(&c, 1)).abs() < 0.05 * loss(&c, 1));
    for d in [full, plain, part, half] {
        std::fs::remove_dir_all(d).ok();
    }
}
