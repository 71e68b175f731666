//! The LLM recipe (`kind = "llm"`, the default): policy, task, reward, rollouts, RL phase.

use crate::common::config::defaults::yes;
use anyhow::{Result, bail};
use ember_engine::*;
use serde::{Deserialize, Serialize};

mod critic;
mod lanpo;
mod offline;
#[cfg(test)]
mod offline_tests;
mod rollout;
mod task;
mod teacher;

pub use rollout::{RolloutBackend, RolloutSpec, ServerKeys};

pub use critic::CriticSpec;
pub use lanpo::{LanpoSpec, UpdateContext};
pub use offline::{AlolValue, GroupObjective, Objective, OfflineSpec, Pairs, Pool};
pub use task::{TaskKind, TaskSpec};
pub use teacher::{TeacherRole, TeacherSpec};

use crate::lm::{
    EvalSpec, ModelSpec, PolicyChoice, PretrainedSpec, RewardSpec, TrainSpec, Warmup, choose_policy,
};

/// An LLM recipe below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmBody {
    /// `f32` (default) or `bf16`: mixed precision of the LLM's products (f32 parameters,
    /// optimizer state, norms, softmax and losses); wgpu falls back to f32 with a message.
    #[serde(default)]
    pub precision: ember_train::Precision,
    /// `[data_parallel]`: the update sharded over several devices (`devices`, `reduce`).
    #[serde(
        default,
        skip_serializing_if = "crate::common::device::DataParallelSpec::is_default"
    )]
    pub data_parallel: crate::common::device::DataParallelSpec,
    /// Run multi-token passes (prefill, rescoring) through burn's fused attention op; decode
    /// steps keep the explicit path that every backend runs.
    #[serde(default)]
    pub fused_attention: bool,
    /// Score rows that share a prompt (a group's samples) with one pass over the prompt, in
    /// the update, the old-policy, reference and critic passes (default true; false runs every
    /// row's prompt, the reference computation: the same values to float rounding).
    #[serde(default = "yes")]
    pub shared_prefix: bool,
    /// Algorithm preset (`ember_engine::Preset`).
    #[serde(default)]
    pub algorithm: Preset,
    /// The tiny policy trained from scratch (or use `[pretrained]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// A pretrained policy with LoRA (or use `[model]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<PretrainedSpec>,
    /// The task.
    pub task: TaskSpec,
    /// Sampled evaluation beside the greedy accuracy.
    #[serde(default)]
    pub eval: EvalSpec,
    /// The reward.
    #[serde(default)]
    pub reward: RewardSpec,
    /// Supervised warm-up of the tiny policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<Warmup>,
    /// Rollouts.
    pub rollout: RolloutSpec,
    /// RL phase.
    pub train: TrainSpec,
    /// Overrides the preset's estimator.
    #[serde(default)]
    pub advantage: Option<AdvantageConfig>,
    /// Overrides the preset's actor loss.
    #[serde(default)]
    pub loss: Option<ActorLossConfig>,
    /// PPO's critic (`algorithm = "ppo"` / `"ppo-pact"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic: Option<CriticSpec>,
    /// Replay of hard groups (set by `algorithm = "rerule"`; this table enables it with
    /// another preset or changes its settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayConfig>,
    /// Training on a fixed dataset instead of rollouts (the offline job runs the recipe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offline: Option<offline::OfflineSpec>,
    /// A teacher scoring every sampled token: on-policy distillation or the KL reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<TeacherSpec>,
    /// LANPO's experience pool and in-context feedback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanpo: Option<LanpoSpec>,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`LlmBody`].
pub type Recipe = crate::common::header::Headed<LlmBody>;

/// Parses an LLM recipe: `text` with `key=value` overrides applied (dotted keys address nested
/// tables; values are TOML, bare words are strings). Unknown keys are errors that list the
/// valid ones.
pub fn parse(text: &str, overrides: &[String]) -> Result<Recipe> {
    llm_table(crate::common::config::apply_overrides(text, overrides)?)
}

/// Parses an LLM recipe an earlier version may have stored (`recipe.resolved.toml`), its keys
/// read in today's spelling ([`crate::common::renamed`]).
pub fn parse_stored(text: &str) -> Result<Recipe> {
    llm_table(crate::common::config::stored_table(text)?)
}

