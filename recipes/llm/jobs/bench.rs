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

use crate::common::device;
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

/// The usage text of `ember bench-llm` / `cargo bench --bench llm`.
pub const USAGE: &str =
    "usage: ember bench-llm [options]   (or: cargo bench --bench llm -- [options])

LLM throughput, Ember side (benches/README.md; benches/llm_torch.py is the PyTorch side):
prefill b8x128, greedy decode b1 and b32 (16-token prompts, 64 new tokens) and a training
forward+backward b8x128, on random weights written as a Hugging Face checkpoint.

options:
  --size tiny|smollm2|all|none   model shapes to run (default all; none with --matmul)
  --device cpu|cuda|wgpu|auto    backend (default auto)
  --out DIR                      where the checkpoints go (default: the temp dir's ember-bench)
  --reps N                       timed runs after the warm-up run; the best counts (default 3)
  --json FILE                    also write the rows as JSON
  --matmul                       matrix products of the SmolLM2 shapes, in GFLOP/s (f32;
                                 the decode shape also in f16 and bf16)
  --precision f32|bf16           product precision (bf16: autocast-style mixed precision)
  --fused-attention              burn's fused attention op for multi-token passes
  --only ROWS                    a comma-separated subset of prefill,decode_b1,decode_b32,train
                                 (e.g. to profile one of them; default all), or update: a GRPO
                                 update's scoring pass and backward (LoRA r16 on the seven
                                 projections, 2 rows of a 64-token prompt and N response
                                 tokens), with the device's reserved memory on GPUs
  --update-tokens N              the update row's response tokens (default 1024)
  --checkpoint                   the update row with each layer's activations checkpointed
  --kernels ember|burn|LIST      Ember's fused kernels (default), the decomposed burn-op
                                 references, or a comma-separated list of the kernels to use
                                 (head, attention, rmsnorm, swiglu, rope, quant, gemv, matmul;
                                 crates/ember-kernels),
                                 with `ember` for the default set: `ember,amx` adds the bf16
                                 products on Intel AMX tiles (not on by default)
  --blocks q4_1|q8_0|bf16        quantize the weights to GGUF's blocks (the f32 weights become
                                 the dequantized blocks), which decode steps of up to
                                 ember_llm::BLOCK_ROWS rows read (the `quant` kernel); bf16:
                                 the weights rounded to bf16 and packed once for AMX tiles,
                                 which every product reads under `--kernels ember,amx`
  -h, --help                     this text";

/// Parsed benchmark options.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchArgs {
    /// Model shapes to run.
    pub sizes: Vec<String>,
    /// Device name.
    pub device: String,
    /// Checkpoint directory.
    pub out: std::path::PathBuf,
    /// Timed repetitions.
    pub reps: usize,
    /// JSON output file.
    pub json: Option<String>,
    /// Run the matrix-product rows.
    pub matmul: bool,
    /// Requested precision.
    pub precision: ember_train::Precision,
    /// Fused attention for multi-token passes.
    pub fused_attention: bool,
    /// The rows to run (`prefill`, `decode_b1`, `decode_b32`, `train`).
    pub only: Vec<String>,
    /// The fused kernels used; the others take their burn-op references.
    pub kernels: Vec<ember_kernels::Kernel>,
    /// Quantize the weights to these blocks (`--blocks`).
    pub blocks: Option<ember_kernels::QuantKind>,
    /// The update row's response tokens (`--update-tokens`).
    pub update_tokens: usize,
    /// The update row with per-layer activation checkpointing (`--checkpoint`).
    pub checkpoint: bool,
}

/// The measurements of each size, in order (`update` only when asked for by `--only`).
const ROWS: [&str; 4] = ["prefill", "decode_b1", "decode_b32", "train"];
const ALL_ROWS: [&str; 5] = ["prefill", "decode_b1", "decode_b32", "train", "update"];

