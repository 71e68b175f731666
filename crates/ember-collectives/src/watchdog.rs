//! The collectives' time limit.

use std::time::Duration;

/// How long a rank waits for the others at one collective before it names the missing ones and
/// ends the world: 10 minutes, PyTorch's default for NCCL process groups. A step's work between
/// two collectives (generation, evaluation, rank 0's checkpoint) must fit in it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// `EMBER_DIST_TIMEOUT` (seconds) when set, else `default`.
///
/// # Errors
/// A value that is not a positive number of seconds.
pub fn timeout_from_env(default: Duration) -> Result<Duration, String> {
    match std::env::var("EMBER_DIST_TIMEOUT") {
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
            _ => Err(format!(
                "EMBER_DIST_TIMEOUT={v:?} is not a positive number of seconds"
            )),
        },
        Err(_) => Ok(default),
    }
}
