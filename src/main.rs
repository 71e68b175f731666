//! The `ember` command line.

use anyhow::{Context, Result, bail};

mod cli_llm;

use ember::{job, recipe};

const USAGE: &str = "usage: ember <command> [options]

commands:
  generate --model <dir|file.gguf> --prompt <text> [--chat] [--max-new-tokens N]
           [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--n N]
           [--adapter <peft dir>] [--device cpu|cuda|wgpu|auto]
                                       complete a prompt (temperature 0 = greedy)
  export --model <dir|file.gguf> [--adapter <peft dir>] --out <dir>
                                       write Hugging Face safetensors + config.json
  train <recipe.toml> [--set key=value ...] [--out <dir>] [--resume] [--overwrite]
        [--stop-after N] [--quiet]     run a recipe (default run directory runs/<name>): an LLM
                                       recipe, or an image recipe (kind = flow);
                                       Ctrl-C stops after the current step with a checkpoint
  warmup <recipe.toml> [--set key=value ...] [--passes N] [--no-eval] [--json FILE] [--quiet]
                                       run every shape of an LLM recipe's job (generation,
                                       rescoring, training, evaluation) N times (default 2) and
                                       time each pass: compiles GPU kernels ahead of a run into
                                       the kernel cache; first-run vs warm seconds
  molora <recipe.toml> [--set key=value ...] [--out <dir>] [--quiet]
                                       compare LoRA, learned-router MoLoRA and ReMix
  eval <run dir> [--checkpoint <dir>] [--eval-size N]
                                       greedy held-out accuracy of an LLM run's final model
  bench-llm [--size tiny|smollm2|all|none] [--device ..] [--reps N] [--json FILE] [--matmul]
            [--precision f32|bf16] [--fused-attention] [--out DIR]
                                       LLM throughput benchmark (benches/README.md;
                                       bench-llm --help lists the options)
  info [--device cpu|cuda|wgpu|auto]   show the compiled backends and run a tiny engine check
  help                                 this text

global option (GPU builds): --kernel-cache <dir|off>  where compiled kernels and autotune results
  persist between runs (default: $EMBER_KERNEL_CACHE, else $EMBER_CACHE/kernels)";

