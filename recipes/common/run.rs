//! The one set-up of a job's run directory: the recipe resolved to TOML (written, stored in
//! every checkpoint and compared on `--resume`) and its run loop; a checkpoint's extra module
//! records (a module and its optimizer under one stem).

use anyhow::{Result, anyhow};
use burn::module::Module;
use burn::store::ModuleRecord;
use ember_run::{Run, RunOptions, RunSpec};
use ember_train::Optimizer;
use std::path::Path;

/// How long a run is and how it keeps checkpoints: the recipe's `train` (or `rl`, `ppo`) table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLoop {
    /// Steps of the run.
    pub steps: usize,
    /// A checkpoint every this many steps (0: only at the end and on a stop).
    pub checkpoint_every: usize,
    /// Checkpoints kept (the newest).
    pub keep_checkpoints: usize,
}

/// Opens `out` for the recipe `r` named `name`, drawing `curves` (reward, held-out metric).
pub fn open_run<R: serde::Serialize + serde::de::DeserializeOwned>(
    out: &Path,
    opts: &RunOptions,
    name: &str,
    r: &R,
    run_loop: RunLoop,
    curves: (&str, &str),
) -> Result<Run> {
    let resolved = toml::to_string_pretty(r)?;
    let spec = RunSpec {
        name,
        resolved: &resolved,
        steps: run_loop.steps,
        checkpoint_every: run_loop.checkpoint_every,
        keep_checkpoints: run_loop.keep_checkpoints,
        curves,
        restate: Some(&restate::<R>),
    };
    Run::open(out, opts, &spec)
}

/// A recipe stored by an earlier version, read in today's spelling with today's defaults and
/// written as today's resolved recipe is (`--resume` across versions).
pub(crate) fn restate<R: serde::Serialize + serde::de::DeserializeOwned>(
    stored: &str,
) -> Option<String> {
    let table = crate::common::config::stored_table(stored).ok()?;
    let r: R = crate::common::config::from_toml(table).ok()?;
    toml::to_string_pretty(&r).ok()
}

/// Writes `<stem>.bpk` (a module's record) and `<stem>_optim.bpk` (its optimizer's).
pub(crate) fn save_pair(
    d: &Path,
    stem: &str,
    record: ModuleRecord,
    optim: &Optimizer,
) -> Result<()> {
    let p = d.join(format!("{stem}.bpk"));
    record
        .save(&p)
        .map_err(|e| anyhow!("writing {}: {e}", p.display()))?;
    let p = d.join(format!("{stem}_optim.bpk"));
    optim
        .to_record()
        .save(&p)
        .map_err(|e| anyhow!("writing {}: {e}", p.display()))
}

/// `module` and `optim` with the records [`save_pair`] wrote under `stem`.
pub(crate) fn load_pair<M: Module>(
    d: &Path,
    stem: &str,
    module: M,
    optim: Optimizer,
) -> Result<(M, Optimizer)> {
    let p = d.join(format!("{stem}.bpk"));
    let rec = ModuleRecord::load(&p).map_err(|e| anyhow!("reading {}: {e}", p.display()))?;
    let module = module
        .try_load_record(rec)
        .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
    let p = d.join(format!("{stem}_optim.bpk"));
    let rec = burn::optim::OptimizerRecord::load(&p)
        .map_err(|e| anyhow!("reading {}: {e}", p.display()))?;
    Ok((module, optim.load_record(rec)))
}

/// `module` and `optim` with the run kit's records of checkpoint `d` (`model.bpk`, read
/// through the checkpoint's manifest, and `optim.bpk`).
pub(crate) fn load_records<M: Module>(
    d: &Path,
    module: M,
    optim: Optimizer,
) -> Result<(M, Optimizer)> {
    let p = d.join(ember_run::checkpoint::MODEL);
    let module = module
        .try_load_record(ember_run::checkpoint::read_model(d, false)?)
        .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
    Ok((module, ember_run::checkpoint::load_optimizer(d, optim)?))
}
