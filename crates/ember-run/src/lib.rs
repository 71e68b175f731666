//! The run kit every job shares: the run directory (no clobbering, resume checks), the metrics
//! log (`metrics.jsonl` appended per step; `metrics.csv` and `curves.png` rewritten at every
//! evaluation), atomic checkpoints, the progress line, and one end-of-step protocol:
//!
//! 1. log the step's row (and publish the CSV and the plot when the step evaluated);
//! 2. write a checkpoint when a stop was asked for (a signal, `--stop-after`), every
//!    `checkpoint_every` steps, and after the last step;
//! 3. after a stop, tell the user how to resume, and end the loop (the process exits 128 + the
//!    signal, 130 for `--stop-after`).
//!
//! Built with the `dashboard` feature, a run on a terminal shows burn-train's dashboard instead
//! of the progress line (`dashboard.rs`).
//!
//! Modules (errors are `anyhow` context chains: every caller is a job at the binary's edge):
//! - `run`: `Run`, an open run directory: no clobbering without `--resume`/`--overwrite`, the
//!   recipe compared on resume, an exclusive `flock`, the progress line, the end of a step.
//! - `job`: the one job loop: the `Job` trait (a set-up, a start, a step and an end), `train`
//!   setting it up and stepping it from the first step to run to the last, a step's metrics `Row`, and `Timings` (verl's
//!   `timing_s/<phase>`).
//! - `metrics`: `metrics.jsonl`, `samples.jsonl`, `metrics.csv` and `curves.png`, the same scalars
//!   in TensorBoard's event file (`tensorboard`: a hand-written TFRecord writer); `plot`: the
//!   curves drawn with a built-in pixel font.
//! - `checkpoint`: atomic checkpoints (temporary directory, rename, then `latest`), each
//!   directory's checksums through `ember_train::manifest`, checked on read.
//! - `stop`: the stop flag that signals and the dashboard set, and the exit status.
//! - `live`: each step's metrics as dashboard metrics, stderr held while a dashboard is up;
//!   `dashboard` (feature `dashboard`): burn-train's terminal UI driven from the run's loop, its
//!   quit menu and kill mapped to the stop protocol.
//! - `world`: a multi-process run's directory: rank 0 writes `world.json` and sends its token,
//!   every other rank reads it back (no shared file system: stop at once) and writes nothing.
//! - `write`: files written atomically, with the path in the error.
//! - `report`: the trackers of `--report-to` (MLflow's REST API, trackio's HTTP API, verl's JSONL
//!   file), each on a worker thread behind a bounded queue with retries, so a tracker that is
//!   down never stops or slows a run.

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
pub use job::{Job, Row, Timings, train};
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
