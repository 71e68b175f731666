//! `[env] kind = "tutor"`: the policy tutors a simulated student, a frozen model in process or
//! behind an endpoint ([`crate::lm::participant`]), on a generated arithmetic word problem.
//!
//! The episode (after the RL-tutor setup of arXiv 2505.15607, whose text this follows where
//! reachable; the choices below are ours where it is silent): the student first answers the
//! problem alone; then each policy turn is a tutor message, and the student replies to it. After
//! the last turn comes the **post-test**: the student is asked a near-transfer variant (the
//! same story with other names and numbers) with the tutor's turns **masked out** of its context
//! ([`post_test`]: the problem, then only what the student wrote), so only what the student
//! wrote itself can help it. The reward, at the last turn, is the product of
//! - the post-test: the last number of the student's answer equals the variant's answer;
//! - the correctness gate: every arithmetic claim `a op b = c` the tutor wrote holds
//!   ([`claims_hold`]);
//! - the leak gate: the tutor never wrote the problem's answer as a number ([`leaks`]); off
//!   with `allow_answer = true` (the ablation of a tutor that may tell the answer).
//!
//! The last observation records the post-test and both gates (it reaches `samples.jsonl`
//! with the transcript).

use crate::lm::participant::{Backend, ChatFormat, Source};
use anyhow::Result;
use burn::tensor::Device;
use ember_engine::SplitMix64;
use ember_llm::Message;
use ember_tasks::env::{EnvError, Environment, Episode, Feedback};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// `[env]` of `kind = "tutor"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TutorSpec {
    /// The student: a model in process (a Hugging Face directory or GGUF file; `~`, `$VAR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Or an OpenAI-compatible endpoint (`http://host:port`, with or without `/v1`) ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// ... and the student's name on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The environment variable holding the endpoint's API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// Retries of a failed request to the endpoint (backoff 1, 2, 4 … s).
    #[serde(default = "three")]
    pub request_retries: u32,
    /// The student's answer length in tokens.
    #[serde(default = "forty_eight")]
    pub student_max_tokens: usize,
    /// Drop the leak gate (the tutor may tell the answer): the gate's ablation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_answer: bool,
}

fn forty_eight() -> usize {
    48
}
fn three() -> u32 {
    3
}

/// A word problem and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub text: String,
    pub answer: i64,
}

const NAMES: [&str; 8] = ["Sam", "Ana", "Lee", "Mia", "Tom", "Zoe", "Raj", "Ivy"];
const ITEMS: [&str; 6] = [
    "apples", "pencils", "stickers", "marbles", "cards", "shells",
];

/// Episode `seed`'s problem, or its near-transfer variant: the same one-step story (adding,
/// taking away or multiplying: one of three) with other names, items and numbers.
pub fn problem(seed: u64, variant: bool) -> Problem {
    let story = SplitMix64(seed).next_u64() % 3;
    let mut rng = SplitMix64(seed ^ if variant { 0x7a51_a7e0 } else { 0 } ^ 0x9e37_79b9);
    // An answer that is also one of the problem's numbers would make quoting the problem a
    // leak: such draws are drawn again.
    loop {
        let p = story_problem(story, &mut rng);
        if !leaks(&p.text, p.answer) {
            return p;
        }
    }
}

fn story_problem(story: u64, rng: &mut SplitMix64) -> Problem {
    let mut pick = |lo: u64, hi: u64| (lo + rng.next_u64() % (hi - lo + 1)) as i64;
    let name = NAMES[pick(0, 7) as usize];
    let item = ITEMS[pick(0, 5) as usize];
    let (a, b) = (pick(2, 9), pick(2, 5));
    match story {
        0 => Problem {
            text: format!(
                "{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have \
                 now?"
            ),
            answer: a + b,
        },
        1 => Problem {
            text: format!(
                "{name} had {} {item} and gave away {b}. How many {item} does {name} have left?",
                a + b
            ),
            answer: a,
        },
        _ => Problem {
            text: format!(
                "{name} buys {b} packs with {a} {item} in each pack. How many {item} does \
                 {name} have?"
            ),
            answer: a * b,
        },
    }
}

