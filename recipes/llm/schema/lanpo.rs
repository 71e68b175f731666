//! `[lanpo]`: LANPO's experience pool and the feedback it puts in the context (Li, Wang, Yuan,
//! Jegelka, Wang, "LANPO: Bootstrapping Language and Numerical Feedback for Reinforcement
//! Learning in LLMs", arXiv 2510.16552): language guides exploration, only the numerical reward
//! drives the update. The rules are in `recipes/llm/lanpo.rs`.

use super::rollout::RolloutSpec;
use crate::common::config::check_count;
use crate::common::config::defaults::{four, two, yes};
use anyhow::{Result, bail};
use ember_engine::PresetParts;
use serde::{Deserialize, Serialize};

/// The `[lanpo]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanpoSpec {
    /// Samples of each group drawn with feedback in the context (default: half of
    /// `rollout.samples_per_prompt`, rounded down); the others are drawn from scratch first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback_samples: Option<usize>,
    /// Reward-Agnostic Reflection: a feedback sample sees one earlier attempt of the policy at
    /// the same problem, never its reward or the reference answer.
    #[serde(default = "yes")]
    pub reflection: bool,
    /// Relevant Abstraction: lessons the policy wrote about other problems, retrieved by the
    /// similarity of the problems' prompts.
    #[serde(default = "yes")]
    pub abstraction: bool,
    /// Earlier attempts kept per problem (newest kept).
    #[serde(default = "four")]
    pub attempts_kept: usize,
    /// Problems kept in the pool (the least recently drawn go first).
    #[serde(default = "problems_kept")]
    pub problems_kept: usize,
    /// Lessons kept in the pool (the oldest go first).
    #[serde(default = "lessons_kept")]
    pub lessons_kept: usize,
    /// Lessons shown to a feedback sample at most (the most similar first).
    #[serde(default = "two")]
    pub lessons_shown: usize,
    /// γ: a lesson is relevant when the cosine similarity of its problem's prompt embedding
    /// (the policy's centred last hidden state) and this problem's is at least this.
    #[serde(default = "similarity")]
    pub similarity: f64,
    /// Lessons the policy writes per step at most (from the problems solved that step).
    #[serde(default = "four")]
    pub lessons_per_step: usize,
    /// New tokens of a lesson at most.
    #[serde(default = "lesson_max_tokens")]
    pub lesson_max_tokens: usize,
    /// What the update conditions the feedback samples on: `"removed"` (the default: the
    /// plain prompt, so that the policy learns to answer without feedback) or `"kept"`.
    #[serde(default)]
    pub update_context: UpdateContext,
}

/// The prompt a feedback sample is trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateContext {
    /// The plain prompt: the response was sampled with feedback, the gradient is taken without.
    #[default]
    Removed,
    /// The prompt with the feedback it was sampled with (on-policy).
    Kept,
}

fn problems_kept() -> usize {
    4096
}
fn lessons_kept() -> usize {
    256
}
fn similarity() -> f64 {
    0.5
}
fn lesson_max_tokens() -> usize {
    40
}

impl LanpoSpec {
    /// Feedback samples of a group of `n`.
    pub fn feedback(&self, n: usize) -> usize {
        self.feedback_samples.unwrap_or(n / 2)
    }

    /// The table's values against a group of `samples_per_prompt`.
    pub fn validate(&self, samples_per_prompt: usize) -> Result<()> {
        let m = self.feedback(samples_per_prompt);
        if m == 0 || m >= samples_per_prompt {
            bail!(
                "lanpo.feedback_samples = {m} with rollout.samples_per_prompt = \
                 {samples_per_prompt}: a group needs at least one sample with feedback and one \
                 from scratch (the attempts a reflection reads)"
            );
        }
        if !(self.reflection || self.abstraction) {
            bail!("[lanpo] with reflection = false and abstraction = false gives no feedback");
        }
        check_count("lanpo.attempts_kept", self.attempts_kept, 1, 64)?;
        check_count("lanpo.problems_kept", self.problems_kept, 1, 1_000_000)?;
        check_count("lanpo.lessons_kept", self.lessons_kept, 1, 100_000)?;
        check_count("lanpo.lessons_shown", self.lessons_shown, 1, 8)?;
        check_count("lanpo.lessons_per_step", self.lessons_per_step, 0, 256)?;
        check_count("lanpo.lesson_max_tokens", self.lesson_max_tokens, 1, 512)?;
        crate::common::config::check_range("lanpo.similarity", self.similarity, -1.0, 1.0)
    }
}

/// What `[lanpo]` works with in the rest of a recipe.
pub(super) struct LanpoContext<'a> {
    /// A pretrained policy (`[pretrained]`), which reads text.
    pub(super) pretrained: bool,
    /// `[rollout]`.
    pub(super) rollout: &'a RolloutSpec,
    /// An `[offline]` table.
    pub(super) offline: bool,
    /// The preset's parts.
    pub(super) parts: &'a PresetParts,
}

/// `[lanpo]`: its values, and the parts of a recipe it works with (a pretrained policy that
/// reads text, rollouts sampled here and now, one group per problem).
pub(super) fn validate_lanpo(lanpo: Option<&LanpoSpec>, c: LanpoContext) -> Result<()> {
    let Some(l) = lanpo else {
        return Ok(());
    };
    l.validate(c.rollout.samples_per_prompt)?;
    let clash = if !c.pretrained {
        Some("the tiny [model], which reads no feedback text (use [pretrained])")
    } else if !c.rollout.backend.is_local() {
        Some("rollout.backend = \"openai\" (the feedback samples are drawn in process)")
    } else if c.rollout.max_staleness > 0 {
        Some("rollout.max_staleness > 0 (the feedback reads this step's attempts)")
    } else if c.parts.adaptive.is_some() {
        Some("Reinforce-Ada's rounds")
    } else if c.parts.replay.is_some() {
        Some("replay of stored groups")
    } else if c.offline {
        Some("[offline], which samples nothing")
    } else {
        None
    };
    match clash {
        Some(what) => bail!("[lanpo] does not combine with {what}"),
        None => Ok(()),
    }
}
