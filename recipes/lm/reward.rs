//! `[reward]`: the weighted terms of a step's reward.

use crate::lm::judge::JudgeSpec;
use ember_engine::OverlongPenalty;
use ember_tasks::reward::{ExternalSpec, PythonSpec};
use serde::{Deserialize, Serialize};

/// The reward: a weighted sum of the task's verifiable reward, a format reward, an external
/// program's reward, plus DAPO's overlong penalty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardSpec {
    /// Weight of the verifiable (correctness) reward.
    #[serde(default = "crate::common::config::defaults::one_f32")]
    pub correct: f32,
    /// Weight of the format reward (see `reward::format_reward`).
    #[serde(default)]
    pub format: f32,
    /// DAPO's soft overlong penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlong: Option<OverlongPenalty>,
    /// An external reward program speaking JSON lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalSpec>,
    /// Python reward functions with TRL's signature (each weighted; logged as
    /// `reward/<function>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonSpec>,
    /// A judge model behind an OpenAI-compatible endpoint (logged as `reward/judge_mean`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeSpec>,
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            correct: 1.0,
            format: 0.0,
            overlong: None,
            external: None,
            python: None,
            judge: None,
        }
    }
}
