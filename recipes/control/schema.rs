//! The control recipe (`kind = "control"`): the environment, the networks, PPO's loop with the
//! training configs it embeds from `ember-train`, and the evaluation, each with its defaults
//! stated once.

use anyhow::{Result, bail};
use ember_control::EnvName;
use serde::{Deserialize, Serialize};

fn control() -> String {
    "control".into()
}
fn sixteen() -> usize {
    16
}
fn hidden() -> Vec<usize> {
    vec![64, 64]
}

/// A control recipe below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlBody {
    /// Always `"control"`.
    #[serde(default = "control")]
    pub kind: String,
    /// The environment.
    pub env: EnvSpec,
    /// The policy and the critic.
    #[serde(default)]
    pub policy: PolicySpec,
    /// PPO.
    #[serde(default)]
    pub ppo: PpoSpec,
    /// RARL's adversary (none without the table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adversary: Option<AdversarySpec>,
    /// The held-out evaluation.
    #[serde(default)]
    pub eval: EvalSpec,
    /// A gradient through the simulator instead of PPO's (none without the table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient: Option<GradientSpec>,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`ControlBody`].
pub type ControlRecipe = crate::common::header::Headed<ControlBody>;

/// `[adversary]`: RARL (Pinto et al. 2017, Algorithm 1). Each iteration trains the protagonist
/// for `protagonist_iters` rollouts with the adversary fixed, then the adversary for
/// `adversary_iters` rollouts with the protagonist fixed; the adversary's reward is −r
/// (zero-sum), its action a force (horizontal, vertical) at the pole's centre.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdversarySpec {
    /// The bound of each force component, in newtons (0 = no adversary: the baseline).
    pub max_force: f32,
    /// N_μ: protagonist rollouts (and updates) per iteration.
    pub protagonist_iters: usize,
    /// N_ν: adversary rollouts (and updates) per iteration.
    pub adversary_iters: usize,
    /// Hidden widths of the adversary's policy and critic.
    pub hidden: Vec<usize>,
    /// The adversary's initial log-std.
    pub log_std_init: f32,
}

impl Default for AdversarySpec {
    fn default() -> Self {
        Self {
            max_force: 1.0,
            protagonist_iters: 1,
            adversary_iters: 1,
            hidden: hidden(),
            log_std_init: 0.0,
        }
    }
}

/// `[gradient]`: each iteration samples `env.episodes` episodes with a fixed Gaussian noise σ
/// on every action and takes one optimizer step (`ppo.lr`, `ppo`'s AdamW and gradient clip)
/// on the return's gradient from [`Estimator`], undiscounted (Suh et al. 2022, §2; Onoda et
/// al. 2026). PPO's own keys (`gamma`, `lambda`, the clips, `epochs`, `mini_batches`,
/// `segment`) and `policy.log_std_init` do not apply: σ is the std.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GradientSpec {
    /// The estimator.
    pub estimator: Estimator,
    /// σ of the action noise (the policy's fixed std).
    #[serde(default = "half")]
    pub sigma: f32,
    /// DDCG's c: how far below the smooth relation the gradients' variance may fall.
    #[serde(default = "ddcg_c")]
    pub ddcg_c: f32,
}

fn half() -> f32 {
    0.5
}
fn ddcg_c() -> f32 {
    ember_control::DdcgConfig::default().c
}

/// A gradient of the expected return through the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// ∂R/∂u_t by autodiff through the dynamics (pathwise; biased where the return jumps).
    First,
    /// (G_t − b_t)·w_t/σ², the engine's REINFORCE loss (likelihood ratio; unbiased, noisy).
    Zeroth,
    /// DDCG (Onoda et al. 2026): inverse-variance mixture where a test finds the return smooth,
    /// the zeroth-order estimator where it does not.
    Ddcg,
    /// IVW-H (Onoda et al. 2026): the inverse-variance mixture per step and action dimension.
    IvwH,
}

impl Estimator {
    /// Every estimator, in the study's order.
    pub const ALL: [Estimator; 4] = [Self::First, Self::Zeroth, Self::Ddcg, Self::IvwH];

    /// The recipe's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Zeroth => "zeroth",
            Self::Ddcg => "ddcg",
            Self::IvwH => "ivw_h",
        }
    }
}

