//! A model beside the policy that a run asks for text: a judge, a simulated student. Frozen and
//! loaded in process (a Hugging Face directory or a GGUF file, on the run's device), or behind
//! an OpenAI-compatible endpoint (`ember serve`, vLLM, SGLang: the one HTTP client, its retries
//! and named errors); its chat template from its tokenizer or the endpoint's
//! `GET /tokenizer_info`.

use super::endpoint::{Endpoint, choices};
use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use ember_llm::{Message, SamplingConfig};
use serde_json::json;

/// A model loaded in process, frozen.
pub struct Loaded {
    pub model: ember_llm::Llama,
    pub tok: ember_llm::Tokenizer,
    /// Its end-of-sequence ids (they end an answer).
    pub eos: Vec<u32>,
    pub device: Device,
}

/// Where the model runs.
pub enum Backend {
    /// An OpenAI-compatible endpoint.
    Endpoint(Endpoint),
    /// A frozen model in process.
    Local(Box<Loaded>),
}

/// Where a recipe table points: an endpoint (`base_url`, `model`) or a file (`path`).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The recipe table, as errors name it (`reward.judge`, `env.student`).
    pub table: &'a str,
    pub base_url: Option<&'a str>,
    pub model: Option<&'a str>,
    pub path: Option<&'a str>,
    /// The environment variable holding the endpoint's API key.
    pub api_key_env: Option<&'a str>,
    /// Seconds per request and retries of a failed one.
    pub timeout_s: f64,
    pub retries: u32,
}

/// A chat template and the special tokens it names.
pub struct ChatFormat {
    pub template: String,
    pub bos: Option<String>,
    pub eos: Option<String>,
}

impl Backend {
    /// The endpoint, or the model loaded on `device`.
    pub fn open(src: &Source, device: &Device) -> Result<Self> {
        Ok(match (src.base_url, src.model, src.path) {
            (Some(url), Some(model), _) => Backend::Endpoint(Endpoint::connect(
                src.table,
                url,
                model,
                src.api_key_env,
                src.timeout_s,
                src.retries,
            )?),
            (_, _, Some(path)) => {
                let path = ember_hub::resolve(&ember_tasks::expand_path(path)?)
                    .with_context(|| format!("{}.path", src.table))?;
                let what = || format!("{}.path {}", src.table, path.display());
                let loaded = ember_llm::load(&path, device).with_context(what)?;
                let tok = ember_llm::Tokenizer::for_checkpoint(&path).with_context(what)?;
                Backend::Local(Box::new(Loaded {
                    model: loaded.model,
                    eos: loaded.eos_ids,
                    tok,
                    device: device.clone(),
                }))
            }
            _ => bail!(
                "{}: give base_url (an endpoint) or path (a model in process)",
                src.table
            ),
        })
    }

    /// The model's chat template: the loaded tokenizer's, or the endpoint's `/tokenizer_info`.
    pub fn chat_format(&self, table: &str) -> Result<ChatFormat> {
        let missing = || format!("{table}: the model has no chat template");
        match self {
            Backend::Local(m) => Ok(ChatFormat {
                template: m.tok.chat_template.clone().with_context(missing)?,
                bos: m.tok.bos_token.clone(),
                eos: m.tok.eos_token.clone(),
            }),
            Backend::Endpoint(e) => {
                let info = e.call("/tokenizer_info", None).with_context(|| {
                    format!("{table} reads the endpoint's chat template from /tokenizer_info")
                })?;
                let text = |k: &str| info[k].as_str().map(str::to_string);
                Ok(ChatFormat {
                    template: text("chat_template").with_context(missing)?,
                    bos: text("bos_token"),
                    eos: text("eos_token"),
                })
            }
        }
    }

    /// Greedy answers of at most `max_tokens` tokens to `prompts` (texts the model continues,
    /// each ended by an end-of-sequence token), batched; `who` names the model in errors.
    pub fn complete(
        &self,
        prompts: &[String],
        max_tokens: usize,
        who: &str,
    ) -> Result<Vec<String>> {
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Backend::Endpoint(e) => {
                let body = json!({"model": e.model, "prompt": prompts,
                                  "max_tokens": max_tokens, "temperature": 0});
                let v = e.call("/v1/completions", Some(&body))?;
                Ok(choices(&v, prompts.len(), who)?
                    .iter()
                    .map(|c| c["text"].as_str().unwrap_or("").to_string())
                    .collect())
            }
            Backend::Local(m) => {
                let ids = prompts
                    .iter()
                    .map(|p| m.tok.encode(p))
                    .collect::<ember_llm::Result<Vec<_>>>()?;
                let sc = SamplingConfig {
                    temperature: 0.0,
                    max_new_tokens: max_tokens,
                    stop_tokens: m.eos.clone(),
                    n: 1,
                    ..SamplingConfig::default()
                };
                let g = ember_llm::generate(&m.model, &ids, &sc, &m.device)?;
                g.response_ids()
                    .iter()
                    .map(|r| Ok(m.tok.decode(r, true)?))
                    .collect()
            }
        }
    }
}

impl ChatFormat {
    /// `messages` through the template, the assistant's turn opened.
    pub fn render(&self, messages: &[Message], table: &str) -> Result<String> {
        ember_llm::render_chat_with(
            &self.template,
            messages,
            true,
            self.bos.as_deref(),
            self.eos.as_deref(),
            &Default::default(),
        )
        .with_context(|| format!("{table}: the model's chat template"))
    }
}
