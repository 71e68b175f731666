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
//! With `reward = "learning_gain"` the post-test's score is replaced by the learning gain
//! post − pre ∈ {−1, 0, 1}: the **pre-test** is the student's answer to the post-test's own
//! item asked alone before any tutoring (the variant, or with a dataset the problem itself, whose
//! first attempt it is); a closed gate gives −1 (our choice: the paper's text was not reachable,
//! and a gated episode must rank below one where the student did not learn). The ablations:
//! `allow_answer`, `claims_gate = false` (no correctness gate), `mask_tutor = false` (the
//! post-test sees the whole dialogue). `problems` reads the problems from a dataset
//! ([`Problems`]). The last observation records the pre- and post-test and both gates (it reaches
//! `samples.jsonl` with the transcript); each ending turn's `info` logs them as `env/*`.

use super::problems::{Problem, Problems, last_number, leaks, numbers};
use crate::common::config::defaults::{is_true, yes};
use crate::lm::participant::{Backend, ChatFormat, Source};
use anyhow::Result;
use burn::tensor::Device;
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
    /// The correctness gate (`false`: its ablation, the tutor's claims are not checked).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub claims_gate: bool,
    /// The tutor's turns masked out of the post-test's context (`false`: its ablation).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub mask_tutor: bool,
    /// What the gated reward scores: the post-test, or the learning gain post − pre.
    #[serde(default, skip_serializing_if = "TutorReward::is_post_test")]
    pub reward: TutorReward,
    /// A dataset of problems (JSON lines or Parquet with `question` and an integer `answer`,
    /// GSM8K's `#### n` read as n; `~`, `$VAR`): the post-test is then the problem itself.
    /// None: the generated word problems with near-transfer variants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problems: Option<String>,
}

/// What the tutor's gated reward scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TutorReward {
    /// 1 when the post-test is right.
    #[default]
    PostTest,
    /// post − pre: the post-test's score less the same item's score before tutoring.
    LearningGain,
}

impl TutorReward {
    fn is_post_test(&self) -> bool {
        *self == Self::PostTest
    }
}

