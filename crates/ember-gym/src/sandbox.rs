//! A limited process: its own scratch directory as the working directory, an empty environment
//! (only `PATH`), no standard input, CPU time, address space, file size and open files bounded by
//! `prlimit`, a wall-clock deadline after which it is killed, at most [`OUTPUT_CAP`] bytes of
//! output kept, and no network where `unshare -rn` works (a new user and network namespace with
//! only a loopback device; [`Isolation`] says which applied).

use crate::error::GymError;
use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Files a sandboxed process may hold open (`prlimit --nofile`).
pub(crate) const MAX_FILES: u32 = 64;

/// Bytes of a process's output kept (the rest is read and dropped): enough for `objdump -d` of
/// the largest source the screen accepts.
pub const OUTPUT_CAP: usize = 8 << 20;

/// Limits of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// CPU seconds.
    pub cpu_s: u64,
    /// Wall-clock seconds before it is killed.
    pub wall_s: f64,
    /// Address space in bytes.
    pub memory: u64,
    /// Largest file it may write, in bytes.
    pub file_size: u64,
}

/// How a process was cut off from the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// A network namespace of its own (`unshare -rn`).
    Namespace,
    /// `unshare -rn` does not work on this machine: the candidate's symbols are the only bar
    /// (no socket call links).
    SymbolsOnly,
}

/// Whether `unshare -rn` works here (tried once per process).
pub fn isolation() -> Isolation {
    static WORKS: OnceLock<Isolation> = OnceLock::new();
    *WORKS.get_or_init(|| {
        let ok = Command::new("unshare")
            .args(["-rn", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Isolation::Namespace
        } else {
            Isolation::SymbolsOnly
        }
    })
}

/// What a finished process left.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Its exit status (`None`: killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Standard output, at most [`OUTPUT_CAP`] bytes.
    pub stdout: String,
    /// Standard error, at most [`OUTPUT_CAP`] bytes.
    pub stderr: String,
    /// Standard output was longer than [`OUTPUT_CAP`] (the rest was dropped).
    pub truncated: bool,
}

impl Finished {
    /// The signal that ended it, if one did.
    pub fn signal(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status.and_then(|s| s.signal())
    }
}

/// Runs `program args` in `dir` under `limits`.
///
/// # Errors
/// [`GymError::Spawn`] when the process cannot be started.
pub fn run(
    dir: &Path,
    program: &str,
    args: &[String],
    limits: &Limits,
) -> Result<Finished, GymError> {
    let mut argv: Vec<String> = Vec::new();
    if isolation() == Isolation::Namespace {
        argv.extend(["unshare".into(), "-rn".into()]);
    }
    argv.extend([
        "prlimit".into(),
        format!("--cpu={}", limits.cpu_s),
        format!("--as={}", limits.memory),
        format!("--fsize={}", limits.file_size),
        format!("--nofile={MAX_FILES}"),
        "--core=0".into(),
        "--".into(),
        program.into(),
    ]);
    argv.extend(args.iter().cloned());
    let start = Instant::now();
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| GymError::Spawn(format!("{program}: {e}")))?;
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    let deadline = Duration::from_secs_f64(limits.wall_s);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let join = |h: Option<std::thread::JoinHandle<String>>| {
        h.and_then(|h| h.join().ok()).unwrap_or_default()
    };
    let stdout = join(out);
    Ok(Finished {
        status,
        truncated: stdout.len() >= OUTPUT_CAP,
        stdout,
        stderr: join(err),
    })
}

/// Reads a pipe to its end on a thread, keeping the first [`OUTPUT_CAP`] bytes.
fn reader<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = OUTPUT_CAP.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}
