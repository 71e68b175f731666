//! `[teacher]`: the model that scores every token the student samples, as a recipe names it
//! (in process or behind an endpoint) and its role; checked against the rest of the recipe.
//! The teacher itself is `crate::llm::teacher`.

use crate::common::config::check_range;
use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// What the teacher's log-probs do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeacherRole {
    /// On-policy distillation: `coef`·(log π_teacher − log π_student) on each sampled token,
    /// less its batch mean, added to the batch's per-token rewards (`algorithm = "opd"` takes them as the
    /// advantages; an outcome estimator such as GRPO sums them into the sequence reward).
    #[default]
    Reward,
    /// The teacher is the reference of the loss's KL term (`train.kl_coef`): KL to the teacher
    /// instead of to the starting policy.
    Kl,
}

/// `[teacher]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherSpec {
    /// A teacher loaded in process: a Hugging Face directory (a tiny run's `final/`; `ember
    /// export` writes one from a checkpoint) or a GGUF file (`~` and `$VAR` expand), or a Hub
    /// id in the Hugging Face cache (`ember_hub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Or an endpoint (`http://host:port`, with or without `/v1`) that echoes prompt log-probs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The teacher's name on the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `reward` (on-policy distillation) or `kl` (the KL loss's reference).
    #[serde(default)]
    pub role: TeacherRole,
    /// `reward`: β of β·(log π_teacher − log π_student), centred over the batch; 0 only logs the teacher's metrics
    /// (`teacher/reverse_kl`), the comparison run of a distillation.
    #[serde(default = "crate::common::config::defaults::one_f32")]
    pub coef: f32,
    /// The environment variable holding the endpoint's API key, if it asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Seconds per request.
    #[serde(default = "two_minutes")]
    pub request_timeout_s: f64,
    /// Retries of a failed request (backoff 1, 2, 4 … s).
    #[serde(default = "three")]
    pub request_retries: u32,
}

fn two_minutes() -> f64 {
    120.0
}
fn three() -> u32 {
    3
}

impl TeacherSpec {
    /// One source, bounded numbers, and the KL role only with a KL term to serve.
    pub fn validate(&self, kl_coef: f32) -> Result<()> {
        check_range("teacher.coef", self.coef.into(), 0.0, 1e6)?;
        check_range(
            "teacher.request_timeout_s",
            self.request_timeout_s,
            1e-3,
            1e6,
        )?;
        if self.request_retries > 10 {
            bail!("teacher.request_retries must be at most 10");
        }
        match (&self.path, &self.base_url, &self.model) {
            (Some(_), None, None) => {}
            (None, Some(url), Some(_)) => {
                if !url.starts_with("http://") && !url.starts_with("https://") {
                    bail!("teacher.base_url must start with http:// or https://");
                }
            }
            (None, Some(_), None) => bail!("teacher.model: name the teacher on the endpoint"),
            _ => bail!(
                "[teacher]: give path (a model in process) or base_url and model (an endpoint), \
                 not both"
            ),
        }
        if self.role == TeacherRole::Kl && kl_coef <= 0.0 {
            bail!(
                "teacher.role = \"kl\" makes the teacher the KL term's reference, but \
                 train.kl_coef is 0: set it > 0"
            );
        }
        Ok(())
    }
}

/// `[teacher]` against the rest of the recipe: `opd` needs one that gives token rewards, and
/// the offline job (`offline`) samples nothing for it to score.
pub fn check(
    teacher: Option<&TeacherSpec>,
    algorithm: ember_engine::Preset,
    offline: bool,
    kl_coef: f32,
) -> Result<()> {
    let distils = algorithm.needs_teacher();
    match teacher {
        None if distils => bail!(
            "algorithm = \"opd\" distils a teacher: add a [teacher] table (path, or base_url and \
             model)"
        ),
        Some(_) if offline => {
            bail!("[teacher] scores sampled tokens; the offline job samples none: remove it")
        }
        Some(t) if distils && t.role != TeacherRole::Reward => {
            bail!(
                "algorithm = \"opd\" takes the teacher's token rewards: teacher.role = \"reward\""
            )
        }
        Some(t) => t.validate(kl_coef),
        None => Ok(()),
    }
}
