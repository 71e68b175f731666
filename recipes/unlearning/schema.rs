//! The unlearning recipe (`kind = "unlearning"`): the corpus of fictitious facts, the model,
//! the supervised stage that teaches every fact, the unlearning method and the evaluation;
//! each default stated once.

use anyhow::{Result, bail};
use ember_tasks::facts::FactsSpec;
use serde::{Deserialize, Serialize};

fn unlearning() -> String {
    "unlearning".into()
}

/// An unlearning recipe below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnlearningBody {
    /// Always `"unlearning"`.
    #[serde(default = "unlearning")]
    pub kind: String,
    /// The corpus.
    #[serde(default)]
    pub facts: FactsSpec,
    /// The model's sizes.
    #[serde(default)]
    pub model: crate::programs::schema::ProgrammerSpec,
    /// The supervised stage.
    #[serde(default)]
    pub learn: LearnSpec,
    /// The unlearning stage.
    #[serde(default)]
    pub forget: ForgetSpec,
    /// Evaluate every this many steps (of both stages; and after the last).
    #[serde(default = "every")]
    pub eval_every: usize,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`UnlearningBody`].
pub type UnlearningRecipe = crate::common::header::Headed<UnlearningBody>;

fn every() -> usize {
    25
}

/// `[learn]`: supervised steps on every fact (teacher-forced −log π of the answer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnSpec {
    /// Steps.
    pub steps: usize,
    /// Facts per step.
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
}

impl Default for LearnSpec {
    fn default() -> Self {
        Self {
            steps: 400,
            batch: 32,
            lr: 3e-3,
        }
    }
}

/// How the model forgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// No unlearning stage (the learned model, for reference).
    None,
    /// The gold standard: the supervised stage never sees the forget facts.
    Retrain,
    /// Gradient ascent on the forget facts (+ `retain_weight` × descent on retain facts).
    GradientAscent,
    /// RULE: rejection steering (supervised refusals on a share of the forget facts), then
    /// GRPO with a refusal reward on forget prompts and correctness on retain prompts.
    Rule,
    /// ReRULE: RULE whose hard groups (mean reward below ½) are stored with their answers
    /// and replayed in later steps through importance-weighted off-policy updates.
    Rerule,
    /// Leave-one-out teacher ensemble: `teachers` models trained on disjoint shards; the model
    /// is distilled on each forget fact toward the mean of the teachers that never saw it.
    LooEnsemble,
}

/// `[forget]`: the unlearning stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForgetSpec {
    /// The method.
    pub method: Method,
    /// Steps.
    pub steps: usize,
    /// Forget facts per step.
    pub batch: usize,
    /// Retain facts per step.
    pub retain_batch: usize,
    /// Weight of the retain facts' loss (gradient ascent, the teacher ensemble).
    pub retain_weight: f32,
    /// Answers sampled per prompt (RULE, ReRULE).
    pub samples_per_prompt: usize,
    /// Stored hard groups replayed per step (ReRULE).
    pub replay: usize,
    /// RULE's rejection steering before its RL steps: supervised steps that answer the
    /// refusal on a share of the forget facts (and the answer on retain facts).
    pub steering_steps: usize,
    /// The share of the forget facts that rejection steering shows (RL must generalise the
    /// refusal to the rest).
    pub steering_share: f32,
    /// Teachers of the leave-one-out ensemble.
    pub teachers: usize,
    /// Learning rate.
    pub lr: f64,
}

impl Default for ForgetSpec {
    fn default() -> Self {
        Self {
            method: Method::Rule,
            steps: 100,
            batch: 8,
            retain_batch: 8,
            retain_weight: 1.0,
            samples_per_prompt: 8,
            replay: 4,
            steering_steps: 10,
            steering_share: 0.25,
            teachers: 4,
            lr: 1e-3,
        }
    }
}

pub(crate) fn from_table(table: toml::Table) -> Result<UnlearningRecipe> {
    let r: UnlearningRecipe = crate::common::config::from_toml(table)?;
    r.validate()?;
    Ok(r)
}

impl UnlearningRecipe {
    /// Steps of both stages.
    pub fn total_steps(&self) -> usize {
        self.learn.steps
            + match self.forget.method {
                Method::None | Method::Retrain => 0,
                _ => self.forget.steps,
            }
    }

    /// Checks every value, naming the key.
    pub fn validate(&self) -> Result<()> {
        if self.kind != "unlearning" {
            bail!(
                "kind = {:?}: an unlearning recipe says kind = \"unlearning\"",
                self.kind
            );
        }
        ember_tasks::facts::Facts::new(&self.facts).map_err(anyhow::Error::msg)?;
        crate::programs::schema::check_model(&self.model)?;
        let (l, f) = (&self.learn, &self.forget);
        let key = "forget.samples_per_prompt";
        crate::common::config::check_samples_per_prompt(key, f.samples_per_prompt, 2)?;
        for (key, v, lo, max) in [
            ("learn.steps", l.steps, 1, 100_000),
            ("learn.batch", l.batch, 1, 4096),
            ("forget.steps", f.steps, 1, 100_000),
            ("forget.batch", f.batch, 1, 4096),
            ("forget.retain_batch", f.retain_batch, 0, 4096),
            ("forget.replay", f.replay, 0, 4096),
            ("forget.teachers", f.teachers, 2, 16),
            ("eval_every", self.eval_every, 1, 100_000),
        ] {
            if v < lo || v > max {
                bail!("{key} = {v} must be in {lo}..={max}");
            }
        }
        for (key, lr) in [("learn.lr", l.lr), ("forget.lr", f.lr)] {
            if !(lr.is_finite() && lr > 0.0 && lr <= 1.0) {
                bail!("{key} = {lr} must be in (0, 1]");
            }
        }
        if !(f.steering_share.is_finite() && f.steering_share > 0.0 && f.steering_share <= 1.0) {
            bail!(
                "forget.steering_share = {} must be in (0, 1]",
                f.steering_share
            );
        }
        if f.steering_steps >= f.steps {
            bail!(
                "forget.steering_steps = {} must be below forget.steps = {}",
                f.steering_steps,
                f.steps
            );
        }
        if !(f.retain_weight.is_finite() && (0.0..=100.0).contains(&f.retain_weight)) {
            bail!(
                "forget.retain_weight = {} must be in [0, 100]",
                f.retain_weight
            );
        }
        Ok(())
    }
}
