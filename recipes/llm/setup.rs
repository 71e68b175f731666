//! What an LLM recipe makes of the LM policy kit ([`crate::lm`]): its policy (with the recipe's
//! precision and attention path), the tiny policy's reference, the rollout sampler, the update
//! schedule and the optimizer of its RL phase.

use crate::llm::schema::Recipe;
use crate::lm::{Policy, policy_from_specs};
use anyhow::{Context, Result, anyhow};
use burn::module::Module;
use burn::store::ModuleRecord;
use burn::tensor::Device;
use ember_engine::ActorLossConfig;
use ember_llm::{Llama, SamplingConfig};
use ember_train::{Optimizer, UpdateConfig};
use std::path::Path;

/// Loads the recipe's policy on `device` (the tiny model freshly initialised from the seed, or
/// the pretrained checkpoint with fresh adapters).
pub fn build_policy(r: &Recipe, device: &Device) -> Result<Policy> {
    build_policy_with(r, device, None)
}

/// [`build_policy`], with a pretrained policy's adapters read from a PEFT directory instead of
/// freshly initialised.
pub fn build_policy_with(r: &Recipe, device: &Device, peft: Option<&Path>) -> Result<Policy> {
    let (precision, note) = crate::common::device::resolve_precision(
        r.precision,
        crate::common::device::kind(&r.header.device)?,
    );
    if let Some(note) = note {
        log::warn!("[{}] {note}", r.header.name);
    }
    let mut policy = build_policy_f32(r, device, peft)?;
    policy.model = policy
        .model
        .with_precision(precision)
        .with_fused_attention(r.fused_attention)
        .with_shared_prefix(r.shared_prefix)
        .with_checkpointing(r.train.run.checkpoint_activations);
    Ok(policy)
}

fn build_policy_f32(r: &Recipe, device: &Device, peft: Option<&Path>) -> Result<Policy> {
    policy_from_specs(
        r.model.as_ref(),
        r.pretrained.as_ref(),
        r.header.seed,
        device,
        peft,
    )
}

/// The tiny policy's reference weights written at the start of a run (`reference.bpk`), as a
/// no-grad model with the policy's precision and attention path.
pub fn read_reference(r: &Recipe, policy: &Policy, path: &Path, ad: &Device) -> Result<Llama> {
    let rec = ModuleRecord::load(path).map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
    let m = r
        .model
        .as_ref()
        .context("tiny model")?
        .llama_config()
        .init(ad)
        .try_load_record(rec)
        .map_err(|e| anyhow!("applying {}: {e}", path.display()))?
        .with_precision(policy.model.precision())
        .with_fused_attention(r.fused_attention)
        .with_shared_prefix(r.shared_prefix);
    Ok(m.valid())
}

/// The rollout sampler of a recipe's step: its temperature, response length, group size and
/// prompt bucket, the policy's stop tokens, and the step's `seed`.
pub fn rollout_sampling(r: &Recipe, stop: &[u32], seed: u64) -> SamplingConfig {
    SamplingConfig {
        temperature: r.rollout.temperature,
        max_new_tokens: r.rollout.max_new_tokens,
        n: r.rollout.samples_per_prompt,
        seed,
        stop_tokens: stop.to_vec(),
        prompt_bucket: r.rollout.shape_bucket,
        ..SamplingConfig::default()
    }
}

/// The update schedule of a recipe's RL phase with the resolved actor loss.
pub fn update_config(r: &Recipe, loss: ActorLossConfig) -> UpdateConfig {
    UpdateConfig {
        schedule: r.train.update,
        loss,
    }
}

/// The RL phase's AdamW (no weight decay; global gradient-norm clipping when `train.grad_clip`
/// > 0).
pub fn optimizer(r: &Recipe) -> Optimizer {
    r.train.optim.init()
}
