//! An environment in any language: a program speaking JSON lines (through
//! [`crate::process::JsonLinesProcess`], with the external reward's timeout, crash and kill
//! handling).
//!
//! Requests, one line each: `{"op": "reset", "episodes": [{"id": 0, "seed": 42}, ...]}`, answered
//! `{"observations": ["...", ...]}`; `{"op": "step", "actions": [{"id": 0, "action": "..."},
//! ...]}`, answered `{"feedback": [{"observation": "...", "reward": 0.0, "done": false}, ...]}`,
//! one entry per episode in request order. The program must build the same episode from the
//! same seed. `examples/envs/guess_number.py` is the built-in guessing game written this way.

use super::{EnvError, Environment, Episode, Feedback};
use crate::process::JsonLinesProcess;
use serde::{Deserialize, Serialize};

/// The recipe's `[env.external]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalEnvSpec {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Seconds to wait for each answer.
    #[serde(default = "sixty")]
    pub timeout_s: f64,
}

fn sixty() -> f64 {
    60.0
}

/// A running external environment.
pub struct ExternalEnv {
    process: JsonLinesProcess,
}

impl ExternalEnv {
    /// Starts the program.
    ///
    /// # Errors
    /// [`EnvError::Process`] when it cannot be started.
    pub fn spawn(spec: &ExternalEnvSpec) -> Result<Self, EnvError> {
        Ok(Self {
            process: JsonLinesProcess::spawn(&spec.command, spec.timeout_s, "env.external")?,
        })
    }

    fn answer<T: for<'de> Deserialize<'de>>(
        &mut self,
        request: &serde_json::Value,
        key: &str,
        n: usize,
        what: &str,
    ) -> Result<Vec<T>, EnvError> {
        let line = self.process.request(&request.to_string(), what)?;
        // `NaN`/`Infinity` (as Python's `json` writes them) become null: an invalid reward.
        let cleaned = crate::reward::external::nulls_for_non_finite(&line);
        let v: serde_json::Value = serde_json::from_str(&cleaned).map_err(|e| {
            self.process.fail(format!(
                "answer to {what} is not JSON ({e}): {:?}",
                line.chars().take(200).collect::<String>()
            ))
        })?;
        let items: Vec<T> = v
            .get(key)
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| {
                self.process
                    .fail(format!("`{key}` of the answer to {what}: {e}"))
            })?
            .ok_or_else(|| {
                self.process
                    .fail(format!("the answer to {what} has no `{key}`"))
            })?;
        if items.len() != n {
            return Err(self
                .process
                .fail(format!("answered {} `{key}` to {what} of {n}", items.len()))
                .into());
        }
        Ok(items)
    }
}

impl Environment for ExternalEnv {
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError> {
        let req = serde_json::json!({ "op": "reset", "episodes": episodes });
        let what = format!("reset ({} episodes)", episodes.len());
        self.answer(&req, "observations", episodes.len(), &what)
    }

    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError> {
        let items: Vec<serde_json::Value> = actions
            .iter()
            .map(|(id, action)| serde_json::json!({ "id": id, "action": action }))
            .collect();
        let req = serde_json::json!({ "op": "step", "actions": items });
        let what = format!("step ({} episodes)", actions.len());
        self.answer(&req, "feedback", actions.len(), &what)
    }
}
