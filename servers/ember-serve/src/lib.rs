//! Ember's HTTP servers, on one HTTP layer (`listen.rs`, `body.rs`, `fair.rs`, `access.rs`):
//! `ember serve` (this file and the modules below), an OpenAI-compatible HTTP server for a
//! Llama/Qwen2 model (a Hugging Face directory or a GGUF file) and its LoRA adapters, so that a
//! trained policy answers the tools people evaluate with (OpenAI clients, lm-eval-harness's
//! `local-completions`) and a trainer can take rollouts from it; and `ember gym serve` (`gym.rs`),
//! the kernel gym's evaluations for other machines. The binary resolves `--device` (the
//! backends are its choice) and passes the device in.
//!
//! - `answer.rs`: what the completion routes share: a batch submitted to the engine, length
//!   checks, stop strings, token text and offsets, the finish reason, the envelope;
//! - `stream.rs`: `stream: true`, the answer as Server-Sent Events token by token;
//! - `api.rs`: the request and response shapes, their checks, OpenAI-style JSON errors;
//! - `engine.rs`: the thread that owns the model and adapters and batches queued requests into
//!   the KV-cache sampler;
//! - `http.rs`: the routes (axum), the bounded queue (429 when full, 503 while shutting down),
//!   the token-to-text side (chat template, decoding, stop strings, log-probs);
//! - `state.rs`: what the handlers share;
//! - `access.rs`: the API key, the admin routes (off unless enabled) and the directories they
//!   may load from;
//! - `listen.rs`: the HTTP layer every server of Ember shares (`HttpLimits`: the flags, the
//!   layers, the accept loop with a header-read timeout and a bound on open connections, the
//!   signals);
//! - `fair.rs`: at most `--max-requests-per-client` requests of one client in flight (429 past
//!   it), so that one client cannot fill the queue;
//! - `body.rs`: a request's body read within `--max-body-bytes` (413 at once past a declared
//!   length) and `--body-read-timeout` (408), before any handler;
//! - `echo.rs`: `echo` (prompt log-probs and top-1 alternatives, for lm-eval-harness's
//!   log-likelihood tasks);
//! - `tokenize.rs`: vLLM's `/tokenize`, `/detokenize` and `/tokenizer_info` (lm-eval-harness's
//!   remote tokenizer);
//! - `gym.rs`: `ember gym serve`, `POST /v1/evaluate` for the gym's remote executor;
//! - `metrics.rs`: `/metrics` in the Prometheus text format (requests in flight, waiting, the
//!   age of the oldest, answers by status class);
//! - `tinker/`: `--tinker`, the Tinker training API (the `tinker` SDK's protocol: training
//!   clients, losses, AdamW, sampling sessions, saved states) over the same model and engine.
//!
//! The first SIGINT or SIGTERM stops accepting connections and lets the requests already taken
//! finish (graceful shutdown); a second exits at once, in every phase of the shutdown (while
//! connections drain, and while the engine finishes work it took after they closed).

pub mod access;
mod answer;
pub mod api;
mod body;
mod echo;
pub mod engine;
mod fair;
pub mod gym;
pub mod http;
pub mod listen;
mod metrics;
pub mod state;
mod stream;
pub mod tinker;
mod tokenize;

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use engine::{Base, Engine, Msg, Names};
use state::ModelInfo;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use tokio::sync::mpsc;