/// The integers in `text`, in order (a `-` directly before digits and after a non-digit, or
/// at the start, makes a negative number).
fn numbers(text: &str) -> Vec<(usize, usize, i64)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if let Ok(v) = text[start..i].parse::<i64>() {
                out.push((start, i, v));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The last integer in `text`.
pub fn last_number(text: &str) -> Option<i64> {
    numbers(text).last().map(|n| n.2)
}

/// Whether `text` states `answer` as a number of its own (not part of a longer one).
pub fn leaks(text: &str, answer: i64) -> bool {
    numbers(text).iter().any(|n| n.2 == answer)
}

/// Whether every claim `a op b = c` in `text` holds (op one of `+ - * x × /`, spaces allowed;
/// a text without claims holds).
pub fn claims_hold(text: &str) -> bool {
    let nums = numbers(text);
    nums.windows(3).all(|w| {
        let (a, b, c) = (w[0], w[1], w[2]);
        let op = text[a.1..b.0].trim();
        let eq = text[b.1..c.0].trim();
        if eq != "=" {
            return true;
        }
        let want = match op {
            "+" => a.2.checked_add(b.2),
            "-" => a.2.checked_sub(b.2),
            "*" | "x" | "×" => a.2.checked_mul(b.2),
            "/" if b.2 != 0 && a.2 % b.2 == 0 => Some(a.2 / b.2),
            "/" => None,
            _ => return true,
        };
        want == Some(c.2)
    })
}

/// The student's question for a problem.
fn ask(p: &Problem) -> String {
    format!("{} Answer with a number.", p.text)
}

/// The post-test conversation: the problem, then only the student's own messages (the tutor's
/// turns masked out), then the variant.
pub fn post_test(first: &Problem, student: &[String], variant: &Problem) -> Vec<Message> {
    let mut m = vec![Message::new("user", &ask(first))];
    m.extend(student.iter().map(|s| Message::new("assistant", s)));
    m.push(Message::new(
        "user",
        &format!("Here is a new problem. {}", ask(variant)),
    ));
    m
}

struct Tutoring {
    first: Problem,
    variant: Problem,
    /// The student's messages: its first answer, then its replies.
    student: Vec<String>,
    /// The tutor's messages.
    tutor: Vec<String>,
}

impl Tutoring {
    /// The student's view while tutored: the problem, its answer, then tutor and student turns.
    fn dialogue(&self) -> Vec<Message> {
        let mut m = vec![Message::new("user", &ask(&self.first))];
        for (i, s) in self.student.iter().enumerate() {
            m.push(Message::new("assistant", s));
            if let Some(t) = self.tutor.get(i) {
                m.push(Message::new("user", t));
            }
        }
        m
    }
}

/// The tutoring environment.
pub struct TutorEnv {
    student: Backend,
    chat: ChatFormat,
    spec: TutorSpec,
    turns: usize,
    live: HashMap<usize, Tutoring>,
}

const TABLE: &str = "env (the tutor's student)";

impl TutorEnv {
    /// The environment with its student loaded on `device` (or connected); `turns` tutor turns.
    pub fn new(spec: &TutorSpec, turns: usize, device: &Device) -> Result<Self> {
        let src = Source {
            table: "env",
            base_url: spec.base_url.as_deref(),
            model: spec.model.as_deref(),
            path: spec.path.as_deref(),
            api_key_env: spec.api_key_env.as_deref(),
            timeout_s: 120.0,
            retries: spec.request_retries,
        };
        let student = Backend::open(&src, device)?;
        let chat = student.chat_format("env")?;
        Ok(Self {
            student,
            chat,
            spec: spec.clone(),
            turns: turns.max(1),
            live: HashMap::new(),
        })
    }

    /// The student's answers to `conversations`, batched.
    fn answer(&self, conversations: &[Vec<Message>]) -> Result<Vec<String>, EnvError> {
        let prompts = conversations
            .iter()
            .map(|c| self.chat.render(c, TABLE))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| EnvError::Protocol(format!("{e:#}")))?;
        self.student
            .complete(&prompts, self.spec.student_max_tokens, "the student")
            .map(|v| v.into_iter().map(|s| s.trim().to_string()).collect())
            .map_err(|e| EnvError::Protocol(format!("{e:#}")))
    }
}

impl Environment for TutorEnv {
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError> {
        let problems: Vec<(Problem, Problem)> = episodes
            .iter()
            .map(|e| (problem(e.seed, false), problem(e.seed, true)))
            .collect();
        let asks: Vec<Vec<Message>> = problems
            .iter()
            .map(|(p, _)| vec![Message::new("user", &ask(p))])
            .collect();
        let attempts = self.answer(&asks)?;
        self.live.clear();
        let mut out = Vec::with_capacity(episodes.len());
        for ((e, (first, variant)), attempt) in episodes.iter().zip(problems).zip(attempts) {
            out.push(format!(
                "You are tutoring a student. The problem: {}\nThe student's answer: {attempt}\n\
                 Give the student one short hint about the method. Do not state the final \
                 answer.",
                first.text
            ));
            let t = Tutoring {
                first,
                variant,
                student: vec![attempt],
                tutor: Vec::new(),
            };
            self.live.insert(e.id, t);
        }
        Ok(out)
    }

    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError> {
        for (id, text) in actions {
            let t = self
                .live
                .get_mut(id)
                .ok_or_else(|| EnvError::Protocol(format!("tutor: episode {id} is not running")))?;
            t.tutor.push(text.trim().to_string());
        }
        let views: Vec<Vec<Message>> = actions
            .iter()
            .map(|(id, _)| self.live[id].dialogue())
            .collect();
        let replies = self.answer(&views)?;
        for ((id, _), r) in actions.iter().zip(replies) {
            if let Some(t) = self.live.get_mut(id) {
                t.student.push(r);
            }
        }
        let ending: Vec<usize> = actions
            .iter()
            .map(|a| a.0)
            .filter(|id| self.live[id].tutor.len() >= self.turns)
            .collect();
        let tests: Vec<Vec<Message>> = ending
            .iter()
            .map(|id| {
                let t = &self.live[id];
                post_test(&t.first, &t.student, &t.variant)
            })
            .collect();
        let posts: HashMap<usize, String> =
            ending.iter().copied().zip(self.answer(&tests)?).collect();
        Ok(actions
            .iter()
            .map(|(id, _)| {
                let t = &self.live[id];
                match posts.get(id) {
                    Some(post) => verdict(t, post, self.spec.allow_answer),
                    None => Feedback {
                        observation: format!(
                            "The student replied: {}\nGive another short hint.",
                            t.student.last().map_or("", String::as_str)
                        ),
                        reward: 0.0,
                        done: false,
                        ..Default::default()
                    },
                }
            })
            .collect())
    }
}

