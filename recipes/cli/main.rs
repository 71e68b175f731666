//! The `ember` command line (clap: `--help` on every subcommand, unknown flags refused). Log
//! messages of the libraries (`log::warn!` and friends) reach stderr through `env_logger`;
//! `RUST_LOG` sets the level (default `warn`).

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use std::path::{Path, PathBuf};

mod generate;
mod gym;
mod world;

use ember::kinds::{self, AnyRecipe};
use ember_run::RunOptions;

/// Pure-Rust policy-gradient post-training on burn.
#[derive(Parser)]
#[command(name = "ember", version, about, long_about = None)]
struct Cli {
    /// GPU builds: where compiled kernels and autotune results persist between runs, or `off`
    /// (default: $EMBER_KERNEL_CACHE, else $EMBER_CACHE/kernels).
    #[arg(long, global = true, value_name = "DIR|off")]
    kernel_cache: Option<String>,
    /// Ember's fused kernels (`ember`, the default where the device has them), the decomposed
    /// burn-op references (`burn`), or a comma-separated list of the kernels to use (`head`,
    /// `attention`, `rmsnorm`, `swiglu`, `rope`, `quant`, `gemv`, `matmul`, and `amx`: many-row
    /// products in bf16 on Intel AMX tiles, never on by default; `ember,amx` adds it to the
    /// default set); also `EMBER_KERNELS`.
    #[arg(long, global = true, value_name = "ember|burn|LIST")]
    kernels: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a recipe: an LLM recipe, an image recipe (kind = "flow"), a multi-turn recipe
    /// (kind = "agent"), a continuous-control recipe (kind = "control"), program synthesis
    /// (kind = "programs") or unlearning (kind = "unlearning"). The first Ctrl-C stops after the
    /// current step with a checkpoint (exit 130); a second quits at once.
    Train(TrainArgs),
    /// Run every shape of an LLM recipe's job (generation, rescoring, training, evaluation) N
    /// times and time each pass: compiles GPU kernels into the kernel cache ahead of a run.
    Warmup(WarmupArgs),
    /// Compare LoRA, learned-router MoLoRA and ReMix on a mixture of tasks.
    Molora(MoloraArgs),
    /// Greedy held-out accuracy of an LLM run's final model (or of a checkpoint); for an image
    /// run, the evaluation the run logs (accuracy, p(class), diversity, entropy, JPEG size) of
    /// its latest checkpoint (or of --checkpoint).
    Eval(EvalArgs),
    /// Complete a prompt with a checkpoint (temperature 0 = greedy).
    Generate(generate::GenerateArgs),
    /// An OpenAI-compatible HTTP server (completions, chat completions, vLLM's LoRA endpoints)
    /// for a Hugging Face directory or GGUF file and its PEFT adapters; SIGINT/SIGTERM stop it
    /// after the requests already taken are answered.
    Serve(Box<ember_serve::ServeArgs>),
    /// Write a checkpoint (plus an optional adapter, merged) as Hugging Face safetensors +
    /// config.json.
    Export(generate::ExportArgs),
    /// Write a dataset of the policy's own samples with their rewards (JSONL), for recipes with
    /// an `[offline]` table.
    Rollouts(RolloutsArgs),
    /// How well each baseline estimates a prompt's value (BASIS, REINFORCE++'s batch mean,
    /// GRPO's group mean of 8): mean squared error against a Monte-Carlo estimate.
    #[command(name = "value-mse")]
    ValueMse(ValueMseArgs),
    /// PLoP (precise LoRA placement): each projection type's normalised feature norm on the
    /// recipe's task prompts, and the types `targets = "plop"` would give adapters.
    Plop(PlopArgs),
    /// LLM throughput benchmark (benches/README.md); `ember bench-llm --help` lists its options.
    #[command(name = "bench-llm", disable_help_flag = true)]
    BenchLlm {
        /// The benchmark's own options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The kernel gym: `list` its tasks, a task's `prompt`, `eval` a C kernel, or serve it as a
    /// `worker` over the JSON-lines environment protocol.
    Gym(gym::GymArgs),
    /// Show the compiled backends and run a tiny engine check on a device.
    Info {
        /// cpu, cuda, wgpu or auto.
        #[arg(long, default_value = "auto")]
        device: String,
    },
}

/// A recipe file and its `--set` overrides.
#[derive(Args)]
struct RecipeArgs {
    /// The recipe (TOML).
    recipe: PathBuf,
    /// Override a recipe value: dotted key = TOML value (bare words are strings); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

impl RecipeArgs {
    fn text(&self) -> Result<String> {
        std::fs::read_to_string(&self.recipe)
            .with_context(|| format!("reading recipe {}", self.recipe.display()))
    }
}

#[derive(Args)]
struct TrainArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Run directory (default runs/<name>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its latest checkpoint (same recipe and --set values).
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// Replace the run in --out (its logs and checkpoints).
    #[arg(long)]
    overwrite: bool,
    /// Stop with a checkpoint after this many steps, as Ctrl-C would (exit 130).
    #[arg(long, value_name = "N")]
    stop_after: Option<usize>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// The progress line instead of burn-train's dashboard (a binary built with
    /// `--features dashboard` shows the dashboard on a terminal).
    #[arg(long)]
    no_dashboard: bool,
    /// Also report every metrics row to these experiment trackers (comma-separated: mlflow,
    /// trackio, file (verl's JSONL), all, none); settings from their own environment variables
    /// (MLFLOW_TRACKING_URI, TRACKIO_SERVER_URL, VERL_FILE_LOGGER_PATH).
    #[arg(long, value_name = "TRACKERS", default_value = "none")]
    report_to: String,
    /// The project the trackers file the run under (default: ember).
    #[arg(long, value_name = "NAME")]
    project: Option<String>,
    /// The run's name in the trackers (default: the run directory's name).
    #[arg(long, value_name = "NAME")]
    run_name: Option<String>,
    /// Several processes (ranks from torchrun, srun or mpirun): auto (a launcher's world over
    /// the engine this binary has: MPI with `--features mpi`, NCCL with `--features cuda`), none
    /// (one process whatever the environment says), mpi, nccl. EMBER_DIST_TIMEOUT (seconds,
    /// default 600) bounds every collective.
    #[arg(long, value_name = "ENGINE", default_value = "auto")]
    dist: String,
}

#[derive(Args)]
struct WarmupArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Passes over the shape set (the first pays compilation).
    #[arg(long, default_value_t = 2)]
    passes: usize,
    /// Skip the held-out evaluation shapes.
    #[arg(long)]
    no_eval: bool,
    /// Write the report to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct MoloraArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Output directory (default runs/<name>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct RolloutsArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// The JSONL file to write.
    #[arg(long)]
    out: PathBuf,
    /// Prompts (each sampled `rollout.samples_per_prompt` times).
    #[arg(long, default_value_t = 512)]
    prompts: usize,
    /// Sample with this checkpoint of a run of the recipe instead of the warm-up.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

#[derive(Args)]
struct ValueMseArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Prompts.
    #[arg(long, default_value_t = 256)]
    prompts: usize,
    /// Monte-Carlo responses per prompt.
    #[arg(long, default_value_t = 64)]
    mc: usize,
    /// Use this checkpoint of a run of the recipe instead of the warm-up.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// BASIS kernel bandwidths to report.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.25,0.5,1")]
    bandwidths: Vec<f32>,
}

#[derive(Args)]
struct PlopArgs {
    #[command(flatten)]
    recipe: RecipeArgs,
    /// Projection types to choose (default: the recipe's `plop_count`, else 3).
    #[arg(long)]
    count: Option<usize>,
    /// Training prompts to score (default: the recipe's `plop_prompts`, else 64).
    #[arg(long)]
    prompts: Option<usize>,
    /// Print the scores as JSON (per type and per layer).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct EvalArgs {
    /// The run directory.
    run: PathBuf,
    /// Evaluate this checkpoint directory instead of the final model.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Held-out problems (default: the recipe's task.eval_size); for an image run, samples per
    /// class (default: the recipe's eval.samples_per_class).
    #[arg(long)]
    eval_size: Option<usize>,
}

fn main() {
    // Before any thread starts: the threads started later inherit the float mode.
    ember::common::subnormals::flush_to_zero();
    ember::common::heap::keep_freed_memory();
    // Log records go to stderr through the run kit, which holds them while a dashboard is up.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .target(env_logger::Target::Pipe(Box::new(ember_run::LogSink)))
        .init();
    ember_run::on_forced_exit(ember_tasks::process::kill_all);
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        // After a stop signal the error is most likely the stop's (a warm-up cut short): exit
        // with the signal's status, as a stopped run does.
        let code = if ember_run::stop_requested() {
            ember_run::stop_exit_code()
        } else {
            1
        };
        std::process::exit(code);
    }
}

