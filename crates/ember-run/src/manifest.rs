//! Content checksums of a checkpoint directory: `manifest.json` lists every file with its size
//! and CRC-32C (Castagnoli; the `crc32c` crate, hardware-accelerated), written before the
//! directory is published and checked when it is read back. A flipped bit, a truncated file, or a
//! file from another run dropped into the directory is an error naming the file, never weights
//! loaded as garbage. A checkpoint written before manifests existed loads with a warning.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST: &str = "manifest.json";

/// One file's size and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Entry {
    bytes: u64,
    crc32c: u32,
}

/// Every regular file below `dir` (but the manifest), by `/`-separated relative name.
fn files(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Entry>) -> Result<()> {
    let list = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for e in list {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        let kind = e.file_type()?;
        if kind.is_dir() {
            files(&e.path(), &format!("{name}/"), out)?;
        } else if kind.is_file() && name != MANIFEST {
            let data = std::fs::read(e.path())
                .with_context(|| format!("reading {}", e.path().display()))?;
            let entry = Entry {
                bytes: data.len() as u64,
                crc32c: crc32c::crc32c(&data),
            };
            out.insert(name, entry);
        }
    }
    Ok(())
}

/// Writes `dir`'s manifest (called on the unpublished directory, before it is flushed and
/// renamed into place).
pub fn write(dir: &Path) -> Result<()> {
    let mut all = BTreeMap::new();
    files(dir, "", &mut all)?;
    let text = serde_json::to_string_pretty(&all)?;
    std::fs::write(dir.join(MANIFEST), text)
        .with_context(|| format!("writing {}", dir.join(MANIFEST).display()))
}

/// Checks `dir` against its manifest: the same files, sizes and checksums.
pub fn verify(dir: &Path) -> Result<()> {
    let p = dir.join(MANIFEST);
    if !p.exists() {
        log::warn!(
            "{} has no {MANIFEST} (written before manifests existed): its files are not checked",
            dir.display()
        );
        return Ok(());
    }
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let want: BTreeMap<String, Entry> =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    let mut have = BTreeMap::new();
    files(dir, "", &mut have)?;
    for (name, w) in &want {
        match have.get(name) {
            None => bail!("checkpoint {}: {name} is missing", dir.display()),
            Some(h) if h != w => bail!(
                "checkpoint {}: {name} is damaged ({} bytes, CRC-32C {:08x}; written: {} bytes, \
                 {:08x})",
                dir.display(),
                h.bytes,
                h.crc32c,
                w.bytes,
                w.crc32c
            ),
            Some(_) => {}
        }
    }
    if let Some(extra) = have.keys().find(|k| !want.contains_key(*k)) {
        bail!(
            "checkpoint {}: {extra} was not part of the checkpoint as written (a file from \
             another run or step?); remove it",
            dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flips_truncations_and_strangers_are_named() {
        let d = std::env::temp_dir().join(format!("ember-manifest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("model.bpk"), vec![7u8; 1000]).unwrap();
        std::fs::write(d.join("sub/replay.json"), "{}").unwrap();
        write(&d).unwrap();
        verify(&d).unwrap();
        let mut bytes = std::fs::read(d.join("model.bpk")).unwrap();
        bytes[500] ^= 1;
        std::fs::write(d.join("model.bpk"), &bytes).unwrap();
        let e = verify(&d).unwrap_err().to_string();
        assert!(e.contains("model.bpk is damaged"), "{e}");
        bytes[500] ^= 1;
        std::fs::write(d.join("model.bpk"), &bytes[..999]).unwrap();
        let e = verify(&d).unwrap_err().to_string();
        assert!(e.contains("999 bytes"), "{e}");
        std::fs::write(d.join("model.bpk"), &bytes).unwrap();
        std::fs::write(d.join("critic.bpk"), "x").unwrap();
        let e = verify(&d).unwrap_err().to_string();
        assert!(e.contains("critic.bpk was not part"), "{e}");
        std::fs::remove_file(d.join("critic.bpk")).unwrap();
        std::fs::remove_file(d.join("sub/replay.json")).unwrap();
        let e = verify(&d).unwrap_err().to_string();
        assert!(e.contains("sub/replay.json is missing"), "{e}");
        // No manifest (an older checkpoint): loads, unchecked.
        std::fs::remove_file(d.join(MANIFEST)).unwrap();
        verify(&d).unwrap();
        std::fs::remove_dir_all(&d).ok();
    }
}
