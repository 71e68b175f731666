//! An environment in any language: a program speaking JSON lines (through
//! [`crate::process::JsonLinesProcess`], with the external reward's timeout, crash and kill
//! handling).
//!
//! Requests, one line each: `{"op": "reset", "episodes": [{"id": 0, "seed": 42}, ...]}`, answered
//! `{"observations": ["...", ...]}`; `{"op": "step", "actions": [{"id": 0, "action": "..."},
//! ...]}`, answered `{"feedback": [{"observation": "...", "reward": 0.0, "done": false}, ...]}`,
//! one entry per episode in request order. The program must build the same episode from the
//! same seed. `examples/envs/guess_number.py` is the built-in guessing game written this way.
//! A feedback entry may also carry `"keep": false` (the turn leaves the update) and `"info":
//! {"name": number}` (logged as `env/<name>`). [`serve`] is the other side: any [`Environment`]
//! answered over the protocol (`ember gym worker` serves the kernel gym this way, so a recipe
//! can run it on another machine: `command = ["ssh", "host", "ember", "gym", "worker"]`).

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

/// One request of the protocol.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Reset { episodes: Vec<Episode> },
    Step { actions: Vec<Action> },
}

/// One action of a `step` request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Action {
    id: usize,
    action: String,
}

/// Answers the protocol's requests from `input` with `env`, one line each on `output`, until
/// the input ends.
///
/// # Errors
/// A request that is not the protocol's (named with its line number), the environment's error,
/// or the streams'.
pub fn serve(
    env: &mut dyn Environment,
    input: impl std::io::BufRead,
    mut output: impl std::io::Write,
) -> Result<(), EnvError> {
    let io = |e: std::io::Error| EnvError::Protocol(format!("environment protocol: {e}"));
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = serde_json::from_str(&line)
            .map_err(|e| EnvError::Protocol(format!("request on line {}: {e}", n + 1)))?;
        let answer = match req {
            Request::Reset { episodes } => {
                serde_json::json!({ "observations": env.reset(&episodes)? })
            }
            Request::Step { actions } => {
                let a: Vec<(usize, String)> =
                    actions.into_iter().map(|a| (a.id, a.action)).collect();
                serde_json::json!({ "feedback": env.step(&a)? })
            }
        };
        writeln!(output, "{answer}").map_err(io)?;
        output.flush().map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::builtin::GuessNumber;

    #[test]
    fn serve_answers_the_protocol() {
        let mut env = GuessNumber::new(9, 3);
        let input = "{\"op\": \"reset\", \"episodes\": [{\"id\": 0, \"seed\": 4}]}\n\n\
                     {\"op\": \"step\", \"actions\": [{\"id\": 0, \"action\": \"5\"}]}\n";
        let mut out = Vec::new();
        serve(&mut env, input.as_bytes(), &mut out).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["observations"].as_array().unwrap().len(), 1);
        let fb: Feedback = serde_json::from_value(lines[1]["feedback"][0].clone()).unwrap();
        assert!(fb.keep && fb.info.is_empty());
        let bad = serve(&mut env, "{\"op\": \"jump\"}\n".as_bytes(), Vec::new()).unwrap_err();
        assert!(bad.to_string().contains("line 1"), "{bad}");
    }
}
