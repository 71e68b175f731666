//! Verifiable rewards: answer extraction, numeric exact match, countdown expressions, a format
//! reward, and external reward functions run as a subprocess speaking JSON lines.

pub(crate) mod external;

pub use external::{
    ExternalReward, ExternalSpec, PYTHON_ADAPTER, PythonSpec, RewardError, RewardItem, Scores,
    TrainerState, parse_rewards,
};
use serde::{Deserialize, Serialize};

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
}
