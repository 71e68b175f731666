//! Verifiable rewards: answer extraction, numeric exact match, countdown expressions, a format
//! reward, and external reward functions run as a subprocess speaking JSON lines.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::Duration;

/// How a completion is verified against an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Check {
    /// The extracted answer equals the reference numerically (textually if not numbers).
    Numeric,
    /// The expression uses each given number at most once and evaluates to the target.
    Countdown {
        /// The numbers on offer.
        numbers: Vec<i64>,
        /// The target.
        target: i64,
    },
}

/// The verifiable reward of `completion` for an example with reference `answer`: 1 or 0.
pub fn check(check: &Check, completion: &str, answer: &str) -> f32 {
    match check {
        Check::Numeric => exact_match(completion, answer),
        Check::Countdown { numbers, target } => countdown_reward(completion, numbers, *target),
    }
}

/// An exact rational `num/den` (den > 0), for countdown expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio {
    num: i128,
    den: i128,
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs().max(1)
    } else {
        gcd(b, a % b)
    }
}

impl Ratio {
    fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 || num.abs() > 1 << 60 || den.abs() > 1 << 60 {
            return None;
        }
        let g = gcd(num, den) * den.signum();
        Some(Self {
            num: num / g,
            den: den / g,
        })
    }

    /// The value when it is an integer.
    pub fn as_integer(&self) -> Option<i64> {
        (self.den == 1)
            .then(|| i64::try_from(self.num).ok())
            .flatten()
    }
}

/// Evaluates `+ - * /` with parentheses and standard precedence over non-negative integer
/// literals, exactly; `None` on a syntax error or division by zero.
pub fn eval_expression(s: &str) -> Option<Ratio> {
    let toks: Vec<char> = s.chars().filter(|c| !c.is_whitespace()).collect();
    let mut pos = 0;
    let v = expr(&toks, &mut pos)?;
    (pos == toks.len()).then_some(v)
}

fn expr(t: &[char], p: &mut usize) -> Option<Ratio> {
    let mut v = term(t, p)?;
    while *p < t.len() && matches!(t[*p], '+' | '-') {
        let op = t[*p];
        *p += 1;
        let r = term(t, p)?;
        v = if op == '+' {
            Ratio::new(v.num * r.den + r.num * v.den, v.den * r.den)?
        } else {
            Ratio::new(v.num * r.den - r.num * v.den, v.den * r.den)?
        };
    }
    Some(v)
}

fn term(t: &[char], p: &mut usize) -> Option<Ratio> {
    let mut v = atom(t, p)?;
    while *p < t.len() && matches!(t[*p], '*' | '/') {
        let op = t[*p];
        *p += 1;
        let r = atom(t, p)?;
        v = if op == '*' {
            Ratio::new(v.num * r.num, v.den * r.den)?
        } else {
            Ratio::new(v.num * r.den, v.den * r.num)?
        };
    }
    Some(v)
}

fn atom(t: &[char], p: &mut usize) -> Option<Ratio> {
    if *p < t.len() && t[*p] == '(' {
        *p += 1;
        let v = expr(t, p)?;
        if *p < t.len() && t[*p] == ')' {
            *p += 1;
            return Some(v);
        }
        return None;
    }
    let start = *p;
    while *p < t.len() && t[*p].is_ascii_digit() {
        *p += 1;
    }
    if start == *p || *p - start > 12 {
        return None;
    }
    let n: i128 = t[start..*p].iter().collect::<String>().parse().ok()?;
    Ratio::new(n, 1)
}

/// Countdown reward (TinyZero's `compute_score` without its format bonus): 1 when the answer
/// expression (from `<answer>` tags or `\boxed{}`, else the whole completion) uses each offered
/// number at most once and equals the target exactly, else 0.
pub fn countdown_reward(completion: &str, numbers: &[i64], target: i64) -> f32 {
    let text = explicit_answer(completion).unwrap_or_else(|| completion.trim().to_string());
    let text = text.split('=').next().unwrap_or("").trim();
    let mut used: Vec<i64> = Vec::new();
    let mut cur = String::new();
    for c in text.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() {
            cur.push(c);
        } else if !cur.is_empty() {
            match cur.parse() {
                Ok(n) => used.push(n),
                Err(_) => return 0.0,
            }
            cur.clear();
        }
    }
    let mut pool = numbers.to_vec();
    for u in &used {
        match pool.iter().position(|n| n == u) {
            Some(i) => {
                pool.swap_remove(i);
            }
            None => return 0.0,
        }
    }
    match eval_expression(text) {
        Some(v) if v.as_integer() == Some(target) => 1.0,
        _ => 0.0,
    }
}

