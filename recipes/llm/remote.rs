//! The `openai` rollout backend: a step's prompts sampled by OpenAI-compatible servers
//! (`ember serve`, vLLM, SGLang) instead of the trainer's own sampler, and the trained LoRA
//! adapter pushed to them after every update.
//!
//! - **Rollouts**: the step's prompts (token ids, the chat template already applied) are split
//!   into equal contiguous shares, one per server, sent at once as `/v1/completions` requests
//!   with `n` = samples per prompt, `logprobs`, vLLM's `return_token_ids` and
//!   `stop_token_ids`; the answers become one [`Generation`] whose log-probs are the servers'.
//!   The trainer rescores the tokens with its own model (π_old) and the engine's mismatch
//!   correction weighs the difference (on by default for this backend; `mismatch/*` metrics).
//! - **Weights**: after each update the adapter is written in PEFT layout and loaded on every
//!   server under a new name (`<run>-step<k>`), the previous one unloaded; rollouts name the new
//!   one, so a server cannot answer with stale weights (it would answer 404, an error here).
//!   A policy that trains every weight (the tiny model) is written as a Hugging Face directory
//!   and loaded with SGLang's `update_weights_from_disk`; each server's `/v1/models` must then
//!   name that directory as the base model's `root` before the rollout.
//! - **Faults**: a request that fails (unreachable, timeout, 429, 5xx) is retried with backoff
//!   1, 2, 4 … s. A server whose request still fails (or whose answer is malformed, or which
//!   does not load the new weights) leaves the pool, and its share of the rollout is re-sent to
//!   the healthy servers with the same seeds; the step fails, naming every server's error, only
//!   when none is left (the job then writes the last completed step's checkpoint). A server
//!   out of the pool is offered the weights at each later sync, one attempt, and joins again
//!   once it has loaded them (and, for full weights, names them in `/v1/models`).
//!   `rollout/servers_healthy` and `rollout/resent_rows` are logged.

use crate::llm::schema::{RolloutSpec, ServerKeys};
use crate::lm::endpoint::call;
use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::{Generation, SamplingConfig};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod push;

/// The servers and the adapter they serve. Cloned (cheaply: the HTTP agent is shared) for a
/// rollout that runs without holding the trainer's lock.
#[derive(Clone)]
pub struct Remote {
    urls: Vec<String>,
    base_model: String,
    agent: ureq::Agent,
    retries: u32,
    run_tag: String,
    adapters_dir: PathBuf,
    /// The adapter name rollouts use (none before the first push).
    current: Option<String>,
    /// The adapters loaded on the servers, oldest first: (step, name).
    loaded: std::collections::VecDeque<(usize, String)>,
    /// How many adapter versions stay loaded (the staleness bound + 1).
    keep: usize,
    /// The step whose weights the servers have.
    pushed: Option<usize>,
    keys: ServerKeys,
    /// Which servers are in the pool (`urls`' order).
    healthy: Vec<bool>,
    /// Rows of the last rollout that were re-sent after their server failed.
    resent_rows: usize,
}

/// The routes that change what a server serves (sent the admin key when there is one).
const ADMIN_PATHS: [&str; 3] = [
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/update_weights_from_disk",
];

/// The most rows (prompts × n) one request asks for: `ember serve`'s default `--max-batch`.
const REQUEST_ROWS: usize = 64;

/// One server's answer to one request, parsed.
struct Choice {
    tokens: Vec<u32>,
    log_probs: Vec<f32>,
    truncated: bool,
}

/// What every request of a rollout asks for: the model (base or adapter), the sampling, and
/// the vocabulary the answers' tokens must lie in.
#[derive(Clone, Copy)]
struct Ask<'a> {
    model: &'a str,
    sc: &'a SamplingConfig,
    vocab: usize,
}

