//! `ember eval` of an image run.

use super::state::with_adapters;
use crate::flow::digits::Digits;
use crate::flow::images::{EvalResult, evaluate, pretrained};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use ember_flow::DigitClassifier;
use ember_run::checkpoint;
use ember_tasks::expand_path;
use std::path::Path;

/// `ember eval` of an image run: the pretrained DiT (from the pretraining cache, or pretrained
/// again as the run did) with the adapters of the run's latest checkpoint, or of `checkpoint`,
/// evaluated as the run evaluates (`samples_per_class` replaces the recipe's).
pub fn evaluate_run(
    run: &Path,
    checkpoint_dir: Option<&Path>,
    samples_per_class: Option<usize>,
) -> Result<EvalResult> {
    let rp = run.join("recipe.resolved.toml");
    let text = std::fs::read_to_string(&rp).with_context(|| format!("reading {}", rp.display()))?;
    let table = crate::common::config::stored_table(&text)?;
    if table.get("kind").and_then(|k| k.as_str()) != Some("flow") {
        bail!("{} is not an image run (kind = \"flow\")", run.display());
    }
    let mut r = crate::flow::schema::from_table(table)?;
    if let Some(n) = samples_per_class {
        if !(2..=10_000).contains(&n) {
            bail!("--eval-size (samples per class) = {n} must be in 2..=10000");
        }
        r.eval.samples_per_class = n;
    }
    let dir = match checkpoint_dir {
        Some(d) => d.to_path_buf(),
        None => checkpoint::latest(&run.join("checkpoints"))?.with_context(|| {
            format!(
                "{} has no checkpoint (did the run take a step?)",
                run.display()
            )
        })?,
    };
    let digits = Digits::load(&expand_path(&r.data.digits)?)?;
    let base = crate::common::device::device(&r.header.device)?;
    let ad = base.clone().autodiff();
    let classifier = DigitClassifier::load(&expand_path(&r.data.classifier)?, &base)?;
    let (model, _) = pretrained(&r, &digits, &ad, true)?;
    let p = dir.join(checkpoint::MODEL);
    let model = with_adapters(model, &r, &ad)?
        .try_load_record(checkpoint::read_model(&dir, true)?)
        .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
    Ok(evaluate(&model.valid(), &classifier, &r, &base)?.0)
}
