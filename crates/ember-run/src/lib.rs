//! The run kit every job shares: the run directory (no clobbering, resume checks), the metrics
//! log (`metrics.jsonl` appended per step; `metrics.csv` and `curves.png` rewritten at every
//! evaluation), atomic checkpoints, the progress line, and one end-of-step protocol:
//!
//! 1. log the step's row (and publish the CSV and the plot when the step evaluated);
//! 2. write a checkpoint when a stop was asked for (Ctrl-C, `--stop-after`), every
//!    `checkpoint_every` steps, and after the last step;
//! 3. after a stop, tell the user how to resume, and end the loop (the process exits 130).
//!
//! Built with the `dashboard` feature, a run on a terminal shows burn-train's dashboard instead
//! of the progress line (`dashboard.rs`).

pub mod checkpoint;
#[cfg(feature = "dashboard")]
mod dashboard;
mod job;
// The board and the holding of stderr serve the dashboard; without it only their tests use them.
#[cfg_attr(not(feature = "dashboard"), allow(dead_code))]
mod live;
mod metrics;
pub mod plot;
mod report;
mod run;
mod stop;
pub mod tensorboard;
mod world;
mod write;

#[cfg(feature = "dashboard")]
pub use dashboard::{on_forced_exit, restore_terminal};
pub use job::{Job, Row, Timings, drive};
pub use live::{LogSink, fmt_metric, notice, say};
pub use metrics::MetricsLog;
pub use report::{Counts, End, ReportTo, Reporter, Tracker};
pub use run::{MAX_NONFINITE_STEPS, Run, RunOptions, RunSpec, StepEnd};
pub use stop::{check_stop, request_stop, request_stop_by, stop_exit_code, stop_requested};
pub use write::write_atomic;

/// Without the `dashboard` feature there is no terminal to put back.
#[cfg(not(feature = "dashboard"))]
pub fn restore_terminal() {}

/// Without the `dashboard` feature nothing forces an exit.
#[cfg(not(feature = "dashboard"))]
pub fn on_forced_exit(_hook: fn()) {}

#[cfg(test)]
mod tests;
