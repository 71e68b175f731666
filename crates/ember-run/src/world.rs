//! The run directory of a multi-process run: rank 0 opens it and writes `world.json` with a
//! token it then sends to every rank; each other rank reads the file back, so a rank that does
//! not see rank 0's directory (no shared file system) stops at once with an error saying so.

use crate::write::write_atomic;
use anyhow::{Context, Result, bail};
use ember_dist::World;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// The file rank 0 writes.
const FILE: &str = "world.json";

/// A token no earlier launch wrote.
fn token() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

/// Rank 0, once the directory is open: writes `world.json` and sends its token and the step the
/// run starts from to every rank.
pub(crate) fn announce(world: &World, out: &Path, first_step: usize) -> Result<()> {
    let token = token();
    let file = serde_json::json!({
        "ranks": world.size(),
        "engine": world.engine(),
        "launcher": world.launch().launcher.name(),
        "token": token,
    });
    write_atomic(
        &out.join(FILE),
        serde_json::to_string_pretty(&file)?.as_bytes(),
    )?;
    let msg = serde_json::json!({ "token": token, "first_step": first_step });
    world.broadcast(serde_json::to_vec(&msg)?, "run directory check")?;
    Ok(())
}

/// A rank other than 0: the step rank 0 starts from, once the token in `world.json` is the one
/// rank 0 sent.
pub(crate) fn follow(world: &World, out: &Path) -> Result<usize> {
    let msg = world.broadcast(Vec::new(), "run directory check")?;
    let msg: serde_json::Value =
        serde_json::from_slice(&msg).context("rank 0's message about the run directory")?;
    let (Some(token), Some(first)) = (msg["token"].as_str(), msg["first_step"].as_u64()) else {
        bail!("rank 0's message about the run directory lacks its token or step");
    };
    let path = out.join(FILE);
    let seen = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let theirs = seen.as_ref().and_then(|v| v["token"].as_str());
    if theirs != Some(token) {
        bail!(
            "rank {} does not see rank 0's run directory ({} is {}): every rank must see the \
             same --out, on a file system they share (NFS, Lustre, a shared volume)",
            world.rank(),
            path.display(),
            match theirs {
                Some(_) => "another launch's",
                None => "missing",
            }
        );
    }
    usize::try_from(first).context("rank 0's first step")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_dist::{At, Collective, DistError, Launch};
    use std::sync::Arc;

    /// Rank 1 of two, to which rank 0 broadcasts `message`.
    struct Follower(Vec<u8>);

    impl Collective for Follower {
        fn rank(&self) -> usize {
            1
        }
        fn size(&self) -> usize {
            2
        }
        fn engine(&self) -> &'static str {
            "test"
        }
        fn all_reduce_sum(&self, buf: Vec<f32>, _: At) -> Result<Vec<f32>, DistError> {
            Ok(buf)
        }
        fn all_gather(&self, bytes: Vec<u8>, _: At) -> Result<Vec<Vec<u8>>, DistError> {
            Ok(vec![bytes])
        }
        fn broadcast(&self, _: Vec<u8>, _: At) -> Result<Vec<u8>, DistError> {
            Ok(self.0.clone())
        }
        fn abort(&self, code: i32) -> ! {
            std::process::exit(code)
        }
    }

    fn follower(message: &serde_json::Value) -> World {
        let launch = Launch {
            rank: 1,
            size: 2,
            local_rank: 1,
            local_size: 2,
            ..Launch::single()
        };
        let bytes = serde_json::to_vec(message).unwrap();
        World::new(Arc::new(Follower(bytes)), launch).unwrap()
    }

    /// A rank that finds rank 0's token follows it from rank 0's step; one that finds another
    /// launch's file, or none, is told that the ranks must share the directory.
    #[test]
    fn a_rank_must_see_rank_zeros_directory() {
        let dir = std::env::temp_dir().join(format!("ember-world-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let msg = serde_json::json!({"token": "abc", "first_step": 7});
        let e = follow(&follower(&msg), &dir).unwrap_err().to_string();
        assert!(
            e.contains("missing") && e.contains("file system they share"),
            "{e}"
        );
        std::fs::write(dir.join(FILE), r#"{"token": "old"}"#).unwrap();
        let e = follow(&follower(&msg), &dir).unwrap_err().to_string();
        assert!(e.contains("another launch's"), "{e}");
        std::fs::write(dir.join(FILE), r#"{"token": "abc"}"#).unwrap();
        assert_eq!(follow(&follower(&msg), &dir).unwrap(), 7);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
