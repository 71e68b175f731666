//! The stop flag that signals and the dashboard set, the signal it came from (the exit
//! status), and the check of phases that write no checkpoint of their own.

use anyhow::Result;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Asks a running job to stop after its current step and write a checkpoint (Ctrl-C). Returns
/// true when a stop had already been asked for.
pub fn request_stop() -> bool {
    STOP.swap(true, Ordering::SeqCst)
}

/// [`request_stop`] on signal `signal` (SIGINT 2, SIGHUP 1, SIGTERM 15), remembered for the exit
/// status ([`stop_exit_code`]).
pub fn request_stop_by(signal: i32) -> bool {
    let again = request_stop();
    if !again {
        STOP_SIGNAL.store(signal, Ordering::SeqCst);
    }
    again
}

/// The exit status of a run that stopped early with a checkpoint: 128 + the signal that asked
/// for the stop (the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), and
/// 130 for `--stop-after`.
pub fn stop_exit_code() -> i32 {
    exit_code_for(STOP_SIGNAL.load(Ordering::SeqCst))
}

/// 128 + `signal`; 130 (SIGINT's) when no signal asked for the stop.
pub(crate) fn exit_code_for(signal: i32) -> i32 {
    match signal {
        0 => 130,
        s => 128 + s,
    }
}

/// True once a stop was asked for.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// An error once a stop was asked for, for the phases that write no checkpoint of their own (a
/// warm-up, a pre-training): they end at their next step instead of running on, and the run
/// exits with the stop's status (a long warm-up used to ignore SIGTERM until it finished).
pub fn check_stop(what: &str, step: usize, total: usize) -> Result<()> {
    if stop_requested() {
        anyhow::bail!(
            "stopped during {what} after {step} of {total} steps; it writes no checkpoint, so the \
             next run starts it again"
        );
    }
    Ok(())
}
