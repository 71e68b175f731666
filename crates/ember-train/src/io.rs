//! Durable file writes shared by every writer of the workspace (run directories, checkpoints,
//! exported models): a temporary file in the same directory, flushed to disk (`fsync`), renamed
//! over the target, then the directory synced so that the rename itself survives a power loss.
//! A failure at any point leaves the previous file untouched and removes the temporary one.
//! And the reads of files a user names: only regular files are opened ([`read`],
//! [`read_to_string`], [`require_regular_file`]).

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

/// Refuses a path that is not a regular file before anything opens it: opening a FIFO for
/// reading blocks until a writer comes, and a device or socket never ends, so a model, adapter
/// or data path naming one would hang the run. Symbolic links are followed.
///
/// # Errors
/// `InvalidInput` naming the path and what it is; the metadata's own error (not found, …).
pub fn require_regular_file(path: &Path) -> std::io::Result<()> {
    let t = std::fs::metadata(path)?.file_type();
    if t.is_file() {
        return Ok(());
    }
    let what = if t.is_dir() {
        "a directory"
    } else {
        special_kind(&t)
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{} is {what}, not a regular file", path.display()),
    ))
}

#[cfg(unix)]
fn special_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// `std::fs::read` of a regular file only ([`require_regular_file`]).
///
/// # Errors
/// As [`require_regular_file`], or the read's.
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    require_regular_file(path)?;
    std::fs::read(path)
}

/// `std::fs::read_to_string` of a regular file only ([`require_regular_file`]).
///
/// # Errors
/// As [`require_regular_file`], or the read's.
pub fn read_to_string(path: &Path) -> std::io::Result<String> {
    require_regular_file(path)?;
    std::fs::read_to_string(path)
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
