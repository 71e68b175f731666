//! Atomic checkpoints: each is written into a temporary directory, flushed, then renamed to
//! `step-XXXXXXXX/` (`ember_train::io::publish_dir`), and only then does the `latest` pointer
//! move (itself written atomically). A failure at any point (disk full, I/O error) leaves the
//! previous checkpoint and pointer untouched. Each directory carries a manifest of its files'
//! checksums (`ember_train::manifest`), checked when it is read back.

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Host-side training state stored beside the model and optimizer records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// RL steps completed.
    pub step: usize,
    /// The job RNG's state after `step`.
    pub rng: u64,
    /// Held-out accuracy after the warm-up (or of the pretrained model).
    pub accuracy_before: f64,
    /// Latest held-out accuracy.
    pub accuracy_after: f64,
    /// The resolved recipe the run was started with (resuming checks it is unchanged).
    pub recipe: String,
}

/// File names inside a checkpoint directory.
pub const MODEL: &str = "model.bpk";
/// The optimizer record.
pub const OPTIM: &str = "optim.bpk";
/// The [`TrainState`].
pub const STATE: &str = "state.json";

fn step_name(step: usize) -> String {
    format!("step-{step:08}")
}

/// Fills a checkpoint directory: the model (or adapter) record, the optimizer record and the
/// [`TrainState`].
pub fn write_records(
    dir: &Path,
    model: burn::store::ModuleRecord,
    optim: &ember_train::Optimizer,
    state: &TrainState,
) -> Result<()> {
    model
        .save(dir.join(MODEL))
        .map_err(|e| anyhow!("writing the model record: {e}"))?;
    optim
        .to_record()
        .save(dir.join(OPTIM))
        .map_err(|e| anyhow!("writing the optimizer record: {e}"))?;
    std::fs::write(dir.join(STATE), serde_json::to_string_pretty(state)?)?;
    Ok(())
}

/// The model (or, with `partial`, adapter) record stored in checkpoint `dir`.
pub fn read_model(dir: &Path, partial: bool) -> Result<burn::store::ModuleRecord> {
    ember_train::manifest::verify(dir)?;
    let p = dir.join(MODEL);
    Ok(burn::store::ModuleRecord::load(&p)
        .map_err(|e| anyhow!("reading {}: {e}", p.display()))?
        .allow_partial(partial))
}

/// `optim` with the AdamW state stored in checkpoint `dir`.
pub fn load_optimizer(dir: &Path, optim: ember_train::Optimizer) -> Result<ember_train::Optimizer> {
    let p = dir.join(OPTIM);
    let rec = burn::optim::OptimizerRecord::load(&p)
        .map_err(|e| anyhow!("reading {}: {e}", p.display()))?;
    Ok(optim.load_record(rec))
}

/// Writes checkpoint `step` under `root` with `write` (which fills the directory it is given),
/// moves `latest` to it, and keeps the newest `keep` checkpoints (at least 1).
pub fn save(
    root: &Path,
    step: usize,
    keep: usize,
    write: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let name = step_name(step);
    let tmp = root.join(format!(".{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing stale {}", tmp.display()))?;
    }
    let previous = latest(root).ok().flatten();
    let keep_note = || match &previous {
        Some(p) => format!("the previous checkpoint {} is intact", p.display()),
        None => "no earlier checkpoint exists".to_string(),
    };
    let dst = root.join(&name);
    let written = std::fs::create_dir_all(&tmp)
        .map_err(anyhow::Error::from)
        .and_then(|()| write(&tmp))
        .and_then(|()| Ok(ember_train::manifest::publish(&tmp, &dst)?));
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.context(format!(
            "writing checkpoint at step {step} failed; {}",
            keep_note()
        )));
    }
    crate::write::write_atomic(&root.join("latest"), name.as_bytes())
        .with_context(|| format!("moving the latest pointer; {}", keep_note()))?;
    let mut all = list(root)?;
    all.retain(|(s, _)| *s != step);
    let excess = (all.len() + 1).saturating_sub(keep.max(1));
    for (_, p) in all.iter().take(excess) {
        let _ = std::fs::remove_dir_all(p);
    }
    Ok(dst)
}

/// Checkpoints under `root`, oldest first.
pub fn list(root: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut out = Vec::new();
    if !root.exists() {
        return Ok(out);
    }
    for e in std::fs::read_dir(root).with_context(|| format!("listing {}", root.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(s) = name.strip_prefix("step-").and_then(|s| s.parse().ok()) {
            out.push((s, e.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The checkpoint `latest` points to, if any.
pub fn latest(root: &Path) -> Result<Option<PathBuf>> {
    let ptr = root.join("latest");
    if !ptr.exists() {
        return Ok(None);
    }
    let name =
        std::fs::read_to_string(&ptr).with_context(|| format!("reading {}", ptr.display()))?;
    let dir = root.join(name.trim());
    if !dir.join(STATE).exists() {
        return Err(anyhow!(
            "{} points to {}, which is not a complete checkpoint",
            ptr.display(),
            dir.display()
        ));
    }
    Ok(Some(dir))
}

/// Reads the state of checkpoint `dir`.
/// Checks the whole directory against its manifest first (`ember_train::manifest`).
pub fn read_state(dir: &Path) -> Result<TrainState> {
    ember_train::manifest::verify(dir)?;
    let p = dir.join(STATE);
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ember-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn state(step: usize) -> impl FnOnce(&Path) -> Result<()> {
        move |d: &Path| {
            let s = TrainState {
                step,
                rng: 7,
                accuracy_before: 0.0,
                accuracy_after: 0.0,
                recipe: String::new(),
            };
            std::fs::write(d.join(STATE), serde_json::to_string(&s)?)?;
            Ok(())
        }
    }

    #[test]
    fn keeps_newest_and_points_latest() {
        let root = tmpdir("keep");
        for s in [2, 4, 6] {
            save(&root, s, 2, state(s)).unwrap();
        }
        let steps: Vec<usize> = list(&root).unwrap().iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, vec![4, 6]);
        assert_eq!(
            read_state(&latest(&root).unwrap().unwrap()).unwrap().step,
            6
        );
        std::fs::remove_dir_all(&root).ok();
    }

    /// Disk full while checkpointing: writing to /dev/full fails with ENOSPC half-way; the
    /// previous checkpoint and the pointer survive, and the error says so.
    #[test]
    fn disk_full_keeps_previous_checkpoint() {
        let root = tmpdir("full");
        save(&root, 3, 2, state(3)).unwrap();
        let err = save(&root, 6, 2, |d: &Path| {
            std::fs::write(d.join(STATE), "{}")?;
            let full = Path::new("/dev/full");
            if full.exists() {
                std::fs::write(full, vec![0u8; 1 << 16])?;
            } else {
                return Err(std::io::Error::from(std::io::ErrorKind::StorageFull).into());
            }
            Ok(())
        })
        .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("step 6") && msg.contains("intact"), "{msg}");
        assert!(
            msg.to_lowercase().contains("space") || msg.to_lowercase().contains("full"),
            "{msg}"
        );
        let l = latest(&root).unwrap().unwrap();
        assert_eq!(read_state(&l).unwrap().step, 3);
        let names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert!(!names.iter().any(|n| n.contains("tmp")), "{names:?}");
        std::fs::remove_dir_all(&root).ok();
    }
}
