//! `[rl]` of an image recipe: the loop's own settings and the training configs it embeds from
//! `ember-train`, with the image job's defaults.

use serde::{Deserialize, Serialize};

/// The RL loop's own settings (the flow job's; the learning rate, AdamW and update schedule
/// are `ember-train`'s configs in [`RlSpec`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowLoop {
    /// RL steps.
    pub steps: usize,
    /// Prompts (requested classes) per step.
    pub prompts_per_step: usize,
    /// Samples per prompt (the group of the baseline).
    pub samples_per_prompt: usize,
    /// Denoising steps trained per trajectory (the first ones; 0 = all).
    #[serde(default)]
    pub train_timesteps: usize,
    /// PPO clip ε_l of the per-step ratio (flow_grpo's symmetric `clip_range` is both).
    pub clip_low: f32,
    /// PPO clip ε_h of the per-step ratio.
    pub clip_high: f32,
    /// Advantage clip (DDPO `adv_clip_max`).
    pub adv_clip: f32,
    /// Flow-GRPO and RAM: divide by the std of all the step's rewards instead of the group's
    /// (flow_grpo `PerPromptStatTracker(global_std=True)`: (R − mean_group) / (std_all + 1e-4);
    /// through the engine's pool statistics, std_all is first clamped to ≥ 1e-4, which differs
    /// only when all the step's rewards are within 1e-4 of each other).
    pub global_std: bool,
    /// Flow-GRPO and LOOP: leave out of the loss the samples whose advantage is zero because
    /// every reward of their group is equal (flow_grpo's training loop drops them).
    pub drop_zero_advantage: bool,
    /// KL(π‖π_base) coefficient (0 = off).
    pub kl_coef: f32,
    /// How the KL is computed: `"k3"` (the engine's estimator on the per-step log-probs) or
    /// `"closed_form"` (flow_grpo's Gaussian mean difference, [`ember_flow::FlowExperience::closed_form_kl`]).
    pub kl_form: KlForm,
    /// Flow-GRPO and LOOP with `sampler.guidance` ≠ 1: the unconditional branch of the guided
    /// velocity carries no gradient in the update, so the policy gradient moves the conditional
    /// prediction only. Off by default, as in flow_grpo (`compute_log_prob` with `train.cfg`
    /// runs both branches in one forward pass with gradient): the adapters also move v_u when
    /// sampling, and detaching it leaves (1 − w)·∂v_u out of the gradient (measured: it costs
    /// about half the gain: docs/src/images.md).
    pub detach_uncond: bool,
    /// RAM: v_old, the velocity inside the target, from an exponential moving average of the
    /// adapters with this decay, reached by a ramp of 0.01 per step (min(d, 0.01·t) after t
    /// steps); the average also draws the clean samples. RAM's code (`training_sd3.py`, as
    /// ports of it describe it) keeps such an average with d = 0.9; 0 = the current weights,
    /// detached, as the paper's Algorithm 1.
    pub ram_ema: f32,
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

impl Default for FlowLoop {
    fn default() -> Self {
        Self {
            steps: 60,
            prompts_per_step: 10,
            samples_per_prompt: 8,
            train_timesteps: 0,
            clip_low: 1e-3,
            clip_high: 1e-3,
            adv_clip: 5.0,
            global_std: false,
            drop_zero_advantage: false,
            kl_coef: 0.0,
            kl_form: KlForm::K3,
            detach_uncond: false,
            ram_ema: 0.0,
            ram_scale: 1.0,
            ram_noisings: 4,
            lora: LoraSpec::default(),
            eval_every: 10,
            checkpoint_every: 0,
            keep_checkpoints: 2,
        }
    }
}

/// The RL fine-tuning: one `[rl]` table holding the loop's own settings and the configs it
/// embeds from `ember-train` (learning-rate schedule, AdamW, update schedule), as an LLM
/// recipe's `[train]` does; the image job's defaults for those are [`RL_DEFAULTS`].
pub type RlSpec = crate::common::config::Training<FlowLoop>;

/// The image job's defaults for the embedded configs' keys, where they differ from
/// `ember-train`'s: `(key, value)`. PyTorch's Adam ε 1e-8: burn's default 1e-5 damps the small
/// gradients of the policy-gradient losses, whose log-probs are averaged over pixels.
pub const RL_DEFAULTS: [(&str, f64); 5] = [
    ("lr", 1e-3),
    ("min_lr_ratio", 0.1),
    ("grad_clip", 1.0),
    ("adam_eps", 1e-8),
    ("mini_batches", 2.0),
];

impl crate::common::config::LoopSettings for FlowLoop {
    const TABLE: &'static str = "rl";
    const DEFAULTS: &'static [(&'static str, f64)] = &RL_DEFAULTS;
}

/// The form of the flow KL penalty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlForm {
    /// Schulman's k3 estimator on the per-step log-probs (the engine's).
    #[default]
    K3,
    /// mean_pixels((μ_θ − μ_ref)²) / (2σ_t²), as flow_grpo's training scripts compute it.
    ClosedForm,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `[rl]` embeds `ember-train`'s configs with the image job's defaults stated once
    /// (`RL_DEFAULTS`); a key of any of them can be set, and an unknown key is named.
    #[test]
    fn rl_table_embeds_the_training_configs_with_the_image_defaults() {
        let d = RlSpec::default();
        assert_eq!(d.schedule.lr, 1e-3);
        assert_eq!(d.schedule.min_lr_ratio, 0.1);
        assert_eq!(d.schedule.warmup_steps, 0);
        assert_eq!(d.optim.grad_clip, 1.0);
        assert_eq!(d.optim.epsilon, 1e-8);
        assert_eq!(d.optim.weight_decay, 0.0);
        assert_eq!((d.update.epochs, d.update.mini_batches), (1, 2));
        assert_eq!(d.update.micro_batch_rows, 0);
        assert_eq!(d.run, FlowLoop::default());
        let r: RlSpec = toml::from_str("lr = 0.5\nsteps = 3\nmini_batches = 4").unwrap();
        assert_eq!(
            (r.schedule.lr, r.run.steps, r.update.mini_batches),
            (0.5, 3, 4)
        );
        assert_eq!(r.optim.epsilon, 1e-8);
        let e = toml::from_str::<RlSpec>("learning_rate = 0.5").unwrap_err();
        assert!(e.to_string().contains("learning_rate"), "{e}");
        let back: RlSpec = toml::from_str(&toml::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
