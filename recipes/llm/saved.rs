//! What an LLM run's checkpoint holds beside the run kit's records (the critic and its
//! optimizer, the replay buffer, LANPO's pool), and the KL reference saved at the start of a run.

use crate::llm::critic::Critic;
use crate::llm::lanpo::Lanpo;
use crate::llm::read_reference;
use crate::llm::replay::Replay;
use crate::llm::schema::Recipe;
use crate::lm::{Policy, model_record};
use anyhow::Result;
use burn::tensor::Device;
use ember_llm::Llama;
use ember_run::checkpoint;
use std::path::Path;

/// What a checkpoint holds beside the policy and its optimizer, when the run has it.
#[derive(Clone, Copy)]
pub struct Extras<'a> {
    /// PPO's critic and its optimizer.
    pub critic: Option<&'a Critic>,
    /// The replay buffer.
    pub replay: Option<&'a Replay>,
    /// LANPO's experience pool.
    pub lanpo: Option<&'a Lanpo>,
}

/// A checkpoint: the policy (or its adapters), its optimizer, the [`Extras`] and the host
/// state.
pub fn save_checkpoint(
    d: &Path,
    policy: &Policy,
    optim: &ember_train::Optimizer,
    extras: Extras,
    state: &checkpoint::TrainState,
) -> Result<()> {
    checkpoint::write_records(d, model_record(policy), optim, state)?;
    if let Some(c) = extras.critic {
        c.save(d)?;
    }
    if let Some(l) = extras.lanpo {
        l.pool.save(d)?;
    }
    extras.replay.map_or(Ok(()), |rp| rp.save(d))
}

/// The KL reference of the tiny policy: the warm-started weights saved at the start of the run
/// (a LoRA policy's reference is its own weights with adapters off, so none is loaded).
pub fn load_reference(
    r: &Recipe,
    policy: &Policy,
    path: &Path,
    ad: &Device,
) -> Result<Option<Llama>> {
    if !(r.own_kl_reference() && policy.lora.is_none()) {
        return Ok(None);
    }
    read_reference(r, policy, path, ad).map(Some)
}
