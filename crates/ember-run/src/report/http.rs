//! The trackers' one HTTP client: JSON requests with a timeout, the answer's status sorted into
//! worth-retrying and refused.

use super::base::{Failure, REQUEST_TIMEOUT};
use serde_json::Value;
use std::time::Duration;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest answer read.
const MAX_ANSWER: u64 = 16 << 20;

/// A tracker's HTTP connection.
pub(crate) struct Http {
    agent: ureq::Agent,
    /// The `Authorization` header's value.
    auth: Option<String>,
}

impl Http {
    /// A client sending `auth` (a whole `Authorization` value) with every request.
    pub fn new(auth: Option<String>) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(REQUEST_TIMEOUT))
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        Self { agent, auth }
    }

    /// A POST of `body` (or a GET without one) to `url`; the answer's JSON (`null` when empty).
    pub fn json(&self, url: &str, body: Option<&Value>) -> Result<Value, HttpError> {
        let sent = match (body, &self.auth) {
            (Some(b), Some(a)) => self.agent.post(url).header("authorization", a).send_json(b),
            (Some(b), None) => self.agent.post(url).send_json(b),
            (None, Some(a)) => self.agent.get(url).header("authorization", a).call(),
            (None, None) => self.agent.get(url).call(),
        };
        self.answer(url, sent)
    }

    /// A POST of `body` to `url` with one more header.
    pub fn json_with(
        &self,
        url: &str,
        body: &Value,
        header: Option<(&str, &str)>,
    ) -> Result<Value, HttpError> {
        let mut req = self.agent.post(url);
        if let Some((k, v)) = header {
            req = req.header(k, v);
        }
        self.answer(url, req.send_json(body))
    }

    /// The answer's JSON, or the error with the status and a short body.
    fn answer(
        &self,
        url: &str,
        sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, HttpError> {
        let mut resp = sent.map_err(|e| HttpError {
            status: None,
            body: Value::Null,
            message: format!("{url}: no answer ({e})"),
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_string()
            .unwrap_or_default();
        let parsed = match text.trim().is_empty() {
            true => Value::Null,
            false => serde_json::from_str(&text).unwrap_or(Value::String(text.clone())),
        };
        if (200..300).contains(&status) {
            return Ok(parsed);
        }
        let short: String = text.chars().take(300).collect();
        Err(HttpError {
            status: Some(status),
            body: parsed,
            message: format!("{url}: HTTP {status}: {short}"),
        })
    }
}

/// A request that did not succeed.
#[derive(Debug)]
pub(crate) struct HttpError {
    /// The answer's status (None: no answer).
    pub status: Option<u16>,
    /// The answer's JSON, if any.
    pub body: Value,
    /// What happened, with the URL.
    pub message: String,
}

impl From<HttpError> for Failure {
    /// No answer, a timeout, 408, 429 and 5xx are worth another try; other answers are refusals.
    fn from(e: HttpError) -> Self {
        match e.status {
            None | Some(408) | Some(429) | Some(500..) => Failure::Retry(e.message),
            Some(_) => Failure::Reject(e.message),
        }
    }
}

/// `Basic` credentials for `user` and `password` (RFC 7617).
pub(crate) fn basic_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    let coded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {coded}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn basic_auth_matches_rfc_7617() {
        // RFC 7617 §2's example.
        assert_eq!(
            super::basic_auth("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
    }
}
