//! burn-train's terminal dashboard (`TuiMetricsRendererWrapper`) as the live view of a run,
//! driven from the run's own loop (`--features dashboard`; the text line stays for logs and CI).
//!
//! - Every metric of the step's row is a burn-train numeric metric ([`Feed`]); the progress is
//!   the run's steps.
//! - Its quit menu (`q`, then `s`) stops the run as Ctrl-C does: after the step, with a
//!   checkpoint. Its kill (`q`, then `k`) exits at once without one, as a second Ctrl-C does.
//! - burn-train's raw mode turns the terminal's signals off; they are turned back on, so Ctrl-C
//!   still reaches the run's handler.
//! - While it is up, stderr is held ([`crate::live`]) and written out when it closes.

use crate::live::{self, Board};
use burn_train::Interrupter;
use burn_train::metric::{
    MetricDefinition, MetricEntry, MetricId, NumericAttributes, NumericEntry, SerializedEntry,
};
use burn_train::renderer::tui::TuiMetricsRendererWrapper;
use burn_train::renderer::{MetricState, MetricsRenderer};
use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a forced exit runs first (the binary kills its reward programs).
static EXIT_HOOK: OnceLock<fn()> = OnceLock::new();

/// Sets what a forced exit (the dashboard's kill) runs before the process ends.
pub fn on_forced_exit(hook: fn()) {
    let _ = EXIT_HOOK.set(hook);
}

/// A burn-train renderer fed with the run's steps.
pub(crate) struct Feed<R> {
    renderer: R,
    board: Board,
    ids: HashMap<String, MetricId>,
    /// The run's label, and what follows it (the run's last message, or the stop).
    label: String,
    note: Option<String>,
    stopping: bool,
    steps: usize,
    done: usize,
}

impl<R: MetricsRenderer> Feed<R> {
    /// Registers the run's curves and starts the progress at `done` of `steps`.
    pub fn new(renderer: R, label: &str, steps: usize, done: usize, curves: &[&str]) -> Self {
        let mut feed = Self {
            renderer,
            board: Board::new(curves),
            ids: HashMap::new(),
            label: label.to_string(),
            note: None,
            stopping: false,
            steps,
            done,
        };
        let curves = feed.board.curves();
        feed.register(curves);
        feed.relabel();
        feed
    }

    /// Registers metrics with the renderer.
    fn register(&mut self, metrics: Vec<crate::live::Metric>) {
        for m in metrics {
            let id = MetricId::new(Arc::new(m.name.clone()));
            self.renderer.register_metric(MetricDefinition {
                metric_id: id.clone(),
                name: Arc::new(m.name.clone()),
                description: None,
                attributes: NumericAttributes {
                    unit: None,
                    higher_is_better: m.higher_is_better,
                }
                .into(),
            });
            self.ids.insert(m.name, id);
        }
    }

    /// Shows `note` after the label (the run's last message), unless the run is stopping.
    pub fn note(&mut self, note: &str) {
        self.note = Some(note.to_string());
        if !self.stopping {
            self.relabel();
        }
    }

    /// Says in the label that the run stops after this step.
    pub fn stopping(&mut self) {
        self.stopping = true;
        self.relabel();
    }

    /// The label above the progress (burn-train's `start` sets it; the progress is re-sent).
    fn relabel(&mut self) {
        let label = match (&self.note, self.stopping) {
            (_, true) => format!("{} · stopping after this step", self.label),
            (Some(note), false) => format!("{} · {note}", self.label),
            (None, false) => self.label.clone(),
        };
        self.renderer.start(1, 1, Some(self.steps), Some(&label));
        self.renderer.start_split("train", self.steps);
        self.renderer.update_split(self.done);
    }

    /// One step's row: its new metrics registered, then its values, then the progress.
    pub fn step(&mut self, done: usize, row: &BTreeMap<String, f64>) {
        let view = self.board.step(row);
        self.register(view.new);
        for (name, v) in view.values {
            let Some(id) = self.ids.get(&name).cloned() else {
                continue;
            };
            let text = SerializedEntry::new(crate::live::fmt_metric(v, 4), v.to_string());
            let entry = MetricEntry::new(id, text);
            self.renderer
                .update_train(MetricState::Numeric(entry, Some(NumericEntry::Value(v))));
        }
        self.done = done;
        self.renderer.update_split(done);
    }

