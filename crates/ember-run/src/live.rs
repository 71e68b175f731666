//! What the live view of a run shows, and where stderr goes while it is up.
//!
//! [`Board`] turns each step's metrics row into the dashboard's metrics: every key is
//! registered once, before its first value (burn-train's renderer thread panics on a value of
//! an unregistered metric), the run's two curve metrics first, and values that are not finite
//! left out of the plots.
//!
//! While a full-screen dashboard is up, anything written to stderr would scribble over it: the
//! run's own lines and the log records ([`LogSink`]) are held, and written out when it closes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// A dashboard is up (stderr is held).
static LIVE: AtomicBool = AtomicBool::new(false);
/// What was written to stderr while a dashboard was up, and the bytes dropped beyond the bound.
static HELD: Mutex<(Vec<u8>, usize)> = Mutex::new((Vec::new(), 0));
/// Held stderr is bounded (a chatty reward program cannot grow the process without limit).
const HELD_MAX: usize = 1 << 20;

/// Held from now on (a dashboard is up).
pub(crate) fn hold() {
    LIVE.store(true, Ordering::SeqCst);
}

/// True while a dashboard is up.
pub(crate) fn is_held() -> bool {
    LIVE.load(Ordering::SeqCst)
}

/// Keeps `bytes` for later when a dashboard is up; false when stderr is free.
fn keep(bytes: &[u8]) -> bool {
    if !is_held() {
        return false;
    }
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let room = HELD_MAX.saturating_sub(held.0.len());
    let take = bytes.len().min(room);
    held.0.extend_from_slice(&bytes[..take]);
    held.1 += bytes.len() - take;
    true
}

/// A line for stderr: held while a dashboard is up, written at once otherwise.
pub(crate) fn line(msg: &str) {
    if !keep(format!("{msg}\n").as_bytes()) {
        eprintln!("{msg}");
    }
}

/// Stops holding and writes out what was held (and how much was dropped).
pub(crate) fn release() {
    LIVE.store(false, Ordering::SeqCst);
    let (bytes, dropped) = {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut held.0), std::mem::take(&mut held.1))
    };
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(&bytes);
    if dropped > 0 {
        let _ = writeln!(err, "({dropped} more bytes of messages were dropped)");
    }
}

/// stderr for a logger (`env_logger`'s `Target::Pipe`): held while a dashboard is up.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogSink;

impl Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if keep(buf) {
            return Ok(buf.len());
        }
        std::io::stderr().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Without the `dashboard` feature there is no dashboard to open.
#[cfg(not(feature = "dashboard"))]
pub(crate) struct NoDashboard;

#[cfg(not(feature = "dashboard"))]
impl NoDashboard {
    pub fn open(_name: &str, _steps: usize, _done: usize, _curves: &[&str]) -> Option<Self> {
        None
    }

    pub fn step(&self, _done: usize, _row: &BTreeMap<String, f64>) {}

    pub fn note(&self, _msg: &str) {}

    pub fn close(&mut self) {}
}

/// A metric of the dashboard.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Metric {
    pub name: String,
    /// Larger is better (burn-train's summary marks the best value).
    pub higher_is_better: bool,
}

/// The dashboard's metrics, in the order they were first seen.
#[derive(Debug, Default)]
pub(crate) struct Board {
    known: BTreeSet<String>,
    first: Vec<String>,
}

/// What one step adds: metrics seen for the first time (register them first), then the values.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct StepView {
    pub new: Vec<Metric>,
    pub values: Vec<(String, f64)>,
}

