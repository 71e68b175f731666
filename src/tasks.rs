//! Tasks with held-out splits: procedurally generated arithmetic and countdown, and JSONL
//! datasets (GSM8K's `question`/`answer` with `#### <number>`, or generic `prompt`/`answer`).

use crate::reward::Check;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A prompt and its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    /// The compact prompt the character-level policy sees (`12+34=`).
    pub prompt: String,
    /// The verifiable answer (for countdown, one solution).
    pub answer: String,
    /// The question in words, for policies with a real tokenizer (placed into the recipe's
    /// prompt template as `{question}`).
    pub question: String,
    /// How a completion is verified.
    pub check: Check,
    /// A chat dataset's conversation (role, content), rendered through the model's chat
    /// template in place of the recipe's prompt template; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<(String, String)>,
    /// A dataset line's other columns, passed to external and Python rewards.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub columns: serde_json::Map<String, serde_json::Value>,
}

/// The job's deterministic RNG (its state is one u64, so checkpoints can store it).
pub use crate::engine::SplitMix64 as Rng;

fn digits() -> u32 {
    2
}
fn ops() -> String {
    "+".into()
}

/// Multi-digit arithmetic `a<op>b=` with operands of 1..=`digits` digits.
///
/// The held-out split is defined by a hash of the operands, not by sampling: a problem is
/// held out when `hash(a, op, b) % 10 == 0`, so training draws never see an evaluation problem
/// whatever the seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arithmetic {
    /// Maximum digits per operand.
    #[serde(default = "digits")]
    pub digits: u32,
    /// Operators to draw from, any of `+-*`.
    #[serde(default = "ops")]
    pub ops: String,
}

impl Default for Arithmetic {
    fn default() -> Self {
        Self {
            digits: digits(),
            ops: ops(),
        }
    }
}

impl Arithmetic {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=6).contains(&self.digits) {
            return Err(format!("task.digits = {} must be in 1..=6", self.digits));
        }
        if self.ops.is_empty() || !self.ops.chars().all(|c| "+-*".contains(c)) {
            return Err(format!("task.ops = {:?} must be made of + - *", self.ops));
        }
        Ok(())
    }

    fn held_out(a: u64, op: char, b: u64) -> bool {
        let mut r = Rng(a.wrapping_mul(1_000_003) ^ b.wrapping_mul(7919) ^ op as u64);
        r.next_u64().is_multiple_of(10)
    }

    fn draw(&self, rng: &mut Rng) -> (u64, char, u64) {
        let max = 10u64.pow(self.digits);
        let ops: Vec<char> = self.ops.chars().collect();
        (
            rng.below(max),
            ops[rng.below(ops.len() as u64) as usize],
            rng.below(max),
        )
    }

    fn example(a: u64, op: char, b: u64) -> Example {
        let v = match op {
            '+' => a as i64 + b as i64,
            '-' => a as i64 - b as i64,
            _ => a as i64 * b as i64,
        };
        Example {
            prompt: format!("{a}{op}{b}="),
            answer: v.to_string(),
            question: format!("{a} {op} {b}"),
            check: Check::Numeric,
            messages: Vec::new(),
            columns: serde_json::Map::new(),
        }
    }

    /// `n` training problems.
    pub fn train(&self, rng: &mut Rng, n: usize) -> Vec<Example> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let (a, op, b) = self.draw(rng);
            if !Self::held_out(a, op, b) {
                out.push(Self::example(a, op, b));
            }
        }
        out
    }

    /// `n` distinct held-out problems (fixed by `seed`).
    pub fn held_out_set(&self, seed: u64, n: usize) -> Vec<Example> {
        let mut rng = Rng(seed ^ 0xE7A1);
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::with_capacity(n);
        let mut tries = 0;
        while out.len() < n && tries < 1000 * n.max(1) {
            tries += 1;
            let (a, op, b) = self.draw(&mut rng);
            if Self::held_out(a, op, b) && seen.insert((a, op, b)) {
                out.push(Self::example(a, op, b));
            }
        }
        out
    }
}

fn count() -> usize {
    3
}
fn max_number() -> i64 {
    9
}
fn max_target() -> i64 {
    99
}

/// Countdown (as in TinyZero): reach a target with the given numbers, each used at most once,
/// with `+ - * /` and parentheses; standard precedence, exact rational arithmetic.
///
/// Problems are generated from a random solution over all the numbers with `+ - *`, so every
/// problem is solvable; the held-out split is a hash of (sorted numbers, target).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Countdown {
    /// Numbers per problem.
    #[serde(default = "count")]
    pub count: usize,
    /// Numbers are drawn from 1..=max_number.
    #[serde(default = "max_number")]
    pub max_number: i64,
    /// Targets lie in 0..=max_target.
    #[serde(default = "max_target")]
    pub max_target: i64,
}

