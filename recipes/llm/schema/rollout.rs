//! `[rollout]`: how an LLM recipe samples, here or on OpenAI-compatible servers.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// Sampling of rollouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Prompts per RL step.
    pub prompts_per_step: usize,
    /// Samples per prompt (the group size).
    pub samples_per_prompt: usize,
    /// Temperature.
    pub temperature: f32,
    /// Maximum response length.
    pub max_new_tokens: usize,
    /// Pad prompts and responses to multiples of this many tokens before rescoring and
    /// training, so GPU kernels see a few shapes (0 = off, the CPU default; 16 or 32 on GPUs).
    #[serde(default)]
    pub shape_bucket: usize,
    /// Reinforce-Ada's sampling in rounds (`mode`, `max_rounds`, `round_repeat`,
    /// `positive_threshold`, `global_stats`); `samples_per_prompt` responses of each prompt are
    /// kept. Set by `algorithm = "reinforce-ada"`; this table enables it with any preset or
    /// changes its settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reinforce_ada: Option<ember_engine::ReinforceAda>,
    /// The pipeline's staleness bound k: the rollout of step t + k is generated (by a worker
    /// thread, here or on the servers) while step t trains, with the weights of step t, so no
    /// sample is more than k updates old. 0 (the default) waits for each step's rollout.
    #[serde(
        default,
        skip_serializing_if = "crate::common::config::defaults::is_zero"
    )]
    pub max_staleness: usize,
    /// Where rollouts are sampled: `"local"` (the trainer's own KV-cache sampler, the default)
    /// or `"openai"` (OpenAI-compatible servers: `ember serve`, vLLM, SGLang; the adapter is
    /// pushed to them after every update, and the mismatch correction is on by default).
    #[serde(default, skip_serializing_if = "RolloutBackend::is_local")]
    pub backend: RolloutBackend,
    /// `"openai"`: the servers' base URLs (`http://host:port`), sent equal shares of each
    /// step's prompts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub base_urls: Vec<String>,
    /// `"openai"`: the base model's name on the servers (`ember serve --served-model-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `"openai"`: seconds one request may take (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_s: Option<f64>,
    /// `"openai"`: retries of a failed request, with backoff 1, 2, 4 … s (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_retries: Option<u32>,
    /// `"openai"`: the environment variable holding the servers' API key, sent as
    /// `Authorization: Bearer` (default: EMBER_API_KEY when it is set). The key itself is never
    /// written to the recipe or the logs. Weight pushes send EMBER_ADMIN_KEY when it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
}

/// The servers' keys, read from the environment.
#[derive(Debug, Clone, Default)]
pub struct ServerKeys {
    /// Sent with every request.
    pub api: Option<String>,
    /// Sent instead with the admin routes (adapter and weight pushes), when set.
    pub admin: Option<String>,
}

/// Where rollouts are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutBackend {
    /// The trainer's own sampler.
    #[default]
    Local,
    /// OpenAI-compatible servers (`recipes/llm/remote.rs`).
    Openai,
}

impl RolloutBackend {
    /// The default.
    pub fn is_local(&self) -> bool {
        *self == Self::Local
    }
}

impl RolloutSpec {
    /// The `"openai"` backend's settings, for a recipe with or without Reinforce-Ada's rounds
    /// (`adaptive`).
    /// `adapters`: the policy is trained through LoRA adapters, which servers hold under a
    /// name per step (so several versions at once).
    pub fn validate_backend(&self, adaptive: bool, adapters: bool) -> Result<()> {
        let ro = self;
        if ro.max_staleness > 16 {
            bail!(
                "rollout.max_staleness = {} must be at most 16",
                ro.max_staleness
            );
        }
        if ro.max_staleness > 1 && !ro.backend.is_local() && !adapters {
            bail!(
                "rollout.max_staleness = {}: servers hold one version of the whole weights (the \
                 last pushed), so with rollout.backend = \"openai\" and [model] at most one \
                 rollout can be ahead (1); LoRA policies ([pretrained]) may run further ahead",
                ro.max_staleness
            );
        }
        if ro.max_staleness > 0 && adaptive {
            bail!(
                "rollout.max_staleness: Reinforce-Ada's rounds score each round before drawing \
                 the next, so they cannot run ahead of training; set it to 0"
            );
        }
        if ro.backend.is_local() {
            if !ro.base_urls.is_empty()
                || ro.model.is_some()
                || ro.request_timeout_s.is_some()
                || ro.request_retries.is_some()
                || ro.api_key_env.is_some()
            {
                bail!(
                    "rollout.base_urls, model, request_timeout_s, request_retries and \
                     api_key_env apply to rollout.backend = \"openai\""
                );
            }
            return Ok(());
        }
        if ro.base_urls.is_empty() {
            bail!(
                "rollout.backend = \"openai\" needs rollout.base_urls (e.g. [\"http://127.0.0.1:8000\"])"
            );
        }
        for u in &ro.base_urls {
            if !u.starts_with("http://") || u.len() <= "http://".len() {
                bail!(
                    "rollout.base_urls: `{u}` must be an http:// URL (https is not supported: \
                     reach the servers over a private network or a local TLS proxy)"
                );
            }
        }
        if ro.model.as_deref().is_none_or(str::is_empty) {
            bail!(
                "rollout.backend = \"openai\" needs rollout.model, the base model's name on the servers"
            );
        }
        if let Some(t) = ro.request_timeout_s {
            crate::common::config::check_range("rollout.request_timeout_s", t, 1.0, 86_400.0)?;
        }
        if ro.request_retries.is_some_and(|r| r > 10) {
            bail!("rollout.request_retries must be at most 10");
        }
        if adaptive {
            bail!("rollout.backend = \"openai\" does not combine with Reinforce-Ada's rounds");
        }
        self.server_keys()?;
        Ok(())
    }

    /// The servers' keys: `api_key_env`'s variable (which must then be set and not empty),
    /// else EMBER_API_KEY if set; EMBER_ADMIN_KEY for the admin routes if set.
    pub fn server_keys(&self) -> Result<ServerKeys> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let api = match &self.api_key_env {
            Some(name) => match var(name) {
                Some(k) => Some(k),
                None => bail!("rollout.api_key_env: the environment variable {name} is not set"),
            },
            None => var("EMBER_API_KEY"),
        };
        Ok(ServerKeys {
            api,
            admin: var("EMBER_ADMIN_KEY"),
        })
    }
}
