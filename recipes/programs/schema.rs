//! The program-synthesis recipe (`kind = "programs"`): the world, the programmer (a tiny Llama
//! over the task's words), Neural Symbolic Machines' training method and its settings, the
//! held-out evaluation; each default stated once.

use anyhow::{Result, bail};
use ember_tasks::program::kb::KbSpec;
use serde::{Deserialize, Serialize};

fn programs() -> String {
    "programs".into()
}
fn three() -> usize {
    3
}

/// A program-synthesis recipe below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramsBody {
    /// Always `"programs"`.
    #[serde(default = "programs")]
    pub kind: String,
    /// Expressions a program may hold (1 to 6).
    #[serde(default = "three")]
    pub max_exprs: usize,
    /// The world.
    #[serde(default)]
    pub kb: KbSpec,
    /// The programmer.
    #[serde(default)]
    pub model: ProgrammerSpec,
    /// The training loop and method.
    #[serde(default)]
    pub train: TrainSpec,
    /// The held-out evaluation.
    #[serde(default)]
    pub eval: EvalSpec,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`ProgramsBody`].
pub type ProgramsRecipe = crate::common::header::Headed<ProgramsBody>;

/// `[model]`: the tiny decoder's sizes (its vocabulary is the task's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProgrammerSpec {
    /// Hidden size.
    pub d_model: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP size.
    pub d_ff: usize,
}

impl Default for ProgrammerSpec {
    fn default() -> Self {
        Self {
            d_model: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            d_ff: 256,
        }
    }
}

/// How the programmer learns (NSM, Liang et al. 2017, its training section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// REINFORCE on the answer's F1 with the group's mean reward as the baseline.
    Reinforce,
    /// Iterative maximum likelihood: −log π of the best program found so far for each question
    /// of the step (its pseudo-gold), the samples only searching.
    IterativeMl,
    /// Augmented REINFORCE: the step's samples at weight (1 − α)/n and the best program found
    /// so far at weight α, baseline the weighted mean reward.
    Augmented,
    /// MAPO (Liang et al. 2018): one program from the question's buffer of good programs,
    /// drawn in proportion to π, at weight w = max(π_B, 0.1) (π_B the buffer's total
    /// probability), and the step's samples outside the buffer sharing 1 − w.
    Mapo,
}

/// The loop's own settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainLoop {
    /// Steps (sample, then one update).
    pub steps: usize,
    /// Training questions per step.
    pub questions: usize,
    /// Programs sampled per question.
    pub samples_per_prompt: usize,
    /// The method.
    pub method: Method,
    /// α of augmented REINFORCE (NSM's 0.1).
    pub alpha: f32,
    /// NSM's schedule: iterative maximum likelihood for the first `ml_steps` steps,
    /// then `method` (0 = `method` throughout).
    pub ml_steps: usize,
    /// With `ml_steps`, start `method` from fresh weights (NSM resets the parameters after
    /// the maximum-likelihood stage, keeping only the best programs it found).
    pub reset_after_ml: bool,
    /// Sampling temperature.
    pub temperature: f32,
    /// Checkpoint every this many steps (0 = at the end and on a stop only).
    pub checkpoint_every: usize,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
}

impl Default for TrainLoop {
    fn default() -> Self {
        Self {
            steps: 200,
            questions: 16,
            samples_per_prompt: 8,
            method: Method::Augmented,
            alpha: 0.1,
            ml_steps: 0,
            reset_after_ml: true,
            temperature: 1.0,
            checkpoint_every: 0,
            keep_checkpoints: 2,
        }
    }
}

/// `[train]`: the loop and the configs it embeds from `ember-train`.
pub type TrainSpec = crate::common::config::Training<TrainLoop>;

/// The defaults of the embedded configs' keys.
pub const TRAIN_DEFAULTS: [(&str, f64); 2] = [("lr", 1e-3), ("grad_clip", 1.0)];

impl crate::common::config::LoopSettings for TrainLoop {
    const TABLE: &'static str = "train";
    const DEFAULTS: &'static [(&'static str, f64)] = &TRAIN_DEFAULTS;
}

/// `[eval]`: greedy programs for every held-out question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSpec {
    /// Evaluate every this many steps (and after the last).
    pub every: usize,
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self { every: 20 }
    }
}

/// Checks the model's sizes, naming the key.
pub fn check_model(m: &ProgrammerSpec) -> Result<()> {
    if m.heads == 0 || m.kv_heads == 0 || !m.heads.is_multiple_of(m.kv_heads) {
        bail!(
            "model.heads = {} must be a positive multiple of model.kv_heads",
            m.heads
        );
    }
    for (key, v, max) in [
        ("model.d_model", m.d_model, 4096),
        ("model.d_ff", m.d_ff, 16_384),
        ("model.layers", m.layers, 64),
    ] {
        if v == 0 || v > max {
            bail!("{key} = {v} must be in 1..={max}");
        }
    }
    if !m.d_model.is_multiple_of(m.heads) || !(m.d_model / m.heads).is_multiple_of(2) {
        bail!(
            "model.d_model = {} must be an even multiple of model.heads",
            m.d_model
        );
    }
    Ok(())
}

pub(crate) fn from_table(table: toml::Table) -> Result<ProgramsRecipe> {
    let r: ProgramsRecipe = crate::common::config::from_toml(table)?;
    r.validate()?;
    Ok(r)
}

impl ProgramsRecipe {
    /// Checks every value, naming the key.
    pub fn validate(&self) -> Result<()> {
        if self.kind != "programs" {
            bail!(
                "kind = {:?}: a program recipe says kind = \"programs\"",
                self.kind
            );
        }
        ember_tasks::program::kb::check_spec(&self.kb).map_err(anyhow::Error::msg)?;
        if !(1..=6).contains(&self.max_exprs) {
            bail!("max_exprs = {} must be in 1..=6", self.max_exprs);
        }
        check_model(&self.model)?;
        let t = &self.train.run;
        let key = "train.samples_per_prompt";
        crate::common::config::check_samples_per_prompt(key, t.samples_per_prompt, 1)?;
        for (key, v, max) in [
            ("train.steps", t.steps, 1_000_000),
            ("train.questions", t.questions, 4096),
            ("train.keep_checkpoints", t.keep_checkpoints, 1000),
            ("eval.every", self.eval.every, 1_000_000),
        ] {
            if v == 0 || v > max {
                bail!("{key} = {v} must be in 1..={max}");
            }
        }
        if t.ml_steps > 0 && (t.method == Method::IterativeMl || t.ml_steps >= t.steps) {
            bail!(
                "train.ml_steps = {} needs train.method = \"reinforce\" or \"augmented\" and \
                 fewer than train.steps = {} (it is the stage before the method)",
                t.ml_steps,
                t.steps
            );
        }
        if !(t.alpha.is_finite() && (0.0..1.0).contains(&t.alpha)) {
            bail!("train.alpha = {} must be in [0, 1)", t.alpha);
        }
        if !ember_llm::temperature_ok(t.temperature.into(), false) {
            let max = ember_llm::MAX_TEMPERATURE;
            bail!(
                "train.temperature = {} must be in (0, {max}]",
                t.temperature
            );
        }
        let s = &self.train.schedule;
        if !(s.lr.is_finite() && s.lr > 0.0 && s.lr <= 1.0) {
            bail!("train.lr = {} must be in (0, 1]", s.lr);
        }
        crate::common::config::check_training("train", s, &self.train.optim, &self.train.update)
    }
}
