//! The world an Ember policy acts in, below every recipe. Depends on the engine and the kernel
//! gym only.
//!
//! - `task`: tasks with hash-defined held-out splits: arithmetic and countdown, and datasets read
//!   as rows of one shape (`jsonl.rs` with chosen keys, chat `messages` and extra columns;
//!   `parquet.rs`, a Parquet file or a Hub dataset directory's `train` shards; `arrow.rs`, a
//!   `datasets` `save_to_disk` folder), each opened within its limits (`file.rs`, `DataError`),
//!   and the `Example` a task yields (`example.rs`).
//! - `reward`: verifiable rewards (answer extraction, exact match, countdown expressions, a
//!   format reward) and external ones (`reward/external.rs`: a JSON-lines reward process, and the
//!   Python adapter `python/ember_reward.py` that runs TRL-signature functions).
//! - `env`: batched multi-turn environments: the `Environment` trait and a turn's `Feedback`, the
//!   built-in `Calculator` and `GuessNumber`, `ExternalEnv` and `serve` (the protocol's other
//!   side), and the kernel gym as an environment with per-turn rewards (`kernel.rs`).
//! - `facts`: a corpus of fictitious facts for unlearning studies, split into forget and retain
//!   sets by person, and Carlini et al.'s exposure.
//! - `program`: program synthesis against a generated knowledge base (`kb.rs`), Neural Symbolic
//!   Machines' Lisp computer that names the words keeping a program valid (`lisp.rs`), the
//!   questions, their split, the incremental mask and the task as a single-turn environment.
//! - `process`: the JSON-lines process plumbing external rewards and environments share (writer
//!   thread, timeout, end of output noticed at once, the registry a second stop signal kills).
//!
//! And `expand_path`: `~`, `$VAR` and `${VAR:-default}` in recipe paths.

pub mod env;
pub mod facts;
pub mod process;
pub mod program;
pub mod reward;
pub mod task;

use std::path::PathBuf;

/// A path a recipe names that cannot be expanded.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// `~` was used and `HOME` is not set.
    #[error("`~` in a path needs HOME")]
    NoHome,
    /// A `${` without its `}`.
    #[error("unclosed `${{` in {0:?}")]
    Unclosed(String),
    /// A variable without a default that is not set.
    #[error("environment variable {name} (in {path:?}) is not set")]
    Unset {
        /// The variable.
        name: String,
        /// The path that names it.
        path: String,
    },
}

fn home() -> Result<String, PathError> {
    std::env::var("HOME").map_err(|_| PathError::NoHome)
}

/// Expands a leading `~/` and `$NAME` / `${NAME}` / `${NAME:-default}` environment variables
/// (an unset variable without a default is an error naming it).
pub fn expand_path(p: &str) -> Result<PathBuf, PathError> {
    let mut out = String::new();
    let mut rest = p;
    if let Some(r) = rest.strip_prefix("~/") {
        out += &home()?;
        out.push('/');
        rest = r;
    }
    while let Some(i) = rest.find('$') {
        out += &rest[..i];
        let tail = &rest[i + 1..];
        let (name, after) = if let Some(t) = tail.strip_prefix('{') {
            let end = t.find('}').ok_or_else(|| PathError::Unclosed(p.into()))?;
            (&t[..end], &t[end + 1..])
        } else {
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            (&tail[..end], &tail[end..])
        };
        let (name, default) = match name.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (name, None),
        };
        match (std::env::var(name), default) {
            (Ok(v), _) if !v.is_empty() => out += &v,
            (_, Some(d)) => match d.strip_prefix("~/") {
                Some(t) => {
                    out += &home()?;
                    out.push('/');
                    out += t;
                }
                None => out += d,
            },
            _ => {
                return Err(PathError::Unset {
                    name: name.into(),
                    path: p.into(),
                });
            }
        }
        rest = after;
    }
    out += rest;
    Ok(PathBuf::from(out))
}