impl Default for Countdown {
    fn default() -> Self {
        Self {
            count: count(),
            max_number: max_number(),
            max_target: max_target(),
        }
    }
}

impl Countdown {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=6).contains(&self.count) {
            return Err(format!("task.count = {} must be in 2..=6", self.count));
        }
        if !(1..=100).contains(&self.max_number) || self.max_target < 1 {
            return Err(format!(
                "task.max_number = {} must be in 1..=100 and task.max_target = {} >= 1",
                self.max_number, self.max_target
            ));
        }
        Ok(())
    }

    fn draw(&self, rng: &mut Rng) -> Example {
        loop {
            let nums: Vec<i64> = (0..self.count)
                .map(|_| 1 + rng.below(self.max_number as u64) as i64)
                .collect();
            let mut expr = nums[0].to_string();
            for n in &nums[1..] {
                let op = ['+', '-', '*'][rng.below(3) as usize];
                expr += &format!("{op}{n}");
            }
            let Some(v) = crate::reward::eval_expression(&expr).and_then(|v| v.as_integer()) else {
                continue;
            };
            if !(0..=self.max_target).contains(&v) {
                continue;
            }
            let mut sorted = nums.clone();
            sorted.sort_unstable();
            let list: Vec<String> = sorted.iter().map(ToString::to_string).collect();
            return Example {
                prompt: format!("{} {v}=", list.join(",")),
                answer: expr,
                question: format!(
                    "Using the numbers {} (each at most once) with + - * / and parentheses, \
                     write an expression equal to {v}.",
                    list.join(", ")
                ),
                check: Check::Countdown {
                    numbers: sorted,
                    target: v,
                },
                messages: Vec::new(),
                columns: serde_json::Map::new(),
            };
        }
    }

    fn held_out(e: &Example) -> bool {
        let Check::Countdown { numbers, target } = &e.check else {
            return false;
        };
        let mut h = *target as u64;
        for n in numbers {
            h = h.wrapping_mul(1_000_003) ^ (*n as u64);
        }
        Rng(h).next_u64().is_multiple_of(10)
    }

    /// `n` training problems.
    pub fn train(&self, rng: &mut Rng, n: usize) -> Vec<Example> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let e = self.draw(rng);
            if !Self::held_out(&e) {
                out.push(e);
            }
        }
        out
    }

    /// `n` distinct held-out problems (fixed by `seed`).
    pub fn held_out_set(&self, seed: u64, n: usize) -> Vec<Example> {
        let mut rng = Rng(seed ^ 0xC0D0);
        let mut out: Vec<Example> = Vec::with_capacity(n);
        let mut tries = 0;
        while out.len() < n && tries < 1000 * n.max(1) {
            tries += 1;
            let e = self.draw(&mut rng);
            if Self::held_out(&e) && !out.iter().any(|o| o.check == e.check) {
                out.push(e);
            }
        }
        out
    }
}

/// A JSONL dataset read in place. Each line is an object with a prompt and an answer:
/// the prompt under `prompt_key` (by default the first of `question`, `prompt`, `messages`),
/// either a string or a chat conversation (a list of `{"role", "content"}`), and the answer
/// under `answer_key` (default `answer`), a string or a number (GSM8K: the text after its `####`
/// is the reference). Every other key is an extra column, passed to rewards. A line is held
/// out when a hash of its prompt is 0 mod 10, whatever the seed.
#[derive(Debug, Clone)]
pub struct JsonlData {
    train: Vec<Example>,
    held_out: Vec<Example>,
}

/// Why a dataset could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read dataset {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not what the loader expects.
    #[error("{path}:{line}: {reason}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No usable example.
    #[error("dataset {path} is empty: {reason}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// Which split is empty.
        reason: String,
    },
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Which keys of a JSONL line hold the prompt and the answer (`None`: the defaults).
#[derive(Debug, Clone, Default)]
pub struct JsonlKeys {
    /// The prompt's key.
    pub prompt: Option<String>,
    /// The answer's key.
    pub answer: Option<String>,
}

