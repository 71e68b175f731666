//! LLM throughput: prefill, decode (batch 1 and 32) and training forward+backward of the
//! log-prob loss, for a tiny config and the SmolLM2-135M shape. Random weights are written as a
//! Hugging Face checkpoint that `benches/llm_torch.py` loads, so both run the same model.
//!
//! ```text
//! cargo bench --bench llm -- [--size tiny|smollm2|all|none] [--device cpu|cuda|wgpu|auto]
//!                            [--out DIR] [--reps N] [--json FILE] [--matmul]
//!                            [--precision f32|bf16] [--fused-attention]
//! ember bench-llm [same options]     (the same, from the CLI: how GPU builds run it)
//! ```
//!
//! Prints one line per measurement and, with `--json`, writes them for the comparison table:
//! tokens/s of the best run, the first run's seconds (kernel compilation and autotuning on a
//! GPU), the best ("warm") seconds, and the process's peak resident memory during the
//! measurement (Linux: the high-water mark is reset before each one through
//! `/proc/self/clear_refs`; `benches/llm_torch.py` measures the same way). GPU memory is
//! sampled outside the process by `scripts/gpu_bench.sh`.

use crate::device;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::{Family, LlamaConfig, SamplingConfig, generate, save_hf};
use std::time::Instant;

fn config(size: &str) -> LlamaConfig {
    match size {
        "tiny" => LlamaConfig::new(Family::Llama, 512, 128, 352, 4, 4, 2)
            .with_max_position_embeddings(512),
        // SmolLM2-135M: d 576, 30 layers, 9 heads / 3 KV heads, MLP 1536, vocab 49152, tied.
        _ => LlamaConfig::new(Family::Llama, 49152, 576, 1536, 30, 9, 3)
            .with_max_position_embeddings(2048)
            .with_rope_theta(100000.0)
            .with_tie_embeddings(true),
    }
}

fn tokens(b: usize, t: usize, vocab: usize, device: &Device) -> Tensor<2, Int> {
    let v: Vec<i64> = (0..b * t)
        .map(|i| ((i * 7919 + 13) % vocab) as i64)
        .collect();
    Tensor::from_data(TensorData::new(v, [b, t]), device)
}

/// Resets the process's peak resident set size (Linux ≥ 4.0; a no-op elsewhere).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident set size in MiB since the last reset (`VmHWM`), if known.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn sync(device: &Device) {
    let _ = device.sync();
}

/// Best of `reps` timings of `f` after one warm-up call (which also pays kernel compilation).
fn time<F: FnMut()>(device: &Device, reps: usize, mut f: F) -> (f64, f64) {
    let t0 = Instant::now();
    f();
    sync(device);
    let first = t0.elapsed().as_secs_f64();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        sync(device);
        best = best.min(t.elapsed().as_secs_f64());
    }
    (first, best)
}

