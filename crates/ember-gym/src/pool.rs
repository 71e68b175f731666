//! Evaluations spread over worker threads, each handing its job to an [`Executor`]: the local
//! one drives its own compiler and harness processes, so a kernel that crashes or hangs takes
//! down its own process and nothing else; a remote one (the `ember gym serve` client) sends the
//! job to another machine.

use crate::error::GymError;
use crate::eval::evaluate;
use crate::report::{EvalConfig, Job, Report};
use std::sync::Mutex;

/// Where evaluations run: this machine's processes ([`Local`]), another machine's gym, or a
/// GPU executor (`docs/src/kernel_gym.md` says what one needs).
pub trait Executor: Send + Sync {
    /// Evaluates one job; `slot` is the worker thread's index (a remote executor spreads the
    /// slots over its machines).
    ///
    /// # Errors
    /// [`GymError`] when the executor cannot evaluate at all (never for a bad kernel).
    fn evaluate(&self, job: &Job<'_>, slot: usize) -> Result<Report, GymError>;
}

/// Evaluations on this machine, each in processes of its own.
#[derive(Debug, Clone, Default)]
pub struct Local(pub EvalConfig);

impl Executor for Local {
    fn evaluate(&self, job: &Job<'_>, _slot: usize) -> Result<Report, GymError> {
        evaluate(job.task, &job.code, job.seed, &self.0)
    }
}

/// Evaluates `jobs` with `executor` on `workers` threads (at least one); the reports in the
/// jobs' order.
pub fn evaluate_all(
    jobs: &[Job<'_>],
    executor: &dyn Executor,
    workers: usize,
) -> Vec<Result<Report, GymError>> {
    let next = Mutex::new(0usize);
    let slots: Vec<Mutex<Option<Result<Report, GymError>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for slot in 0..workers.clamp(1, jobs.len().max(1)) {
            let (next, slots) = (&next, &slots);
            s.spawn(move || {
                loop {
                    let i = {
                        let mut n = next.lock().unwrap_or_else(|p| p.into_inner());
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(job) = jobs.get(i) else { break };
                    let r = executor.evaluate(job, slot);
                    *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .unwrap_or_else(|| Err(GymError::Spawn("a worker thread ended early".into())))
        })
        .collect()
}
