//! A model behind an OpenAI-compatible endpoint (`ember serve`, vLLM, SGLang) that a job asks
//! beside its policy: a judge, a teacher. The connection (the URL without `/v1`, the API key
//! from an environment variable, the timeout and retries of the one HTTP client) and the
//! choices of a completions answer, in index order.

use anyhow::{Result, anyhow, bail};
use serde_json::Value;
use std::time::Duration;

/// A connected endpoint.
pub struct Endpoint {
    /// `http://host:port`, without `/v1`.
    pub base: String,
    /// The model's name on the endpoint.
    pub model: String,
    agent: ureq::Agent,
    key: Option<String>,
    retries: u32,
}

impl Endpoint {
    /// The endpoint at `url` (with or without `/v1`); `table` names the recipe table in errors.
    pub fn connect(
        table: &str,
        url: &str,
        model: &str,
        api_key_env: Option<&str>,
        timeout_s: f64,
        retries: u32,
    ) -> Result<Self> {
        let key = match api_key_env {
            Some(var) => Some(
                std::env::var(var)
                    .map_err(|_| anyhow!("{table}.api_key_env: ${var} is not set"))?,
            ),
            None => None,
        };
        let base = url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(timeout_s)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(Self {
            base: base.to_string(),
            model: model.to_string(),
            agent,
            key,
            retries,
        })
    }

    /// A GET (without `body`) or POST to `path` of the endpoint, with its key and retries.
    pub fn call(&self, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        call(&self.agent, &url, body, self.key.as_deref(), self.retries)
    }
}

/// The `n` choices of a completions answer, in index order; `who` names the model in errors.
pub fn choices<'a>(v: &'a Value, n: usize, who: &str) -> Result<Vec<&'a Value>> {
    let list = v["choices"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let mut out: Vec<Option<&Value>> = vec![None; n];
    for c in list {
        match c["index"].as_u64().and_then(|i| out.get_mut(i as usize)) {
            Some(slot) => *slot = Some(c),
            None => bail!("{who} answered a choice with a bad index: {}", c["index"]),
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, c)| c.ok_or_else(|| anyhow!("{who}'s answer has no choice {i}")))
        .collect()
}

/// One JSON request to `full` (a GET without `body`, else a POST of it, with `key` as a bearer
/// token) with `retries` retries and exponential backoff; a 4xx other than 408/429 fails at
/// once. Answers of at most 1 GiB; a 200 that is not JSON reads as a string (vLLM's adapter
/// routes answer plain text).
pub(crate) fn call(
    agent: &ureq::Agent,
    full: &str,
    body: Option<&Value>,
    key: Option<&str>,
    retries: u32,
) -> Result<Value> {
    let mut last = String::new();
    let auth = key.map(|k| format!("Bearer {k}"));
    for attempt in 0..=retries {
        if attempt > 0 {
            let wait = Duration::from_secs(1u64 << (attempt - 1).min(6));
            log::warn!("{full}: {last}; retry {attempt}/{retries} in {wait:?}");
            std::thread::sleep(wait);
        }
        let sent = match (body, &auth) {
            (Some(b), Some(a)) => agent.post(full).header("authorization", a).send_json(b),
            (Some(b), None) => agent.post(full).send_json(b),
            (None, Some(a)) => agent.get(full).header("authorization", a).call(),
            (None, None) => agent.get(full).call(),
        };
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => {
                last = format!("no answer ({e})");
                continue;
            }
        };
        let status = resp.status().as_u16();
        let text = match resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
        {
            Ok(t) => t,
            Err(e) => {
                last = format!("HTTP {status}, reading the answer failed ({e})");
                continue;
            }
        };
        if status == 200 {
            return Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)));
        }
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(text);
        last = format!("HTTP {status}: {message}");
        if (400..500).contains(&status) && status != 429 && status != 408 {
            break;
        }
    }
    bail!("{full}: {last}")
}