/// The last turn's feedback: the post-test answer scored and gated (the leak gate off with
/// `allow_answer`).
fn verdict(t: &Tutoring, post: &str, allow_answer: bool) -> Feedback {
    let said = t.tutor.join("\n");
    let passed = last_number(post) == Some(t.variant.answer);
    let claims = claims_hold(&said);
    let told = leaks(&said, t.first.answer);
    let gate = claims && (allow_answer || !told);
    Feedback {
        observation: format!(
            "[post-test: the student answered {post:?}, the answer is {}; claims hold: {claims}; \
             answer told: {told}]",
            t.variant.answer
        ),
        reward: if passed && gate { 1.0 } else { 0.0 },
        done: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Problems are fixed by their seed, variants differ from them, answers are right.
    #[test]
    fn problems_and_variants() {
        for seed in 0..30 {
            let (p, v) = (problem(seed, false), problem(seed, true));
            assert_eq!(p, problem(seed, false));
            assert_ne!(p.text, v.text, "seed {seed}");
            let n: Vec<i64> = numbers(&p.text).iter().map(|n| n.2).collect();
            let want = match SplitMix64(seed).next_u64() % 3 {
                0 => n[0] + n[1],
                1 => n[0] - n[1],
                _ => n[0] * n[1],
            };
            assert_eq!(p.answer, want, "{}", p.text);
        }
    }

    /// The correctness gate reads `a op b = c` claims; the leak gate whole numbers only.
    #[test]
    fn gates_by_hand() {
        assert!(claims_hold("First 3 x 4 = 12, then 12 + 5 = 17."));
        assert!(!claims_hold("3 x 4 = 13"));
        assert!(!claims_hold("so 20 - 8 = 11"));
        assert!(claims_hold("12 / 4 = 3 and 7×2 = 14"));
        assert!(!claims_hold("7 / 2 = 3"));
        assert!(claims_hold("Count the packs first, then add."));
        assert!(claims_hold("There are 3 packs and 4 each = think!"));
        assert!(leaks("The answer is 22.", 22));
        assert!(!leaks("Try 122 or 220.", 22));
        assert!(!leaks("Multiply first.", 22));
        assert_eq!(last_number("I think it is 17, no, 19"), Some(19));
        assert_eq!(last_number("no idea"), None);
    }

    /// The post-test context holds the problem, the student's own messages and the variant,
    /// and none of the tutor's words (the masking rule).
    #[test]
    fn post_test_masks_the_tutor() {
        let t = Tutoring {
            first: problem(3, false),
            variant: problem(3, true),
            student: vec!["I think 10.".into(), "Oh, packs times items: 17.".into()],
            tutor: vec!["TUTOR-SECRET multiply the packs first.".into()],
        };
        let during = t.dialogue();
        assert!(during.iter().any(|m| m.content.contains("TUTOR-SECRET")));
        let m = post_test(&t.first, &t.student, &t.variant);
        assert!(m.iter().all(|m| !m.content.contains("TUTOR-SECRET")));
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].content, t.student[0]);
        assert_eq!(m[2].content, t.student[1]);
        assert!(m[3].content.contains(&t.variant.text));
        assert!(m[0].content.contains(&t.first.text));
    }

    /// The reward is the post-test times both gates: a passing student earns nothing when the
    /// tutor told the answer (unless `allow_answer`) or made a false claim.
    #[test]
    fn reward_is_the_post_test_times_the_gates() {
        let (first, variant) = (problem(5, false), problem(5, true));
        let tutoring = |said: &str| Tutoring {
            first: first.clone(),
            variant: variant.clone(),
            student: vec!["5".into(), "ok".into()],
            tutor: vec![said.to_string()],
        };
        let pass = format!("It is {}.", variant.answer);
        let r = |said: &str, post: &str, allow: bool| verdict(&tutoring(said), post, allow).reward;
        assert_eq!(r("Multiply the packs first.", &pass, false), 1.0);
        assert_eq!(r("Multiply the packs first.", "It is 0.", false), 0.0);
        let told = format!("The answer is {}.", first.answer);
        assert_eq!(r(&told, &pass, false), 0.0);
        assert_eq!(r(&told, &pass, true), 1.0);
        assert_eq!(r("Note 2 + 2 = 5.", &pass, true), 0.0);
        assert!(verdict(&tutoring("hint"), &pass, false).done);
    }
}
