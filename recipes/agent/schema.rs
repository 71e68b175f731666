//! `kind = "agent"` recipes: the tiny character-level policy trained over multi-turn episodes
//! of an environment (`[env]`), with the LLM recipe's `[model]` and `[train]` tables and a
//! preset `algorithm` whose advantages are computed over whole trajectories.

use crate::common::config::defaults::one_f32;
use crate::common::config::{check_lr, check_range, check_training};
use crate::lm::TrainSpec;
use crate::lm::{ModelSpec, PolicyChoice, PretrainedSpec, Warmup, choose_policy};
use anyhow::{Result, bail};
use ember_engine::{AdvantageConfig, AdvantageKind, Preset, PresetParts};
use ember_tasks::env::external::ExternalEnvSpec;
use serde::{Deserialize, Serialize};

/// Which environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EnvSpec {
    /// Guess a secret in `0..=max` with higher/lower replies (`env::builtin::GuessNumber`).
    Guess {
        /// Largest secret.
        max: u32,
    },
    /// A product with a calculator tool (`env::builtin::Calculator`).
    Calculator {
        /// Digits per factor.
        digits: u32,
        /// Open each episode with instructions in English (for a pretrained policy): the
        /// question and how to call the calculator (`<calc>…</calc>` → `<result>…</result>`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        instructions: bool,
    },
    /// A program speaking the JSON-lines environment protocol.
    External(ExternalEnvSpec),
    /// Tutor a simulated student (a frozen model) toward a masked near-transfer post-test
    /// (`recipes/agent/tutor.rs`).
    Tutor(super::tutor::TutorSpec),
    /// Write C kernels for the kernel gym's tasks (`ember_tasks::env::kernel::KernelGym`).
    KernelGym(ember_tasks::env::kernel::KernelGymSpec),
}

/// Episodes and sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRollout {
    /// Episode seeds per step (an episode seed is the prompt a group of episodes shares).
    pub prompts_per_step: usize,
    /// Episodes played from each episode seed (a group: the seed fixes the episode's opening
    /// prompt).
    pub samples_per_prompt: usize,
    /// Policy turns per episode at most.
    pub max_turns: usize,
    /// Tokens per turn at most.
    pub max_new_tokens: usize,
    /// Sampling temperature.
    #[serde(default = "one_f32")]
    pub temperature: f32,
}

/// A multi-turn recipe below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentBody {
    /// Always `"agent"`.
    pub kind: String,
    /// Algorithm preset (its advantage and loss; trajectory-level).
    #[serde(default)]
    pub algorithm: Preset,
    /// Overrides the preset's estimator, e.g. `kind = "trloo"` (turn-level leave-one-out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantage: Option<AdvantageConfig>,
    /// The tiny policy, trained from scratch (or use `[pretrained]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// A pretrained policy trained through LoRA adapters; the first observation fills
    /// `template`'s `{question}`, and with `chat` the episode is a conversation: observations are
    /// user messages, turns assistant messages (or use `[model]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<PretrainedSpec>,
    /// Supervised warm-up on the environment's demonstrations (built-in environments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<Warmup>,
    /// The environment.
    pub env: EnvSpec,
    /// Held-out episodes evaluated (greedy success rate).
    pub eval_episodes: usize,
    /// Episodes and sampling.
    pub rollout: AgentRollout,
    /// Steps, schedule, optimizer, update schedule (as in LLM recipes).
    pub train: TrainSpec,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`AgentBody`].
pub type AgentRecipe = crate::common::header::Headed<AgentBody>;

pub(crate) fn from_table(table: toml::Table) -> Result<AgentRecipe> {
    let r: AgentRecipe = crate::common::config::from_toml(table)?;
    r.validate()?;
    Ok(r)
}

