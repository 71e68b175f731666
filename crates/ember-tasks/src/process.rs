//! A helper program speaking JSON lines: one request line on its stdin, one answer line on its
//! stdout. External rewards and external environments both run through it: a writer thread (so a
//! program that does not read cannot block past the timeout), a reader thread that reports the
//! end of the program's output at once, a timeout per request, and a registry of live programs
//! that a second stop signal kills ([`kill_all`]). On Unix each program leads a process group of
//! its own, and ending it kills the whole group: what it started (a shell's children, a
//! simulator it launched) does not outlive the run, and a terminal's Ctrl-C reaches the trainer
//! alone, which finishes its step before the programs are stopped.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Why a helper program could not be started or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program could not be started.
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The command or its timeout is unusable, or the program exited, timed out or answered
    /// something unusable.
    #[error("`{command}`: {reason}")]
    Protocol {
        /// The command line.
        command: String,
        /// What went wrong.
        reason: String,
    },
}

/// A running helper program.
pub struct JsonLinesProcess {
    /// Shared with [`LIVE`], so that [`kill_all`] can end it from the signal thread.
    child: Arc<Mutex<Child>>,
    requests: Option<Sender<String>>,
    lines: Receiver<std::io::Result<String>>,
    timeout: Duration,
    command: String,
}

/// Every helper program still running.
static LIVE: Mutex<Vec<Weak<Mutex<Child>>>> = Mutex::new(Vec::new());

/// Kills every helper program still running (a second stop signal exits at once, without the
/// graceful path's `Drop`). A program whose lock is held at that moment (reading its exit status)
/// is skipped; it sees end-of-input when the process exits.
pub fn kill_all() {
    let Ok(live) = LIVE.try_lock() else {
        return;
    };
    for child in live.iter().filter_map(Weak::upgrade) {
        if let Ok(mut c) = child.try_lock() {
            end(&mut c);
        }
    }
}

/// Kills `child`'s process group (Unix: the program and everything it started), then the
/// program itself, and reaps it.
fn end(child: &mut Child) {
    #[cfg(unix)]
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl JsonLinesProcess {
    /// Starts `command` (program and arguments); `key` names the recipe key in errors.
    pub fn spawn(command: &[String], timeout_s: f64, key: &str) -> Result<Self, ProcessError> {
        Self::spawn_as(command, &command.join(" "), timeout_s, key)
    }

    /// [`Self::spawn`], naming the program `display` in errors (instead of its command line).
    pub fn spawn_as(
        command: &[String],
        display: &str,
        timeout_s: f64,
        key: &str,
    ) -> Result<Self, ProcessError> {
        let line = display.to_string();
        let Some(program) = command.first() else {
            return Err(ProcessError::Protocol {
                command: line,
                reason: format!("{key}.command is empty"),
            });
        };
        let timeout = match Duration::try_from_secs_f64(timeout_s) {
            Ok(t) if timeout_s > 0.0 => t,
            _ => {
                return Err(ProcessError::Protocol {
                    command: line,
                    reason: format!(
                        "{key}.timeout_s = {timeout_s} must be a number of seconds > 0"
                    ),
                });
            }
        };
        let mut cmd = Command::new(program);
        cmd.args(&command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            command: line.clone(),
            source,
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let child = Arc::new(Mutex::new(child));
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&child));
        }
        let (tx, rx) = channel();
        let requests = stdin.map(|stdin| {
            let (req_tx, req_rx) = channel::<String>();
            let errors = tx.clone();
            std::thread::spawn(move || writer(stdin, &req_rx, &errors));
            req_tx
        });
        if let Some(out) = stdout {
            std::thread::spawn(move || reader(BufReader::new(out), &tx));
        }
        Ok(Self {
            child,
            requests,
            lines: rx,
            timeout,
            command: line,
        })
    }

    /// The command line.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// An error about this program.
    pub fn fail(&self, reason: String) -> ProcessError {
        ProcessError::Protocol {
            command: self.command.clone(),
            reason,
        }
    }

    /// Sends `request` (one JSON value, without its newline) and returns the answer line; `what`
    /// names the request in errors (`step 3 (12 items)`). The timeout covers writing the request
    /// and reading the answer.
    pub fn request(&mut self, request: &str, what: &str) -> Result<String, ProcessError> {
        self.nothing_unasked(what)?;
        let sent = self
            .requests
            .as_ref()
            .map(|r| r.send(format!("{request}\n")).is_ok());
        if sent != Some(true) {
            return Err(self.fail("its stdin is closed".into()));
        }
        match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(e)) => Err(self.output_error(&e, what)),
            Err(RecvTimeoutError::Timeout) => Err(self.fail(format!(
                "no answer within {:.1} s for {what}",
                self.timeout.as_secs_f64()
            ))),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.exit_status();
                Err(self.fail(format!("{status} before answering {what}")))
            }
        }
    }

    /// An error for a line the program wrote before `what` was asked: each request gets exactly
    /// one line, so a second line (a debugging `print`) would otherwise be read as the answer to
    /// the next request, a step late.
    fn nothing_unasked(&mut self, what: &str) -> Result<(), ProcessError> {
        match self.lines.try_recv() {
            Ok(Ok(line)) => Err(self.fail(format!(
                "wrote a line nobody asked for before {what}: {:?}; a helper answers each \
                 request with one line on stdout (write anything else to stderr)",
                line.chars().take(200).collect::<String>()
            ))),
            Ok(Err(e)) => Err(self.output_error(&e, what)),
            Err(_) => Ok(()),
        }
    }

    /// The error for a failed read of the program's output while waiting for `what`.
    fn output_error(&mut self, e: &std::io::Error, what: &str) -> ProcessError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            let status = self.exit_status();
            self.fail(format!("{status} before answering {what}"))
        } else {
            self.fail(e.to_string())
        }
    }

    /// How the program ended, waiting up to a second for it to exit after closing its output.
    fn exit_status(&mut self) -> String {
        for _ in 0..100 {
            let status = self
                .child
                .lock()
                .ok()
                .and_then(|mut c| c.try_wait().ok().flatten());
            if let Some(s) = status {
                return format!("exited ({s})");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "closed its stdout".into()
    }
}

/// The longest answer line read (64 MiB): a program that writes without a newline is stopped
/// by an error, not by the trainer's memory.
pub const MAX_LINE: usize = 64 << 20;

/// Sends each line of the program's output to `tx` (an error for a line that is not UTF-8, and
/// a last error for a line longer than [`MAX_LINE`]), then the end of its output: the program
/// exited (the writer thread still holds a sender, so the channel alone would not tell
/// `request` before its timeout).
fn reader(mut out: impl BufRead, tx: &Sender<std::io::Result<String>>) {
    loop {
        let line = match read_line(&mut out, MAX_LINE) {
            Ok(None) => break,
            Ok(Some(bytes)) => String::from_utf8(bytes).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "its answer is not UTF-8 text",
                )
            }),
            Err(e) => {
                let _ = tx.send(Err(std::io::Error::new(
                    e.kind(),
                    format!("reading its answer failed: {e}"),
                )));
                return;
            }
        };
        if tx.send(line).is_err() {
            return;
        }
    }
    let _ = tx.send(Err(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "closed its stdout",
    )));
}