fn run(cli: Cli) -> Result<()> {
    if let Some(k) = &cli.kernels {
        ember_kernels::set_kernels(&ember::llm::jobs::bench::kernels_flag(k)?);
    } else if let Ok(k) = std::env::var("EMBER_KERNELS") {
        let kernels =
            ember_kernels::parse_kernels(&k).map_err(|e| anyhow::anyhow!("EMBER_KERNELS: {e}"))?;
        ember_kernels::set_kernels(&kernels);
    }
    let cache = ember::common::kernel_cache::resolve(cli.kernel_cache.as_deref())?;
    ember::common::kernel_cache::configure(&cache)?;
    match cli.command {
        Command::Train(a) => train(a),
        Command::Serve(a) => {
            let device = ember::common::device::device(&a.device)?;
            ember_serve::serve(*a, device)
        }
        Command::Warmup(a) => warmup(a),
        Command::Molora(a) => molora(a),
        Command::Eval(a) if is_flow_run(&a.run) => {
            let e = ember::flow::job::evaluate_run(&a.run, a.checkpoint.as_deref(), a.eval_size)?;
            let mut v = serde_json::to_value(e)?;
            v["run"] = a.run.display().to_string().into();
            println!("{v}");
            Ok(())
        }
        Command::Eval(a) => {
            let acc =
                ember::llm::jobs::eval::evaluate_run(&a.run, a.checkpoint.as_deref(), a.eval_size)?;
            println!(
                "{}",
                serde_json::json!({ "run": a.run.display().to_string(), "accuracy": acc })
            );
            Ok(())
        }
        Command::Rollouts(a) => {
            let r = ember::llm::schema::parse(&a.recipe.text()?, &a.recipe.sets)?;
            let report = ember::llm::jobs::rollouts::rollouts(
                &r,
                &a.out,
                a.prompts,
                a.checkpoint.as_deref(),
            )?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Command::ValueMse(a) => {
            let r = ember::llm::schema::parse(&a.recipe.text()?, &a.recipe.sets)?;
            let o = ember::llm::jobs::value_mse::ValueMse {
                prompts: a.prompts,
                mc: a.mc,
                checkpoint: a.checkpoint.as_deref(),
                bandwidths: a.bandwidths,
            };
            let report = ember::llm::jobs::value_mse::value_mse(&r, &o)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        Command::Plop(a) => {
            let r = ember::llm::schema::parse(&a.recipe.text()?, &a.recipe.sets)?;
            let c = ember::llm::jobs::plop::plop(&r, a.count, a.prompts)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                print!("{}", c.table());
            }
            Ok(())
        }
        Command::Generate(a) => generate::generate_cmd(a),
        Command::Export(a) => generate::export_cmd(a),
        Command::BenchLlm { args } => ember::llm::jobs::bench::run(&args),
        Command::Gym(a) => gym::gym(a),
        Command::Info { device } => info(&device),
    }
}

/// The run directory holds an image run (its resolved recipe says `kind = "flow"`).
fn is_flow_run(run: &Path) -> bool {
    std::fs::read_to_string(run.join("recipe.resolved.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .is_some_and(|t| t.get("kind").and_then(|k| k.as_str()) == Some("flow"))
}

fn train(a: TrainArgs) -> Result<()> {
    let path = a.recipe.recipe.display().to_string();
    let recipe = kinds::parse_any(&a.recipe.text()?, &a.recipe.sets)
        .with_context(|| format!("recipe {path}"))?;
    let out = a
        .out
        .unwrap_or_else(|| Path::new("runs").join(recipe.name()));
    let world = world::open(&a.dist)?;
    let opts = RunOptions {
        quiet: a.quiet,
        resume: a.resume,
        overwrite: a.overwrite,
        stop_after: a.stop_after,
        dashboard: !a.no_dashboard,
        report: ember_run::ReportTo {
            trackers: ember_run::ReportTo::parse_trackers(&a.report_to)?,
            project: a.project,
            run_name: a.run_name,
        },
        world: world.clone(),
    };
    handle_stop_signals();
    let result = run_recipe(recipe, &out, &opts);
    drop(opts);
    let interrupted = match (result, world) {
        (Ok(i), w) => {
            drop(w); // every rank ends the world together (MPI_Finalize)
            i
        }
        (Err(e), None) => return Err(e),
        // One rank's error ends every rank now, instead of at the others' timeout.
        (Err(e), Some(w)) => {
            eprintln!("Error (rank {} of {}): {e:?}", w.rank(), w.size());
            w.abort(1)
        }
    };
    if interrupted {
        std::process::exit(ember_run::stop_exit_code());
    }
    Ok(())
}

/// Runs a recipe of any kind; true when it stopped before its last step. Only LLM recipes run
/// over several processes.
fn run_recipe(recipe: AnyRecipe, out: &Path, opts: &RunOptions) -> Result<bool> {
    if let Some(w) = opts.world.as_ref().filter(|w| w.size() > 1) {
        let online_llm = matches!(&recipe, AnyRecipe::Llm(r) if r.offline.is_none());
        if !online_llm {
            bail!(
                "only online LLM recipes (kind = \"llm\" without [offline]) train over several \
                 processes; this one was started as {} ranks by {}",
                w.size(),
                w.launch().launcher.name()
            );
        }
    }
    Ok(match recipe {
        AnyRecipe::Llm(r) if r.offline.is_some() => {
            ember::offline::job::train(&r, out, opts)?.interrupted
        }
        AnyRecipe::Llm(r) => ember::llm::jobs::train::train(&r, out, opts)?.interrupted,
        AnyRecipe::Flow(r) => ember::flow::job::train(&r, out, opts)?.interrupted,
        AnyRecipe::Agent(r) => ember::agent::job::train(&r, out, opts)?.interrupted,
        AnyRecipe::Control(r) => ember::control::job::train(&r, out, opts)?.interrupted,
        AnyRecipe::Programs(r) => ember::programs::job::train(&r, out, opts)?.interrupted,
        AnyRecipe::Unlearning(r) => ember::unlearning::job::train(&r, out, opts)?.interrupted,
    })
}

/// The first Ctrl-C, SIGTERM or SIGHUP: finish the step, checkpoint, exit 128 + the signal.
/// A second: kill the reward programs and exit at once.
#[cfg(unix)]
fn handle_stop_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("cannot handle stop signals ({e}): Ctrl-C will kill the run");
            return;
        }
    };
    std::thread::spawn(move || {
        for sig in signals.forever() {
            let name = match sig {
                SIGINT => "Ctrl-C",
                SIGTERM => "SIGTERM",
                _ => "SIGHUP",
            };
            if ember_run::request_stop_by(sig) {
                ember_run::restore_terminal();
                eprintln!("\n{name} again: exiting without a final checkpoint");
                ember_tasks::process::kill_all();
                std::process::exit(128 + sig);
            }
            ember_run::notice(&format!(
                "\n{name}: stopping after this step and writing a checkpoint ({name} again to quit \
                 now)"
            ));
        }
    });
}