/// `ember serve` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// A Hugging Face model directory, a .gguf file, or a Hub id (`ORG/NAME[@REVISION]`, a file
    /// inside it as `ORG/NAME/FILE`) found in the local Hugging Face cache.
    #[arg(long)]
    pub model: PathBuf,
    /// A PEFT LoRA adapter to load at start, as NAME=DIR (requests select it with
    /// "model": NAME); repeatable.
    #[arg(long = "adapter", value_name = "NAME=DIR")]
    pub adapters: Vec<String>,
    /// The name requests use for the base model (default: --model as given, as vLLM does).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// cpu, cuda, wgpu or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Sampled rows (prompts × n) one batched call may take; also the most one request may ask.
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Rows × KV-cache positions (prompt + max_tokens) one batched call may hold, which bounds
    /// its memory; a request asking for more gets 400.
    #[arg(long, default_value_t = 65_536)]
    pub max_batch_tokens: usize,
    /// Requests that may wait for the engine; more get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Body, header, connection and per-client bounds and the API key, as every server of
    /// Ember takes them.
    #[command(flatten)]
    pub http: listen::HttpLimits,
    /// `continuous`: a request joins the running decode batch at the next step and each row
    /// leaves it when it ends; `static`: the requests waiting when the engine is free run as
    /// one batch to its longest row.
    #[arg(long, default_value = "continuous", value_parser = ["continuous", "static"])]
    pub batching: String,
    /// Prompt positions one step prefills (for generation) or scores (for `echo`) between two
    /// decode steps: a longer prompt goes in chunks through a KV cache, taking turns with the
    /// other requests, so it delays the running batch by one chunk at a time (chunked prefill).
    #[arg(long, default_value_t = engine::DEFAULT_CHUNK_TOKENS)]
    pub prefill_chunk_tokens: usize,
    /// LoRA adapters held at once (vLLM's name); a load beyond it gets 400 until one is
    /// unloaded.
    #[arg(long, default_value_t = engine::DEFAULT_MAX_LORAS)]
    pub max_loras: usize,
    /// Context length to serve (default: the model's); prompt + max_tokens must fit.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Turn on the admin routes, which load files and change the weights
    /// (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, `/update_weights_from_disk`); off,
    /// they answer 403.
    #[arg(long)]
    pub enable_admin: bool,
    /// The Tinker training API.
    #[command(flatten)]
    pub tinker: tinker::TinkerArgs,
    /// The admin routes' key (default: EMBER_ADMIN_KEY; neither: the API key).
    #[arg(long)]
    pub admin_key: Option<String>,
    /// A directory the admin routes may load from (repeatable; canonicalised with symlinks
    /// resolved, so no path escapes it); none: every load is refused.
    #[arg(long = "allowed-path", value_name = "DIR")]
    pub allowed_paths: Vec<PathBuf>,
}

/// Runs the server on `device` (the one `--device` names, which the caller resolves: the
/// backends are the binary's choice) until SIGINT/SIGTERM; returns once the requests in flight
/// are answered.
pub fn serve(a: ServeArgs, device: Device) -> Result<()> {
    if [
        a.max_batch,
        a.max_queue,
        a.max_batch_tokens,
        a.prefill_chunk_tokens,
    ]
    .contains(&0)
    {
        bail!(
            "--max-batch, --max-batch-tokens, --max-queue and --prefill-chunk-tokens must be >= 1"
        );
    }
    a.http.check()?;
    let mut adapters = Vec::new();
    for spec in &a.adapters {
        let Some((name, dir)) = spec.split_once('=') else {
            bail!("--adapter {spec}: expected NAME=DIR");
        };
        adapters.push(api::LoadLora {
            lora_name: name.to_string(),
            lora_path: dir.to_string(),
            load_inplace: false,
        });
    }
    let env = |name: &str| std::env::var(name).ok().filter(|k| !k.is_empty());
    let access = access::Access::new(access::AccessArgs {
        api_key: a.http.api_key()?,
        enable_admin: a.enable_admin,
        admin_key: a.admin_key.clone().or_else(|| env("EMBER_ADMIN_KEY")),
        allowed_paths: &a.allowed_paths,
    })?;
    if let Some(w) = access.open_warning(&a.host) {
        eprintln!("ember serve: {w}");
    }
    let base_name = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| a.model.display().to_string());
    // A Hub id (`ORG/NAME`) is served from its snapshot in the Hugging Face cache, under the id.
    let a = ServeArgs {
        model: ember_hub::resolve(&a.model).context("--model")?,
        ..a
    };
    let tok = Arc::new(
        ember_llm::Tokenizer::for_checkpoint(&a.model)
            .with_context(|| format!("reading the tokenizer of {}", a.model.display()))?,
    );
    let names: Names = Arc::new(RwLock::new(Vec::new()));
    let (tx, rx) = mpsc::channel::<Msg>(a.max_queue);

    // The engine thread loads the model (so it never crosses threads) and says when it is
    // ready, or why it could not start.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<ModelInfo>>();
    let engine = {
        let (a, names, tok, device) = (a.clone(), names.clone(), tok.clone(), device.clone());
        std::thread::Builder::new()
            .name("ember-serve-engine".into())
            .spawn(
                move || match start_engine(&a, &device, base_name, names, &tok, &adapters) {
                    Ok((engine, info)) => {
                        ready_tx.send(Ok(info)).ok();
                        engine.run(rx)
                    }
                    Err(e) => {
                        ready_tx.send(Err(e)).ok();
                    }
                },
            )
            .context("starting the engine thread")?
    };
    let info = ready_rx
        .recv()
        .context("the engine thread ended before the model was loaded")??;

    let tinker = if a.tinker.tinker {
        let name = &info.base_name;
        let body = a.http.max_body_bytes;
        let t = tinker::Service::start(&a.tinker, &a.model, name, tx.clone(), &device, body)?;
        Some(Arc::new(t))
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let state = Arc::new(
        state::AppState::new(info, tok, names, tx, budget(&a), Arc::new(access))
            .with_tinker(tinker),
    );
    let result = rt.block_on(serve_http(&a, state.clone()));
    // The trainer holds a sender of the engine's queue: it stops, so that the queue closes.
    if let Some(t) = &state.tinker {
        t.shutdown();
    }
    // With the queue's senders gone the engine answers what is left and returns.
    rt.shutdown_background();
    engine
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    result
}