impl Remote {
    /// The backend of a recipe's `[rollout]` with `backend = "openai"` (its servers, model,
    /// timeout, retries and keys); adapters are written under `adapters_dir`; `run_tag` names
    /// them on the servers. Checks every server lists the base model.
    pub fn connect(ro: &RolloutSpec, run_tag: &str, adapters_dir: &Path) -> Result<Self> {
        let (urls, base_model) = (&ro.base_urls, ro.model.as_deref().unwrap_or_default());
        let timeout_s = ro.request_timeout_s.unwrap_or(600.0);
        let retries = ro.request_retries.unwrap_or(3);
        let keys = ro.server_keys()?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(timeout_s)))
            .http_status_as_error(false)
            .build()
            .into();
        let remote = Self {
            // (`http://host:port`; a trailing `/v1` as OpenAI clients take it is dropped.)
            urls: urls
                .iter()
                .map(|u| {
                    let u = u.trim_end_matches('/');
                    u.strip_suffix("/v1").unwrap_or(u).to_string()
                })
                .collect(),
            base_model: base_model.to_string(),
            agent,
            retries,
            run_tag: run_tag
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect(),
            adapters_dir: adapters_dir.to_path_buf(),
            current: None,
            loaded: std::collections::VecDeque::new(),
            keep: 1,
            pushed: None,
            keys,
            healthy: vec![true; urls.len()],
            resent_rows: 0,
        };
        // Adapters of an earlier process of this run (a resume) are not this one's.
        if remote.adapters_dir.exists() {
            std::fs::remove_dir_all(&remote.adapters_dir)
                .with_context(|| format!("clearing {}", remote.adapters_dir.display()))?;
        }
        for url in &remote.urls {
            let v = remote.request(url, "/v1/models", None)?;
            let ids: Vec<&str> = v["data"]
                .as_array()
                .map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect())
                .unwrap_or_default();
            if !ids.contains(&base_model) {
                bail!(
                    "{url} does not serve the model `{base_model}` (rollout.model); it serves: {}",
                    ids.join(", ")
                );
            }
        }
        Ok(remote)
    }

    /// Keeps the adapters of the last `versions` pushes loaded (a rollout `k` steps stale is
    /// answered by its own step's adapter while newer ones are pushed): `k + 1`.
    pub fn keep_versions(&mut self, versions: usize) {
        self.keep = versions.max(1);
    }

    /// The model name that answers with step `version`'s weights: that step's adapter while it
    /// is loaded; the base model when it holds that step's weights. An error otherwise.
    pub fn model_for(&self, version: usize) -> Result<String> {
        if let Some((_, name)) = self.loaded.iter().find(|(v, _)| *v == version) {
            return Ok(name.clone());
        }
        if self.loaded.is_empty()
            && self.pushed == Some(version)
            && let Some(c) = &self.current
        {
            return Ok(c.clone());
        }
        bail!(
            "the servers do not hold the weights of step {version} (they hold steps {:?})",
            self.loaded.iter().map(|(v, _)| *v).collect::<Vec<_>>()
        )
    }

    /// Whether pushes are adapters under names of their own (rollouts may then run while newer
    /// versions are pushed).
    pub fn versioned(&self) -> bool {
        !self.loaded.is_empty()
    }

    /// Takes in what a rollout run on a clone learned of the servers: a server that failed
    /// there leaves the pool.
    pub fn merge_health(&mut self, other: &Remote) {
        for (h, o) in self.healthy.iter_mut().zip(&other.healthy) {
            *h = *h && *o;
        }
        self.resent_rows = other.resent_rows;
    }

    /// Servers in the pool, and the rows of the last rollout that were re-sent.
    pub fn health(&self) -> (usize, usize) {
        let up = self.healthy.iter().filter(|&&h| h).count();
        (up, self.resent_rows)
    }

    /// One JSON request with retries and backoff; 4xx other than 429 fails at once.
    /// A GET without `body`, else a POST of it.
    fn request(&self, url: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        self.request_with(url, path, body, self.retries)
    }

    /// [`Self::request`] with `retries` retries.
    fn request_with(
        &self,
        url: &str,
        path: &str,
        body: Option<&Value>,
        retries: u32,
    ) -> Result<Value> {
        let key = match ADMIN_PATHS.contains(&path) {
            true => self.keys.admin.as_ref().or(self.keys.api.as_ref()),
            false => self.keys.api.as_ref(),
        };
        call(
            &self.agent,
            &format!("{url}{path}"),
            body,
            key.map(String::as_str),
            retries,
        )
    }

    /// Samples `sc.n` responses of each prompt on the servers, as [`ember_llm::generate`] would
    /// (same shapes and row order), with the servers' log-probs. A request that fails takes its
    /// server out of the pool and goes, with its seed, to a healthy one.
    pub fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        sc: &SamplingConfig,
        vocab: usize,
        device: &Device,
    ) -> Result<Generation> {
        let model = self
            .current
            .clone()
            .ok_or_else(|| anyhow!("no adapter was pushed to the servers before the rollout"))?;
        self.generate_with(&model, prompts, sc, vocab, device)
    }

    /// [`Self::generate`] with the model (base or adapter) named `model`.
    pub fn generate_with(
        &mut self,
        model: &str,
        prompts: &[Vec<u32>],
        sc: &SamplingConfig,
        vocab: usize,
        device: &Device,
    ) -> Result<Generation> {
        let model = model.to_string();
        let live = self.live()?;
        // Equal contiguous shares, one per healthy server, each sent as requests of at most
        // REQUEST_ROWS rows (`ember serve`'s default --max-batch), all at once.
        let shares = live.len().min(prompts.len()).max(1);
        let per = prompts.len().div_ceil(shares).max(1);
        let per_request = (REQUEST_ROWS / sc.n.max(1)).max(1);
        // Chunk j and the server it goes to first (its share's).
        let (mut target, chunks): (Vec<usize>, Vec<&[Vec<u32>]>) = prompts
            .chunks(per)
            .enumerate()
            .flat_map(|(i, share)| {
                let server = live[i % live.len()];
                share.chunks(per_request).map(move |c| (server, c))
            })
            .unzip();
        let mut answers: Vec<Option<Vec<Choice>>> = chunks.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..chunks.len()).collect();
        let mut errors = Vec::new();
        self.resent_rows = 0;
        while !pending.is_empty() {
            let ask = Ask {
                model: &model,
                sc,
                vocab,
            };
            let results = self.send(ask, &chunks, &pending, &target);
            let mut failed = Vec::new();
            for (&j, r) in pending.iter().zip(results) {
                match r {
                    Ok(c) => answers[j] = Some(c),
                    Err(e) => {
                        let s = target[j];
                        if std::mem::replace(&mut self.healthy[s], false) {
                            log::warn!("{} leaves the rollout pool: {e:#}", self.urls[s]);
                            errors.push(format!("{e:#}"));
                        }
                        failed.push(j);
                    }
                }
            }
            if !failed.is_empty() {
                let live = self
                    .live()
                    .with_context(|| format!("the rollout failed: {}", errors.join("; ")))?;
                for (pos, &j) in failed.iter().enumerate() {
                    target[j] = live[pos % live.len()];
                    self.resent_rows += chunks[j].len() * sc.n;
                }
            }
            pending = failed;
        }
        let choices: Vec<Choice> = answers.into_iter().flatten().flatten().collect();
        Ok(to_generation(prompts, choices, sc, device))
    }

    /// Runs `load(self, url, retries)` on every server: one in the pool with the recipe's
    /// retries, one out of it with a single attempt, joining again when it succeeds. A server in
    /// the pool that fails leaves it; an error, naming each failure, only when none is left.
    fn on_every_server(
        &mut self,
        what: &str,
        load: impl Fn(&Self, &str, u32) -> Result<()>,
    ) -> Result<()> {
        let mut errors = Vec::new();
        for i in 0..self.urls.len() {
            let (url, was) = (self.urls[i].clone(), self.healthy[i]);
            let retries = if was { self.retries } else { 0 };
            let loaded = load(self, &url, retries);
            match &loaded {
                Ok(()) if !was => log::info!("{url} joins the rollout pool again ({what} loaded)"),
                Ok(()) => {}
                Err(e) if was => {
                    log::warn!("{url} leaves the rollout pool (loading {what}): {e:#}")
                }
                Err(_) => {}
            }
            if let Err(e) = &loaded {
                errors.push(format!("{e:#}"));
            }
            self.healthy[i] = loaded.is_ok();
        }
        self.live()
            .with_context(|| format!("loading {what}: {}", errors.join("; ")))?;
        Ok(())
    }

    /// The servers in the pool (indices into `urls`); an error when none is.
    fn live(&self) -> Result<Vec<usize>> {
        let live: Vec<usize> = (0..self.urls.len()).filter(|&i| self.healthy[i]).collect();
        if live.is_empty() {
            bail!(
                "no rollout server is left in the pool ({} failed)",
                self.urls.join(", ")
            );
        }
        Ok(live)
    }

    /// Sends chunks `pending` (chunk `j` to server `target[j]`, with seed `sc.seed + j`) at
    /// once, each asking for `ask`; their parsed answers in `pending`'s order.
    fn send(
        &self,
        ask: Ask<'_>,
        chunks: &[&[Vec<u32>]],
        pending: &[usize],
        target: &[usize],
    ) -> Vec<Result<Vec<Choice>>> {
        let Ask { model, sc, vocab } = ask;
        std::thread::scope(|s| {
            let hs: Vec<_> = pending
                .iter()
                .map(|&j| {
                    let (url, chunk) = (&self.urls[target[j]], chunks[j]);
                    let body = json!({
                        "model": model,
                        "prompt": chunk,
                        "n": sc.n,
                        "max_tokens": sc.max_new_tokens,
                        "temperature": sc.temperature,
                        "top_p": sc.top_p,
                        // (−1 = off: older vLLM refuses 0.)
                        "top_k": if sc.top_k == 0 { -1 } else { sc.top_k as i64 },
                        "min_p": sc.min_p,
                        "seed": sc.seed.wrapping_add(j as u64) as i64,
                        "logprobs": 1,
                        "return_token_ids": true,
                        "stop_token_ids": sc.stop_tokens,
                    });
                    s.spawn(move || {
                        let v = self.request(url, "/v1/completions", Some(&body))?;
                        parse_choices(&v, chunk.len() * sc.n, sc.max_new_tokens, vocab)
                            .with_context(|| format!("the answer of {url}"))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a request thread panicked")))
                })
                .collect()
        })
    }
}

/// The `rows` choices of one answer, checked: as many as asked, tokens within the vocabulary,
/// one finite log-prob ≤ 0 per token, at most `max_new` tokens.
fn parse_choices(v: &Value, rows: usize, max_new: usize, vocab: usize) -> Result<Vec<Choice>> {
    let choices = v["choices"]
        .as_array()
        .ok_or_else(|| anyhow!("no `choices` list"))?;
    if choices.len() != rows {
        bail!("{} choices, expected {rows}", choices.len());
    }
    let mut out = Vec::with_capacity(rows);
    for (i, c) in choices.iter().enumerate() {
        if c["index"].as_u64() != Some(i as u64) {
            bail!("choice {i} has index {}", c["index"]);
        }
        let tokens: Vec<u32> = c["token_ids"]
            .as_array()
            .ok_or_else(|| {
                anyhow!("choice {i} has no `token_ids` (the server must support return_token_ids)")
            })?
            .iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < vocab)
                    .map(|t| t as u32)
                    .ok_or_else(|| anyhow!("choice {i}: token {t} is not in the vocabulary"))
            })
            .collect::<Result<_>>()?;
        let log_probs: Vec<f32> = c["logprobs"]["token_logprobs"]
            .as_array()
            .ok_or_else(|| anyhow!("choice {i} has no logprobs.token_logprobs"))?
            .iter()
            .map(|x| {
                x.as_f64()
                    .filter(|x| x.is_finite() && *x <= 1e-3)
                    .map(|x| x as f32)
                    .ok_or_else(|| anyhow!("choice {i}: log-prob {x} is not a finite value <= 0"))
            })
            .collect::<Result<_>>()?;
        if log_probs.len() != tokens.len() || tokens.len() > max_new {
            bail!(
                "choice {i}: {} tokens, {} log-probs (max_tokens {max_new})",
                tokens.len(),
                log_probs.len()
            );
        }
        out.push(Choice {
            tokens,
            log_probs,
            truncated: c["finish_reason"].as_str() == Some("length"),
        });
    }
    Ok(out)
}