impl AgentRecipe {
    /// The preset's parts with the `[advantage]` override; Dr.GRPO's constant is the longest
    /// response region's policy tokens (every turn at its budget).
    pub fn algorithm_parts(&self) -> PresetParts {
        let mut parts = self
            .algorithm
            .parts(self.rollout.max_new_tokens * self.rollout.max_turns);
        if let Some(a) = self.advantage {
            parts.advantage = a;
        }
        parts
    }

    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let ro = &self.rollout;
        for (key, v) in [
            ("rollout.prompts_per_step", ro.prompts_per_step),
            ("rollout.samples_per_prompt", ro.samples_per_prompt),
            ("rollout.max_turns", ro.max_turns),
            ("rollout.max_new_tokens", ro.max_new_tokens),
            ("eval_episodes", self.eval_episodes),
            ("train.steps", self.train.run.steps),
            ("train.eval_every", self.train.run.eval_every),
        ] {
            if v == 0 {
                bail!("{key} must be >= 1");
            }
        }
        if ro.max_turns > 64 || ro.max_new_tokens > 4096 || self.eval_episodes > 100_000 {
            bail!(
                "rollout.max_turns must be <= 64, rollout.max_new_tokens <= 4096, eval_episodes \
                 <= 100000"
            );
        }
        let key = "rollout.samples_per_prompt";
        crate::common::config::check_samples_per_prompt(key, ro.samples_per_prompt, 1)?;
        let rows = ro.prompts_per_step.checked_mul(ro.samples_per_prompt);
        if rows.is_none_or(|n| n > 100_000) {
            bail!("rollout.prompts_per_step × rollout.samples_per_prompt must be at most 100000");
        }
        if let PolicyChoice::Pretrained(p) =
            choose_policy(self.model.as_ref(), self.pretrained.as_ref())?
            && p.lora.is_plop()
        {
            bail!(
                "pretrained.lora.targets = \"plop\" is for single-turn recipes (PLoP scores the \
                 task's prompts); name the modules here (`ember plop` on a single-turn recipe \
                 of the same model prints the scores)"
            );
        }
        // The first observation of a built-in environment (with the tiny policy's BOS) and one
        // turn must fit the tiny model's 64 positions.
        let first = match (&self.env, &self.model) {
            (_, None) => None,
            (env, Some(_)) => match env {
                EnvSpec::Guess { max } => Some(format!("0,{max}=").len()),
                EnvSpec::Calculator { digits, .. } => Some(2 * *digits as usize + 2),
                EnvSpec::External(_) | EnvSpec::Tutor(_) | EnvSpec::KernelGym(_) => None,
            },
        };
        if let Some(n) = first
            && 1 + n + ro.max_new_tokens > 64
        {
            bail!(
                "rollout.max_new_tokens = {}: the first observation ({n} tokens) and one turn \
                 exceed the tiny model's context of 64",
                ro.max_new_tokens
            );
        }
        if !ember_llm::temperature_ok(ro.temperature.into(), false) {
            bail!(
                "rollout.temperature = {}: RL rollouts need a temperature in (0, {}]",
                ro.temperature,
                ember_llm::MAX_TEMPERATURE
            );
        }
        let t = &self.train;
        check_training("train", &t.schedule, &t.optim, &t.update)?;
        self.validate_algorithm()?;
        self.validate_env()
    }

    /// The preset's parts: the estimators and options agent episodes take.
    fn validate_algorithm(&self) -> Result<()> {
        let parts = self.algorithm_parts();
        parts
            .advantage
            .validate()
            .map_err(|e| anyhow::anyhow!("[advantage]: {e}"))?;
        if let Some(t) = &parts.turn_updates {
            t.validate()?;
        }
        if parts.adaptive.is_some() {
            bail!(
                "algorithm = {:?} samples prompts in rounds; agent recipes do not take it",
                self.algorithm.name()
            );
        }
        if parts.replay.is_some() {
            bail!(
                "algorithm = {:?} replays stored groups; agent recipes do not take it",
                self.algorithm.name()
            );
        }
        if parts.advantage.kind.needs_features() {
            bail!(
                "[advantage] kind = \"basis\" reads prompt representations that agent episodes \
                 do not provide; agent recipes take the other estimators"
            );
        }
        if parts.critic.is_some() || matches!(parts.advantage.kind, AdvantageKind::Gae { .. }) {
            bail!(
                "algorithm = {:?}: a learned critic (GAE) runs in LLM recipes only for now; \
                 agent recipes take critic-free presets",
                self.algorithm.name()
            );
        }
        if parts.advantage.kind.needs_greedy_baseline() || parts.dynamic_sampling {
            bail!(
                "algorithm = {:?}: agent recipes take presets without a greedy baseline or \
                 dynamic sampling for now",
                self.algorithm.name()
            );
        }
        Ok(())
    }

    /// `[env]`, `[warmup]` and the reference: what the environment supports.
    fn validate_env(&self) -> Result<()> {
        if let Some(w) = &self.warmup {
            if w.batch == 0 || w.batch > 100_000 {
                bail!("warmup.batch = {} must be in 1..=100000", w.batch);
            }
            check_lr("warmup.lr", w.lr)?;
            if matches!(self.env, EnvSpec::External(_)) {
                bail!("[warmup]: external environments give no demonstrations; remove [warmup]");
            }
            if matches!(self.env, EnvSpec::Guess { .. }) {
                bail!("[warmup]: the guessing game has no demonstrations; remove [warmup]");
            }
            if matches!(self.env, EnvSpec::Tutor(_)) {
                bail!("[warmup]: the tutoring environment has no demonstrations; remove [warmup]");
            }
            if matches!(self.env, EnvSpec::KernelGym(_)) {
                bail!("[warmup]: the kernel gym has no demonstrations; remove [warmup]");
            }
        }
        if self.train.run.kl_coef != 0.0 {
            bail!("train.kl_coef: agent recipes have no reference policy yet; leave it at 0");
        }
        match &self.env {
            EnvSpec::Guess { max } if !(1..=9999).contains(max) => {
                bail!("env.max = {max} must be in 1..=9999")
            }
            EnvSpec::Calculator {
                instructions: true, ..
            } if self.model.is_some() => {
                bail!(
                    "env.instructions: the tiny policy's vocabulary has no letters; use it with \
                     [pretrained]"
                )
            }
            EnvSpec::Calculator { digits, .. } if !(1..=4).contains(digits) => {
                bail!("env.digits = {digits} must be in 1..=4")
            }
            EnvSpec::External(x) => check_range("env.timeout_s", x.timeout_s, 1e-3, 1e6)?,
            EnvSpec::KernelGym(_) if self.model.is_some() => {
                bail!("env.kind = \"kernel-gym\": the tiny policy cannot write C; use [pretrained]")
            }
            EnvSpec::KernelGym(g) => {
                g.resolve()
                    .map_err(|e| anyhow::anyhow!("[env] (kernel-gym): {e}"))?;
            }
            EnvSpec::Tutor(_) if self.model.is_some() => {
                bail!(
                    "env.kind = \"tutor\": the tiny policy cannot write English; use [pretrained]"
                )
            }
            EnvSpec::Tutor(t) => {
                let endpoint = t.base_url.is_some() && t.model.is_some();
                if endpoint == t.path.is_some() {
                    bail!("env (tutor): give the student's path, or base_url and model");
                }
                if !(1..=1024).contains(&t.student_max_tokens) || t.request_retries > 10 {
                    bail!(
                        "env.student_max_tokens must be within 1..=1024 and env.request_retries \
                         at most 10"
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }
}