/// An LLM recipe from its whole table (a recipe of another kind is refused).
fn llm_table(mut table: toml::Table) -> Result<Recipe> {
    match crate::common::config::take_kind(&mut table)? {
        "llm" => from_table(table),
        kind => bail!(
            "this is {} recipe; this command takes LLM recipes",
            crate::common::config::describe_kind(kind)
        ),
    }
}

/// Deserialises and checks an LLM recipe table (overrides applied, `kind` removed).
pub(crate) fn from_table(table: toml::Table) -> Result<Recipe> {
    let recipe: Recipe = crate::common::config::from_toml(table)?;
    recipe.validate()?;
    Ok(recipe)
}

impl Recipe {
    /// Checks the values serde cannot, table by table.
    pub fn validate(&self) -> Result<()> {
        match choose_policy(self.model.as_ref(), self.pretrained.as_ref())? {
            PolicyChoice::Tiny(_) if self.warmup.is_none() => {
                bail!("the tiny [model] needs a [warmup] table (steps, batch, lr)")
            }
            PolicyChoice::Pretrained(_) if self.warmup.is_some() => {
                bail!("[warmup] applies to the tiny [model] only, not to [pretrained]")
            }
            _ => {}
        }
        self.validate_reward()?;
        self.validate_rollout()?;
        self.validate_train()?;
        let parts = self.algorithm_parts();
        self.validate_algorithm(&parts)?;
        if let Some(a) = &parts.adaptive {
            self.validate_adaptive(a, &parts)?;
        }
        self.validate_tables(&parts)?;
        self.validate_loss_and_eval(&parts)?;
        self.rollout
            .validate_backend(parts.adaptive.is_some(), self.pretrained.is_some())
    }

    /// `[reward]`: finite weights, the overlong penalty, the external and Python programs.
    fn validate_reward(&self) -> Result<()> {
        use crate::common::config::check_range;
        if let Some(o) = &self.reward.overlong {
            o.validate()?;
        }
        // A weight beyond ±1e9 makes every reward invalid (the engine's limit), so nothing trains.
        check_range("reward.correct", self.reward.correct.into(), -1e9, 1e9)?;
        check_range("reward.format", self.reward.format.into(), -1e9, 1e9)?;
        let w = &self.reward;
        let any = w.correct != 0.0
            || w.format != 0.0
            || w.overlong.is_some()
            || w.external.as_ref().is_some_and(|x| x.weight != 0.0)
            || w.python.is_some()
            || w.judge.as_ref().is_some_and(|j| j.weight != 0.0)
            || self
                .teacher
                .as_ref()
                .is_some_and(|t| t.role == TeacherRole::Reward && t.coef > 0.0);
        if !any {
            bail!(
                "[reward]: every term has weight 0 (reward.correct, reward.format, no overlong \
                 penalty, external, Python or judge reward), so every reward is 0 and nothing \
                 trains"
            );
        }
        if let Some(x) = &self.reward.external {
            check_range("reward.external.weight", x.weight.into(), -1e9, 1e9)?;
            check_range("reward.external.timeout_s", x.timeout_s, 1e-3, 1e6)?;
        }
        if let Some(j) = &self.reward.judge {
            j.validate()?;
        }
        if let Some(p) = &self.reward.python {
            check_range("reward.python.timeout_s", p.timeout_s, 1e-3, 1e6)?;
            if p.functions.is_empty() {
                bail!("reward.python.functions is empty: name at least one `file.py:function`");
            }
        }
        Ok(())
    }