/// The choices (prompt-major, `sc.n` per prompt) as a [`Generation`]: prompts left-padded,
/// responses right-padded with masked zeros.
fn to_generation(
    prompts: &[Vec<u32>],
    choices: Vec<Choice>,
    sc: &SamplingConfig,
    device: &Device,
) -> Generation {
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), sc.n))
        .collect();
    let group_ids: Vec<usize> = (0..prompts.len())
        .flat_map(|i| std::iter::repeat_n(i, sc.n))
        .collect();
    let (prompt_tokens, prompt_mask) = ember_llm::left_pad_to(&rows, sc.prompt_bucket, device);
    let b = choices.len();
    let t = choices
        .iter()
        .map(|c| c.tokens.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut toks = vec![0i64; b * t];
    let mut lps = vec![0f32; b * t];
    let mut mask = vec![0f32; b * t];
    for (r, c) in choices.iter().enumerate() {
        for (j, (&tok, &lp)) in c.tokens.iter().zip(&c.log_probs).enumerate() {
            toks[r * t + j] = i64::from(tok);
            lps[r * t + j] = lp;
            mask[r * t + j] = 1.0;
        }
    }
    Generation {
        prompt_tokens,
        prompt_mask,
        tokens: Tensor::<2, Int>::from_data(TensorData::new(toks, [b, t]), device),
        log_probs: Tensor::<2>::from_data(TensorData::new(lps, [b, t]), device),
        mask: Tensor::<2>::from_data(TensorData::new(mask, [b, t]), device),
        group_ids,
        truncated: choices.iter().map(|c| c.truncated).collect(),
        // Decoded by the servers: counted as a batch that runs every row to the end.
        decode_positions: b * t,
    }
}
