//! Durable file writes shared by every writer of the workspace (run directories, checkpoints,
//! exported models): a temporary file in the same directory, flushed to disk (`fsync`), renamed
//! over the target, then the directory synced so that the rename itself survives a power loss.
//! A failure at any point leaves the previous file untouched and removes the temporary one.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary name a file is written to before its rename: `.<name>.tmp` beside it (hidden,
/// and never a name a reader looks for).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().to_string());
    path.with_file_name(format!(".{name}.tmp"))
}

/// Flushes a directory's entries (renames, creations) to disk. Best effort: not every platform
/// lets a directory be opened for syncing.
pub fn sync_dir(dir: &Path) {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Writes `bytes` to `path` atomically and durably (temporary file, fsync, rename, directory
/// sync). Readers see the old content or the new, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |tmp| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })
}

/// [`write_atomic`] for writers that create the file themselves (burn's record `save`, a
/// serializer): `write` fills the temporary path it is given; the file is then synced, renamed
/// over `path` and the directory synced.
pub fn write_atomic_with<E>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<std::io::Error>,
{
    let tmp = temp_path(path);
    let res = write(&tmp).and_then(|()| {
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    } else if let Some(dir) = path.parent() {
        sync_dir(dir);
    }
    res
}

/// Replaces directory `dst` by the fully written directory `tmp`: every file in `tmp` synced,
/// `tmp` synced, the old `dst` removed, `tmp` renamed to `dst`, the parent synced.
pub fn publish_dir(tmp: &Path, dst: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(tmp)? {
        let p = e?.path();
        if p.is_file() {
            std::fs::File::open(&p)?.sync_all()?;
        }
    }
    sync_dir(tmp);
    if dst.exists() {
        std::fs::remove_dir_all(dst)?;
    }
    std::fs::rename(tmp, dst)?;
    if let Some(parent) = dst.parent() {
        sync_dir(parent);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ember-io-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let d = tmpdir("replace");
        let p = d.join("a.json");
        write_atomic(&p, b"old").unwrap();
        write_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        std::fs::remove_dir_all(&d).ok();
    }

    /// A writer that fails half-way (as on a full disk) leaves the old file and no temporary.
    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let d = tmpdir("fail");
        let p = d.join("m.csv");
        write_atomic(&p, b"kept").unwrap();
        let err = write_atomic_with(&p, |tmp| {
            std::fs::write(tmp, b"half")?;
            Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
        })
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(std::fs::read(&p).unwrap(), b"kept");
        assert!(!temp_path(&p).exists());
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn publishes_a_directory_over_an_old_one() {
        let d = tmpdir("dir");
        let (tmp, dst) = (d.join(".final.tmp"), d.join("final"));
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(dst.join("old"), b"x").unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("new"), b"y").unwrap();
        publish_dir(&tmp, &dst).unwrap();
        assert!(dst.join("new").exists() && !dst.join("old").exists() && !tmp.exists());
        std::fs::remove_dir_all(&d).ok();
    }
}