    /// `[rollout]` and the batch sizes: temperature, token budget, samples per prompt.
    fn validate_rollout(&self) -> Result<()> {
        let t = self.rollout.temperature;
        if !ember_llm::temperature_ok(t.into(), false) {
            bail!(
                "rollout.temperature = {t}: RL rollouts need a temperature in (0, 100] (at 0 every \
                 sample of a prompt is the same greedy answer, so every group advantage is 0; \
                 greedy decoding is for `ember eval` and `ember generate`)"
            );
        }
        if self.rollout.max_new_tokens == 0 || self.rollout.max_new_tokens > 1 << 20 {
            bail!(
                "rollout.max_new_tokens = {} must be in 1..={}",
                self.rollout.max_new_tokens,
                1 << 20
            );
        }
        let kind = self.algorithm_parts().advantage.kind;
        if self.rollout.samples_per_prompt < 2 && !kind.group_free() {
            bail!(
                "rollout.samples_per_prompt = {} must be >= 2 (group baselines need two samples; \
                 basis, reinforce, reinforce++, remax and gae take one)",
                self.rollout.samples_per_prompt
            );
        }
        crate::common::config::check_samples_per_prompt(
            "rollout.samples_per_prompt",
            self.rollout.samples_per_prompt,
            1,
        )?;
        if self.rollout.samples_per_prompt < 2 && self.algorithm_parts().dynamic_sampling {
            bail!(
                "dynamic sampling drops groups whose rewards are all equal, which every group of \
                 one sample is: rollout.samples_per_prompt must be >= 2"
            );
        }
        if self.rollout.prompts_per_step == 0
            || self.task.eval_size == 0
            || self.warmup.as_ref().is_some_and(|w| w.batch == 0)
        {
            bail!("rollout.prompts_per_step, task.eval_size and warmup.batch must be >= 1");
        }
        // Each is the length of a list built up front: a huge value aborted on allocation.
        for (key, v, max) in [
            ("task.eval_size", self.task.eval_size, 1_000_000),
            (
                "warmup.batch",
                self.warmup.as_ref().map_or(1, |w| w.batch),
                100_000,
            ),
            ("rollout.shape_bucket", self.rollout.shape_bucket, 1 << 20),
        ] {
            crate::common::config::check_count(key, v, 0, max)?;
        }
        if self
            .rollout
            .prompts_per_step
            .checked_mul(self.rollout.samples_per_prompt)
            .is_none_or(|x| x > 100_000)
        {
            bail!("rollout.prompts_per_step × rollout.samples_per_prompt must be at most 100000");
        }
        Ok(())
    }

    /// `[train]` and `[loss.kl]`: learning rates, clipping, the KL coefficient given once.
    fn validate_train(&self) -> Result<()> {
        use crate::common::config::{check_lr, check_range, check_training};
        if let Some(kl) = self.loss.and_then(|l| l.kl) {
            if self.train.run.kl_coef <= 0.0 || self.train.run.kl_coef.is_nan() {
                bail!(
                    "[loss.kl] needs train.kl_coef > 0: train.kl_coef is the KL coefficient and \
                     turns on the reference log-probs"
                );
            }
            if kl.coef != 0.0 && kl.coef != self.train.run.kl_coef {
                bail!(
                    "loss.kl.coef = {} differs from train.kl_coef = {}: give the coefficient \
                     once, as train.kl_coef",
                    kl.coef,
                    self.train.run.kl_coef
                );
            }
        }
        let t = &self.train;
        check_training("train", &t.schedule, &t.optim, &t.update)?;
        check_range("train.kl_coef", t.run.kl_coef.into(), 0.0, 1e6)?;
        if let Some(w) = &self.warmup {
            check_lr("warmup.lr", w.lr)?;
            w.check()?;
        }
        Ok(())
    }

    /// The estimator and loss after preset and overrides, checked now rather than at the
    /// first update.
    fn validate_algorithm(&self, parts: &PresetParts) -> Result<()> {
        if parts.turn_updates.is_some() {
            bail!(
                "algorithm = {:?} updates multi-turn episodes turn by turn: use it in a \
                 kind = \"agent\" recipe",
                self.algorithm.name()
            );
        }
        parts.advantage.validate()?;
        let kl_coef = self.train.run.kl_coef;
        let teacher = self.teacher.as_ref();
        teacher::check(teacher, self.algorithm, self.offline.is_some(), kl_coef)?;
        Ok(())
    }

    /// Whether the run keeps a KL reference of its own (the starting policy): a KL term in the
    /// loss (`train.kl_coef`) or in REINFORCE++'s reward (`[advantage] kl_coef`, Hu 2025 eq. 4)
    /// whose reference is not the teacher.
    pub fn own_kl_reference(&self) -> bool {
        let teacher_kl = self
            .teacher
            .as_ref()
            .is_some_and(|t| t.role == TeacherRole::Kl);
        let reward_kl = matches!(
            self.algorithm_parts().advantage.kind,
            AdvantageKind::ReinforcePlusPlus { kl_coef, .. } if kl_coef > 0.0
        );
        (self.train.run.kl_coef > 0.0 || reward_kl) && !teacher_kl
    }

