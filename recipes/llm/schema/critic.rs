//! `[critic]`: the learned value model of `algorithm = "ppo"` and `"ppo-pact"` (its learning
//! rate, critic-only warm-up steps, and overrides of the preset's value clip and PACT).

use crate::common::config::check_lr;
use anyhow::{Result, bail};
use ember_engine::*;
use serde::{Deserialize, Serialize};

/// The critic's recipe table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriticSpec {
    /// The critic's learning rate, constant (default: the actor's `train.lr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// The first steps train the critic only (verl `trainer.critic_warmup`).
    #[serde(default)]
    pub warmup_steps: usize,
    /// ε_v of the clipped value loss (default: the preset's 0.5; 0 = no clip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_clip: Option<f32>,
    /// PACT's settings; given with `algorithm = "ppo"` it turns PACT on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pact: Option<Pact>,
}

impl CriticSpec {
    /// The preset's critic with this table's overrides.
    pub fn apply(&self, mut c: CriticConfig) -> CriticConfig {
        if let Some(v) = self.value_clip {
            c.value_clip = v;
        }
        if self.pact.is_some() {
            c.pact = self.pact;
        }
        c
    }
}

/// Checks that a critic and GAE come together, and the table's values.
pub fn validate(
    spec: Option<&CriticSpec>,
    algorithm: Preset,
    parts: &PresetParts,
    steps: usize,
) -> Result<()> {
    let gae = matches!(parts.advantage.kind, AdvantageKind::Gae { .. });
    match (&parts.critic, gae) {
        (None, true) => bail!(
            "[advantage] kind = \"gae\" needs a critic's values: use algorithm = \"ppo\" or \
             \"ppo-pact\""
        ),
        (Some(_), false) => bail!(
            "algorithm = {:?} trains a critic for GAE; its [advantage] kind must stay \"gae\"",
            algorithm.name()
        ),
        _ => {}
    }
    if let Some(s) = spec {
        if parts.critic.is_none() {
            bail!(
                "[critic] applies to algorithm = \"ppo\" or \"ppo-pact\", not {:?}",
                algorithm.name()
            );
        }
        if let Some(lr) = s.lr {
            check_lr("critic.lr", lr)?;
        }
        if s.warmup_steps >= steps {
            bail!(
                "critic.warmup_steps = {} leaves no step for the actor (train.steps = {steps})",
                s.warmup_steps
            );
        }
    }
    if let Some(c) = &parts.critic {
        c.validate()?;
    }
    Ok(())
}
