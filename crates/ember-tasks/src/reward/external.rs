//! External reward functions: a subprocess started once per run speaking JSON lines, and the
//! Python adapter that runs TRL-style functions over the same protocol.

use crate::process::JsonLinesProcess;
use crate::process::ProcessError;
use serde::{Deserialize, Serialize};

/// An external reward function: a subprocess started once per run that reads one JSON request
/// per line on stdin and answers one JSON line on stdout.
///
/// Request: `{"step": 3, "items": [{"prompt": "..", "completion": "..", "answer": "..",
/// "group": 0}, ...]}`. Answer: `{"rewards": [1.0, 0.0, null, ...]}`, one per item; `null`,
/// `NaN` or ±`Infinity` mark a sample invalid (it is masked and counted, never trained on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalSpec {
    /// Program and arguments.
    pub command: Vec<String>,
    /// Weight of its reward in the sum.
    #[serde(default = "one")]
    pub weight: f32,
    /// Seconds to wait for each answer.
    #[serde(default = "sixty")]
    pub timeout_s: f64,
}

fn one() -> f32 {
    1.0
}
fn sixty() -> f64 {
    60.0
}

/// Why an external reward failed: the helper program's error ([`ProcessError`]).
pub type RewardError = ProcessError;

/// Python reward functions with TRL's signature, run by Ember's adapter
/// (`python/ember_reward.py`, built into the binary) over the same protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonSpec {
    /// `path/to/module.py:function[=weight]` (or `package.module:function`), one per function;
    /// `~` and `$VAR` are expanded.
    pub functions: Vec<String>,
    /// The interpreter (`~` and `$VAR` are expanded).
    #[serde(default = "python3")]
    pub python: String,
    /// Seconds to wait for each answer.
    #[serde(default = "sixty")]
    pub timeout_s: f64,
}

fn python3() -> String {
    "python3".into()
}

/// The adapter's source, run with `python -c`.
pub const PYTHON_ADAPTER: &str = include_str!("../../python/ember_reward.py");

impl PythonSpec {
    /// The external program that runs the functions: `python -u -c <adapter> functions…`.
    pub fn external(&self) -> Result<ExternalSpec, RewardError> {
        let expand = |s: &str| {
            crate::expand_path(s)
                .map(|p| p.to_string_lossy().into_owned())
                .map_err(|e| ProcessError::Protocol {
                    command: "reward.python".into(),
                    reason: format!("{e:#}"),
                })
        };
        if self.functions.is_empty() {
            return Err(ProcessError::Protocol {
                command: "reward.python".into(),
                reason: "reward.python.functions is empty".into(),
            });
        }
        let mut command = vec![
            expand(&self.python)?,
            "-u".into(),
            "-c".into(),
            PYTHON_ADAPTER.into(),
        ];
        for f in &self.functions {
            command.push(expand(f)?);
        }
        Ok(ExternalSpec {
            command,
            weight: 1.0,
            timeout_s: self.timeout_s,
        })
    }
}

/// One item of a request.
#[derive(Debug, Clone, Serialize)]
pub struct RewardItem<'a> {
    /// The question: the task's question text, or a chat line's last user message (not the
    /// rendered template).
    pub prompt: &'a str,
    /// The decoded completion.
    pub completion: &'a str,
    /// The reference answer.
    pub answer: &'a str,
    /// Index of the prompt in the step (samples of one prompt share it).
    pub group: usize,
    /// The dataset line's other columns.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub columns: &'a serde_json::Map<String, serde_json::Value>,
    /// A chat dataset's conversation as `[role, content]` pairs (the Python adapter then
    /// shapes prompts and completions as TRL does for conversational data); empty otherwise.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub messages: &'a [(String, String)],
    /// The completion's token ids (TRL's `completion_ids`).
    pub completion_ids: &'a [u32],
}

/// Where training stands, for reward functions that shape by progress (TRL's `trainer_state`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TrainerState {
    /// Optimizer steps completed before this batch.
    pub global_step: usize,
    /// The run's total steps.
    pub max_steps: usize,
    /// Passes over the training prompts completed (fractional).
    pub epoch: f64,
}

/// An answer: a reward per item (NaN when invalid) and, optionally, named components (each a
/// value per item, NaN when it does not apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scores {
    /// The reward of each item.
    pub rewards: Vec<f32>,
    /// Named parts of the reward (the Python adapter's functions), in the answer's order.
    pub components: Vec<(String, Vec<f32>)>,
    /// Scalars the functions logged for this batch (TRL's `log_metric`), by name.
    pub metrics: Vec<(String, f64)>,
}