impl BenchArgs {
    /// Parses `args`; `Ok(None)` means `--help` was asked for. Unknown flags, missing values
    /// and bad values are errors that name them.
    pub fn parse(args: &[String]) -> anyhow::Result<Option<Self>> {
        use anyhow::{Context, bail};
        let mut out = BenchArgs {
            sizes: vec!["tiny".into(), "smollm2".into()],
            device: "auto".into(),
            out: std::env::temp_dir().join("ember-bench"),
            reps: 3,
            json: None,
            matmul: false,
            precision: ember_train::Precision::F32,
            fused_attention: false,
            only: ROWS.iter().map(|r| r.to_string()).collect(),
            kernels: ember_kernels::Kernel::DEFAULT.to_vec(),
            blocks: None,
            update_tokens: 1024,
            checkpoint: false,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value\n\n{USAGE}"))
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                // `cargo bench` passes `--bench` to every harness-less bench binary.
                "--bench" => {}
                "--matmul" => out.matmul = true,
                "--fused-attention" => out.fused_attention = true,
                "--checkpoint" => out.checkpoint = true,
                "--update-tokens" => {
                    let v = value()?;
                    out.update_tokens = match v.parse::<usize>() {
                        Ok(n) if (1..=8192).contains(&n) => n,
                        _ => bail!("--update-tokens {v}: expected a whole number from 1 to 8192"),
                    }
                }
                "--size" => {
                    out.sizes = match value()?.as_str() {
                        "all" => vec!["tiny".into(), "smollm2".into()],
                        "none" => vec![],
                        s @ ("tiny" | "smollm2") => vec![s.to_string()],
                        s => bail!("--size {s}: expected tiny, smollm2, all or none"),
                    }
                }
                "--device" => out.device = value()?,
                "--only" => {
                    let v = value()?;
                    out.only = v.split(',').map(|r| r.trim().to_string()).collect();
                    if let Some(bad) = out.only.iter().find(|r| !ALL_ROWS.contains(&r.as_str())) {
                        bail!(
                            "--only {v}: unknown row `{bad}` (rows: {})",
                            ALL_ROWS.join(",")
                        );
                    }
                }
                "--out" => out.out = value()?.into(),
                "--json" => out.json = Some(value()?),
                "--reps" => {
                    let v = value()?;
                    out.reps = match v.parse::<usize>() {
                        Ok(n) if n >= 1 => n,
                        _ => bail!("--reps {v}: expected a whole number >= 1"),
                    }
                }
                "--precision" => {
                    out.precision = match value()?.as_str() {
                        "f32" => ember_train::Precision::F32,
                        "bf16" => ember_train::Precision::Bf16,
                        p => bail!("--precision {p}: expected f32 or bf16"),
                    }
                }
                "--kernels" => out.kernels = kernels_flag(&value()?)?,
                "--blocks" => {
                    out.blocks = match value()?.as_str() {
                        "q4_1" => Some(ember_kernels::QuantKind::Q4_1),
                        "q8_0" => Some(ember_kernels::QuantKind::Q8_0),
                        "bf16" => Some(ember_kernels::QuantKind::Bf16),
                        b => bail!("--blocks {b}: expected q4_1, q8_0 or bf16"),
                    }
                }
                other => bail!("unknown option `{other}`\n\n{USAGE}"),
            }
        }
        Ok(Some(out))
    }
}

/// `--kernels ember|burn|LIST`: the fused kernels chosen (`ember_kernels::parse_kernels`).
///
/// # Errors
/// An unknown kernel name.
pub fn kernels_flag(v: &str) -> anyhow::Result<Vec<ember_kernels::Kernel>> {
    ember_kernels::parse_kernels(v).map_err(|e| anyhow::anyhow!("--{e}"))
}

