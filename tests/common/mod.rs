//! Helpers shared by the whole-stack tests.
#![allow(dead_code)]

pub mod assets;
pub mod http;

/// A micro budget of the digits recipe (`recipes/digits-flow.toml`): every stage runs in
/// seconds; not a learning run.
pub const FLOW_MICRO: [&str; 14] = [
    "model.d_model=16",
    "model.layers=1",
    "model.heads=2",
    "pretrain.steps=20",
    "pretrain.batch=32",
    "pretrain.cache=false",
    "sampler.steps=4",
    "sampler.eval_steps=4",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.samples_per_prompt=4",
    "rl.eval_every=1",
    "eval.samples_per_class=2",
    "rl.train_timesteps=3",
];

use burn::tensor::{Device, Tensor, TensorData};

/// The CPU test device.
pub fn dev() -> Device {
    Device::flex()
}

/// A `[rows, cols]` tensor from nested rows.
pub fn t2(rows: &[&[f32]]) -> Tensor<2> {
    let r = rows.len();
    let c = rows.first().map_or(0, |x| x.len());
    let flat: Vec<f32> = rows.iter().flat_map(|x| x.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [r, c]), &dev())
}

/// A `[n]` tensor.
pub fn t1(v: &[f32]) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &dev())
}

/// A `[rows, cols]` tensor filled with `v`.
pub fn full2(rows: usize, cols: usize, v: f32) -> Tensor<2> {
    Tensor::full([rows, cols], v, &dev())
}

/// Host values of a tensor.
pub fn vals<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.try_into_vec_as::<f32>().expect("f32 data")
}

/// The largest element-wise `|a − b|` (0 for empty slices).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Asserts element-wise closeness with an absolute tolerance.
#[track_caller]
pub fn assert_close(actual: &[f32], expected: &[f64], tol: f64) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "length: {actual:?} vs {expected:?}"
    );
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (f64::from(*a) - e).abs() <= tol,
            "element {i}: {a} vs expected {e} (tol {tol}); actual {actual:?}"
        );
    }
}

/// Deterministic pseudo-random numbers (the engine's SplitMix64).
pub use ember_engine::SplitMix64;

/// Helpers on [`SplitMix64`] for the tests.
pub trait RngExt {
    /// `n` uniform values in [lo, hi).
    fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64>;
}

impl RngExt for SplitMix64 {
    fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// A `[rows, cols]` tensor from f64 host values.
pub fn from_f64(v: &[f64], rows: usize, cols: usize) -> Tensor<2> {
    let f: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    Tensor::from_data(TensorData::new(f, [rows, cols]), &dev())
}

/// A `[rows, cols]` tensor from f64 host values on `device`.
pub fn from_f64_on(v: &[f64], rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    let f: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    Tensor::from_data(TensorData::new(f, [rows, cols]), device)
}

/// The rows of a run's `metrics.jsonl` without wall times (`perf/*`, `timing_s/*`), to compare
/// two runs step for step.
pub fn metric_rows(run: &std::path::Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut m: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(l).unwrap();
            m.retain(|k, _| !k.starts_with("perf/") && !k.starts_with("timing_s/"));
            m
        })
        .collect()
}

/// Prefill `prompt_len` tokens of `batch` rows, then three single-token steps: the logits of
/// every step, flattened.
pub fn decode_logits(
    model: &ember_llm::Llama,
    batch: usize,
    prompt_len: usize,
    device: &Device,
) -> Vec<f32> {
    let vocab = model.vocab_size();
    let mut cache =
        ember_llm::cache::KvCache::new(model.cache_shape(), batch, prompt_len + 3, device);
    let ids = |t: usize, s: usize| -> Tensor<2, burn::tensor::Int> {
        let v: Vec<i64> = (0..batch * t)
            .map(|i| ((i * 37 + s * 11 + 5) % vocab) as i64)
            .collect();
        Tensor::from_data(TensorData::new(v, [batch, t]), device)
    };
    let mut out = vals(model.forward_cached(
        ids(prompt_len, 0),
        Tensor::ones([batch, prompt_len], device),
        &mut cache,
    ));
    for s in 1..4 {
        let step = model.forward_cached(ids(1, s), Tensor::ones([batch, 1], device), &mut cache);
        out.extend(vals(step));
    }
    out
}
