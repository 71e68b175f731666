//! Tasks with held-out splits: procedurally generated arithmetic and countdown, and datasets in
//! JSON lines, Parquet or `datasets` folders (GSM8K's `question`/`answer` with `#### <number>`,
//! or generic `prompt`/`answer`).

mod arrow;
mod example;
mod file;
mod jsonl;
mod parquet;

pub use example::Example;
pub use file::DataError;
pub use jsonl::{JsonlData, JsonlKeys, Record, records};

use crate::reward::Check;
use ember_engine::SplitMix64;
use serde::{Deserialize, Serialize};

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
        let mut r = SplitMix64(a.wrapping_mul(1_000_003) ^ b.wrapping_mul(7919) ^ op as u64);
        r.next_u64().is_multiple_of(10)
    }

    fn draw(&self, rng: &mut SplitMix64) -> (u64, char, u64) {
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
    pub fn train(&self, rng: &mut SplitMix64, n: usize) -> Vec<Example> {
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
        let mut rng = SplitMix64(seed ^ 0xE7A1);
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

    fn draw(&self, rng: &mut SplitMix64) -> Example {
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
        SplitMix64(h).next_u64().is_multiple_of(10)
    }

    /// `n` training problems.
    pub fn train(&self, rng: &mut SplitMix64, n: usize) -> Vec<Example> {
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
        let mut rng = SplitMix64(seed ^ 0xC0D0);
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
            Self::Jsonl(d) => d.train_examples(),
            Self::Arithmetic(_) | Self::Countdown(_) => &[],
        }
    }

    /// `n` training examples.
    pub fn train(&self, rng: &mut SplitMix64, n: usize) -> Vec<Example> {
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
        let train = t.train(&mut SplitMix64(5), 2000);
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
        let train = t.train(&mut SplitMix64(3), 500);
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
}
