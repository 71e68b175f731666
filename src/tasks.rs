//! Procedurally generated tasks with held-out splits.

use serde::{Deserialize, Serialize};

/// A prompt and its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    /// What the policy sees.
    pub prompt: String,
    /// The verifiable answer.
    pub answer: String,
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
}
