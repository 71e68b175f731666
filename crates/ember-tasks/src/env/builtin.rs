//! Built-in environments that a tiny character-level policy can play on a CPU (their texts use
//! only digits, `+ - * = . ,` and spaces) and that a real tokenizer reads as well; the
//! calculator's `instructions` mode opens in English, for a pretrained policy.

use super::{EnvError, Environment, Episode, Feedback};
use crate::reward::{eval_expression, last_number, parse_number};
use ember_engine::SplitMix64;
use std::collections::BTreeMap;

/// Tool use: a product of two `digits`-digit numbers, with a calculator. A turn whose text is an
/// arithmetic expression (`47*38`), or holds `<calc>47*38</calc>`, calls the calculator: the
/// observation is `=1786,` (or `<result>1786</result>` for the tagged form) and the episode goes
/// on. Any other turn is the final answer (its last number): reward 1 if it equals the product,
/// else 0, and the episode ends. After `max_turns` turns without an answer it ends with 0.
#[derive(Debug, Clone)]
pub struct Calculator {
    /// Digits per factor (1..=4).
    pub digits: u32,
    /// Turns per episode, the answer included.
    pub max_turns: usize,
    /// Open with instructions in English ([`Calculator::with_instructions`]).
    pub instructions: bool,
    running: BTreeMap<usize, (i64, usize)>,
}

impl Calculator {
    /// A calculator task with `digits`-digit factors and at most `max_turns` turns.
    pub fn new(digits: u32, max_turns: usize) -> Self {
        Self {
            digits: digits.clamp(1, 4),
            max_turns: max_turns.max(1),
            instructions: false,
            running: BTreeMap::new(),
        }
    }

    /// With `on`, each episode opens with the question and how to call the calculator, for a
    /// pretrained policy: "What is 47*38? You can use a calculator: send <calc>47*38</calc>…".
    pub fn with_instructions(self, on: bool) -> Self {
        Self {
            instructions: on,
            ..self
        }
    }

    fn first_observation(&self, a: i64, b: i64) -> String {
        if self.instructions {
            format!(
                "What is {a}*{b}? You can use a calculator: send <calc>{a}*{b}</calc> and it \
                 replies <result>value</result>. Then reply with the value alone."
            )
        } else {
            format!("{a}*{b}=")
        }
    }

    /// The factors of episode `seed`.
    pub fn problem(&self, seed: u64) -> (i64, i64) {
        let lo = 10i64.pow(self.digits - 1);
        let span = (9 * lo) as u64;
        let mut r = SplitMix64(seed ^ 0xca1c);
        (lo + r.below(span) as i64, lo + r.below(span) as i64)
    }
}

/// The expression of a calculator call, if `action` is one: `<calc>…</calc>`, or the whole turn
/// when it is an expression with an operator (a plain number is an answer).
fn calculator_call(action: &str) -> Option<(String, bool)> {
    if let Some(start) = action.find("<calc>") {
        let rest = &action[start + 6..];
        let inner = rest.find("</calc>").map_or(rest, |end| &rest[..end]);
        return Some((inner.trim().to_string(), true));
    }
    let t = action.trim();
    let has_op = t
        .char_indices()
        .any(|(i, c)| "+*/".contains(c) || (c == '-' && i > 0));
    (has_op && eval_expression(t).is_some()).then(|| (t.to_string(), false))
}

impl Environment for Calculator {
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError> {
        Ok(episodes
            .iter()
            .map(|e| {
                let (a, b) = self.problem(e.seed);
                self.running.insert(e.id, (a * b, 0));
                self.first_observation(a, b)
            })
            .collect())
    }

    /// A quarter of the time the calculator is called and its result given as the answer;
    /// otherwise the product is answered directly (correct, but learnt by heart: it does not
    /// carry to new problems, which is what reinforcement then finds out).
    fn demonstration(&self, seed: u64, rng: &mut SplitMix64) -> Option<Vec<String>> {
        let (a, b) = self.problem(seed);
        let first = self.first_observation(a, b);
        Some(if rng.below(4) != 0 || self.max_turns < 2 {
            vec![first, (a * b).to_string()]
        } else {
            let (call, result) = if self.instructions {
                (
                    format!("<calc>{a}*{b}</calc>"),
                    format!("<result>{}</result>", a * b),
                )
            } else {
                (format!("{a}*{b}"), format!("={},", a * b))
            };
            vec![first, call, result, (a * b).to_string()]
        })
    }

    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError> {
        actions
            .iter()
            .map(|(id, action)| {
                let (answer, turns) = self
                    .running
                    .get_mut(id)
                    .ok_or_else(|| EnvError::Protocol(format!("no running episode {id}")))?;
                *turns += 1;
                let answer = *answer;
                let last_turn = *turns >= self.max_turns;
                let feedback = match calculator_call(action) {
                    Some(_) if last_turn => Feedback {
                        observation: String::new(),
                        reward: 0.0,
                        done: true,
                        ..Default::default()
                    },
                    Some((expr, tagged)) => {
                        let value = eval_expression(&expr).and_then(|r| r.as_integer());
                        let v = value.map(|v| v.to_string()).unwrap_or_default();
                        Feedback {
                            observation: if tagged {
                                format!("<result>{v}</result>")
                            } else {
                                format!("={v},")
                            },
                            reward: 0.0,
                            done: false,
                            ..Default::default()
                        }
                    }
                    None => {
                        let given = last_number(action).and_then(|n| parse_number(&n));
                        let right = given.is_some_and(|g| (g - answer as f64).abs() < 1e-9);
                        Feedback {
                            observation: String::new(),
                            reward: if right { 1.0 } else { 0.0 },
                            done: true,
                            ..Default::default()
                        }
                    }
                };
                if feedback.done {
                    self.running.remove(id);
                }
                Ok(feedback)
            })
            .collect()
    }
}