fn forty_eight() -> usize {
    48
}
fn three() -> u32 {
    3
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
/// turns masked out), then the variant (or the problem again, when the variant is the problem).
pub fn post_test(first: &Problem, student: &[String], variant: &Problem) -> Vec<Message> {
    let mut m = vec![Message::new("user", &ask(first))];
    m.extend(student.iter().map(|s| Message::new("assistant", s)));
    m.push(post_question(first, variant));
    m
}

/// The post-test's question.
fn post_question(first: &Problem, variant: &Problem) -> Message {
    let lead = if variant == first {
        "Now solve the problem again on your own."
    } else {
        "Here is a new problem."
    };
    Message::new("user", &format!("{lead} {}", ask(variant)))
}

struct Tutoring {
    first: Problem,
    variant: Problem,
    /// The student's messages: its first answer, then its replies.
    student: Vec<String>,
    /// The tutor's messages.
    tutor: Vec<String>,
    /// The pre-test: the student answered the post-test's item right before tutoring.
    pre: bool,
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

    /// The post-test's context: masked ([`post_test`]), or the whole dialogue (the ablation).
    fn post_context(&self, mask_tutor: bool) -> Vec<Message> {
        if mask_tutor {
            return post_test(&self.first, &self.student, &self.variant);
        }
        let mut m = self.dialogue();
        m.push(post_question(&self.first, &self.variant));
        m
    }
}

/// The tutoring environment.
pub struct TutorEnv {
    student: Backend,
    chat: ChatFormat,
    spec: TutorSpec,
    problems: Problems,
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
        let problems = Problems::open(spec.problems.as_deref())?;
        if let Problems::File {
            dropped: n @ 1.., ..
        } = &problems
        {
            eprintln!("env.problems: {n} problems state their own answer in their text; left out");
        }
        let student = Backend::open(&src, device)?;
        let chat = student.chat_format("env")?;
        Ok(Self {
            student,
            chat,
            spec: spec.clone(),
            problems,
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
            .map(|e| self.problems.episode(e.seed))
            .collect();
        // The problems, then the variants that differ from them (their pre-tests), in one batch.
        let alone = |p: &Problem| vec![Message::new("user", &ask(p))];
        let mut asks: Vec<Vec<Message>> = problems.iter().map(|(p, _)| alone(p)).collect();
        asks.extend(
            problems
                .iter()
                .filter(|(p, v)| p != v)
                .map(|(_, v)| alone(v)),
        );
        let mut answers = self.answer(&asks)?.into_iter();
        let attempts: Vec<String> = answers.by_ref().take(problems.len()).collect();
        self.live.clear();
        let mut out = Vec::with_capacity(episodes.len());
        for ((e, (first, variant)), attempt) in episodes.iter().zip(problems).zip(attempts) {
            let pre_answer = if first == variant {
                Some(attempt.clone())
            } else {
                answers.next()
            };
            let pre = pre_answer.and_then(|a| last_number(&a)) == Some(variant.answer);
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
                pre,
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
            .map(|id| self.live[id].post_context(self.spec.mask_tutor))
            .collect();
        let posts: HashMap<usize, String> =
            ending.iter().copied().zip(self.answer(&tests)?).collect();
        Ok(actions
            .iter()
            .map(|(id, _)| {
                let t = &self.live[id];
                match posts.get(id) {
                    Some(post) => verdict(t, post, &self.spec),
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

/// The last turn's feedback: the post-test (or the learning gain) scored and gated, the
/// gates as the spec's ablations leave them; `info` holds the pre- and post-test, the gain and
/// both gates (`env/*` in the metrics).
fn verdict(t: &Tutoring, post: &str, spec: &TutorSpec) -> Feedback {
    let said = t.tutor.join("\n");
    let passed = last_number(post) == Some(t.variant.answer);
    let claims = claims_hold(&said);
    let told = leaks(&said, t.first.answer);
    let gate = (claims || !spec.claims_gate) && (spec.allow_answer || !told);
    let gain = f32::from(u8::from(passed)) - f32::from(u8::from(t.pre));
    let reward = match (spec.reward, gate) {
        (TutorReward::PostTest, true) => f32::from(u8::from(passed)),
        (TutorReward::PostTest, false) => 0.0,
        (TutorReward::LearningGain, true) => gain,
        (TutorReward::LearningGain, false) => -1.0,
    };
    let flag = |b: bool| f64::from(u8::from(b));
    let info = [
        ("pre_test", flag(t.pre)),
        ("post_test", flag(passed)),
        ("learning_gain", f64::from(gain)),
        ("claims_hold", flag(claims)),
        ("answer_told", flag(told)),
    ];
    Feedback {
        observation: format!(
            "[pre-test: {}; post-test: the student answered {post:?}, the answer is {}; claims \
             hold: {claims}; answer told: {told}]",
            if t.pre { "right" } else { "wrong" },
            t.variant.answer
        ),
        reward,
        done: true,
        info: info.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::problems::problem;

    /// The tutor spec of a recipe with only the student's path.
    fn spec() -> TutorSpec {
        toml::from_str("path = \"student.gguf\"").unwrap()
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
            pre: false,
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
        assert_eq!(t.post_context(true), m);
        // The ablation: the post-test sees the whole dialogue, the tutor's words included.
        let all = t.post_context(false);
        assert!(all.iter().any(|m| m.content.contains("TUTOR-SECRET")));
        assert_eq!(all.len(), 5);
        assert!(all[4].content.starts_with("Here is a new problem."));
        // With a dataset the post-test is the problem itself, asked again.
        let same = post_test(&t.first, &t.student, &t.first);
        assert!(
            same[3]
                .content
                .starts_with("Now solve the problem again on your own.")
        );
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
            pre: false,
        };
        let pass = format!("It is {}.", variant.answer);
        let r = |said: &str, post: &str, allow: bool| {
            let spec = TutorSpec {
                allow_answer: allow,
                ..spec()
            };
            verdict(&tutoring(said), post, &spec).reward
        };
        assert_eq!(r("Multiply the packs first.", &pass, false), 1.0);
        assert_eq!(r("Multiply the packs first.", "It is 0.", false), 0.0);
        let told = format!("The answer is {}.", first.answer);
        assert_eq!(r(&told, &pass, false), 0.0);
        assert_eq!(r(&told, &pass, true), 1.0);
        assert_eq!(r("Note 2 + 2 = 5.", &pass, true), 0.0);
        assert!(verdict(&tutoring("hint"), &pass, &spec()).done);
        // The correctness gate's ablation lets a false claim through.
        let no_claims = TutorSpec {
            claims_gate: false,
            ..spec()
        };
        assert_eq!(
            verdict(&tutoring("Note 2 + 2 = 5."), &pass, &no_claims).reward,
            1.0
        );
    }

    /// The learning gain post − pre by hand: a student who was wrong before and right after
    /// earns 1, right both times 0, right before and wrong after −1; a closed gate gives −1.
    /// `info` logs the pre- and post-test, the gain and the gates.
    #[test]
    fn learning_gain_is_post_minus_pre_and_gated() {
        let (first, variant) = (problem(7, false), problem(7, true));
        let gain = TutorSpec {
            reward: TutorReward::LearningGain,
            ..spec()
        };
        let pass = format!("So {}.", variant.answer);
        let fail = format!("So {}.", variant.answer + 1);
        let case = |pre: bool, post: &str, said: &str| {
            let t = Tutoring {
                first: first.clone(),
                variant: variant.clone(),
                student: vec!["?".into(), "ok".into()],
                tutor: vec![said.into()],
                pre,
            };
            verdict(&t, post, &gain)
        };
        assert_eq!(case(false, &pass, "Count the packs.").reward, 1.0);
        assert_eq!(case(true, &pass, "Count the packs.").reward, 0.0);
        assert_eq!(case(true, &fail, "Count the packs.").reward, -1.0);
        assert_eq!(case(false, &fail, "Count the packs.").reward, 0.0);
        let told = format!("It is {}.", first.answer);
        assert_eq!(case(false, &pass, &told).reward, -1.0);
        let f = case(false, &pass, &told);
        let want = [
            ("answer_told", 1.0),
            ("claims_hold", 1.0),
            ("learning_gain", 1.0),
            ("post_test", 1.0),
            ("pre_test", 0.0),
        ];
        assert_eq!(
            f.info.into_iter().collect::<Vec<_>>(),
            want.map(|(k, v)| (k.to_string(), v))
        );
        assert!(f.observation.starts_with("[pre-test: wrong; post-test:"));
    }
}