impl Board {
    /// A board whose `first` metrics (the run's curves) lead the tabs.
    pub fn new(first: &[&str]) -> Self {
        Self {
            known: BTreeSet::new(),
            first: first.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The run's curves, registered before any value (they lead the tabs).
    pub fn curves(&mut self) -> Vec<Metric> {
        let first = self.first.clone();
        first.iter().filter_map(|k| self.know(k)).collect()
    }

    /// `key`'s metric when it is new.
    fn know(&mut self, key: &str) -> Option<Metric> {
        self.known.insert(key.to_string()).then(|| metric(key))
    }

    /// The metrics of one step's row: unknown keys registered (the curves first, then the row's
    /// order), then every finite value.
    pub fn step(&mut self, row: &BTreeMap<String, f64>) -> StepView {
        let mut view = StepView::default();
        let keys = self.first.iter().filter(|k| row.contains_key(*k));
        let keys = keys.chain(row.keys().filter(|k| !self.first.contains(k)));
        for key in keys.cloned().collect::<Vec<_>>() {
            view.new.extend(self.know(&key));
            let v = row[&key];
            if v.is_finite() {
                view.values.push((key.clone(), v));
            }
        }
        view
    }
}

/// A metric's place on the dashboard, from its name: losses, divergences, times and clipped or
/// skipped fractions are better small.
fn metric(key: &str) -> Metric {
    let lower = [
        "loss", "kl", "time", "timing", "clip", "skipped", "overflow", "nll",
    ];
    let leaf = key.rsplit('/').next().unwrap_or(key);
    let higher_is_better = !lower.iter().any(|w| key.starts_with(w) || leaf.contains(w));
    Metric {
        name: key.to_string(),
        higher_is_better,
    }
}

/// A notice for the user on stderr (a stop signal's), held while a dashboard is up.
pub fn notice(msg: &str) {
    line(msg);
}

/// A line on stderr for the user, unless `quiet` (the one place jobs print from).
pub fn say(quiet: bool, msg: &str) {
    if !quiet {
        line(msg);
    }
}

/// A metric for a human: fixed decimals, never a negative zero (`-0.0000` prints `0.0000`).
pub fn fmt_metric(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    match s.strip_prefix('-') {
        Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => rest.to_string(),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kv: &[(&str, f64)]) -> BTreeMap<String, f64> {
        kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn metrics_are_registered_once_before_their_values_curves_first() {
        let mut b = Board::new(&["reward/mean", "eval/accuracy"]);
        let v = b.step(&row(&[("actor/loss", 0.5), ("reward/mean", 0.25)]));
        let names: Vec<_> = v.new.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["reward/mean", "actor/loss"]);
        let names: Vec<_> = b.curves().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["eval/accuracy"]);
        assert_eq!(
            v.values,
            [
                ("reward/mean".to_string(), 0.25),
                ("actor/loss".to_string(), 0.5)
            ]
        );
        assert!(v.new[0].higher_is_better);
        assert!(!v.new[1].higher_is_better);
        // The held-out accuracy appears at its first evaluation; a value that is not finite is
        // registered but not plotted.
        let v = b.step(&row(&[
            ("actor/loss", f64::NAN),
            ("eval/accuracy", 0.75),
            ("reward/mean", 0.5),
            ("timing_s/step", 2.0),
        ]));
        let names: Vec<_> = v.new.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["timing_s/step"]);
        assert!(!v.new[0].higher_is_better);
        assert_eq!(
            v.values,
            [
                ("reward/mean".to_string(), 0.5),
                ("eval/accuracy".to_string(), 0.75),
                ("timing_s/step".to_string(), 2.0)
            ]
        );
        assert!(b.step(&row(&[("eval/accuracy", 0.8)])).new.is_empty());
    }

    #[test]
    fn stderr_is_held_while_live_and_bounded() {
        let mut sink = LogSink;
        hold();
        sink.write_all(b"a warning\n").unwrap();
        line("[run] a line");
        sink.write_all(&vec![b'x'; HELD_MAX]).unwrap();
        {
            let held = HELD.lock().unwrap();
            assert!(held.0.starts_with(b"a warning\n[run] a line\n"));
            assert_eq!(held.0.len(), HELD_MAX);
            assert_eq!(held.1, 23);
        }
        release();
        assert!(!is_held());
        assert_eq!(HELD.lock().unwrap().0.len(), 0);
    }
}
