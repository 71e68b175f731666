//! What an evaluation takes and gives: the settings, the job and the report.

use crate::sandbox::{self, Isolation, Limits};
use crate::task::Task;
use crate::verdict::Verdict;
use serde::{Deserialize, Serialize};

/// One evaluation to make.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    /// The task.
    pub task: &'a Task,
    /// The candidate's source.
    pub code: String,
    /// Draws the hidden shapes and inputs.
    pub seed: u64,
}

/// One evaluation asked of a gym server over HTTP (`ember gym serve`'s `POST /v1/evaluate`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    /// The task's name.
    pub task: String,
    /// The kernel's C source.
    pub code: String,
    /// Draws the hidden shapes and inputs.
    pub seed: u64,
    /// Hidden shapes checked beside the prompt's.
    pub hidden_shapes: usize,
    /// CPU seconds the harness run may take (at most the server's `--max-cpu-s`).
    pub cpu_s: u64,
}

/// How the gym evaluates.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalConfig {
    /// Hidden shapes checked besides the visible ones.
    pub hidden_shapes: usize,
    /// Time the candidate against the reference (off: correctness only).
    pub time: bool,
    /// The compiler's limits.
    pub compile: Limits,
    /// The harness's limits (the candidate runs in it).
    pub run: Limits,
    /// The C compiler (`cc`, or `$CC`).
    pub cc: String,
}

impl Default for EvalConfig {
    fn default() -> Self {
        let gib = 1 << 30;
        Self {
            hidden_shapes: 3,
            time: true,
            compile: Limits {
                cpu_s: 30,
                wall_s: 60.0,
                memory: 2 * gib,
                file_size: 64 << 20,
            },
            run: Limits {
                cpu_s: 20,
                wall_s: 40.0,
                memory: 2 * gib,
                file_size: 1 << 20,
            },
            cc: std::env::var("CC").unwrap_or_else(|_| "cc".into()),
        }
    }
}

/// What one evaluation found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The task's name.
    pub task: String,
    /// The outcome.
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The reference's median CPU time at the timed shape, nanoseconds.
    pub ref_ns: Option<f64>,
    /// The candidate's median CPU time there.
    pub kernel_ns: Option<f64>,
    /// `ref_ns / kernel_ns`.
    pub speedup: Option<f64>,
    /// The share of the candidate's time spent in its own code rather than the task's library
    /// routines (KernelGYM's profiled coverage, Dr.Kernel §3.3 eq. 7).
    pub coverage: Option<f64>,
    /// The candidate's interquartile range over its median time.
    pub noise: Option<f64>,
    /// Timed repetitions of each.
    pub reps: Option<u32>,
    /// The kernel's process's CPU time over an empty request, subtracted from each of its timed
    /// calls (the least of 21, measured before the candidate ever ran).
    #[serde(default)]
    pub overhead_ns: Option<f64>,
    /// The shapes checked, visible first.
    pub shapes: Vec<Vec<i32>>,
    /// How the run was cut off from the network.
    pub isolation: Isolation,
    /// Seconds the evaluation took.
    pub seconds: f64,
}

impl Report {
    /// The report of a candidate that never reached the gym (an answer without code).
    pub fn unevaluated(task: &Task, verdict: Verdict) -> Self {
        Self::new(task, verdict)
    }

    pub(crate) fn new(task: &Task, verdict: Verdict) -> Self {
        Self {
            task: task.name.to_string(),
            verdict,
            ref_ns: None,
            kernel_ns: None,
            speedup: None,
            coverage: None,
            noise: None,
            reps: None,
            overhead_ns: None,
            shapes: Vec::new(),
            isolation: sandbox::isolation(),
            seconds: 0.0,
        }
    }
}