/// Runs the benchmark with command-line style `args`.
pub fn run(args: &[String]) {
    let args: Vec<String> = args.iter().filter(|a| *a != "--bench").cloned().collect();
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let sizes: Vec<String> = match get("--size").as_deref() {
        Some("all") | None => vec!["tiny".into(), "smollm2".into()],
        Some("none") => vec![],
        Some(s) => vec![s.to_string()],
    };
    let device_name = get("--device").unwrap_or_else(|| "auto".into());
    let device = device::device(&device_name).expect("device");
    let requested = match get("--precision").as_deref() {
        None | Some("f32") => ember_llm::Precision::F32,
        Some("bf16") => ember_llm::Precision::Bf16,
        Some(other) => panic!("--precision {other}: expected f32 or bf16"),
    };
    let (precision, note) =
        device::resolve_precision(requested, device::kind(&device_name).expect("device"));
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let reps: usize = get("--reps").and_then(|r| r.parse().ok()).unwrap_or(3);
    let out = std::path::PathBuf::from(get("--out").unwrap_or_else(|| {
        std::env::temp_dir()
            .join("ember-bench")
            .display()
            .to_string()
    }));
    let mut rows = Vec::new();
    if get("--matmul").is_some() || args.iter().any(|a| a == "--matmul") {
        // Attribution: plain f32 matrix products of the SmolLM2 shapes (an MLP projection and the
        // LM head over 1024 tokens).
        for (m, k, n) in [
            (1024usize, 576usize, 1536usize),
            (1024, 576, 49152),
            (32, 576, 1536),
        ] {
            let a = Tensor::<2>::ones([m, k], &device);
            let b = Tensor::<2>::ones([k, n], &device);
            let (first, best) = time(&device, reps, || {
                let _ = a.clone().matmul(b.clone());
            });
            let gflops = 2.0 * (m * k * n) as f64 / best / 1e9;
            println!(
                "ember matmul {m}x{k}x{n}: {gflops:.1} GFLOP/s (best {best:.4} s, first {first:.3} s)"
            );
            rows.push(serde_json::json!({"size": "matmul", "bench": format!("{m}x{k}x{n}"), "gflops": gflops, "best_s": best}));
        }
    }
    for size in &sizes {
        let cfg = config(size);
        let model = cfg.init(&device);
        let dir = out.join(size);
        save_hf(&model, &cfg, &[], &dir).expect("write checkpoint");
        let fused = args.iter().any(|a| a == "--fused-attention");
        let model = model.with_precision(precision).with_fused_attention(fused);
        let vocab = cfg.vocab_size;
        let mut record = |name: &str, tokens: usize, (first, best): (f64, f64)| {
            let tps = tokens as f64 / best;
            let peak = peak_rss_mib();
            println!(
                "ember {size:8} {name:18} {tps:12.1} tokens/s   (best {best:.4} s, first {first:.3} s, \
                 peak RSS {} MiB)",
                peak.map_or("?".into(), |m| format!("{m:.0}"))
            );
            rows.push(
                serde_json::json!({"size": size, "bench": name, "tokens_per_s": tps,
                "best_s": best, "first_s": first, "peak_rss_mib": peak,
                "precision": format!("{precision:?}").to_lowercase()}),
            );
        };
        // Prefill: batch 8 × 128 tokens, no grad.
        let (b, t) = (8, 128);
        let toks = tokens(b, t, vocab, &device);
        let mask = Tensor::<2>::ones([b, t], &device);
        reset_peak_rss();
        record(
            "prefill_b8_t128",
            b * t,
            time(&device, reps, || {
                let _ = model.forward(toks.clone(), mask.clone());
            }),
        );
        // Decode: 16-token prompts, 64 new tokens, greedy, no stop token.
        for batch in [1usize, 32] {
            let prompts: Vec<Vec<u32>> = (0..batch)
                .map(|i| {
                    (0..16)
                        .map(|j| ((i * 31 + j * 17) % vocab) as u32)
                        .collect()
                })
                .collect();
            let sc = SamplingConfig {
                temperature: 0.0,
                max_new_tokens: 64,
                stop_check_every: 1000,
                ..SamplingConfig::default()
            };
            reset_peak_rss();
            record(
                &format!("decode_b{batch}"),
                batch * 64,
                time(&device, reps.min(2), || {
                    let _ = generate(&model, &prompts, &sc, &device).expect("generate");
                }),
            );
        }
        // Training: forward + backward of −Σ log π over batch 8 × 128 tokens.
        let ad = device.clone().autodiff();
        let train_model = ember_llm::load(&dir, &ad)
            .expect("reload checkpoint")
            .model
            .with_precision(precision)
            .with_fused_attention(fused);
        let toks = tokens(b, t, vocab, &ad);
        let mask = Tensor::<2>::ones([b, t], &ad);
        reset_peak_rss();
        record(
            "train_b8_t128",
            b * t,
            time(&ad, reps, || {
                let (lp, _) =
                    train_model.token_log_probs(toks.clone(), mask.clone(), 1.0, false, true);
                let _grads = lp.sum().neg().backward();
            }),
        );
    }
    if let Some(path) = get("--json") {
        std::fs::write(&path, serde_json::to_string_pretty(&rows).unwrap()).expect("write json");
    }
}