fn main() {
    ember::heap::keep_freed_memory();
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let flag = take_option(&mut args, "--kernel-cache")?;
    let cache = ember::kernel_cache::resolve(flag.as_deref())?;
    ember::kernel_cache::configure(&cache)?;
    match args.first().map(String::as_str) {
        Some("info") => info(&args[1..]),
        Some("generate") => cli_llm::generate_cmd(&args[1..]),
        Some("train") => train_cmd(&args[1..]),
        Some("eval") => eval_cmd(&args[1..]),
        Some("molora") => molora_cmd(&args[1..]),
        Some("warmup") => warmup_cmd(&args[1..]),
        Some("bench-llm") => ember::bench::run(&args[1..]),
        Some("export") => cli_llm::export_cmd(&args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}

/// Removes `name <value>` from `args` wherever it appears, returning the value.
fn take_option(args: &mut Vec<String>, name: &str) -> Result<Option<String>> {
    let Some(i) = args.iter().position(|a| a == name) else {
        return Ok(None);
    };
    if i + 1 >= args.len() {
        bail!("{name} needs a value");
    }
    let v = args.remove(i + 1);
    args.remove(i);
    Ok(Some(v))
}

fn train_cmd(args: &[String]) -> Result<()> {
    let path = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .context("usage: ember train <recipe.toml> [--set key=value ...] [--out dir] [--resume]")?;
    let mut sets = Vec::new();
    let mut out = None;
    let mut opts = job::RunOptions::default();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--set" => sets.push(it.next().context("--set needs key=value")?.clone()),
            "--out" => {
                out = Some(std::path::PathBuf::from(
                    it.next().context("--out needs a directory")?,
                ))
            }
            "--quiet" => opts.quiet = true,
            "--resume" => opts.resume = true,
            "--overwrite" => opts.overwrite = true,
            "--stop-after" => {
                let v = it.next().context("--stop-after needs a step count")?;
                opts.stop_after = Some(
                    v.parse()
                        .with_context(|| format!("--stop-after: `{v}` is not a step count"))?,
                );
            }
            other => bail!(
                "unknown option `{other}` for `ember train` (valid: --out, --overwrite, --quiet, \
                 --resume, --set, --stop-after)"
            ),
        }
    }
    if opts.resume && opts.overwrite {
        bail!("--resume and --overwrite contradict each other");
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading recipe {path}"))?;
    if ember::flow_job::is_flow_recipe(&text) {
        let recipe =
            ember::flow_job::parse(&text, &sets).with_context(|| format!("recipe {path}"))?;
        let out = out.unwrap_or_else(|| std::path::Path::new("runs").join(&recipe.name));
        set_ctrlc();
        let s = ember::flow_job::train(&recipe, &out, &opts)?;
        if s.interrupted {
            std::process::exit(130);
        }
        return Ok(());
    }
    let recipe = recipe::parse(&text, &sets).with_context(|| format!("recipe {path}"))?;
    let out = out.unwrap_or_else(|| std::path::Path::new("runs").join(&recipe.name));
    set_ctrlc();
    let s = job::train(&recipe, &out, &opts)?;
    if s.interrupted {
        std::process::exit(130);
    }
    Ok(())
}

/// First Ctrl-C: finish the step, checkpoint, exit 130. Second: exit at once.
fn set_ctrlc() {
    let _ = ctrlc::set_handler(|| {
        if job::request_stop() {
            eprintln!("\ninterrupted again: exiting without a final checkpoint");
            std::process::exit(130);
        }
        eprintln!(
            "\nCtrl-C: stopping after this step and writing a checkpoint (Ctrl-C again to quit now)"
        );
    });
}

fn warmup_cmd(args: &[String]) -> Result<()> {
    let path = args.first().filter(|a| !a.starts_with("--")).context(
        "usage: ember warmup <recipe.toml> [--set key=value ...] [--passes N] [--json FILE]",
    )?;
    let mut sets = Vec::new();
    let mut json = None;
    let mut opts = ember::warmup::WarmupOptions::default();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--set" => sets.push(it.next().context("--set needs key=value")?.clone()),
            "--json" => json = Some(it.next().context("--json needs a file")?.clone()),
            "--quiet" => opts.quiet = true,
            "--no-eval" => opts.eval = false,
            "--passes" => {
                let v = it.next().context("--passes needs a count")?;
                opts.passes = v
                    .parse()
                    .with_context(|| format!("--passes: `{v}` is not a count"))?;
            }
            other => bail!(
                "unknown option `{other}` for `ember warmup` (valid: --json, --no-eval, \
                 --passes, --quiet, --set)"
            ),
        }
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading recipe {path}"))?;
    if ember::flow_job::is_flow_recipe(&text) {
        bail!(
            "{path} is an image (kind = \"flow\") recipe; `ember warmup` covers LLM recipes, \
             and an image run's shapes are fixed from its first step"
        );
    }
    let recipe = recipe::parse(&text, &sets).with_context(|| format!("recipe {path}"))?;
    let report = ember::warmup::warmup(&recipe, &opts)?;
    let text = serde_json::to_string_pretty(&report)?;
    match json {
        Some(f) => ember::checkpoint::write_atomic(std::path::Path::new(&f), text.as_bytes())
            .with_context(|| format!("writing {f}"))?,
        None => println!("{text}"),
    }
    Ok(())
}

fn molora_cmd(args: &[String]) -> Result<()> {
    let path = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .context("usage: ember molora <recipe.toml> [--set key=value ...] [--out dir]")?;
    let mut sets = Vec::new();
    let mut out = None;
    let mut quiet = false;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--set" => sets.push(it.next().context("--set needs key=value")?.clone()),
            "--out" => out = Some(it.next().context("--out needs a directory")?.clone()),
            "--quiet" => quiet = true,
            other => {
                bail!("unknown option `{other}` for `ember molora` (valid: --out, --quiet, --set)")
            }
        }
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading recipe {path}"))?;
    let recipe =
        ember::molora_job::parse(&text, &sets).with_context(|| format!("recipe {path}"))?;
    let out = out.map_or_else(
        || std::path::Path::new("runs").join(&recipe.name),
        std::path::PathBuf::from,
    );
    ember::molora_job::run(&recipe, &out, quiet)?;
    Ok(())
}