/// `[env]`: which environment, how many episodes run at once, how long they are, and its
/// physical constants' multipliers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSpec {
    /// `"pendulum"` (gymnasium `Pendulum-v1`) or `"cart_pole"` (`CartPole-v1`, continuous).
    pub name: EnvName,
    /// Episodes per rollout (run side by side as one batch).
    #[serde(default = "sixteen")]
    pub episodes: usize,
    /// Steps per episode (0 = the reference's time limit: 200, 500).
    #[serde(default)]
    pub horizon: usize,
    /// Multiplier of the pole's (the pendulum's) mass; the cart's stays.
    #[serde(default = "crate::common::config::defaults::one_f32")]
    pub mass: f32,
    /// Multiplier of every length.
    #[serde(default = "crate::common::config::defaults::one_f32")]
    pub length: f32,
    /// Viscous friction: a force −b·ẋ on the cart, or a torque −b·θ̇ on the pendulum's joint
    /// (0 in the references).
    #[serde(default)]
    pub friction: f32,
}

/// `[policy]`: the Gaussian policy's and the critic's MLPs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicySpec {
    /// Hidden widths of the policy's mean.
    pub hidden: Vec<usize>,
    /// Hidden widths of the critic.
    pub critic_hidden: Vec<usize>,
    /// The initial log-std of every action dimension.
    pub log_std_init: f32,
}

impl Default for PolicySpec {
    fn default() -> Self {
        Self {
            hidden: hidden(),
            critic_hidden: hidden(),
            log_std_init: 0.0,
        }
    }
}

/// PPO's own settings (the learning rate, AdamW and update schedule are `ember-train`'s
/// configs in [`PpoSpec`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PpoLoop {
    /// Iterations (rollout, then update).
    pub steps: usize,
    /// Discount γ.
    pub gamma: f32,
    /// GAE's λ.
    pub lambda: f32,
    /// The ratio's clip ε_l (PPO: ρ is clipped to [1 − ε_l, 1 + ε_h]).
    pub clip_low: f32,
    /// The ratio's clip ε_h.
    pub clip_high: f32,
    /// Entropy bonus coefficient.
    pub entropy_coef: f32,
    /// The critic's learning rate (0 = the policy's).
    pub critic_lr: f64,
    /// ε_v of the clipped value loss in reward units (0 = unclipped).
    pub value_clip: f32,
    /// Rewards are multiplied by this before GAE (the logged returns are not).
    pub reward_scale: f32,
    /// The update's rows: segments of this many steps cut from the episodes after GAE, so
    /// mini-batches mix time steps of many episodes (0 = whole episodes).
    pub segment: usize,
    /// Checkpoint every this many iterations (0 = only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
}

impl Default for PpoLoop {
    fn default() -> Self {
        Self {
            steps: 50,
            gamma: 0.99,
            lambda: 0.95,
            clip_low: 0.2,
            clip_high: 0.2,
            entropy_coef: 0.0,
            critic_lr: 0.0,
            value_clip: 0.0,
            reward_scale: 1.0,
            segment: 0,
            checkpoint_every: 0,
            keep_checkpoints: 2,
        }
    }
}

/// `[ppo]`: the loop and the configs it embeds, with the control job's defaults
/// ([`PPO_DEFAULTS`]: cleanrl `ppo_continuous_action`'s learning rate, Adam ε, gradient clip and
/// epochs).
pub type PpoSpec = crate::common::config::Training<PpoLoop>;

/// The control job's defaults for the embedded configs' keys: `(key, value)`.
pub const PPO_DEFAULTS: [(&str, f64); 5] = [
    ("lr", 3e-4),
    ("adam_eps", 1e-5),
    ("grad_clip", 0.5),
    ("epochs", 10.0),
    ("mini_batches", 4.0),
];

impl crate::common::config::LoopSettings for PpoLoop {
    const TABLE: &'static str = "ppo";
    const DEFAULTS: &'static [(&'static str, f64)] = &PPO_DEFAULTS;
}

/// `[eval]`: the deterministic policy (its mean action) on fixed initial states.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSpec {
    /// Episodes per evaluation.
    pub episodes: usize,
    /// Evaluate every this many iterations (and after the last).
    pub every: usize,
    /// Seed of the evaluation's initial states (the same at every evaluation).
    pub seed: u64,
    /// After training, the protagonist is also evaluated (without the adversary) under every
    /// pair of these mass multipliers …
    pub masses: Vec<f32>,
    /// … and these friction coefficients (`env.friction`'s units), written to
    /// `robustness.json` (empty = none).
    pub frictions: Vec<f32>,
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self {
            episodes: 32,
            every: 10,
            seed: 12_345,
            masses: Vec::new(),
            frictions: Vec::new(),
        }
    }
}