/// The first Ctrl-C: finish the step, checkpoint, exit 130. A second: exit at once.
#[cfg(not(unix))]
fn handle_stop_signals() {
    let _ = ctrlc::set_handler(|| {
        if ember_run::request_stop() {
            ember_run::restore_terminal();
            eprintln!("\ninterrupted again: exiting without a final checkpoint");
            ember_tasks::process::kill_all();
            std::process::exit(130);
        }
        eprintln!(
            "\nCtrl-C: stopping after this step and writing a checkpoint (Ctrl-C again to quit now)"
        );
    });
}

fn warmup(a: WarmupArgs) -> Result<()> {
    let path = a.recipe.recipe.display().to_string();
    let r = match kinds::parse_any(&a.recipe.text()?, &a.recipe.sets)
        .with_context(|| format!("recipe {path}"))?
    {
        AnyRecipe::Llm(r) => r,
        AnyRecipe::Flow(_) => bail!(
            "{path} is an image (kind = \"flow\") recipe; `ember warmup` covers LLM recipes, and \
             an image run's shapes are fixed from its first step"
        ),
        AnyRecipe::Agent(_) => bail!(
            "{path} is a multi-turn (kind = \"agent\") recipe; `ember warmup` covers LLM recipes"
        ),
        AnyRecipe::Control(_) => bail!(
            "{path} is a continuous-control (kind = \"control\") recipe; `ember warmup` covers \
             LLM recipes"
        ),
        AnyRecipe::Programs(_) | AnyRecipe::Unlearning(_) => bail!(
            "{path} is a program-synthesis or unlearning recipe; `ember warmup` covers LLM recipes"
        ),
    };
    let opts = ember::llm::jobs::warmup::WarmupOptions {
        passes: a.passes,
        eval: !a.no_eval,
        quiet: a.quiet,
        ..Default::default()
    };
    let report = ember::llm::jobs::warmup::warmup(&r, &opts)?;
    let text = serde_json::to_string_pretty(&report)?;
    match a.json {
        Some(f) => ember_run::write_atomic(&f, text.as_bytes())?,
        None => println!("{text}"),
    }
    Ok(())
}