/// A running external reward process.
pub struct ExternalReward {
    process: JsonLinesProcess,
}

impl ExternalReward {
    /// Starts the program of `reward.external`.
    pub fn spawn(spec: &ExternalSpec) -> Result<Self, RewardError> {
        Self::spawn_for(spec, "reward.external")
    }

    /// Starts the program; `key` names the recipe table in errors.
    pub fn spawn_for(spec: &ExternalSpec, key: &str) -> Result<Self, RewardError> {
        Ok(Self {
            process: JsonLinesProcess::spawn(&spec.command, spec.timeout_s, key)?,
        })
    }

    /// Starts the Python adapter for `spec` and checks, before any work, that it loaded every
    /// function and that their names are usable metric names.
    pub fn spawn_python(spec: &PythonSpec) -> Result<Self, RewardError> {
        let ext = spec.external()?;
        let display = format!(
            "{} ember_reward.py {}",
            spec.python,
            spec.functions.join(" ")
        );
        let mut process =
            JsonLinesProcess::spawn_as(&ext.command, &display, spec.timeout_s, "reward.python")?;
        let line = process.request(r#"{"op": "describe"}"#, "the list of its functions")?;
        let names: Vec<String> = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| serde_json::from_value(v.get("functions")?.clone()).ok())
            .ok_or_else(|| process.fail(format!("unexpected answer to `describe`: {line:?}")))?;
        for n in &names {
            check_component_name(n).map_err(|reason| process.fail(reason))?;
        }
        Ok(Self { process })
    }

    /// Scores one batch: one reward per item, NaN for an invalid sample, and the answer's
    /// components.
    pub fn score(&mut self, step: usize, items: &[RewardItem]) -> Result<Scores, RewardError> {
        self.score_at(step, items, None)
    }

    /// [`score`](Self::score) with the run's progress sent as the request's `trainer_state`.
    pub fn score_at(
        &mut self,
        step: usize,
        items: &[RewardItem],
        state: Option<TrainerState>,
    ) -> Result<Scores, RewardError> {
        let mut request = serde_json::json!({ "step": step, "items": items });
        if let Some(st) = state {
            request["trainer_state"] = serde_json::json!(st);
        }
        let request = request.to_string();
        let what = format!("step {step} ({} items)", items.len());
        let line = self.process.request(&request, &what)?;
        parse_rewards(&line, items.len()).map_err(|reason| self.process.fail(reason))
    }
}

/// A reward component's name becomes the metric `reward/<name>`: 1 to 64 letters (any script),
/// digits, `_`, `-` or `.`.
fn check_component_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= 64
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || "_-.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "component name {name:?} must be 1-64 letters, digits, `_`, `-` or `.`"
        ))
    }
}

/// The most components or metrics one answer may name: each becomes a metric column of every
/// log, so a program that invents names without end would grow them without end.
pub const MAX_NAMES: usize = 64;

fn check_count(what: &str, n: usize) -> Result<(), String> {
    if n > MAX_NAMES {
        return Err(format!(
            "`{what}` names {n} entries; at most {MAX_NAMES} (each is a metric of every log)"
        ));
    }
    Ok(())
}