    /// Reinforce-Ada's rounds (`rollout.reinforce_ada`) against the rest of the recipe.
    fn validate_adaptive(&self, a: &ember_engine::ReinforceAda, parts: &PresetParts) -> Result<()> {
        a.validate()?;
        if parts.dynamic_sampling {
            bail!(
                "algorithm = {:?} filters groups itself (dynamic sampling); Reinforce-Ada's \
                 rounds already balance them: use one of the two",
                self.algorithm.name()
            );
        }
        let n = self.rollout.samples_per_prompt;
        if n > a.round_repeat * a.max_rounds {
            bail!(
                "rollout.samples_per_prompt = {n}: with Reinforce-Ada it is the responses kept \
                 per prompt, at most round_repeat × max_rounds = {}",
                a.round_repeat * a.max_rounds
            );
        }
        if self
            .rollout
            .prompts_per_step
            .checked_mul(a.round_repeat)
            .is_none_or(|x| x > 100_000)
        {
            bail!(
                "rollout.prompts_per_step × rollout.reinforce_ada.round_repeat must be at most \
                 100000"
            );
        }
        if a.global_stats {
            if !matches!(
                parts.advantage.kind,
                AdvantageKind::Grpo { .. } | AdvantageKind::DrGrpo
            ) {
                bail!(
                    "rollout.reinforce_ada.global_stats: the pool's statistics replace GRPO's \
                     group mean and std, so they need a GRPO-family estimator (grpo, dr-grpo); \
                     set global_stats = false for another"
                );
            }
            if self.reward.overlong.is_some() {
                bail!(
                    "reward.overlong shapes rewards after Reinforce-Ada's pool statistics are \
                     taken; set rollout.reinforce_ada.global_stats = false to use it"
                );
            }
        }
        Ok(())
    }

    /// `[offline]`, `[data_parallel]`, `[critic]` and replay.
    fn validate_tables(&self, parts: &PresetParts) -> Result<()> {
        if let Some(o) = &self.offline {
            o.validate()?;
            if self.rollout.max_staleness > 0 {
                bail!("rollout.max_staleness paces rollouts; the offline job samples none");
            }
            if !self.data_parallel.is_default() {
                bail!(
                    "[data_parallel] shards the online update; the offline objectives \
                     ([offline]) run on one device: remove [data_parallel]"
                );
            }
        }
        self.data_parallel.validate()?;
        critic::validate(
            self.critic.as_ref(),
            self.algorithm,
            parts,
            self.train.run.steps,
        )?;
        if let Some(rp) = &parts.replay {
            rp.validate()?;
            let fresh = self.rollout.prompts_per_step * self.rollout.samples_per_prompt;
            let replayed = (f64::from(rp.ratio) * self.rollout.prompts_per_step as f64).round()
                * self.rollout.samples_per_prompt as f64;
            if fresh as f64 + replayed > 100_000.0 {
                bail!(
                    "rollout.prompts_per_step × rollout.samples_per_prompt × (1 + replay.ratio) \
                     must be at most 100000 rows"
                );
            }
            if self.rollout.samples_per_prompt < 2 {
                bail!(
                    "replay admits groups with at least two different rewards: \
                     rollout.samples_per_prompt must be >= 2"
                );
            }
            if parts.adaptive.is_some() || parts.advantage.kind.needs_greedy_baseline() {
                bail!(
                    "replay of stored groups does not combine with Reinforce-Ada's rounds or \
                     ReMax's greedy baseline (algorithm = {:?})",
                    self.algorithm.name()
                );
            }
        }
        let context = lanpo::LanpoContext {
            pretrained: self.pretrained.is_some(),
            rollout: &self.rollout,
            offline: self.offline.is_some(),
            parts,
        };
        lanpo::validate_lanpo(self.lanpo.as_ref(), context)
    }