/// A feedback game with the reward only at the end: guess a secret number in `0..=max`; each
/// wrong guess (the turn's last number) is answered `+,` (the secret is higher) or `-,` (lower),
/// a turn without a number `,`. Reward 1 when guessed within `max_turns` turns, else 0.
#[derive(Debug, Clone)]
pub struct GuessNumber {
    /// Largest secret.
    pub max: u32,
    /// Guesses per episode.
    pub max_turns: usize,
    running: BTreeMap<usize, (i64, usize)>,
}

impl GuessNumber {
    /// Secrets in `0..=max`, at most `max_turns` guesses.
    pub fn new(max: u32, max_turns: usize) -> Self {
        Self {
            max: max.max(1),
            max_turns: max_turns.max(1),
            running: BTreeMap::new(),
        }
    }

    /// The secret of episode `seed`.
    pub fn secret(&self, seed: u64) -> i64 {
        SplitMix64(seed ^ 0x6e55).below(u64::from(self.max) + 1) as i64
    }
}

impl Environment for GuessNumber {
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError> {
        Ok(episodes
            .iter()
            .map(|e| {
                self.running.insert(e.id, (self.secret(e.seed), 0));
                format!("0,{}=", self.max)
            })
            .collect())
    }

    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError> {
        actions
            .iter()
            .map(|(id, action)| {
                let (secret, turns) = self
                    .running
                    .get_mut(id)
                    .ok_or_else(|| EnvError::Protocol(format!("no running episode {id}")))?;
                *turns += 1;
                let (secret, last_turn) = (*secret, *turns >= self.max_turns);
                let guess = last_number(action).and_then(|n| parse_number(&n));
                let feedback = match guess {
                    Some(g) if (g - secret as f64).abs() < 1e-9 => Feedback {
                        observation: String::new(),
                        reward: 1.0,
                        done: true,
                        ..Default::default()
                    },
                    _ if last_turn => Feedback {
                        observation: String::new(),
                        reward: 0.0,
                        done: true,
                        ..Default::default()
                    },
                    Some(g) => Feedback {
                        observation: if (secret as f64) > g { "+," } else { "-," }.into(),
                        reward: 0.0,
                        done: false,
                        ..Default::default()
                    },
                    None => Feedback {
                        observation: ",".into(),
                        reward: 0.0,
                        done: false,
                        ..Default::default()
                    },
                };
                if feedback.done {
                    self.running.remove(id);
                }
                Ok(feedback)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: usize, seed: u64) -> Episode {
        Episode { id, seed }
    }

    #[test]
    fn calculator_calls_then_answers() {
        let mut env = Calculator::new(2, 3);
        let (a, b) = env.problem(5);
        assert!((10..100).contains(&a) && (10..100).contains(&b));
        let obs = env.reset(&[ep(0, 5), ep(1, 5)]).unwrap();
        assert_eq!(obs[0], format!("{a}*{b}="));
        let f = env
            .step(&[(0, format!("{a}*{b}")), (1, "12".into())])
            .unwrap();
        assert_eq!(f[0].observation, format!("={},", a * b));
        assert!(!f[0].done);
        assert!(f[1].done && f[1].reward == 0.0 || a * b == 12);
        let f = env.step(&[(0, format!("{}", a * b))]).unwrap();
        assert!(f[0].done && f[0].reward == 1.0);
        // Stepping a finished episode is an error, not a panic.
        assert!(env.step(&[(1, "1".into())]).is_err());
        // The tagged form, and the turn limit.
        let mut env = Calculator::new(2, 2);
        env.reset(&[ep(3, 9)]).unwrap();
        let f = env.step(&[(3, "let me <calc>6*7</calc>".into())]).unwrap();
        assert_eq!(f[0].observation, "<result>42</result>");
        let f = env.step(&[(3, "<calc>1+1</calc>".into())]).unwrap();
        assert!(f[0].done && f[0].reward == 0.0);
        assert_eq!(calculator_call("-12"), None);
        assert_eq!(calculator_call("1786"), None);
    }

    #[test]
    fn guess_number_answers_higher_lower() {
        let mut env = GuessNumber::new(31, 6);
        let s = env.secret(11);
        assert!((0..=31).contains(&s));
        assert_eq!(env.reset(&[ep(0, 11)]).unwrap()[0], "0,31=");
        // Binary search finds it within 6 guesses.
        let (mut lo, mut hi) = (0i64, 31i64);
        for turn in 0..6 {
            let g = (lo + hi) / 2;
            let f = env.step(&[(0, g.to_string())]).unwrap().remove(0);
            if f.done {
                assert_eq!(f.reward, 1.0, "turn {turn}");
                assert_eq!(g, s);
                return;
            }
            match f.observation.as_str() {
                "+," => lo = g + 1,
                "-," => hi = g - 1,
                o => panic!("{o}"),
            }
        }
        panic!("binary search did not finish");
    }
}