/// A prompt value: a string, or a conversation whose last user turn is the question.
fn parse_prompt(v: &serde_json::Value) -> Result<(String, Vec<(String, String)>), String> {
    match v {
        serde_json::Value::String(s) => Ok((s.clone(), Vec::new())),
        serde_json::Value::Array(turns) => {
            let mut msgs = Vec::with_capacity(turns.len());
            for (i, t) in turns.iter().enumerate() {
                let field = |k: &str| t.get(k).and_then(|x| x.as_str()).map(str::to_string);
                let (Some(role), Some(content)) = (field("role"), field("content")) else {
                    return Err(format!(
                        "message {i} needs string fields `role` and `content`"
                    ));
                };
                if !["system", "user", "assistant"].contains(&role.as_str()) {
                    return Err(format!(
                        "message {i} has role {role:?}; expected system, user or assistant"
                    ));
                }
                msgs.push((role, content));
            }
            match msgs.last() {
                Some((role, _)) if role == "user" => {}
                Some((role, _)) => {
                    return Err(format!(
                        "the conversation ends with a {role} message; the policy answers the                          last user message"
                    ));
                }
                None => return Err("the conversation is empty".into()),
            }
            let question = msgs.last().map(|m| m.1.clone()).unwrap_or_default();
            Ok((question, msgs))
        }
        other => Err(format!(
            "the prompt is {}, not a string or a list of messages",
            kind_of(other)
        )),
    }
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

impl JsonlData {
    /// Reads `path` with the default keys.
    pub fn load(path: &Path) -> Result<Self, DataError> {
        Self::load_with(path, &JsonlKeys::default())
    }

    /// Reads `path`, the prompt and answer under `keys`.
    pub fn load_with(path: &Path, keys: &JsonlKeys) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let line_err = |line: usize, reason: String| DataError::Line {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let (mut train, mut held_out) = (Vec::new(), Vec::new());
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| line_err(i + 1, format!("not JSON: {e}")))?;
            let serde_json::Value::Object(mut obj) = v else {
                return Err(line_err(
                    i + 1,
                    format!("{} is not a JSON object", kind_of(&v)),
                ));
            };
            let prompt_key = match &keys.prompt {
                Some(k) => k.clone(),
                None => ["question", "prompt", "messages"]
                    .into_iter()
                    .find(|k| obj.contains_key(*k))
                    .unwrap_or("prompt")
                    .to_string(),
            };
            let answer_key = keys.answer.clone().unwrap_or_else(|| "answer".into());
            let (Some(p), Some(a)) = (obj.remove(&prompt_key), obj.remove(&answer_key)) else {
                let default = keys.prompt.is_none();
                return Err(line_err(
                    i + 1,
                    format!(
                        "expected a prompt under {} and an answer under `{answer_key}` (set \
                         task.prompt_key / task.answer_key for other names); the line has {:?}",
                        if default {
                            "`question`, `prompt` or `messages`".to_string()
                        } else {
                            format!("`{prompt_key}`")
                        },
                        obj.keys().collect::<Vec<_>>()
                    ),
                ));
            };
            let (question, messages) = parse_prompt(&p)
                .map_err(|reason| line_err(i + 1, format!("`{prompt_key}`: {reason}")))?;
            let answer = match &a {
                serde_json::Value::String(s) => match s.rsplit_once("####") {
                    Some((_, tail)) => tail.trim().replace(',', ""),
                    None => s.trim().to_string(),
                },
                serde_json::Value::Number(n) => n.to_string(),
                other => {
                    return Err(line_err(
                        i + 1,
                        format!(
                            "`{answer_key}` is {}, not a string or a number",
                            kind_of(other)
                        ),
                    ));
                }
            };
            if answer.is_empty() {
                return Err(line_err(i + 1, "the answer is empty".into()));
            }
            let e = Example {
                prompt: question.clone(),
                answer,
                question,
                check: Check::Numeric,
                messages,
                columns: obj,
            };
            if Rng(fnv(&e.question)).next_u64().is_multiple_of(10) {
                held_out.push(e);
            } else {
                train.push(e);
            }
        }
        let empty = |reason: &str| DataError::Empty {
            path: path.to_path_buf(),
            reason: reason.into(),
        };
        if train.is_empty() && held_out.is_empty() {
            return Err(empty("no examples"));
        }
        if train.is_empty() || held_out.is_empty() {
            return Err(empty(
                "too few examples to split into training and held-out (1 in 10 is held out)",
            ));
        }
        Ok(Self { train, held_out })
    }

    /// `n` training examples drawn uniformly.
    pub fn train(&self, rng: &mut Rng, n: usize) -> Vec<Example> {
        (0..n)
            .map(|_| self.train[rng.below(self.train.len() as u64) as usize].clone())
            .collect()
    }

    /// The first `n` held-out examples (file order).
    pub fn held_out_set(&self, n: usize) -> Vec<Example> {
        self.held_out.iter().take(n).cloned().collect()
    }

    /// (training, held-out) sizes.
    pub fn sizes(&self) -> (usize, usize) {
        (self.train.len(), self.held_out.len())
    }
}