    /// The actor loss's settings and `[eval]`.
    fn validate_loss_and_eval(&self, parts: &PresetParts) -> Result<()> {
        parts.loss.policy.validate()?;
        if let (Some(_), PolicyLossKind::Opmd { k2_coef, .. }) =
            (self.train.update.lopti_threshold, parts.loss.policy)
            && k2_coef != 0.0
        {
            bail!(
                "train.lopti_threshold with OPMD's k2_coef = {k2_coef}: the k2 term does not \
                 scale with the advantage, so both of Lopti's passes would apply it to every step"
            );
        }
        if let AdvantageKind::Bnpo { decompose: true } = parts.advantage.kind {
            let other = [
                (
                    parts.replay.is_some(),
                    "[replay] (replayed rows keep only their sum)",
                ),
                (parts.adaptive.is_some(), "Reinforce-Ada's rounds"),
                (self.lanpo.is_some(), "[lanpo]"),
                (
                    self.reward.overlong.is_some(),
                    "reward.overlong (not a term of its own)",
                ),
            ];
            if let Some((_, what)) = other.iter().find(|(on, _)| *on) {
                bail!(
                    "[advantage] decompose = true with {what}: BNPO's decomposition needs every \
                     reward term of every row as scored this step"
                );
            }
        }
        parts.loss.agg.validate()?;
        if let Some(m) = &parts.loss.mismatch {
            m.validate()?;
            if matches!(parts.loss.policy, PolicyLossKind::Topr { .. }) {
                bail!(
                    "[loss.mismatch] with TOPR: TOPR truncates its own ratio to the sampler's \
                     policy for negatives only (Le Roux et al. 2025, eq. 9); a mismatch weight \
                     would reweight its positives too. Remove [loss.mismatch]"
                );
            }
        }
        crate::common::config::check_range(
            "loss.entropy_coef",
            parts.loss.entropy_coef.into(),
            -1e6,
            1e6,
        )?;
        if self.eval.samples > 1024 {
            bail!("eval.samples = {} must be at most 1024", self.eval.samples);
        }
        // Checked even when unused (eval.samples = 0): no recipe number is taken as NaN.
        crate::common::config::check_range(
            "eval.temperature",
            self.eval.temperature.into(),
            1e-3,
            100.0,
        )?;
        if self.train.run.eval_every == 0 {
            bail!("train.eval_every must be >= 1");
        }
        Ok(())
    }

    /// Estimator, actor loss and dynamic sampling after the preset and the recipe's
    /// `[advantage]` / `[loss]` overrides; a KL coefficient without a `[loss.kl]` table means
    /// the k3 estimator in the loss.
    pub fn algorithm_parts(&self) -> PresetParts {
        let mut parts = self.algorithm.parts(self.rollout.max_new_tokens);
        if let Some(a) = self.advantage {
            parts.advantage = a;
        }
        if let Some(l) = self.loss {
            parts.loss = l;
        }
        if let Some(a) = self.rollout.reinforce_ada {
            parts.adaptive = Some(a);
        }
        if let Some(rp) = self.replay {
            parts.replay = Some(rp);
        }
        // Replayed rows are stale, and a server's numbers are not the trainer's: without a
        // correction in the loss they would be trained as if the current policy had sampled
        // them, so replay and the openai backend bring the default one.
        // TOPR weighs its negatives against the sampler itself (eq. 9), positives at 1.
        let stale = self.rollout.max_staleness > 0;
        let topr = matches!(parts.loss.policy, PolicyLossKind::Topr { .. });
        if (parts.replay.is_some() || !self.rollout.backend.is_local() || stale)
            && parts.loss.mismatch.is_none()
            && !topr
        {
            parts.loss.mismatch = Some(MismatchCorrection::default());
        }
        if let (Some(spec), Some(c)) = (&self.critic, parts.critic) {
            parts.critic = Some(spec.apply(c));
        }
        // `train.kl_coef` is the recipe's one KL coefficient; `[loss.kl]` may pick the
        // estimator (k3 by default).
        if self.train.run.kl_coef > 0.0 {
            parts.loss.kl = Some(KlLoss {
                estimator: parts.loss.kl.map_or(KlEstimator::K3, |k| k.estimator),
                coef: self.train.run.kl_coef,
            });
        }
        parts
    }
}
