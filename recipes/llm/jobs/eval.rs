//! `ember eval`: greedy held-out accuracy of an LLM run's final model (or of a checkpoint).

use crate::llm::{build_policy, build_policy_with};
use crate::lm::{Policy, evaluate, load_checkpoint};
use anyhow::{Context, Result, bail};
use std::path::Path;

/// `ember eval`: greedy held-out accuracy of a run's final model (or of a checkpoint).
pub fn evaluate_run(
    run: &Path,
    checkpoint_dir: Option<&Path>,
    eval_size: Option<usize>,
) -> Result<f64> {
    let rp = run.join("recipe.resolved.toml");
    let text = std::fs::read_to_string(&rp).with_context(|| format!("reading {}", rp.display()))?;
    let stored = crate::llm::schema::parse_stored(&text)?;
    let mut r = crate::llm::plop::apply_recorded(&stored, run)?;
    if let Some(n) = eval_size {
        r.task.eval_size = n;
    }
    let task = r.task.build()?;
    let eval = task.held_out_set(r.header.seed, r.task.eval_size);
    let base = crate::common::device::device(&r.header.device)?;
    let final_dir = run.join("final");
    let policy = match checkpoint_dir {
        Some(d) => load_checkpoint(build_policy(&r, &base)?, d)?,
        None if !final_dir.exists() => bail!(
            "{} has no final/ model (did the run finish?); pass --checkpoint <dir>",
            run.display()
        ),
        None if r.pretrained.is_some() => build_policy_with(&r, &base, Some(&final_dir))?,
        None => Policy {
            model: ember_llm::load(&final_dir, &base)?.model,
            ..build_policy(&r, &base)?
        },
    };
    evaluate(&policy, &eval, r.rollout.max_new_tokens, &base)
}