/// Loads the model on the engine's device, with its stop ids, context and startup adapters.
fn start_engine(
    a: &ServeArgs,
    device: &Device,
    base_name: String,
    names: Names,
    tok: &ember_llm::Tokenizer,
    adapters: &[api::LoadLora],
) -> Result<(Engine, ModelInfo)> {
    let loaded = ember_llm::load_with_blocks(&a.model, device)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let blocks = loaded.model.block_bytes();
    if blocks > 0 && ember_kernels::enabled(ember_kernels::Kernel::Quant) {
        log::info!(
            "decoding steps of up to {} sequences read the file's quantized weights ({:.0} MiB \
             of blocks; --kernels without `quant` reads the f32 weights)",
            ember_llm::BLOCK_ROWS,
            blocks as f64 / (1 << 20) as f64
        );
    }
    let mut stop = loaded.eos_ids.clone();
    stop.extend(tok.eos_ids.iter().copied());
    stop.sort_unstable();
    stop.dedup();
    let positions = loaded.model.max_positions();
    let context = a.max_model_len.unwrap_or(positions);
    if context == 0 || context > positions {
        bail!("--max-model-len {context} must be in 1..={positions}");
    }
    let vocab = loaded.model.vocab_size();
    let info = ModelInfo {
        base_name: base_name.clone(),
        context,
        vocab,
        root: a.model.display().to_string(),
        defaults: loaded.generation.clone(),
    };
    if loaded.generation != ember_llm::GenerationDefaults::default() {
        log::info!(
            "requests that leave them out sample with generation_config.json's {:?}",
            loaded.generation
        );
    }
    let budget = budget(a);
    let base = Base {
        name: base_name,
        model: loaded.model,
        config: loaded.config,
        stop_tokens: stop,
    };
    let mut engine = Engine::new(base, device.clone(), budget, names)
        .with_max_loras(a.max_loras)
        .with_chunk_tokens(a.prefill_chunk_tokens)
        .with_continuous_batching(a.batching == "continuous");
    for req in adapters {
        engine
            .load(req)
            .map_err(|e| anyhow::anyhow!("--adapter {}: {}", req.lora_name, e.message))?;
    }
    Ok((engine, info))
}

/// Serves HTTP on `--host:--port` until the first signal, then answers what was taken.
async fn serve_http(a: &ServeArgs, state: Arc<state::AppState>) -> Result<()> {
    let addr = format!("{}:{}", a.host, a.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    let app = http::router(state.clone(), &a.http);
    // Printed on stdout, flushed: scripts and tests wait for this line.
    println!(
        "ember serve: listening on http://{local} (model `{}`)",
        state.info.base_name
    );
    use std::io::Write;
    std::io::stdout().flush().ok();
    let st = state.clone();
    listen::serve(listener, app, a.http.connections(), async move {
        listen::first_signal("ember serve").await;
        st.begin_shutdown();
    })
    .await
    .context("serving HTTP")?;
    state.close_queue();
    Ok(())
}

/// The batch budget the flags give.
fn budget(a: &ServeArgs) -> engine::Budget {
    engine::Budget {
        max_rows: a.max_batch,
        max_cells: a.max_batch_tokens,
    }
}
