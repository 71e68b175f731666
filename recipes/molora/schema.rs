//! The Mixture-of-LoRA comparison recipe (`ember molora`): the tiny model and its warm-up, the
//! tasks of the mixture, the fine-tuning and the adapter arms compared.

use crate::lm::{ModelSpec, Warmup};
use anyhow::{Result, bail};
use ember_molora::MixtureSettings;
use ember_tasks::task::Arithmetic;
use serde::{Deserialize, Serialize};

/// One task of the mixture: arithmetic with its operator and digits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixTask {
    /// Label in the table.
    pub name: String,
    /// Operators.
    pub ops: String,
    /// Digits per operand.
    pub digits: u32,
}

/// One adapter arm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Arm {
    /// One LoRA of rank `rank`.
    Lora {
        /// Label.
        name: String,
        /// Rank.
        rank: usize,
    },
    /// A Mixture-of-LoRA.
    Mixture {
        /// Label.
        name: String,
        /// The mixture.
        #[serde(flatten)]
        settings: MixtureSettings,
    },
}

impl Arm {
    /// The arm's label.
    pub fn name(&self) -> &str {
        match self {
            Arm::Lora { name, .. } | Arm::Mixture { name, .. } => name,
        }
    }
}

/// Supervised fine-tuning of the adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finetune {
    /// Optimizer steps.
    pub steps: usize,
    /// Examples per step (ReMix evaluates each under M selections).
    pub batch: usize,
    /// Learning rate.
    pub lr: f64,
    /// Projections that get adapters.
    pub targets: Vec<String>,
    /// α of every adapter.
    #[serde(default = "alpha")]
    pub alpha: f64,
}

fn alpha() -> f64 {
    16.0
}

/// The comparison recipe below its header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoloraBody {
    /// The tiny model.
    pub model: ModelSpec,
    /// Its warm-up (on `warmup_task`).
    pub warmup: Warmup,
    /// The warm-up task (the CPU recipe's: 2-digit addition).
    pub warmup_task: MixTask,
    /// The tasks of the mixture.
    pub tasks: Vec<MixTask>,
    /// Held-out problems per task.
    pub eval_size: usize,
    /// Fine-tuning.
    pub finetune: Finetune,
    /// The arms compared.
    pub arms: Vec<Arm>,
}

/// The whole recipe: the header (`name`, `seed`, `device`, [`crate::common::header::RunHeader`]) and [`MoloraBody`].
pub type MoloraRecipe = crate::common::header::Headed<MoloraBody>;

/// Parses a comparison recipe with `key=value` overrides.
pub fn parse(text: &str, overrides: &[String]) -> Result<MoloraRecipe> {
    let r: MoloraRecipe =
        crate::common::config::from_toml(crate::common::config::apply_overrides(text, overrides)?)?;
    if r.tasks.is_empty() || r.arms.is_empty() {
        bail!("the recipe needs at least one [[tasks]] and one [[arms]]");
    }
    for t in r.tasks.iter().chain([&r.warmup_task]) {
        arithmetic(t).validate().map_err(anyhow::Error::msg)?;
    }
    for a in &r.arms {
        if let Arm::Mixture { settings, .. } = a {
            settings.validate()?;
        }
    }
    // The tiny model's sizes, as an LLM recipe checks them (0 or 2^63 panicked or aborted).
    crate::lm::choose_policy(Some(&r.model), None)?;
    crate::common::config::check_lr("warmup.lr", r.warmup.lr)?;
    crate::common::config::check_lr("finetune.lr", r.finetune.lr)?;
    crate::common::config::check_positive("finetune.alpha", r.finetune.alpha)?;
    crate::common::config::check_range("finetune.alpha", r.finetune.alpha, 0.0, 1e6)?;
    for (key, v, max) in [
        ("warmup.batch", r.warmup.batch, 100_000),
        ("finetune.batch", r.finetune.batch, 100_000),
        ("eval_size", r.eval_size, 1_000_000),
    ] {
        crate::common::config::check_count(key, v, 1, max)?;
    }
    Ok(r)
}

/// The task's generator.
pub fn arithmetic(t: &MixTask) -> Arithmetic {
    Arithmetic {
        digits: t.digits,
        ops: t.ops.clone(),
    }
}
