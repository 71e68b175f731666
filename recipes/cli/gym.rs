//! `ember gym`: the kernel gym from the command line: its tasks, a task's prompt, one kernel's
//! evaluation, and a worker that serves the gym over the JSON-lines environment protocol (so a
//! recipe's `[env] kind = "external"` can run it on another machine through `ssh`).

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use ember_gym::{EvalConfig, RejectionConfig, RewardConfig};
use ember_tasks::env::kernel::{KernelGym, KernelGymSpec};
use std::io::Read;
use std::path::PathBuf;

/// `ember gym …`.
#[derive(Args)]
pub struct GymArgs {
    #[command(subcommand)]
    command: GymCommand,
}

#[derive(Subcommand)]
enum GymCommand {
    /// The tasks: name, level, signature and the library routines each may call.
    List,
    /// The first observation of a task's episodes.
    Prompt {
        /// The task's name.
        task: String,
    },
    /// Evaluate one kernel (a C file, or `-` for standard input): the verdict, timings,
    /// coverage and rewards as JSON.
    Eval {
        /// The task's name.
        #[arg(long)]
        task: String,
        /// The kernel's C source.
        file: PathBuf,
        /// Draws the hidden shapes and inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Check correctness only.
        #[arg(long)]
        no_time: bool,
    },
    /// Serve evaluations over HTTP (`POST /v1/evaluate`), for recipes whose `[env] remote`
    /// names this machine.
    Serve {
        /// `host:port` to listen on.
        #[arg(long, default_value = "127.0.0.1:8311")]
        listen: String,
        /// Evaluations at once (each a compiler and a harness process).
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// The largest CPU limit, in seconds, a request may ask for.
        #[arg(long, default_value_t = 60)]
        max_cpu_s: u64,
        /// Body, header, connection and per-client bounds and the API key, as `ember serve`
        /// takes them.
        #[command(flatten)]
        http: ember_serve::listen::HttpLimits,
    },
    /// Serve the gym over the JSON-lines environment protocol on standard input and output.
    Worker {
        /// The gym's `[env]` table as JSON (`{"tasks": ["vec_add"], "reward": {"coverage": 1}}`).
        #[arg(long, default_value = "{}")]
        spec: String,
        /// Turns per episode.
        #[arg(long, default_value_t = 3)]
        max_turns: usize,
    },
}

/// Runs `ember gym …`.
pub fn gym(a: GymArgs) -> Result<()> {
    match a.command {
        GymCommand::List => {
            for t in ember_gym::suite() {
                let lib: Vec<&str> = t.library.iter().map(|l| l.name).collect();
                println!(
                    "{:<18} level {}  {};{}",
                    t.name,
                    t.level,
                    t.signature(t.entry),
                    if lib.is_empty() {
                        String::new()
                    } else {
                        format!("  may call {}", lib.join(", "))
                    }
                );
            }
            Ok(())
        }
        GymCommand::Prompt { task } => {
            println!("{}", ember_gym::task_prompt(find(&task)?));
            Ok(())
        }
        GymCommand::Eval {
            task,
            file,
            seed,
            no_time,
        } => eval(&task, &file, seed, no_time),
        GymCommand::Serve {
            listen,
            workers,
            max_cpu_s,
            http,
        } => {
            let s = ember_serve::gym::GymServer {
                listen,
                workers,
                max_cpu_s,
                http,
            };
            ember_serve::gym::serve(&s)
        }
        GymCommand::Worker { spec, max_turns } => {
            let spec: KernelGymSpec = serde_json::from_str(&spec)
                .context("--spec is not the gym's [env] table as JSON")?;
            let mut env = KernelGym::new(&spec, max_turns)?;
            let stdin = std::io::stdin().lock();
            ember_tasks::env::external::serve(&mut env, stdin, std::io::stdout().lock())?;
            Ok(())
        }
    }
}

fn find(name: &str) -> Result<&'static ember_gym::Task> {
    ember_gym::task(name).ok_or_else(|| ember_gym::GymError::UnknownTask(name.into()).into())
}

/// One kernel's report and its rewards with and without the profiling-based term.
fn eval(task: &str, file: &PathBuf, seed: u64, no_time: bool) -> Result<()> {
    let t = find(task)?;
    let limit = ember_gym::MAX_SOURCE as u64 + 1;
    let mut code = String::new();
    let read = if file.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_string(&mut code)
    } else {
        std::fs::File::open(file)
            .with_context(|| format!("{}", file.display()))?
            .take(limit)
            .read_to_string(&mut code)
    };
    read.with_context(|| format!("reading {} as UTF-8 text", file.display()))?;
    let cfg = EvalConfig {
        time: !no_time,
        ..EvalConfig::default()
    };
    let report = ember_gym::evaluate(t, &code, seed, &cfg)?;
    let with_pr = RewardConfig {
        coverage: 1.0,
        ..RewardConfig::default()
    };
    let mut v = serde_json::to_value(&report)?;
    v["reward"] = RewardConfig::default().reward(&report).into();
    v["reward_with_pr"] = with_pr.reward(&report).into();
    v["prs_keep_probability"] = RejectionConfig::default().keep_probability(&report).into();
    v["hacking"] = report.verdict.hacking().into();
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
