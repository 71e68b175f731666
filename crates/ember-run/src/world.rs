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

/// Reads of `world.json` (every 200 ms) before a rank concludes it does not see rank 0's.
const WAIT_TRIES: usize = 25;

/// A token no earlier launch wrote.
fn token() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

/// Rank 0, once the directory is open: writes `world.json` and sends its token and the step the
/// run starts from to every rank.
pub(crate) fn announce(world: &World, out: &Path, first_step: usize, recipe: &str) -> Result<()> {
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
    let msg = serde_json::json!({
        "token": token,
        "first_step": first_step,
        "recipe": crc32c::crc32c(recipe.as_bytes()),
    });
    world.broadcast(serde_json::to_vec(&msg)?, "run directory check")?;
    Ok(())
}

/// A rank other than 0: the step rank 0 starts from, once the token in `world.json` is the one
/// rank 0 sent (read again for a few seconds, as a network file system may show it late) and
/// rank 0 runs the same resolved `recipe` (the same `--set` values).
pub(crate) fn follow(world: &World, out: &Path, recipe: &str) -> Result<usize> {
    follow_within(world, out, recipe, WAIT_TRIES)
}

fn follow_within(world: &World, out: &Path, recipe: &str, tries: usize) -> Result<usize> {
    let msg = world.broadcast(Vec::new(), "run directory check")?;
    let msg: serde_json::Value =
        serde_json::from_slice(&msg).context("rank 0's message about the run directory")?;
    let (Some(token), Some(first)) = (msg["token"].as_str(), msg["first_step"].as_u64()) else {
        bail!("rank 0's message about the run directory lacks its token or step");
    };
    if msg["recipe"].as_u64() != Some(u64::from(crc32c::crc32c(recipe.as_bytes()))) {
        bail!(
            "rank {} runs another recipe than rank 0 (other --set values, or another file): \
             every rank must run the same",
            world.rank()
        );
    }
    let path = out.join(FILE);
    let read = || {
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["token"].as_str().map(str::to_string))
    };
    let mut theirs = read();
    for _ in 0..tries {
        if theirs.as_deref() == Some(token) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        theirs = read();
    }
    if theirs.as_deref() != Some(token) {
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

    /// Rank 1 of two, to which rank 0 broadcasts `message` (its length first).
    struct Follower(Vec<u8>, std::sync::Mutex<usize>);

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
            let mut calls = self.1.lock().unwrap();
            *calls += 1;
            Ok(match *calls % 2 {
                1 => (self.0.len() as u64).to_le_bytes().to_vec(),
                _ => self.0.clone(),
            })
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
        World::new(Arc::new(Follower(bytes, Default::default())), launch).unwrap()
    }

    /// A rank that finds rank 0's token follows it from rank 0's step; one that finds another
    /// launch's file, or none, is told that the ranks must share the directory; one that runs
    /// another recipe is told so.
    #[test]
    fn a_rank_must_see_rank_zeros_directory() {
        let dir = std::env::temp_dir().join(format!("ember-world-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let recipe = "name = \"x\"";
        let crc = crc32c::crc32c(recipe.as_bytes());
        let msg = serde_json::json!({"token": "abc", "first_step": 7, "recipe": crc});
        let e = follow_within(&follower(&msg), &dir, recipe, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing") && e.contains("file system they share"),
            "{e}"
        );
        std::fs::write(dir.join(FILE), r#"{"token": "old"}"#).unwrap();
        let e = follow_within(&follower(&msg), &dir, recipe, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another launch's"), "{e}");
        std::fs::write(dir.join(FILE), r#"{"token": "abc"}"#).unwrap();
        assert_eq!(follow_within(&follower(&msg), &dir, recipe, 1).unwrap(), 7);
        let e = follow_within(&follower(&msg), &dir, "name = \"y\"", 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another recipe"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
