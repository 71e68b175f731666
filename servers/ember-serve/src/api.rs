//! The OpenAI API's request and response shapes that `ember serve` speaks (the Completions and
//! Chat Completions APIs, and vLLM's LoRA endpoints), their checks, and OpenAI-style errors.
//!
//! Fields the server does not implement are refused by name (never silently ignored) when they
//! would change the answer: `best_of`, penalties, `logit_bias`, more than the top-1
//! alternative in `logprobs`, tools, and in a stream `logprobs`, `echo` and `return_token_ids`. Fields that only label a request (`user`) are accepted.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ember_llm::Message;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An error as the OpenAI API returns it: `{"error": {"message", "type", "param", "code"}}`
/// with an HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message naming the problem.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `not_found_error`, …).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    /// 400 `invalid_request_error`, naming `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
        }
    }

    /// An error with no field at fault.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
        }
    }

    /// 404 for a `model` that is neither the base model nor a loaded adapter.
    pub fn no_model(name: &str, served: &[String]) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{name}` does not exist; served: {}",
                served.join(", ")
            ),
            kind: "not_found_error",
            param: Some("model".into()),
        }
    }
}

impl ApiError {
    /// The `error` object of the OpenAI API's error bodies.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16(),
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.body() });
        (self.status, Json(body)).into_response()
    }
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings, checked (at most 4, as OpenAI allows, none empty).
    pub fn strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
        let v = match stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        if v.len() > 4 || v.iter().any(String::is_empty) {
            return Err(ApiError::bad(
                "stop",
                "stop takes at most 4 non-empty strings",
            ));
        }
        Ok(v)
    }
}

/// `prompt` of a completion request: text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// Sampling fields shared by both endpoints (OpenAI's, plus vLLM's `top_k`, `min_p`,
/// `return_token_ids`).
#[derive(Debug, Clone, Deserialize)]
pub struct Sampling {
    /// Softmax temperature in [0, `ember_llm::MAX_TEMPERATURE`] (0 = greedy; vLLM does not cap
    /// it at OpenAI's 2); default 1.
    pub temperature: Option<f32>,
    /// Nucleus mass in (0, 1]; default 1.
    pub top_p: Option<f32>,
    /// vLLM: keep the k most likely tokens (0 or −1 = off).
    pub top_k: Option<i64>,
    /// vLLM: drop tokens below this fraction of the most likely one's probability.
    pub min_p: Option<f32>,
    /// Choices per prompt; default 1.
    pub n: Option<usize>,
    /// Stop strings (not included in the text).
    pub stop: Option<Stop>,
    /// Makes the answer reproducible: the request is sampled in a batch of its own, seeded.
    pub seed: Option<i64>,
    /// vLLM: also return each choice's token ids (and the prompt's).
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM: tokens in `logprobs` as `token_id:<id>` instead of their text.
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    /// vLLM: token ids that also end a choice (kept in it, as the end-of-sequence token is).
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: draw on past the model's end-of-sequence tokens (to `max_tokens`, or a stop
    /// string or `stop_token_ids`); load tests use it for answers of a known length.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Send the answer as Server-Sent Events, token by token (`stream.rs`).
    #[serde(default)]
    pub stream: bool,
    /// `{"include_usage": true}`: a last event with the usage and no choices.
    pub stream_options: Option<StreamOptions>,
    /// Must be 0 or absent.
    pub presence_penalty: Option<f32>,
    /// Must be 0 or absent.
    pub frequency_penalty: Option<f32>,
    /// Must be absent or empty.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Accepted, unused (labels the request).
    pub user: Option<String>,
}

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send the usage in a last event (`choices: []`); the others carry `usage: null`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The base model's name or a loaded adapter's.
    pub model: String,
    /// The prompt(s).
    pub prompt: Prompt,
    /// New tokens at most; default 16 (OpenAI's).
    pub max_tokens: Option<usize>,
    /// Log-probs of the sampled tokens when set (0 or 1; with `echo`, 1 also gives the top-1
    /// alternative at each position).
    pub logprobs: Option<u32>,
    /// Give the prompt back before the completion, with its log-probs (`max_tokens` may be 0).
    #[serde(default)]
    pub echo: bool,
    /// Must be absent or equal to n.
    pub best_of: Option<usize>,
    /// Must be absent.
    pub suffix: Option<String>,
    /// The sampling fields.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// One chat message; `content` is text or a list of `{"type": "text", "text": …}` parts.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or `developer`, read as `system`).
    pub role: String,
    /// The text.
    pub content: Option<Content>,
}

/// Message content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts (text only).
    Parts(Vec<serde_json::Value>),
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The base model's name or a loaded adapter's.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// New tokens at most (default: the rest of the context).
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Return the sampled tokens' log-probs.
    #[serde(default)]
    pub logprobs: bool,
    /// Must be 0 or absent (top alternatives are not returned).
    pub top_logprobs: Option<u32>,
    /// Must be absent or empty.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Must be absent or `{"type": "text"}`.
    pub response_format: Option<serde_json::Value>,
    /// Extra chat-template variables (vLLM's and SGLang's name), e.g. Qwen3's
    /// `{"enable_thinking": false}`; over the server's own.
    #[serde(default)]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The sampling fields.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// vLLM's `POST /v1/load_lora_adapter`.
#[derive(Debug, Clone, Deserialize)]
pub struct LoadLora {
    /// The name requests select it by (`model`).
    pub lora_name: String,
    /// A PEFT directory (`adapter_config.json` + `adapter_model.safetensors`).
    pub lora_path: String,
    /// Replace an adapter already loaded under this name (vLLM's `load_inplace`).
    #[serde(default)]
    pub load_inplace: bool,
}

/// SGLang's `POST /update_weights_from_disk`: the base model's weights replaced by those of a
/// Hugging Face directory (or GGUF file) of the same architecture, between batches.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateWeights {
    /// The directory (or file) to read.
    pub model_path: String,
    /// Only `auto` (or absent): the format is read from the path.
    #[serde(default)]
    pub load_format: Option<String>,
    /// A label for these weights, reported back (SGLang's `weight_version`).
    #[serde(default)]
    pub weight_version: Option<String>,
    /// SGLang's flags for requests in flight: here requests queued before the update are
    /// answered with the old weights, the later ones with the new, whatever these say.
    #[serde(default)]
    pub abort_all_requests: Option<bool>,
    /// As above.
    #[serde(default)]
    pub flush_cache: Option<bool>,
}

/// vLLM's `POST /v1/unload_lora_adapter`.
#[derive(Debug, Clone, Deserialize)]
pub struct UnloadLora {
    /// The adapter's name.
    pub lora_name: String,
}

/// The checked sampling settings of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Top-k (0 = off).
    pub top_k: usize,
    /// Min-p (0 = off).
    pub min_p: f32,
    /// Choices per prompt.
    pub n: usize,
    /// Seed, when the request gives one.
    pub seed: Option<u64>,
    /// Stop tokens besides the model's end-of-sequence ids (sorted, deduplicated).
    pub stop_tokens: Vec<u32>,
    /// The model's end-of-sequence ids do not stop the answer.
    pub ignore_eos: bool,
}

/// The most choices one request may ask for per prompt.
pub const MAX_N: usize = 128;

impl Sampling {
    /// [`params`](Self::params) with the settings the request leaves out taken from the
    /// model's `generation_config.json` (vLLM's default, `--generation-config auto`).
    pub fn params_with(&self, d: &ember_llm::GenerationDefaults) -> Result<Params, ApiError> {
        let mut s = self.clone();
        s.temperature = s.temperature.or(d.temperature);
        s.top_p = s.top_p.or(d.top_p);
        s.top_k = s.top_k.or(d.top_k.and_then(|k| i64::try_from(k).ok()));
        s.min_p = s.min_p.or(d.min_p);
        s.params()
    }

    /// Checks the fields, refusing what the server does not implement.
    pub fn params(&self) -> Result<Params, ApiError> {
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad(
                "stream_options",
                "stream_options is only allowed with stream = true",
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if v.is_some_and(|v| v != 0.0) {
                return Err(ApiError::bad(
                    name,
                    format!("{name} is not supported (0 only)"),
                ));
            }
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::bad("logit_bias", "logit_bias is not supported"));
        }
        let mut temperature = self.temperature.unwrap_or(1.0);
        if !ember_llm::temperature_ok(temperature.into(), true) {
            return Err(ApiError::bad(
                "temperature",
                format!(
                    "temperature {temperature} must be in [0, {}]",
                    ember_llm::MAX_TEMPERATURE
                ),
            ));
        }
        // (A tiny temperature would overflow the scaled logits: it is greedy decoding.)
        if temperature < 1e-5 {
            temperature = 0.0;
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad(
                "top_p",
                format!("top_p {top_p} must be in (0, 1]"),
            ));
        }
        let top_k = match self.top_k.unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => return Err(ApiError::bad("top_k", format!("top_k {k} must be >= -1"))),
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(0.0..1.0).contains(&min_p) {
            return Err(ApiError::bad(
                "min_p",
                format!("min_p {min_p} must be in [0, 1)"),
            ));
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::bad("n", format!("n {n} must be in 1..={MAX_N}")));
        }
        let mut stop_tokens = self.stop_token_ids.clone().unwrap_or_default();
        if stop_tokens.len() > 64 {
            return Err(ApiError::bad("stop_token_ids", "at most 64 stop token ids"));
        }
        stop_tokens.sort_unstable();
        stop_tokens.dedup();
        Ok(Params {
            stop_tokens,
            temperature,
            top_p,
            top_k,
            min_p,
            n,
            // Any i64 is a seed; its bits are the RNG's.
            seed: self.seed.map(|s| s as u64),
            ignore_eos: self.ignore_eos,
        })
    }
}

impl ChatMessage {
    /// The message's text (text parts joined), checked.
    pub fn text(&self, i: usize) -> Result<String, ApiError> {
        let param = format!("messages[{i}].content");
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(t)) => Ok(t.clone()),
            Some(Content::Parts(parts)) => {
                let mut out = String::new();
                for p in parts {
                    match (p.get("type").and_then(|t| t.as_str()), p.get("text")) {
                        (Some("text"), Some(serde_json::Value::String(t))) => out.push_str(t),
                        _ => {
                            return Err(ApiError::bad(
                                &param,
                                "only text content parts ({\"type\": \"text\", \"text\": …}) are \
                                 supported",
                            ));
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// `usage` of a response.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// The sum.
    pub total_tokens: usize,
}

impl Usage {
    /// The usage of `prompt_tokens` read and `completion_tokens` generated.
    pub fn of(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// The JSON body as `T`, or the error a client can act on (413 past the limit, 400 naming
/// the JSON problem).
pub(crate) fn parse<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        ApiError::new(
            status,
            "invalid_request_error",
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!("the request body is too large: {}", e.body_text())
            } else {
                format!("reading the request body: {}", e.body_text())
            },
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the request body is not a valid request: {e}"),
        )
    })
}

/// A request's chat messages as the template takes them (`developer` read as `system`).
pub(crate) fn chat_messages(list: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if list.is_empty() {
        return Err(ApiError::bad("messages", "messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant") => r,
            r => {
                return Err(ApiError::bad(
                    &format!("messages[{i}].role"),
                    format!("role `{r}`: expected system, developer, user or assistant"),
                ));
            }
        };
        messages.push(Message::new(role, &m.text(i)?));
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(v: serde_json::Value) -> Sampling {
        serde_json::from_value(v).unwrap()
    }

    /// The model's `generation_config.json` fills what a request leaves out; the request wins.
    #[test]
    fn generation_config_fills_absent_settings() {
        let d = ember_llm::GenerationDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            top_k: Some(20),
            min_p: None,
        };
        let p = sampling(serde_json::json!({})).params_with(&d).unwrap();
        assert_eq!(
            (p.temperature, p.top_p, p.top_k, p.min_p),
            (0.6, 0.95, 20, 0.0)
        );
        let p = sampling(serde_json::json!({"temperature": 0, "top_k": -1}))
            .params_with(&d)
            .unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.0, 0.95, 0));
    }

    #[test]
    fn refuses_what_it_does_not_implement() {
        for (v, param) in [
            (
                serde_json::json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
            (
                serde_json::json!({"presence_penalty": 0.5}),
                "presence_penalty",
            ),
            // Above `ember_llm::MAX_TEMPERATURE`, the bound a recipe's rollouts have too.
            (serde_json::json!({"temperature": 100.5}), "temperature"),
            (serde_json::json!({"temperature": -0.5}), "temperature"),
            (serde_json::json!({"top_p": 0}), "top_p"),
            (serde_json::json!({"n": 0}), "n"),
            (serde_json::json!({"n": 1000}), "n"),
            (serde_json::json!({"top_k": -2}), "top_k"),
            (serde_json::json!({"logit_bias": {"5": 1}}), "logit_bias"),
        ] {
            let e = sampling(v).params().unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param));
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        // 2.5 is refused by OpenAI's API and taken by vLLM's, as by a recipe's rollouts.
        let p = sampling(serde_json::json!({"temperature": 2.5}))
            .params()
            .unwrap();
        assert_eq!(p.temperature, 2.5);
        let p = sampling(serde_json::json!({"top_k": -1, "seed": -3, "n": 4}))
            .params()
            .unwrap();
        assert_eq!((p.top_k, p.n, p.seed), (0, 4, Some((-3i64) as u64)));
        assert!(Stop::strings(Some(Stop::Many(vec!["a".into(); 5]))).is_err());
        assert!(Stop::strings(Some(Stop::One(String::new()))).is_err());
    }
}
