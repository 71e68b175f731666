//! The one set-up of a job's run directory: the recipe resolved to TOML (written, stored in
//! every checkpoint and compared on `--resume`) and its run loop.

use anyhow::Result;
use ember_run::{Run, RunOptions, RunSpec};
use std::path::Path;

/// How long a run is and how it keeps checkpoints: `(steps, checkpoint_every,
/// keep_checkpoints)` of the recipe's `train` (or `rl`) table.
pub type RunLoop = (usize, usize, usize);

/// Opens `out` for the recipe `r` named `name`, drawing `curves` (reward, held-out metric).
pub fn open_run<R: serde::Serialize>(
    out: &Path,
    opts: &RunOptions,
    (name, r): (&str, &R),
    (steps, checkpoint_every, keep_checkpoints): RunLoop,
    curves: (&str, &str),
) -> Result<Run> {
    let resolved = toml::to_string_pretty(r)?;
    let spec = RunSpec {
        name,
        resolved: &resolved,
        steps,
        checkpoint_every,
        keep_checkpoints,
        curves,
    };
    Run::open(out, opts, &spec)
}