/// Runs the benchmark with command-line style `args` (`--help` prints the usage).
///
/// # Errors
/// A bad option, an unknown device, or a checkpoint or JSON file that cannot be written.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    use anyhow::Context;
    let Some(opts) = BenchArgs::parse(args)? else {
        println!("{USAGE}");
        return Ok(());
    };
    ember_kernels::set_kernels(&opts.kernels);
    let device = device::device(&opts.device)?;
    let (precision, note) = device::resolve_precision(opts.precision, device::kind(&opts.device)?);
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let mut rows = Vec::new();
    if opts.matmul {
        rows.extend(matmul_rows(&device, opts.reps));
    }
    for size in &opts.sizes {
        // On a worker of the CPU backend's pool, as generation and the update run.
        let r = ember_kernels::on_workers(|| size_rows(size, &opts, &device, precision))?;
        rows.extend(r);
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

/// Attribution: matrix products of the SmolLM2 shapes (an MLP projection and the LM head over
/// 1024 tokens, and a decode step's projection at batch 32): f32, then the decode shape with f16
/// and bf16 operands (the activations cast on every call, as a reduced-precision rollout would;
/// the weight cast once).
fn matmul_rows(device: &Device, reps: usize) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    use burn::tensor::FloatDType;
    for (m, k, n, dt) in [
        (1024usize, 576usize, 1536usize, None),
        (1024, 576, 49152, None),
        (32, 576, 1536, None),
        (32, 576, 1536, Some(FloatDType::F16)),
        (32, 576, 1536, Some(FloatDType::BF16)),
    ] {
        let a = Tensor::<2>::ones([m, k], device);
        let b = Tensor::<2>::ones([k, n], device);
        let b = match dt {
            Some(dt) => b.cast(dt),
            None => b,
        };
        let (first, best) = time(device, reps, || {
            let _ = match dt {
                Some(dt) => a.clone().cast(dt).matmul(b.clone()),
                None => a.clone().matmul(b.clone()),
            };
        });
        let gflops = 2.0 * (m * k * n) as f64 / best / 1e9;
        let name = match dt {
            Some(dt) => format!("{m}x{k}x{n} {dt:?}").to_lowercase(),
            None => format!("{m}x{k}x{n}"),
        };
        println!("ember matmul {name}: {gflops:.1} GFLOP/s (best {best:.4} s, first {first:.3} s)");
        rows.push(
            serde_json::json!({"size": "matmul", "bench": name, "gflops": gflops, "best_s": best}),
        );
    }
    rows
}

/// Prefill, decode and training rows of one model size (a checkpoint written under `--out`).
fn size_rows(
    size: &str,
    opts: &BenchArgs,
    device: &Device,
    precision: ember_train::Precision,
) -> anyhow::Result<Vec<serde_json::Value>> {
    use anyhow::Context;
    let mut rows = Vec::new();
    let cfg = config(size);
    let model = cfg.init(device);
    let dir = opts.out.join(size);
    save_hf(&model, &cfg, &[], &dir)
        .with_context(|| format!("writing the benchmark checkpoint {}", dir.display()))?;
    let fused = opts.fused_attention;
    let reps = opts.reps;
    let model = match opts.blocks {
        Some(kind) => model
            .quantized(kind)
            .with_context(|| format!("quantizing to {}", kind.name()))?,
        None => model,
    };
    let model = model.with_precision(precision).with_fused_attention(fused);
    let vocab = cfg.vocab_size;
    let mut record = |name: &str, tokens: usize, (first, best): (f64, f64)| {
        let tps = tokens as f64 / best;
        let peak = peak_rss_mib();
        let reserved = device_reserved_mib(device);
        println!(
            "ember {size:8} {name:18} {tps:12.1} tokens/s   (best {best:.4} s, first {first:.3} s, \
             peak RSS {} MiB{})",
            peak.map_or("?".into(), |m| format!("{m:.0}")),
            reserved.map_or(String::new(), |m| format!(", device reserved {m:.0} MiB"))
        );
        rows.push(
            serde_json::json!({"size": size, "bench": name, "tokens_per_s": tps,
            "best_s": best, "first_s": first, "peak_rss_mib": peak,
            "device_reserved_mib": reserved,
            "precision": format!("{precision:?}").to_lowercase()}),
        );
    };
    // Prefill: batch 8 × 128 tokens, no grad.
    let (b, t) = (8, 128);
    let toks = tokens(b, t, vocab, device);
    let mask = Tensor::<2>::ones([b, t], device);
    if opts.only.iter().any(|r| r == "prefill") {
        reset_peak_rss();
        record(
            "prefill_b8_t128",
            b * t,
            time(device, reps, || {
                let _ = model.forward(toks.clone(), mask.clone());
            }),
        );
    }
    // Decode: 16-token prompts, 64 new tokens, greedy, no stop token.
    for batch in [1usize, 32] {
        if !opts.only.contains(&format!("decode_b{batch}")) {
            continue;
        }
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
            time(device, reps.min(2), || {
                // The prompts are valid by construction (in the vocabulary, within context).
                let _ = generate(&model, &prompts, &sc, device).expect("generate");
            }),
        );
    }
    if opts.only.iter().any(|r| r == "update") {
        let ad = device.clone().autodiff();
        let base = ember_llm::load(&dir, &ad)
            .with_context(|| format!("reloading {}", dir.display()))?
            .model
            .with_precision(precision)
            .with_checkpointing(opts.checkpoint);
        let (name, tokens, timed) = update_row(base, opts, &ad)?;
        record(&name, tokens, timed);
    }
    // Training: forward + backward of −Σ log π over batch 8 × 128 tokens.
    if !opts.only.iter().any(|r| r == "train") {
        return Ok(rows);
    }
    let ad = device.clone().autodiff();
    let train_model = ember_llm::load(&dir, &ad)
        .with_context(|| format!("reloading {}", dir.display()))?
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
            let (lp, _) = train_model.token_log_probs(toks.clone(), mask.clone(), 1.0, false, true);
            let _grads = lp.sum().neg().backward();
        }),
    );
    Ok(rows)
}