/// `line` with the bare JavaScript numbers `NaN`, `Infinity` and `-Infinity` (which Python's
/// `json` writes) replaced by `null` outside strings.
pub(crate) fn nulls_for_non_finite(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if let Some(token) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|t| rest.starts_with(t))
        {
            out.push_str("null");
            rest = &rest[token.len()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Parses `{"rewards": [...], "components": {"name": [...]}}` (components optional) with
/// `expected` entries per list (`null`/`NaN`/`Infinity` become NaN).
pub fn parse_rewards(line: &str, expected: usize) -> Result<Scores, String> {
    let cleaned = nulls_for_non_finite(line);
    let v: serde_json::Value = serde_json::from_str(&cleaned).map_err(|e| {
        format!(
            "answer is not JSON ({e}): {:?}",
            line.chars().take(200).collect::<String>()
        )
    })?;
    let numbers = |what: &str, v: Option<&serde_json::Value>| -> Result<Vec<f32>, String> {
        let arr = v
            .and_then(|r| r.as_array())
            .ok_or_else(|| format!("answer has no `{what}` array"))?;
        if arr.len() != expected {
            return Err(format!(
                "answered {} values in `{what}` for {expected} completions",
                arr.len()
            ));
        }
        arr.iter()
            .enumerate()
            .map(|(i, x)| match x {
                serde_json::Value::Null => Ok(f32::NAN),
                serde_json::Value::Number(n) => Ok(n.as_f64().map_or(f32::NAN, |f| f as f32)),
                other => Err(format!("value {i} of `{what}` is {other}, not a number")),
            })
            .collect()
    };
    let rewards = numbers("rewards", v.get("rewards"))?;
    let mut components = Vec::new();
    match v.get("components") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) => {
            check_count("components", m.len())?;
            for (name, values) in m {
                check_component_name(name)?;
                components.push((
                    name.clone(),
                    numbers(&format!("components.{name}"), Some(values))?,
                ));
            }
        }
        Some(other) => return Err(format!("`components` is {other}, not an object")),
    }
    let mut metrics = Vec::new();
    match v.get("metrics") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(m)) => {
            check_count("metrics", m.len())?;
            for (name, x) in m {
                check_component_name(name)?;
                let x = match x {
                    serde_json::Value::Null => f64::NAN,
                    serde_json::Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                    other => return Err(format!("metric {name:?} is {other}, not a number")),
                };
                metrics.push((name.clone(), x));
            }
        }
        Some(other) => return Err(format!("`metrics` is {other}, not an object")),
    }
    Ok(Scores {
        rewards,
        components,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_answers_parse() {
        assert_eq!(
            parse_rewards(r#"{"rewards": [1, 0.5]}"#, 2)
                .unwrap()
                .rewards,
            vec![1.0, 0.5]
        );
        let v = parse_rewards(r#"{"rewards": [null, NaN, Infinity]}"#, 3).unwrap();
        assert!(v.rewards.iter().all(|x| x.is_nan()));
        assert!(
            parse_rewards(r#"{"rewards": [1]}"#, 2)
                .unwrap_err()
                .contains("1 values in `rewards` for 2")
        );
        let s = parse_rewards(
            r#"{"rewards": [1, null], "components": {"acc": [1, null], "fmt": [0, 0]}}"#,
            2,
        )
        .unwrap();
        assert_eq!(s.components[0].0, "acc");
        assert_eq!(s.components[1].1, vec![0.0, 0.0]);
        assert!(s.components[0].1[1].is_nan());
        // Only bare tokens are numbers: a name holding "NaN" is kept.
        let s = parse_rewards(
            r#"{"rewards": [NaN, 1], "components": {"isNaN": [Infinity, -Infinity]}}"#,
            2,
        )
        .unwrap();
        assert!(s.rewards[0].is_nan() && s.rewards[1] == 1.0);
        assert_eq!(s.components[0].0, "isNaN");
        assert!(s.components[0].1.iter().all(|x| x.is_nan()));
        assert!(parse_rewards(r#"{"rewards": [1], "components": {"précision": [1]}}"#, 1).is_ok());
        for bad in [
            r#"{"rewards": [1], "components": {"a": [1, 2]}}"#,
            r#"{"rewards": [1], "components": {"a b": [1]}}"#,
            r#"{"rewards": [1], "components": [1]}"#,
        ] {
            assert!(parse_rewards(bad, 1).is_err(), "{bad}");
        }
        assert!(parse_rewards("oops", 1).unwrap_err().contains("not JSON"));
        // A metric that is not a number is an error (it was logged as NaN); names are bounded.
        let e = parse_rewards(r#"{"rewards": [1], "metrics": {"m": "x"}}"#, 1).unwrap_err();
        assert!(e.contains("metric \"m\" is \"x\", not a number"), "{e}");
        let named = |n: usize, key: &str| {
            let entries: Vec<String> = (0..n).map(|i| format!(r#""c{i}": [1]"#)).collect();
            let entries = entries.join(", ");
            format!(r#"{{"rewards": [1], "{key}": {{{entries}}}}}"#)
        };
        assert!(parse_rewards(&named(MAX_NAMES, "components"), 1).is_ok());
        let e = parse_rewards(&named(MAX_NAMES + 1, "components"), 1).unwrap_err();
        assert!(e.contains("names 65 entries; at most 64"), "{e}");
        let metrics = named(MAX_NAMES + 1, "metrics").replace("\": [1]", "\": 1");
        let metrics = metrics.replacen("\"rewards\": 1", "\"rewards\": [1]", 1);
        assert!(
            parse_rewards(&metrics, 1)
                .unwrap_err()
                .contains("at most 64")
        );
        assert!(
            parse_rewards(r#"{"rewards": ["x"]}"#, 1)
                .unwrap_err()
                .contains("not a number")
        );
    }
}