fn molora(a: MoloraArgs) -> Result<()> {
    let path = a.recipe.recipe.display().to_string();
    let r = ember::molora::schema::parse(&a.recipe.text()?, &a.recipe.sets)
        .with_context(|| format!("recipe {path}"))?;
    let out = a
        .out
        .unwrap_or_else(|| Path::new("runs").join(&r.header.name));
    ember::molora::job::run(&r, &out, a.quiet)?;
    Ok(())
}

fn info(name: &str) -> Result<()> {
    let backends: Vec<String> = ember::common::device::compiled_backends()
        .iter()
        .map(ToString::to_string)
        .collect();
    println!(
        "ember {} — backends compiled in: {}",
        env!("CARGO_PKG_VERSION"),
        backends.join(", ")
    );
    let device = ember::common::device::device(name)?;
    println!("device: {device:?}");
    println!("kernel cache: {}", ember::common::kernel_cache::describe());
    // A one-group GRPO check on the chosen device: rewards [1, 0, 0, 0] → [1.5, −0.5, −0.5, −0.5].
    use burn::tensor::Tensor;
    use ember_engine::{AdvantageConfig, RolloutBatch, compute_advantages};
    let mask = Tensor::<2>::ones([4, 1], &device);
    let rewards = Tensor::<1>::from_floats([1.0, 0.0, 0.0, 0.0], &device);
    let batch = RolloutBatch::new(mask, rewards, &[0, 0, 0, 0])?;
    let adv = compute_advantages(&AdvantageConfig::default(), &batch, 0)?;
    let v: Vec<f32> = adv
        .advantages
        .try_into_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    println!("GRPO advantages of rewards [1, 0, 0, 0]: {v:?}");
    println!("heap: {}", ember::common::heap::keep_freed_memory());
    println!("floats: {}", ember::common::subnormals::flush_to_zero());
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