/// The most episodes one rollout or evaluation runs at once.
const MAX_EPISODES: usize = 65_536;
/// The longest episode.
const MAX_HORIZON: usize = 100_000;
/// The largest mass or length multiplier, friction coefficient or adversary force a recipe
/// takes: far beyond any robustness study (RARL's varies the mass 0.5–2×), and small enough that
/// the f32 dynamics stay finite.
const MAX_PHYSICAL: f32 = 1000.0;

/// Parses a control recipe's table and checks every value.
pub(crate) fn from_table(table: toml::Table) -> Result<ControlRecipe> {
    let r: ControlRecipe = crate::common::config::from_toml(table)?;
    r.validate()?;
    Ok(r)
}

impl ControlRecipe {
    /// The environment of the recipe.
    pub fn env(&self) -> Result<ember_control::Env> {
        let e = &self.env;
        Ok(ember_control::Env::new(e.name, e.mass, e.length)?.with_friction(e.friction)?)
    }

    /// The adversary, when one plays (`max_force` > 0).
    pub fn adversary(&self) -> Option<&AdversarySpec> {
        self.adversary.as_ref().filter(|a| a.max_force > 0.0)
    }

    /// The episode length.
    pub fn horizon(&self) -> Result<usize> {
        let env = self.env()?;
        Ok(match self.env.horizon {
            0 => env.time_limit(),
            h => h,
        })
    }