/// One line of `r` without its `\n` (or `\r\n`); `None` at the end of the output; an error
/// once the line passes `max` bytes.
fn read_line(r: &mut impl BufRead, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        line.extend_from_slice(&chunk[..take]);
        r.consume(take + usize::from(done));
        if line.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("an answer line longer than {} MiB", max >> 20),
            ));
        }
        if done {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(line));
        }
    }
}

/// Writes each request to the program's stdin; a failed write is reported on the answer
/// channel, where [`JsonLinesProcess::request`] waits.
fn writer(
    mut stdin: ChildStdin,
    requests: &Receiver<String>,
    errors: &Sender<std::io::Result<String>>,
) {
    for request in requests {
        if let Err(e) = stdin
            .write_all(request.as_bytes())
            .and_then(|()| stdin.flush())
        {
            let _ = errors.send(Err(std::io::Error::new(
                e.kind(),
                format!("writing the request failed ({e}); did it exit?"),
            )));
            return;
        }
    }
}

impl Drop for JsonLinesProcess {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Ok(mut c) = self.child.lock() {
            end(&mut c);
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Whether `pid` runs (a zombie waiting to be reaped does not).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
    }

    /// A program that starts a child of its own (a `sleep` in the background), then answers:
    /// ending the program ends its child too (the child used to outlive the run).
    #[test]
    fn ending_a_program_ends_what_it_started() {
        let dir = std::env::temp_dir().join(format!("ember-group-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pid");
        let script = format!(
            "sleep 300 & echo $! > {}; while read l; do echo '{{}}'; done",
            pidfile.display()
        );
        let command = ["sh".to_string(), "-c".to_string(), script];
        let mut p = JsonLinesProcess::spawn(&command, 10.0, "test").unwrap();
        assert_eq!(p.request("{}", "a request").unwrap(), "{}");
        let pid: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(alive(pid));
        drop(p);
        let gone = (0..300).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            !alive(pid)
        });
        std::fs::remove_dir_all(&dir).ok();
        assert!(gone, "the program's child {pid} outlived it");
    }

    /// Lines end at `\n` or `\r\n`, the last may lack one, and a line past the bound is an
    /// error instead of memory.
    #[test]
    fn lines_are_read_up_to_a_bound() {
        let mut r = std::io::Cursor::new(b"ab\r\n\ncd\nlast".to_vec());
        let got: Vec<_> = std::iter::from_fn(|| read_line(&mut r, 8).unwrap()).collect();
        assert_eq!(got, [&b"ab"[..], b"", b"cd", b"last"]);
        let mut r = std::io::BufReader::with_capacity(3, &b"0123456789\nok\n"[..]);
        let e = read_line(&mut r, 8).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
    }

    /// A program that answers twice (a debugging `print` on stdout): the second request names
    /// the stray line instead of taking it as its answer (it did, a step late).
    #[test]
    fn a_line_nobody_asked_for_is_named() {
        let script = "while read l; do echo '{\"n\": 1}'; echo 'debug'; done";
        let command = ["sh".to_string(), "-c".to_string(), script.to_string()];
        let mut p = JsonLinesProcess::spawn(&command, 10.0, "test").unwrap();
        assert_eq!(p.request("{}", "step 1").unwrap(), r#"{"n": 1}"#);
        std::thread::sleep(Duration::from_millis(300));
        let e = p.request("{}", "step 2").unwrap_err().to_string();
        assert!(
            e.contains("nobody asked for before step 2: \"debug\""),
            "{e}"
        );
    }

    /// A program that writes without end: an error once the line passes the bound, and the
    /// trainer's memory stays bounded by it.
    #[test]
    fn an_endless_line_is_an_error() {
        let command = [
            "sh".to_string(),
            "-c".to_string(),
            "read l; yes | tr -d '\\n'".to_string(),
        ];
        let mut p = JsonLinesProcess::spawn(&command, 60.0, "test").unwrap();
        let e = p.request("{}", "step 1").unwrap_err().to_string();
        assert!(e.contains("longer than 64 MiB"), "{e}");
    }
}
