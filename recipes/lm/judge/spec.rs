//! `[reward.judge]`: a judge model (behind an endpoint or loaded in process) as a recipe names
//! it, how its answer becomes a reward, and the values checked. The judge itself is
//! [`crate::lm::judge`].

use crate::common::config::check_range;
use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// How the judge's answer becomes a reward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// P(yes) / (P(yes) + P(no)) of the words after the judge prompt, from the endpoint's
    /// echoed log-probs: in [0, 1].
    YesNo,
    /// The first number of the judge's greedy answer over `max_score`, clamped to [0, 1]; an
    /// answer without a number is an invalid reward (masked and counted).
    Score,
}

/// `[reward.judge]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeSpec {
    /// The endpoint (`http://host:port`, with or without `/v1`); or give `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The judge model's name on the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A judge loaded in process instead, frozen, on the run's device: a Hugging Face
    /// directory or a GGUF file (`~` and `$VAR` expand), or a Hub id in the Hugging Face cache
    /// (`ember_hub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The judge prompt; `{prompt}`, `{completion}` and `{answer}` are replaced.
    pub template: String,
    /// `yes_no` or `score`.
    pub verdict: Verdict,
    /// The weight of the judge's reward in the sum.
    #[serde(default = "crate::common::config::defaults::one_f32")]
    pub weight: f32,
    /// The words whose probabilities `yes_no` compares, as they follow the prompt.
    #[serde(default = "yes")]
    pub yes: String,
    /// The word `yes` is weighed against.
    #[serde(default = "no")]
    pub no: String,
    /// `score`: the score that reads as 1.
    #[serde(default = "ten")]
    pub max_score: f64,
    /// `score`: the judge's answer length in tokens.
    #[serde(default = "sixteen")]
    pub max_tokens: usize,
    /// The environment variable holding the endpoint's API key, if it asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Seconds per request.
    #[serde(default = "two_minutes")]
    pub request_timeout_s: f64,
    /// Retries of a failed request (backoff 1, 2, 4 … s).
    #[serde(default = "three")]
    pub request_retries: u32,
    /// Send the filled template as the user's message through the judge's chat template, the
    /// assistant's turn opened (an instruct judge); an endpoint's template comes from its
    /// `GET /tokenizer_info` (`ember serve` and vLLM answer it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chat: bool,
}

fn yes() -> String {
    " yes".into()
}
fn no() -> String {
    " no".into()
}
fn ten() -> f64 {
    10.0
}
fn sixteen() -> usize {
    16
}
fn two_minutes() -> f64 {
    120.0
}
fn three() -> u32 {
    3
}

impl JudgeSpec {
    /// The values a run can use: a template with `{completion}`, distinct non-empty words,
    /// bounded sizes.
    pub fn validate(&self) -> Result<()> {
        check_range("reward.judge.weight", self.weight.into(), -1e9, 1e9)?;
        check_range("reward.judge.max_score", self.max_score, 1e-9, 1e12)?;
        check_range(
            "reward.judge.request_timeout_s",
            self.request_timeout_s,
            1e-3,
            1e6,
        )?;
        if !self.template.contains("{completion}") {
            bail!("reward.judge.template has no {{completion}}: the judge would not see it");
        }
        if self.yes.is_empty() || self.no.is_empty() || self.yes == self.no {
            bail!("reward.judge.yes and reward.judge.no must be two different non-empty words");
        }
        if !(1..=4096).contains(&self.max_tokens) {
            bail!("reward.judge.max_tokens must be within 1..=4096");
        }
        if self.request_retries > 10 {
            bail!("reward.judge.request_retries must be at most 10");
        }
        match (&self.base_url, &self.model, &self.path) {
            (Some(url), Some(_), None) => {
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    bail!("reward.judge.base_url must start with http:// or https://");
                }
            }
            (Some(_), None, None) => bail!("reward.judge.model: name the model on the endpoint"),
            (None, None, Some(_)) => {}
            (None, Some(_), Some(_)) => {
                bail!("reward.judge.model names a model on an endpoint: give base_url, or drop it")
            }
            _ => bail!("reward.judge: give base_url (an endpoint) or path (a model in process)"),
        }
        Ok(())
    }
}
