//! `[task]`: which task an LLM or agent recipe trains on (generated arithmetic or countdown, or
//! a JSONL file) and its settings.

use anyhow::{Context, Result, bail};
use ember_tasks::expand_path;
use ember_tasks::task::{Arithmetic, Countdown, JsonlData, JsonlKeys, TaskSet};
use serde::{Deserialize, Serialize};

/// Which task family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// Generated multi-digit arithmetic (`digits`, `ops`).
    #[default]
    Arithmetic,
    /// Generated countdown (`count`, `max_number`, `max_target`).
    Countdown,
    /// A dataset file (`path`): JSON lines, Parquet (a `.parquet` file, or a Hugging Face
    /// dataset directory whose `train*.parquet` shards are read), or a folder `datasets`
    /// saved (`save_to_disk`; a dictionary's `train` split); GSM8K `question`/`answer` or
    /// `prompt`/`answer`. `kind = "parquet"` and `kind = "datasets"` read the same.
    #[serde(alias = "parquet", alias = "datasets")]
    Jsonl,
}

/// Which task, and its settings (only those of its kind may be set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Task family.
    #[serde(default)]
    pub kind: TaskKind,
    /// Arithmetic: maximum digits per operand (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digits: Option<u32>,
    /// Arithmetic: operators, any of `+-*` (default `+`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<String>,
    /// Countdown: numbers per problem (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// Countdown: largest number (default 9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_number: Option<i64>,
    /// Countdown: largest target (default 99).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_target: Option<i64>,
    /// JSONL: the data file (`~` and `$VAR` are expanded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// JSONL: the key of the prompt, a string or a chat `messages` list (default: the first of
    /// `question`, `prompt`, `messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_key: Option<String>,
    /// JSONL: the key of the reference answer (default `answer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_key: Option<String>,
    /// Held-out problems evaluated.
    pub eval_size: usize,
}

impl TaskSpec {
    /// Builds the task (reads a JSONL file), checking that only this kind's fields are set.
    pub fn build(&self) -> Result<TaskSet> {
        let given = |name: &str, set: bool, kinds: &str| -> Result<()> {
            if set {
                bail!("task.{name} applies to kind = {kinds}, not {:?}", self.kind);
            }
            Ok(())
        };
        let k = self.kind;
        given(
            "digits",
            self.digits.is_some() && k != TaskKind::Arithmetic,
            "arithmetic",
        )?;
        given(
            "ops",
            self.ops.is_some() && k != TaskKind::Arithmetic,
            "arithmetic",
        )?;
        for (n, set) in [
            ("count", self.count.is_some()),
            ("max_number", self.max_number.is_some()),
            ("max_target", self.max_target.is_some()),
        ] {
            given(n, set && k != TaskKind::Countdown, "countdown")?;
        }
        given("path", self.path.is_some() && k != TaskKind::Jsonl, "jsonl")?;
        given(
            "prompt_key",
            self.prompt_key.is_some() && k != TaskKind::Jsonl,
            "jsonl",
        )?;
        given(
            "answer_key",
            self.answer_key.is_some() && k != TaskKind::Jsonl,
            "jsonl",
        )?;
        Ok(match k {
            TaskKind::Arithmetic => {
                let d = Arithmetic::default();
                let t = Arithmetic {
                    digits: self.digits.unwrap_or(d.digits),
                    ops: self.ops.clone().unwrap_or(d.ops),
                };
                t.validate().map_err(anyhow::Error::msg)?;
                TaskSet::Arithmetic(t)
            }
            TaskKind::Countdown => {
                let d = Countdown::default();
                let t = Countdown {
                    count: self.count.unwrap_or(d.count),
                    max_number: self.max_number.unwrap_or(d.max_number),
                    max_target: self.max_target.unwrap_or(d.max_target),
                };
                t.validate().map_err(anyhow::Error::msg)?;
                TaskSet::Countdown(t)
            }
            TaskKind::Jsonl => {
                let p = self
                    .path
                    .as_deref()
                    .context("task.kind = \"jsonl\" needs task.path")?;
                let keys = JsonlKeys {
                    prompt: self.prompt_key.clone(),
                    answer: self.answer_key.clone(),
                };
                TaskSet::Jsonl(JsonlData::load_with(&expand_path(p)?, &keys)?)
            }
        })
    }
}