fn eval_cmd(args: &[String]) -> Result<()> {
    let run = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .context("usage: ember eval <run dir> [--checkpoint <dir>] [--eval-size N]")?;
    let o = cli_llm::Opts::parse(&args[1..], &["checkpoint", "eval-size"], &[])?;
    let eval_size = o
        .get("eval-size")
        .map(str::parse)
        .transpose()
        .context("--eval-size")?;
    let acc = job::evaluate_run(
        std::path::Path::new(run),
        o.get("checkpoint").map(std::path::Path::new),
        eval_size,
    )?;
    println!("{}", serde_json::json!({ "run": run, "accuracy": acc }));
    Ok(())
}

fn info(args: &[String]) -> Result<()> {
    let mut name = "auto".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--device" => name = it.next().context("--device needs a value")?.clone(),
            other => bail!("unknown option `{other}` for `ember info`"),
        }
    }
    let backends: Vec<String> = ember::device::compiled_backends()
        .iter()
        .map(ToString::to_string)
        .collect();
    println!(
        "ember {} — backends compiled in: {}",
        env!("CARGO_PKG_VERSION"),
        backends.join(", ")
    );
    let device = ember::device::device(&name)?;
    println!("device: {device:?}");
    println!("kernel cache: {}", ember::kernel_cache::describe());
    // A one-group GRPO check on the chosen device: rewards [1, 0, 0, 0] → [1.5, −0.5, −0.5, −0.5].
    use burn::tensor::Tensor;
    use ember::engine::{AdvantageConfig, RolloutBatch, compute_advantages};
    let mask = Tensor::<2>::ones([4, 1], &device);
    let rewards = Tensor::<1>::from_floats([1.0, 0.0, 0.0, 0.0], &device);
    let batch = RolloutBatch::new(mask, rewards, &[0, 0, 0, 0])?;
    let adv = compute_advantages(&AdvantageConfig::default(), &batch, 0)?;
    let v: Vec<f32> = adv
        .advantages
        .try_into_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    println!("GRPO advantages of rewards [1, 0, 0, 0]: {v:?}");
    println!("heap: {}", ember::heap::keep_freed_memory());
    #[cfg(target_arch = "x86_64")]
    println!(
        "CPU vector units: avx512f {}, avx2 {}, fma {} (the CPU backend's GEMM picks its \
         kernels at run time: AVX-512 where present, else AVX2/FMA, else SSE)",
        yes_no(std::arch::is_x86_feature_detected!("avx512f")),
        yes_no(std::arch::is_x86_feature_detected!("avx2")),
        yes_no(std::arch::is_x86_feature_detected!("fma")),
    );
    let err = matmul_check(&device)?;
    println!("f32 matmul 67x96 · 96x130 against a host loop: max |error| {err:.2e}");
    if err > 1e-3 {
        bail!("the matrix product on {name} disagrees with the host loop by {err}");
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// A product large enough to go through the backend's GEMM kernels (and its runtime choice of
/// vector units), checked against a plain host loop.
fn matmul_check(device: &burn::tensor::Device) -> Result<f32> {
    use burn::tensor::{Tensor, TensorData};
    let (m, k, n) = (67usize, 96usize, 130usize);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let ta = Tensor::<2>::from_data(TensorData::new(a.clone(), [m, k]), device);
    let tb = Tensor::<2>::from_data(TensorData::new(b.clone(), [k, n]), device);
    let got: Vec<f32> = ta
        .matmul(tb)
        .try_into_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut worst = 0f32;
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            worst = worst.max((got[i * n + j] - want).abs());
        }
    }
    Ok(worst)
}