    /// Rows of the update: segments, or whole episodes.
    pub fn update_rows(&self) -> Result<usize> {
        let h = self.horizon()?;
        Ok(match self.ppo.run.segment {
            0 => self.env.episodes,
            s => self.env.episodes * (h / s),
        })
    }

    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.kind != "control" {
            bail!(
                "kind = {:?}: a control recipe says kind = \"control\"",
                self.kind
            );
        }
        let (e, p) = (&self.env, &self.ppo.run);
        if !(1..=MAX_EPISODES).contains(&e.episodes)
            || !(1..=MAX_EPISODES).contains(&self.eval.episodes)
        {
            bail!("env.episodes and eval.episodes must be 1 to {MAX_EPISODES}");
        }
        let h = self.horizon()?;
        if h > MAX_HORIZON {
            bail!("env.horizon = {h} must be at most {MAX_HORIZON}");
        }
        if p.segment > 0 && !h.is_multiple_of(p.segment) && self.gradient.is_none() {
            bail!("ppo.segment = {} must divide the horizon {h}", p.segment);
        }
        let unit = |v: f32| (0.0..=1.0).contains(&v);
        if !(unit(p.gamma) && unit(p.lambda)) {
            bail!("ppo.gamma and ppo.lambda must be in [0, 1]");
        }
        crate::common::config::check_ppo_clip("ppo", p.clip_low, p.clip_high)?;
        let pos = |v: f32| v.is_finite() && (0.0..=1e6).contains(&v);
        if !(pos(p.entropy_coef)
            && pos(p.value_clip)
            && pos(p.reward_scale)
            && p.reward_scale > 0.0)
        {
            bail!(
                "ppo.entropy_coef and ppo.value_clip must be in [0, 1e6], ppo.reward_scale in \
                 (0, 1e6]"
            );
        }
        self.validate_physics()?;
        self.validate_gradient()?;
        let lr_ok = |v: f64| v.is_finite() && v > 0.0 && v <= 1.0;
        if !lr_ok(self.ppo.schedule.lr) || !(p.critic_lr == 0.0 || lr_ok(p.critic_lr)) {
            bail!("ppo.lr must be in (0, 1], ppo.critic_lr 0 (the policy's) or in (0, 1]");
        }
        let u = &self.ppo.update;
        crate::common::config::check_training("ppo", &self.ppo.schedule, &self.ppo.optim, u)?;
        let rows = self.update_rows()?;
        // Under `[gradient]` PPO's update does not run: its rows do not bound `mini_batches`.
        let bound = if self.gradient.is_some() {
            usize::MAX
        } else {
            rows
        };
        if u.epochs == 0 || u.mini_batches == 0 || u.mini_batches > bound {
            bail!(
                "ppo.epochs must be >= 1 and ppo.mini_batches 1 to the update's {rows} rows \
                 (episodes, or episodes × horizon / segment)"
            );
        }
        if p.steps == 0 || self.eval.every == 0 || p.keep_checkpoints == 0 {
            bail!("ppo.steps, ppo.keep_checkpoints and eval.every must be >= 1");
        }
        let widths = |v: &[usize]| v.len() <= 16 && v.iter().all(|&w| (1..=65_536).contains(&w));
        if !widths(&self.policy.hidden) || !widths(&self.policy.critic_hidden) {
            bail!("policy.hidden and policy.critic_hidden: at most 16 widths, each 1 to 65536");
        }
        self.validate_rarl(widths)
    }

    /// The body, its variations and the adversary's force within [`MAX_PHYSICAL`].
    fn validate_physics(&self) -> Result<()> {
        let (e, ev) = (&self.env, &self.eval);
        let multiplier = |v: f32| v.is_finite() && v > 0.0 && v <= MAX_PHYSICAL;
        let friction = |v: f32| v.is_finite() && (0.0..=MAX_PHYSICAL).contains(&v);
        if !(multiplier(e.mass) && multiplier(e.length) && friction(e.friction)) {
            bail!(
                "env.mass and env.length must be in (0, {MAX_PHYSICAL}], env.friction in [0, \
                 {MAX_PHYSICAL}] (got {}, {}, {})",
                e.mass,
                e.length,
                e.friction
            );
        }
        if let Some(m) = ev.masses.iter().find(|m| !multiplier(**m)) {
            bail!("eval.masses: {m} is not a multiplier in (0, {MAX_PHYSICAL}]");
        }
        if let Some(f) = ev.frictions.iter().find(|f| !friction(**f)) {
            bail!("eval.frictions: {f} is not a friction in [0, {MAX_PHYSICAL}]");
        }
        if !(self.policy.log_std_init.is_finite() && self.policy.log_std_init.abs() <= 10.0) {
            bail!("policy.log_std_init must be within ±10");
        }
        if let Some(a) = self.adversary.as_ref().filter(|a| !friction(a.max_force)) {
            bail!(
                "adversary.max_force = {} must be in [0, {MAX_PHYSICAL}]",
                a.max_force
            );
        }
        Ok(())
    }

    /// `[gradient]`: σ and c in range, no adversary.
    fn validate_gradient(&self) -> Result<()> {
        let Some(g) = &self.gradient else {
            return Ok(());
        };
        if !(g.sigma.is_finite() && (1e-4..=10.0).contains(&g.sigma)) {
            bail!("gradient.sigma = {} must be in [1e-4, 10]", g.sigma);
        }
        let variances = matches!(g.estimator, Estimator::Ddcg | Estimator::IvwH);
        if variances && self.env.episodes < 2 {
            bail!(
                "gradient.estimator = \"{}\" weighs two sample variances over the episodes: \
                 env.episodes must be at least 2",
                g.estimator.name()
            );
        }
        if !(0.0..1.0).contains(&g.ddcg_c) {
            bail!("gradient.ddcg_c = {} must be in [0, 1)", g.ddcg_c);
        }
        if self.adversary().is_some() {
            bail!(
                "[gradient] trains the protagonist alone; RARL's [adversary] trains with PPO \
                 (remove one of the two tables, or set adversary.max_force = 0)"
            );
        }
        Ok(())
    }

    fn validate_rarl(&self, widths: impl Fn(&[usize]) -> bool) -> Result<()> {
        let ev = &self.eval;
        let grid = ev.masses.len().saturating_mul(ev.frictions.len());
        if grid > 1024 {
            bail!("eval.masses × eval.frictions: at most 1024 pairs, got {grid}");
        }
        let Some(a) = &self.adversary else {
            return Ok(());
        };
        let iters = 1..=1000;
        if !iters.contains(&a.protagonist_iters) || !iters.contains(&a.adversary_iters) {
            bail!("adversary.protagonist_iters and adversary.adversary_iters must be 1 to 1000");
        }
        if !(widths(&a.hidden) && a.log_std_init.is_finite() && a.log_std_init.abs() <= 10.0) {
            bail!("adversary.hidden: at most 16 widths, each 1 to 65536; log_std_init within ±10");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// A control run an earlier version stored with `ppo.clip` resumes under today's
    /// `ppo.clip_low`/`ppo.clip_high`: the restated recipe is today's resolved text.
    #[test]
    fn a_recipe_stored_in_an_earlier_spelling_is_restated_as_today() {
        let text = include_str!("../pendulum-ppo.toml");
        let table = crate::common::config::apply_overrides(text, &[]).unwrap();
        let today = toml::to_string_pretty(&super::from_table(table).unwrap()).unwrap();
        let pair = "clip_low = 0.20000000298023224\nclip_high = 0.20000000298023224\n";
        assert!(today.contains(pair), "{today}");
        let earlier = today.replace(pair, "clip = 0.20000000298023224\n");
        let restated = crate::common::run::restate::<super::ControlRecipe>(&earlier);
        assert_eq!(restated.as_deref(), Some(today.as_str()));
    }
}