    /// Re-sends the progress (the watcher's heartbeat: it panics once the user killed the run).
    fn ping(&mut self) {
        self.renderer.update_split(self.done);
    }
}

/// The dashboard of a run, up while it lives.
pub(crate) struct Dashboard {
    feed: Option<Arc<Mutex<Feed<TuiMetricsRendererWrapper>>>>,
    closing: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
}

impl Dashboard {
    /// Opens the dashboard when stdout and stderr are both terminals (and `TERM` is not `dumb`).
    pub fn open(name: &str, steps: usize, done: usize, curves: &[&str]) -> Option<Self> {
        let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
        if dumb || !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() {
            return None;
        }
        let interrupter = Interrupter::new();
        let tui = TuiMetricsRendererWrapper::new(interrupter.clone(), None);
        live::hold();
        let label = format!("{name} · q: stop or kill");
        let feed = Arc::new(Mutex::new(Feed::new(tui, &label, steps, done, curves)));
        let closing = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (feed, closing) = (feed.clone(), closing.clone());
            std::thread::Builder::new()
                .name("dashboard-watch".into())
                .spawn(move || watch(&feed, &closing, &interrupter))
                .ok()
        };
        Some(Self {
            feed: Some(feed),
            closing,
            watcher,
        })
    }

    /// Shows one step's row.
    pub fn step(&self, done: usize, row: &BTreeMap<String, f64>) {
        if let Some(feed) = &self.feed {
            guarded(|| lock(feed).step(done, row));
        }
    }

    /// Shows the run's latest message in the label.
    pub fn note(&self, msg: &str) {
        if let Some(feed) = &self.feed {
            guarded(|| lock(feed).note(msg));
        }
    }

    /// Closes the dashboard (the terminal is put back) and writes out the held stderr.
    pub fn close(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        if let Some(feed) = self.feed.take() {
            guarded(move || drop(feed));
        }
        live::release();
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a call into burn-train's renderer, which panics once the user chose "kill" in its
/// menu: then the process exits at once, as on a second Ctrl-C.
fn guarded(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        killed();
    }
}

/// The user killed the run from the dashboard: the terminal back, the held stderr out, the
/// exit hook, exit 130 (the latest checkpoint is kept; this step is not saved).
fn killed() -> ! {
    restore_terminal();
    eprintln!("killed from the dashboard: exiting without a checkpoint of this step");
    if let Some(hook) = EXIT_HOOK.get() {
        hook();
    }
    std::process::exit(130);
}

/// Every 200 ms until the dashboard closes: its quit menu becomes a stop request, a stop
/// request (from the menu or a signal) shows in its label, and a heartbeat finds a kill.
fn watch(feed: &Mutex<Feed<TuiMetricsRendererWrapper>>, closing: &AtomicBool, quit: &Interrupter) {
    let mut signals_on = false;
    let mut told = false;
    while !closing.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        if !signals_on {
            signals_on = terminal_signals_on();
        }
        if quit.should_stop() && !crate::stop::stop_requested() {
            crate::stop::request_stop();
        }
        if crate::stop::stop_requested() && !told {
            told = true;
            guarded(|| lock(feed).stopping());
        }
        guarded(|| lock(feed).ping());
    }
}

/// Turns the terminal's signals (Ctrl-C) back on once burn-train's renderer has set raw mode;
/// true once done (or when there is nothing to do).
#[cfg(unix)]
fn terminal_signals_on() -> bool {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let stdin = std::io::stdin();
    let Ok(mut t) = tcgetattr(&stdin) else {
        return true;
    };
    if t.local_modes.contains(LocalModes::ICANON) {
        return false; // raw mode is not set yet
    }
    t.local_modes |= LocalModes::ISIG;
    let _ = tcsetattr(&stdin, OptionalActions::Now, &t);
    true
}

#[cfg(not(unix))]
fn terminal_signals_on() -> bool {
    true
}

/// Puts the terminal back (raw mode off, main screen, no mouse capture, cursor shown) and
/// writes out the held stderr, when a dashboard is up; for an exit that skips its close.
pub fn restore_terminal() {
    if !live::is_held() {
        return;
    }
    use crossterm::event::DisableMouseCapture;
    use crossterm::terminal::{LeaveAlternateScreen, disable_raw_mode};
    let _ = disable_raw_mode();
    let _ = crossterm::execute!(
        std::io::stdout(),
        DisableMouseCapture,
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
    live::release();
}

#[cfg(test)]
mod tests;