/// The device allocator's reserved memory in MiB (GPU backends; `None` on the CPU backend).
fn device_reserved_mib(device: &Device) -> Option<f64> {
    let usage = device.memory_pool_usage()?;
    Some(usage.bytes_reserved as f64 / (1u64 << 20) as f64)
}

/// The update row on `base` (on `ad`, an autodiff device): its name, tokens and timings, the
/// device's memory freed and the peak RSS reset before it.
fn update_row(
    base: ember_llm::Llama,
    opts: &BenchArgs,
    ad: &Device,
) -> anyhow::Result<(String, usize, (f64, f64))> {
    let run = update_pass(base, opts.update_tokens, ad)?;
    ad.memory_cleanup();
    reset_peak_rss();
    let t = 64 + opts.update_tokens;
    Ok((format!("update_b2_t{t}"), 2 * t, time(ad, opts.reps, run)))
}

/// A GRPO update's pass on `base` with LoRA r16/α32 on the seven projections: the actor's
/// scoring of 2 rows of a 64-token prompt and `response` tokens, `−Σ log π` and its backward
/// (finished by recomputing the layers where `base` checkpoints them).
fn update_pass(
    base: ember_llm::Llama,
    response: usize,
    ad: &Device,
) -> anyhow::Result<impl FnMut()> {
    use ember_train::Actor;
    let settings = ember_llm::LoraSettings {
        rank: 16,
        alpha: 32.0,
        targets: ember_llm::LORA_TARGETS
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    let model = ember_llm::apply_lora(base, &settings)?;
    let vocab = model.vocab_size();
    let t = 64 + response;
    let exp = ember_llm::actor::LlmExperience {
        tokens: tokens(2, t, vocab, ad),
        mask: Tensor::<2>::ones([2, t], ad),
        response_len: response,
        temperature: 1.0,
        adapters: true,
    };
    Ok(move || {
        let mut s = model.score(&exp, &[0, 1], false);
        let recompute = s.recompute.take();
        let grads = s.log_probs.sum().neg().backward();
        if let Some(r) = recompute {
            let _ = r.finish(grads);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Option<BenchArgs>> {
        BenchArgs::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_parse_and_bad_ones_are_named() {
        let o = parse(&["--size", "tiny", "--reps", "5", "--matmul", "--bench"])
            .unwrap()
            .unwrap();
        assert_eq!(o.sizes, vec!["tiny".to_string()]);
        assert_eq!((o.reps, o.matmul, o.fused_attention), (5, true, false));
        let k = parse(&["--kernels", "attention"]).unwrap().unwrap();
        assert_eq!(k.kernels, vec![ember_kernels::Kernel::Attention]);
        let k = parse(&["--kernels", "burn"]).unwrap().unwrap();
        assert!(k.kernels.is_empty());
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(parse(&["--size", "none", "-h"]).unwrap().is_none());
        for (args, needle) in [
            (&["--sizes", "tiny"][..], "unknown option `--sizes`"),
            (&["--reps"][..], "--reps needs a value"),
            (&["--reps", "0"][..], "--reps 0"),
            (&["--size", "huge"][..], "--size huge"),
            (&["--precision", "f16"][..], "--precision f16"),
            (&["--only", "prefill,decode"][..], "unknown row `decode`"),
            (
                &["--kernels", "head,flash"][..],
                "\"flash\" is not a kernel",
            ),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
