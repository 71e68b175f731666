//! `ember plop <recipe>`: PLoP's scores (`llm::plop`) of the recipe's pretrained model on its
//! task's training prompts, and the projection types `targets = "plop"` would choose.

use crate::llm::plop::{Choice, score};
use crate::llm::schema::Recipe;
use crate::lm::LoraSpec;
use anyhow::{Result, bail};

/// Scores the recipe's model; `count` and `prompts` default to the recipe's PLoP settings.
pub fn plop(r: &Recipe, count: Option<usize>, prompts: Option<usize>) -> Result<Choice> {
    let Some(p) = &r.pretrained else {
        bail!("`ember plop` scores a [pretrained] model; this recipe has the tiny [model]");
    };
    let (c0, p0) = if p.lora.is_plop() {
        p.lora.plop()
    } else {
        (LoraSpec::PLOP_COUNT, LoraSpec::PLOP_PROMPTS)
    };
    let (count, prompts) = (count.unwrap_or(c0), prompts.unwrap_or(p0));
    if prompts == 0 || prompts > 4096 {
        bail!("--prompts must be in 1..=4096");
    }
    let n = ember_llm::LORA_TARGETS.len();
    if count == 0 || count > n {
        bail!("--count (or pretrained.lora.plop_count) = {count} must be in 1..={n}");
    }
    let task = r.task.build()?;
    let device = crate::common::device::device(&r.header.device)?;
    score(r, &task, count, prompts, &device)
}