/// The answer when the completion marks it explicitly (`\boxed{}`, `<answer>` tags).
fn explicit_answer(text: &str) -> Option<String> {
    if text.contains("\\boxed{") || (text.contains("<answer>") && text.contains("</answer>")) {
        extract_answer(text)
    } else {
        None
    }
}

/// Format reward: 1 when the response ended with a stop token and its answer is cleanly
/// extractable: marked (`\boxed{}`, `<answer>` tags, "answer:") or the whole response is one
/// number or expression; else 0.
pub fn format_reward(completion: &str, stopped: bool) -> f32 {
    if !stopped {
        return 0.0;
    }
    let t = completion.trim();
    let marked = explicit_answer(t).is_some() || t.to_lowercase().contains("answer:");
    let bare = !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_digit() || "+-*/(). ,".contains(c));
    f32::from(marked || bare)
}

/// The final answer in a completion, tried in order: the last `\boxed{…}`, the last
/// `<answer>…</answer>`, the text after the last "answer:" / "answer is", else the last number.
pub fn extract_answer(text: &str) -> Option<String> {
    if let Some(i) = text.rfind("\\boxed{") {
        let rest = &text[i + 7..];
        let mut depth = 1usize;
        for (j, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(rest[..j].trim().to_string());
                    }
                }
                _ => {}
            }
        }
    }
    if let (Some(a), Some(b)) = (text.rfind("<answer>"), text.rfind("</answer>"))
        && a + 8 <= b
    {
        return Some(text[a + 8..b].trim().to_string());
    }
    let lower = text.to_lowercase();
    for marker in ["answer:", "answer is"] {
        if let Some(i) = lower.rfind(marker) {
            let tail = &text[i + marker.len()..];
            if let Some(n) = last_number(tail.lines().next().unwrap_or("")) {
                return Some(n);
            }
        }
    }
    last_number(text)
}

/// The last number in `text` (optional sign, digits, thousands commas, decimals).
pub fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut end = chars.len();
    while end > 0 {
        if chars[end - 1].is_ascii_digit() {
            let mut start = end;
            while start > 0
                && (chars[start - 1].is_ascii_digit()
                    || chars[start - 1] == '.'
                    || chars[start - 1] == ',')
            {
                start -= 1;
            }
            while start < end && !chars[start].is_ascii_digit() {
                start += 1;
            }
            if start > 0 && chars[start - 1] == '-' {
                start -= 1;
            }
            return Some(chars[start..end].iter().filter(|c| **c != ',').collect());
        }
        end -= 1;
    }
    None
}

/// Parses a numeric answer (commas, `$`, `%` and surrounding spaces ignored).
pub fn parse_number(s: &str) -> Option<f64> {
    let cleaned: String = s
        .chars()
        .filter(|c| !matches!(c, ',' | '$' | '%' | ' '))
        .collect();
    cleaned.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// 1 when the completion's extracted answer equals `answer` numerically (or textually when
/// either is not a number), else 0.
pub fn exact_match(completion: &str, answer: &str) -> f32 {
    let Some(got) = extract_answer(completion) else {
        return 0.0;
    };
    match (parse_number(&got), parse_number(answer)) {
        (Some(a), Some(b)) => f32::from((a - b).abs() <= 1e-6 * b.abs().max(1.0)),
        _ => f32::from(got.trim() == answer.trim()),
    }
}

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

/// Why an external reward failed.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// The program could not be started.
    #[error("cannot start external reward `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The program exited, timed out or answered something unusable.
    #[error("external reward `{command}`: {reason}")]
    Protocol {
        /// The command line.
        command: String,
        /// What went wrong.
        reason: String,
    },
}

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
pub const PYTHON_ADAPTER: &str = include_str!("../python/ember_reward.py");

