//! Environments for multi-turn episodes: the policy acts (a turn of text), the environment
//! answers with an observation, a reward and whether the episode is over. Batched: a job keeps
//! many episodes in flight and steps those still running together.
//!
//! Episodes are named by a seed: an environment must build the same episode from the same seed
//! (so that runs and resumes are reproducible), and the held-out episodes are fixed by a hash of
//! the seed ([`EpisodeSource`]), whatever the run's seed, as the tasks' held-out splits are.
//! Built in: [`builtin::Calculator`] (tool use) and [`builtin::GuessNumber`] (feedback with the
//! reward at the end); [`external::ExternalEnv`] runs one in any language over JSON lines.

pub mod builtin;
pub mod external;
pub mod kernel;

use ember_engine::SplitMix64;

/// Why an environment failed.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The external environment's program failed (see [`crate::process::ProcessError`]).
    #[error(transparent)]
    Process(#[from] crate::process::ProcessError),
    /// A step for an episode that is not running, or an answer of the wrong shape.
    #[error("environment: {0}")]
    Protocol(String),
    /// The kernel gym could not evaluate (no C compiler, no scratch space); a candidate's own
    /// failures are verdicts, never this.
    #[error(transparent)]
    Gym(#[from] ember_gym::GymError),
}

/// One episode to start: the caller's id for it (unique among those in flight) and its seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Episode {
    /// The caller's id.
    pub id: usize,
    /// What the environment builds the episode from.
    pub seed: u64,
}

/// The environment's answer to one turn.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Feedback {
    /// Text appended to the context before the policy's next turn (empty when done).
    #[serde(default)]
    pub observation: String,
    /// Reward of this turn (NaN, ±∞, null or beyond ±1e9 mark the episode invalid, as for
    /// rewards).
    #[serde(default, deserialize_with = "reward_or_nan")]
    pub reward: f32,
    /// The episode is over.
    pub done: bool,
    /// The turn enters the update (`false`: rejected, e.g. by KernelGYM's profiling-based
    /// rejection sampling; it still counts in the estimator's baselines).
    #[serde(default = "yes")]
    pub keep: bool,
    /// Numbers the job averages over the step's turns and logs as `env/<name>` (the kernel
    /// gym's compile, correctness and hacking rates, speed-up, coverage).
    #[serde(default)]
    pub info: std::collections::BTreeMap<String, f64>,
}

fn yes() -> bool {
    true
}

impl Default for Feedback {
    fn default() -> Self {
        Self::new(String::new(), 0.0, false)
    }
}

impl Feedback {
    /// A kept turn's feedback without numbers.
    pub fn new(observation: impl Into<String>, reward: f32, done: bool) -> Self {
        Self {
            observation: observation.into(),
            reward,
            done,
            keep: true,
            info: std::collections::BTreeMap::new(),
        }
    }
}

/// A reward that may be null (invalid: NaN).
fn reward_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    let v: Option<f64> = serde::Deserialize::deserialize(d)?;
    Ok(v.map_or(f32::NAN, |x| x as f32))
}

/// An environment: starts episodes and answers the policy's turns, many episodes at once.
pub trait Environment {
    /// Starts `episodes`; returns each one's first observation (the prompt), in order.
    ///
    /// # Errors
    /// [`EnvError`] when the environment cannot start them.
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError>;

    /// One turn of each listed episode (`(id, action text)`); returns the feedback in order.
    /// An episode that got `done` is not stepped again.
    ///
    /// # Errors
    /// [`EnvError`] for an unknown id or a failing environment.
    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError>;

    /// A demonstration of episode `seed` for a supervised warm-up: the first observation, then
    /// the policy's turns and the environment's observations alternating (ending with a turn).
    /// `rng` may choose among ways to play. `None`: this environment has none.
    fn demonstration(&self, seed: u64, rng: &mut SplitMix64) -> Option<Vec<String>> {
        let _ = (seed, rng);
        None
    }
}

/// The episode seeds of a run: held out when a hash of the seed is 0 mod 10 (about one in ten),
/// so no run trains on them.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpisodeSource;

impl EpisodeSource {
    /// Whether `seed` names a held-out episode.
    pub fn held_out(seed: u64) -> bool {
        SplitMix64(seed ^ 0x0e75_eed5).next_u64().is_multiple_of(10)
    }

    /// `n` training seeds drawn from `rng`.
    pub fn train(rng: &mut SplitMix64, n: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let s = rng.next_u64();
            if !Self::held_out(s) {
                out.push(s);
            }
        }
        out
    }

    /// The first `n` held-out seeds (the same for every run).
    pub fn held_out_set(n: usize) -> Vec<u64> {
        (0u64..).filter(|s| Self::held_out(*s)).take(n).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_disjoint_and_fixed() {
        let eval = EpisodeSource::held_out_set(50);
        assert_eq!(eval.len(), 50);
        assert_eq!(eval, EpisodeSource::held_out_set(50));
        assert!(eval.iter().all(|s| EpisodeSource::held_out(*s)));
        let train = EpisodeSource::train(&mut SplitMix64(7), 500);
        assert!(train.iter().all(|s| !EpisodeSource::held_out(*s)));
        // About one in ten is held out.
        let share = (0..10_000u64)
            .filter(|s| EpisodeSource::held_out(*s))
            .count();
        assert!((800..1200).contains(&share), "{share}");
    }
}
