//! The wgpu backend without a GPU: Ember's kernels (`wgpu_smoke/kernels.rs`) and a micro-sized
//! model on wgpu (Vulkan through Mesa's lavapipe, or GL on llvmpipe) against the CPU backend:
//! logits, greedy generation with its log-probs, and one training step. Built only with
//! `--features wgpu`; `.ci/gpu-smoke` runs it.
#![cfg(feature = "wgpu")]

#[path = "wgpu_smoke/kernels.rs"]
mod kernels;

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::actor::LlmExperience;
use ember_llm::{Family, Llama, LlamaConfig, SamplingConfig, generate};
use ember_train::Actor;
use std::time::Instant;

fn config() -> LlamaConfig {
    LlamaConfig::new(Family::Llama, 24, 32, 64, 2, 4, 2).with_max_position_embeddings(32)
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.try_into_vec_as::<f32>().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn batch(device: &Device) -> (Tensor<2, Int>, Tensor<2>) {
    let toks = vec![1i64, 5, 7, 9, 11, 2, 0, 0, 1, 3, 4, 8, 6, 10, 12, 2];
    let mask = vec![
        1f32, 1., 1., 1., 1., 1., 0., 0., 1., 1., 1., 1., 1., 1., 1., 1.,
    ];
    (
        Tensor::from_data(TensorData::new(toks, [2, 8]), device),
        Tensor::from_data(TensorData::new(mask, [2, 8]), device),
    )
}

/// One AdamW step on the mean log-likelihood of the batch (`model` on `device`'s autodiff
/// device); returns the new logits.
fn train_step(model: Llama, device: &Device) -> Vec<f32> {
    let ad = device.clone().autodiff();
    let (toks, mask) = batch(&ad);
    let (lp, _) = model.token_log_probs(toks.clone(), mask.clone(), 1.0, false, true);
    let [b, t] = mask.dims();
    let m = mask.clone().slice([0..b, 1..t]);
    let loss = (lp * m.clone()).sum().neg() / m.sum();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    assert!(
        !grads.is_empty(),
        "no gradients on {device:?}: parameters are not tracked"
    );
    let mut optim: ModuleOptimizer = AdamWConfig::new().init();
    let model = optim.step(1e-2, model, grads).valid();
    let (toks, mask) = batch(device);
    values(model.forward(toks, mask))
}

/// One SGD step (learning rate 0.1) on the batch's response log-likelihood through the actor's
/// training pass on `device`'s autodiff device, its layers checkpointed or not; the new logits.
fn checkpointed_step(model: Llama, device: &Device, checkpoint: bool) -> Vec<f32> {
    let ad = device.clone().autodiff();
    let (tokens, mask) = batch(&ad);
    let exp = LlmExperience {
        tokens,
        mask,
        response_len: 4,
        temperature: 1.0,
        adapters: true,
    };
    let m = model.with_checkpointing(checkpoint);
    let mut s = m.score(&exp, &[0, 1], false);
    let recompute = s.recompute.take();
    assert_eq!(recompute.is_some(), checkpoint);
    let grads = s.log_probs.sum().neg().backward();
    let grads = match recompute {
        Some(r) => r.finish(grads),
        None => GradientsParams::from_grads(grads, &m),
    };
    let mut optim: ModuleOptimizer = SgdConfig::new().init();
    let model = optim.step(0.1, m, grads).valid();
    let (toks, mask) = batch(device);
    values(model.forward(toks, mask))
}

#[test]
fn wgpu_matches_cpu() {
    // The kernel cache `ember` would use (`.ci/gpu-smoke` points EMBER_KERNEL_CACHE at a fresh
    // directory), set up before the first wgpu device.
    let cache = ember::common::kernel_cache::resolve(None).unwrap();
    let db = ember::common::kernel_cache::configure(&cache).unwrap();
    eprintln!("kernel cache: {db:?}");
    let cpu = ember::common::device::device("cpu").unwrap();
    let gpu = ember::common::device::device("wgpu").unwrap();
    let t0 = Instant::now();
    kernels::check_all(&gpu);
    eprintln!("kernels: {:.1} s", t0.elapsed().as_secs_f64());
    let (cpu_ad, gpu_ad) = (cpu.clone().autodiff(), gpu.clone().autodiff());
    cpu_ad.seed(1);
    let trainable = config().init(&cpu_ad);
    // Same weights, created on the wgpu autodiff device so its parameters are tracked
    // (`to_device` across backends keeps the values but not the gradient tracking).
    let trainable_gpu = config()
        .init(&gpu_ad)
        .load_record(trainable.clone().into_record());
    let model = trainable.valid();
    let on_gpu = trainable_gpu.valid();

    let t0 = Instant::now();
    let (toks, mask) = batch(&cpu);
    let want = values(model.forward(toks, mask));
    let (toks, mask) = batch(&gpu);
    let got = values(on_gpu.forward(toks, mask));
    eprintln!(
        "forward: first wgpu call {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let d = max_diff(&want, &got);
    assert!(d < 1e-4, "logits differ by {d}");

    let prompts = vec![vec![1u32, 5, 7], vec![1, 3]];
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: 6,
        ..SamplingConfig::default()
    };
    let t0 = Instant::now();
    let a = generate(&model, &prompts, &cfg, &cpu).unwrap();
    let b = generate(&on_gpu, &prompts, &cfg, &gpu).unwrap();
    eprintln!(
        "generate: {:.1} s (CPU and wgpu)",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(a.response_ids(), b.response_ids(), "greedy tokens differ");
    let d = max_diff(&values(a.log_probs), &values(b.log_probs));
    assert!(d < 1e-4, "sampler log-probs differ by {d}");
    // Sampling with the same seed draws the same tokens (host-generated uniforms).
    // Prompts left-padded to a bucket of 8 (the prefill shape of a bucketed recipe).
    let sampled = SamplingConfig {
        temperature: 1.0,
        seed: 9,
        n: 2,
        prompt_bucket: 8,
        ..cfg
    };
    let a = generate(&model, &prompts, &sampled, &cpu).unwrap();
    let b = generate(&on_gpu, &prompts, &sampled, &gpu).unwrap();
    assert_eq!(a.response_ids(), b.response_ids(), "sampled tokens differ");

    let t0 = Instant::now();
    let want = train_step(trainable, &cpu);
    let got = train_step(trainable_gpu, &gpu);
    eprintln!(
        "train step: {:.1} s (CPU and wgpu)",
        t0.elapsed().as_secs_f64()
    );
    let d = max_diff(&want, &got);
    assert!(d < 1e-3, "logits after one AdamW step differ by {d}");

    // Per-layer activation checkpointing on wgpu: the gradients of the plain backward.
    let t0 = Instant::now();
    let fresh = || {
        config()
            .init(&gpu_ad)
            .load_record(model.clone().into_record())
    };
    let plain = checkpointed_step(fresh(), &gpu, false);
    let checkpointed = checkpointed_step(fresh(), &gpu, true);
    eprintln!(
        "checkpointed step: {:.1} s (two steps on wgpu)",
        t0.elapsed().as_secs_f64()
    );
    let d = max_diff(&plain, &checkpointed);
    assert!(d < 1e-4, "checkpointed and plain steps differ by {d}");

    // WGSL has no bf16: a bf16 recipe runs in f32 on wgpu, and says so.
    let (p, note) = ember::common::device::resolve_precision(
        ember_train::Precision::Bf16,
        ember::common::device::kind("wgpu").unwrap(),
    );
    assert_eq!(p, ember_train::Precision::F32);
    assert!(note.unwrap().contains("no bf16 type"));
}