impl PythonSpec {
    /// The external program that runs the functions: `python -u -c <adapter> functions…`.
    pub fn external(&self) -> Result<ExternalSpec, RewardError> {
        let expand = |s: &str| {
            crate::recipe::expand_path(s)
                .map(|p| p.to_string_lossy().into_owned())
                .map_err(|e| RewardError::Protocol {
                    command: "reward.python".into(),
                    reason: format!("{e:#}"),
                })
        };
        if self.functions.is_empty() {
            return Err(RewardError::Protocol {
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
    /// The prompt as the policy saw it.
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
}

/// An answer: a reward per item (NaN when invalid) and, optionally, named components (each a
/// value per item, NaN when it does not apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scores {
    /// The reward of each item.
    pub rewards: Vec<f32>,
    /// Named parts of the reward (the Python adapter's functions), in the answer's order.
    pub components: Vec<(String, Vec<f32>)>,
}

/// A running external reward process.
pub struct ExternalReward {
    child: Child,
    /// Requests go to a writer thread that owns the program's stdin, so that a program which
    /// does not read (a full pipe) cannot block the job past `timeout`.
    requests: Option<Sender<String>>,
    lines: Receiver<std::io::Result<String>>,
    timeout: Duration,
    command: String,
}

impl ExternalReward {
    /// Starts the program.
    pub fn spawn(spec: &ExternalSpec) -> Result<Self, RewardError> {
        let command = spec.command.join(" ");
        let Some(program) = spec.command.first() else {
            return Err(RewardError::Protocol {
                command,
                reason: "reward.external.command is empty".into(),
            });
        };
        let timeout = match Duration::try_from_secs_f64(spec.timeout_s) {
            Ok(t) if spec.timeout_s > 0.0 => t,
            _ => {
                return Err(RewardError::Protocol {
                    command,
                    reason: format!(
                        "timeout_s = {} must be a number of seconds > 0",
                        spec.timeout_s
                    ),
                });
            }
        };
        let mut child = Command::new(program)
            .args(&spec.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| RewardError::Spawn {
                command: command.clone(),
                source,
            })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, rx) = channel();
        let requests = stdin.map(|stdin| {
            let (req_tx, req_rx) = channel::<String>();
            let errors = tx.clone();
            std::thread::spawn(move || writer(stdin, &req_rx, &errors));
            req_tx
        });
        if let Some(out) = stdout {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let line = line.map_err(|e| {
                        std::io::Error::new(e.kind(), format!("reading its answer failed: {e}"))
                    });
                    if tx.send(line).is_err() {
                        return;
                    }
                }
                // End of output: the program exited (the writer thread still holds a sender,
                // so the channel alone would not tell `score` before its timeout).
                let _ = tx.send(Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed its stdout",
                )));
            });
        }
        Ok(Self {
            child,
            requests,
            lines: rx,
            timeout,
            command,
        })
    }

    /// How the program ended, waiting up to a second for it to exit after closing its output.
    fn exit_status(&mut self) -> String {
        for _ in 0..100 {
            if let Ok(Some(s)) = self.child.try_wait() {
                return format!("exited ({s})");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "closed its stdout".into()
    }

    fn fail(&self, reason: String) -> RewardError {
        RewardError::Protocol {
            command: self.command.clone(),
            reason,
        }
    }

    /// Scores one batch: one reward per item, NaN for an invalid sample, and the answer's
    /// components.
    pub fn score(&mut self, step: usize, items: &[RewardItem]) -> Result<Scores, RewardError> {
        let request = serde_json::json!({ "step": step, "items": items }).to_string() + "\n";
        let sent = self.requests.as_ref().map(|r| r.send(request).is_ok());
        if sent != Some(true) {
            return Err(self.fail("its stdin is closed".into()));
        }
        // The timeout covers writing the request (in the writer thread) and the answer.
        let line = match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                let status = self.exit_status();
                return Err(self.fail(format!("{status} before answering step {step}")));
            }
            Ok(Err(e)) => return Err(self.fail(e.to_string())),
            Err(RecvTimeoutError::Timeout) => {
                return Err(self.fail(format!(
                    "no answer within {:.1} s for step {step} ({} items)",
                    self.timeout.as_secs_f64(),
                    items.len()
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.exit_status();
                return Err(self.fail(format!("{status} before answering step {step}")));
            }
        };
        parse_rewards(&line, items.len()).map_err(|reason| self.fail(reason))
    }
}

/// Writes each request to the program's stdin; a failed write is reported on the answer
/// channel, where [`ExternalReward::score`] waits.
fn writer(
    mut stdin: ChildStdin,
    requests: &Receiver<String>,
    errors: &Sender<std::io::Result<String>>,
) {
    for request in requests {
        if let Err(e) = stdin
            .write_all(request.as_bytes())
            .and_then(|()| stdin.flush())
        {
            let _ = errors.send(Err(std::io::Error::new(
                e.kind(),
                format!("writing the request failed ({e}); did it exit?"),
            )));
            return;
        }
    }
}

impl Drop for ExternalReward {
    fn drop(&mut self) {
        drop(self.requests.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses `{"rewards": [...], "components": {"name": [...]}}` (components optional) with
/// `expected` entries per list (`null`/`NaN`/`Infinity` become NaN).
pub fn parse_rewards(line: &str, expected: usize) -> Result<Scores, String> {
    let cleaned = line
        .replace("-Infinity", "null")
        .replace("Infinity", "null")
        .replace("NaN", "null");
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
            for (name, values) in m {
                let ok = !name.is_empty()
                    && name.len() <= 64
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
                if !ok {
                    return Err(format!(
                        "component name {name:?} must be 1-64 letters, digits, `_`, `-` or `.`"
                    ));
                }
                components.push((
                    name.clone(),
                    numbers(&format!("components.{name}"), Some(values))?,
                ));
            }
        }
        Some(other) => return Err(format!("`components` is {other}, not an object")),
    }
    Ok(Scores {
        rewards,
        components,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_order_and_numbers() {
        assert_eq!(
            extract_answer("so \\boxed{\\frac{1}{2}} done").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(
            extract_answer("x <answer> 42 </answer> y 7").as_deref(),
            Some("42")
        );
        assert_eq!(
            extract_answer("The answer is 1,234.\nThen 9").as_deref(),
            Some("1234")
        );
        assert_eq!(extract_answer("first 3 then -17").as_deref(), Some("-17"));
        assert_eq!(extract_answer("no digits"), None);
        assert_eq!(exact_match("46", "46"), 1.0);
        assert_eq!(exact_match("answer: 46.0", "46"), 1.0);
        assert_eq!(exact_match("#### 1,000", "1000"), 1.0);
        assert_eq!(exact_match("45", "46"), 0.0);
        assert_eq!(exact_match("", "46"), 0.0);
    }

    #[test]
    fn countdown_checks_numbers_and_value() {
        let n = [3, 5, 7];
        assert_eq!(countdown_reward("3*5+7", &n, 22), 1.0);
        assert_eq!(countdown_reward("<answer>(7-5)*3</answer>", &n, 6), 1.0);
        assert_eq!(countdown_reward("7/(5-3)*4", &[3, 4, 5, 7], 14), 1.0);
        assert_eq!(countdown_reward("3*5+7 = 22", &n, 22), 1.0);
        assert_eq!(countdown_reward("3*5+7", &n, 23), 0.0, "wrong value");
        assert_eq!(countdown_reward("3*3+13", &n, 22), 0.0, "3 used twice");
        assert_eq!(countdown_reward("5/(3-3)", &n, 1), 0.0, "division by zero");
        assert_eq!(countdown_reward("3*(5+7", &n, 36), 0.0, "syntax");
        assert_eq!(countdown_reward("7/2", &[7, 2], 3), 0.0, "3.5 is not 3");
        assert_eq!(
            eval_expression("7/2*2").and_then(|r| r.as_integer()),
            Some(7)
        );
    }

    #[test]
    fn format_reward_cases() {
        assert_eq!(format_reward("46", true), 1.0);
        assert_eq!(format_reward("46", false), 0.0, "truncated");
        assert_eq!(format_reward("so <answer>4</answer>", true), 1.0);
        assert_eq!(format_reward("The answer: 4", true), 1.0);
        assert_eq!(format_reward("I think 4", true), 0.0);
        assert_eq!(format_reward("", true), 0.0);
    }

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
        for bad in [
            r#"{"rewards": [1], "components": {"a": [1, 2]}}"#,
            r#"{"rewards": [1], "components": {"a b": [1]}}"#,
            r#"{"rewards": [1], "components": [1]}"#,
        ] {
            assert!(parse_rewards(bad, 1).is_err(), "{bad}");
        }
        assert!(parse_rewards("oops", 1).unwrap_err().contains("not JSON"));
        assert!(
            parse_rewards(r#"{"rewards": ["x"]}"#, 1)
                .unwrap_err()
                .contains("not a number")
        );
    }
}
