//! Files written atomically and durably, with the path in the error.

use anyhow::{Context, Result};
use std::path::Path;

/// Writes `bytes` to `path` atomically and durably (`ember_train::io::write_atomic`).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    ember_train::io::write_atomic(path, bytes)
        .with_context(|| format!("writing {} failed", path.display()))
}