/// A task ready to draw from.
#[derive(Debug, Clone)]
pub enum TaskSet {
    /// Generated arithmetic.
    Arithmetic(Arithmetic),
    /// Generated countdown.
    Countdown(Countdown),
    /// A JSONL file.
    Jsonl(JsonlData),
}

impl TaskSet {
    /// The training examples of a dataset, so that a job can check each one before it starts
    /// (none for the generated tasks, whose every example is well formed).
    pub fn dataset_train(&self) -> &[Example] {
        match self {
            Self::Jsonl(d) => &d.train,
            Self::Arithmetic(_) | Self::Countdown(_) => &[],
        }
    }

    /// `n` training examples.
    pub fn train(&self, rng: &mut Rng, n: usize) -> Vec<Example> {
        match self {
            Self::Arithmetic(t) => t.train(rng, n),
            Self::Countdown(t) => t.train(rng, n),
            Self::Jsonl(t) => t.train(rng, n),
        }
    }

    /// The held-out evaluation set.
    pub fn held_out_set(&self, seed: u64, n: usize) -> Vec<Example> {
        match self {
            Self::Arithmetic(t) => t.held_out_set(seed, n),
            Self::Countdown(t) => t.held_out_set(seed, n),
            Self::Jsonl(t) => t.held_out_set(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_disjoint_and_answers_right() {
        let t = Arithmetic {
            digits: 2,
            ops: "+-*".into(),
        };
        let eval = t.held_out_set(1, 100);
        assert_eq!(eval.len(), 100);
        let train = t.train(&mut Rng(5), 2000);
        for e in &train {
            assert!(!eval.contains(e), "{e:?} is in both splits");
        }
        let e = Arithmetic::example(12, '*', 34);
        assert_eq!((e.prompt.as_str(), e.answer.as_str()), ("12*34=", "408"));
        assert_eq!(Arithmetic::example(3, '-', 50).answer, "-47");
        assert_eq!(
            t.held_out_set(1, 100),
            eval,
            "held-out set is fixed by its seed"
        );
    }

    #[test]
    fn countdown_problems_are_solvable_and_split() {
        let t = Countdown::default();
        let eval = t.held_out_set(0, 50);
        assert_eq!(eval.len(), 50);
        let train = t.train(&mut Rng(3), 500);
        for e in train.iter().chain(&eval) {
            // The generating solution earns the reward.
            assert_eq!(
                crate::reward::check(&e.check, &e.answer, &e.answer),
                1.0,
                "{e:?}"
            );
        }
        for e in &train {
            assert!(
                !eval.iter().any(|h| h.check == e.check),
                "{e:?} in both splits"
            );
        }
    }

    #[test]
    fn jsonl_gsm8k_and_generic_and_errors() {
        let dir = std::env::temp_dir().join(format!("ember-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.jsonl");
        let mut text = String::new();
        for i in 0..40 {
            text += &format!("{{\"question\": \"q{i}\", \"answer\": \"work\\n#### 1,{i:03}\"}}\n");
        }
        text += "{\"prompt\": \"p\", \"answer\": \" 7 \"}\n";
        std::fs::write(&p, &text).unwrap();
        let d = JsonlData::load(&p).unwrap();
        let (a, b) = d.sizes();
        assert_eq!(a + b, 41);
        assert!(b >= 1 && a >= 1);
        let all: Vec<Example> = d.train.iter().chain(&d.held_out).cloned().collect();
        let q3 = all.iter().find(|e| e.question == "q3").unwrap();
        assert_eq!(q3.answer, "1003");
        assert_eq!(all.iter().find(|e| e.question == "p").unwrap().answer, "7");

        std::fs::write(&p, "{\"question\": 3}\n").unwrap();
        let e = JsonlData::load(&p).unwrap_err().to_string();
        assert!(e.contains("d.jsonl:1:") && e.contains("question"), "{e}");
        std::fs::write(&p, "\n\n").unwrap();
        let e = JsonlData::load(&p).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
        let e = JsonlData::load(&dir.join("missing.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.jsonl"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
