//! The one loop every job runs (burn-train's `Learner`, verl's `RayPPOTrainer.fit`): a job
//! supplies its set-up, its start, its step and its ending; [`train`] sets it up and starts it,
//! then owns the stepping from the first step to run (0, or the step after the resumed
//! checkpoint), the stop, and the clock. A step ends through [`Run::end_step`] (the row logged,
//! the checkpoint, the stop), and its phases are timed with [`Timings`] (verl's
//! `timing_s/<phase>`).

use crate::run::{Run, RunOptions};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// One step's metrics, `area/name` → value: the row that [`Run::end_step`] logs.
pub type Row = BTreeMap<String, f64>;

/// A training job the run loop drives; `'r` is the recipe's lifetime (a job may borrow it).
pub trait Job<'r>: Sized {
    /// The recipe a run of this job reads.
    type Recipe: ?Sized + 'r;
    /// What the run returns (and writes as `summary.json` through [`Run::finish`]).
    type Summary;

    /// Opens the run directory `out` and builds what the steps use (model, data, optimizer),
    /// resuming from its last checkpoint when `opts` asks.
    fn setup(recipe: &'r Self::Recipe, out: &'r Path, opts: &RunOptions) -> Result<Self>;

    /// What runs once before the first step (a warm-up, the first evaluation); none by default.
    fn start(self) -> Result<Self> {
        Ok(self)
    }

    /// The job's open run directory.
    fn run(&self) -> &Run;

    /// Step `step` (0-based) through to its end ([`Run::end_step`]); returns the job and
    /// whether the run stops after it (a stop signal or `--stop-after`, checkpoint written).
    fn step(self, step: usize) -> Result<(Self, bool)>;

    /// Ends the run after `seconds` (set-up included): the final evaluation and the summary;
    /// `interrupted` when a step asked the loop to stop.
    fn finish(self, interrupted: bool, seconds: f64) -> Result<Self::Summary>;
}

/// Runs a job of type `J` on `recipe` into `out`: [`Job::setup`], [`Job::start`], each step from
/// the run's first to its last, then [`Job::finish`] with the seconds since the set-up began.
pub fn train<'r, J: Job<'r>>(
    recipe: &'r J::Recipe,
    out: &'r Path,
    opts: &RunOptions,
) -> Result<J::Summary> {
    let started = Instant::now();
    let mut job = J::setup(recipe, out, opts)?.start()?;
    let (first, steps) = (job.run().first_step(), job.run().steps());
    let mut interrupted = false;
    for step in first..steps {
        let stop;
        (job, stop) = job.step(step)?;
        if stop {
            interrupted = true;
            break;
        }
    }
    job.finish(interrupted, started.elapsed().as_secs_f64())
}

/// The seconds of a step's named phases, logged as `timing_s/<phase>` (verl's keys).
#[derive(Debug, Default, Clone)]
pub struct Timings(Vec<(&'static str, f64)>);

impl Timings {
    /// Runs `phase` named `name` and records its seconds (added to an earlier phase of the
    /// same name).
    pub fn time<T>(&mut self, name: &'static str, phase: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = phase();
        self.add(name, t.elapsed().as_secs_f64());
        out
    }

    /// Adds `seconds` to phase `name`.
    pub fn add(&mut self, name: &'static str, seconds: f64) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, s)) => *s += seconds,
            None => self.0.push((name, seconds)),
        }
    }

    /// Writes every phase into `row` as `timing_s/<phase>` (added to a time the row holds).
    pub fn log(self, row: &mut Row) {
        for (name, seconds) in self.0 {
            Self::record(row, name, seconds);
        }
    }

    /// Adds `seconds` to phase `name` of `row` (`timing_s/<name>`): for a phase timed where
    /// only the row travels.
    pub fn record(row: &mut Row, name: &str, seconds: f64) {
        *row.entry(format!("timing_s/{name}")).or_insert(0.0) += seconds;
    }
}
