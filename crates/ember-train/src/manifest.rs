//! Content checksums of a directory a run writes and later reads back (a checkpoint, `final/`,
//! the weights pushed to rollout servers): `manifest.json` lists every file with its size and
//! CRC-32C (Castagnoli; the `crc32c` crate, hardware-accelerated), written before the directory
//! is published and checked when it is read back. A flipped bit, a truncated file, or a file
//! from another run dropped into a checkpoint is an error naming the file, never weights loaded
//! as garbage.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The manifest's file name inside a directory.
pub const MANIFEST: &str = "manifest.json";

/// Why a directory does not match its manifest, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Listing, reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The manifest is not the JSON this module writes.
    #[error("parsing {path}: {reason}")]
    Parse {
        /// The manifest's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A listed file is gone.
    #[error("{dir}: {name} is missing")]
    Missing {
        /// The directory.
        dir: PathBuf,
        /// The file, relative to it.
        name: String,
    },
    /// A listed file's size or checksum differs.
    #[error(
        "{dir}: {name} is damaged ({bytes} bytes, CRC-32C {crc:08x}; written: {want_bytes} bytes, \
         {want_crc:08x})"
    )]
    Damaged {
        /// The directory.
        dir: PathBuf,
        /// The file, relative to it.
        name: String,
        /// Its size now.
        bytes: u64,
        /// Its checksum now.
        crc: u32,
        /// Its size as written.
        want_bytes: u64,
        /// Its checksum as written.
        want_crc: u32,
    },
    /// A file that the manifest does not list (strict checks only).
    #[error(
        "{dir}: {name} was not part of the checkpoint as written (a file from another run or \
         step?); remove it"
    )]
    Stranger {
        /// The directory.
        dir: PathBuf,
        /// The file, relative to it.
        name: String,
    },
}

type Result<T> = std::result::Result<T, ManifestError>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ManifestError + '_ {
    move |source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One file's size and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Entry {
    bytes: u64,
    crc32c: u32,
}

/// Every regular file below `dir` (but the manifest), by `/`-separated relative name.
fn files(dir: &Path, prefix: &str, out: &mut BTreeMap<String, Entry>) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let name = format!("{prefix}{}", e.file_name().to_string_lossy());
        let kind = e.file_type().map_err(io(&e.path()))?;
        if kind.is_dir() {
            files(&e.path(), &format!("{name}/"), out)?;
        } else if kind.is_file() && name != MANIFEST {
            let data = std::fs::read(e.path()).map_err(io(&e.path()))?;
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
    let text = serde_json::to_string_pretty(&all).map_err(|e| ManifestError::Parse {
        path: dir.join(MANIFEST),
        reason: e.to_string(),
    })?;
    let p = dir.join(MANIFEST);
    std::fs::write(&p, text).map_err(io(&p))
}

/// Writes `tmp`'s manifest, then publishes `tmp` as `dst` (`crate::io::publish_dir`).
pub fn publish(tmp: &Path, dst: &Path) -> Result<()> {
    write(tmp)?;
    crate::io::publish_dir(tmp, dst).map_err(io(dst))
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Every listed file matched.
    Verified,
    /// The directory has no manifest: nothing was checked.
    NoManifest,
}

/// Checks `dir` against its manifest: the same files, sizes and checksums (a checkpoint, which
/// nobody should add files to). Without a manifest (a checkpoint older than manifests), logs a
/// warning and returns [`Checked::NoManifest`].
pub fn verify(dir: &Path) -> Result<Checked> {
    let checked = check(dir, true)?;
    if checked == Checked::NoManifest {
        log::warn!(
            "{} has no {MANIFEST} (written before manifests existed): its files are not checked",
            dir.display()
        );
    }
    Ok(checked)
}

/// Checks a model or adapter directory that may carry a manifest (a run's `final/`, a
/// `serving/step-N/` pushed to servers): each listed file must match; a file added since (a
/// README, a chat template) is only logged; no manifest (any other Hugging Face directory)
/// checks nothing.
pub fn verify_export(dir: &Path) -> Result<Checked> {
    check(dir, false)
}

fn check(dir: &Path, strict: bool) -> Result<Checked> {
    let p = dir.join(MANIFEST);
    if !p.exists() {
        return Ok(Checked::NoManifest);
    }
    let text = std::fs::read_to_string(&p).map_err(io(&p))?;
    let want: BTreeMap<String, Entry> =
        serde_json::from_str(&text).map_err(|e| ManifestError::Parse {
            path: p.clone(),
            reason: e.to_string(),
        })?;
    let mut have = BTreeMap::new();
    files(dir, "", &mut have)?;
    let named = |name: &str| (dir.to_path_buf(), name.to_string());
    for (name, w) in &want {
        match have.get(name) {
            None => {
                let (dir, name) = named(name);
                return Err(ManifestError::Missing { dir, name });
            }
            Some(h) if h != w => {
                let (dir, name) = named(name);
                return Err(ManifestError::Damaged {
                    dir,
                    name,
                    bytes: h.bytes,
                    crc: h.crc32c,
                    want_bytes: w.bytes,
                    want_crc: w.crc32c,
                });
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = have.keys().find(|k| !want.contains_key(*k)) {
        let (dir, name) = named(extra);
        if strict {
            return Err(ManifestError::Stranger { dir, name });
        }
        log::info!(
            "{}: {name} was added after {MANIFEST} was written",
            dir.display()
        );
    }
    Ok(Checked::Verified)
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
        assert_eq!(verify(&d).unwrap(), Checked::NoManifest);
        std::fs::remove_dir_all(&d).ok();
    }
}

#[cfg(test)]
mod export_tests {
    use super::*;

    /// An export's listed files are checked; a file added since is allowed; no manifest checks
    /// nothing.
    #[test]
    fn exports_allow_additions_but_not_damage() {
        let d = std::env::temp_dir().join(format!("ember-manifest-export-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("model.safetensors"), vec![3u8; 64]).unwrap();
        assert_eq!(verify_export(&d).unwrap(), Checked::NoManifest);
        write(&d).unwrap();
        std::fs::write(d.join("README.md"), "notes").unwrap();
        assert_eq!(verify_export(&d).unwrap(), Checked::Verified);
        assert!(matches!(verify(&d), Err(ManifestError::Stranger { .. })));
        std::fs::write(d.join("model.safetensors"), vec![4u8; 64]).unwrap();
        let e = verify_export(&d).unwrap_err().to_string();
        assert!(e.contains("model.safetensors is damaged"), "{e}");
        std::fs::remove_dir_all(&d).ok();
    }
}
