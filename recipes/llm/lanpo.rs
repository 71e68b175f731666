//! LANPO's experience pool and the feedback it puts in the context (Li, Wang, Yuan, Jegelka,
//! Wang, arXiv 2510.16552): language guides exploration, only the numerical reward drives the
//! update. Per problem the pool keeps the policy's earlier attempts (with their rewards, which
//! no context ever shows); across problems it keeps lessons the policy wrote about problems it
//! solved, each with its problem's prompt embedding. A feedback sample's context holds
//!
//! - **Reward-Agnostic Reflection**: one earlier attempt of the policy at the same problem,
//!   without its reward or the reference answer, to check and improve on, and
//! - **Relevant Abstraction**: at most k lessons from *other* problems whose prompts are
//!   similar (centred cosine ≥ γ); a lesson keeps none of its source's numbers, and a lesson
//!   that holds this problem's answer is not shown.
//!
//! The paper's text beyond its abstract was not reachable; the choices where it is silent are
//! stated in `docs/src/lanpo.md`.

use crate::llm::schema::LanpoSpec;
use anyhow::{Context, Result, anyhow, bail};
use ember_tasks::task::Example;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

/// The pool's file in a checkpoint directory.
pub const POOL_FILE: &str = "lanpo_pool.json";

/// One attempt of the policy at a problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The response text.
    pub text: String,
    /// Its reward: chooses the attempt a lesson is written from; never shown in a context.
    pub reward: f32,
}

/// A problem's earlier attempts, newest last, and the last step that drew it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Problem {
    attempts: VecDeque<Attempt>,
    seen: usize,
}

/// A lesson the policy wrote about a problem it solved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lesson {
    /// The problem's key ([`key`]): never shown to the same problem.
    pub source: String,
    /// The lesson, its source's numbers masked.
    pub text: String,
    /// The source prompt's embedding (the policy's last hidden state at the prompt's end).
    pub embedding: Vec<f32>,
}

/// The experience pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    problems: BTreeMap<String, Problem>,
    lessons: VecDeque<Lesson>,
    /// Sum and count of every prompt embedding seen: the centre similarities are taken about.
    centre_sum: Vec<f64>,
    centre_n: u64,
}

/// A problem's identity in the pool: its prompt, question and conversation.
pub fn key(e: &Example) -> String {
    serde_json::to_string(&(&e.prompt, &e.question, &e.messages)).unwrap_or_default()
}

/// The feedback appended to a problem's user message. It takes texts only, so no reward and no
/// reference answer can reach a context (the leakage rule of Reward-Agnostic Reflection).
pub fn render_feedback(lessons: &[&str], attempt: Option<&str>) -> String {
    let mut s = String::new();
    if !lessons.is_empty() {
        s.push_str("\n\nTips learned on similar questions:");
        for l in lessons {
            s.push_str("\n- ");
            s.push_str(l);
        }
    }
    if let Some(a) = attempt {
        s.push_str("\n\nAn earlier attempt at this question, which may be right or wrong:\n");
        s.push_str(a.trim());
        s.push_str("\nCheck it, then reply as asked.");
    }
    s
}

/// The request for a lesson about a solved problem: a general tip without its numbers.
pub fn lesson_request(question: &str, answer: &str) -> String {
    format!(
        "Question: {question}\nA good reply: {}\nIn one short sentence, give a general tip for \
         answering questions like this one. Do not use the numbers of this question.",
        answer.trim()
    )
}

/// A lesson as written: its first non-empty line, at most 300 characters, with every digit
/// run that also occurs in `sources` (the question, the reply, the answer) replaced by `N`;
/// none when nothing is left.
pub fn clean_lesson(text: &str, sources: &[&str]) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line: String = line.chars().take(300).collect();
    let numbers: Vec<&str> = sources.iter().flat_map(|s| digit_runs(s)).collect();
    let mut out = String::new();
    let mut rest = line.as_str();
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let end = rest[start..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len(), |e| start + e);
        out.push_str(&rest[..start]);
        let run = &rest[start..end];
        out.push_str(if numbers.contains(&run) { "N" } else { run });
        rest = &rest[end..];
    }
    out.push_str(rest);
    let out = out.trim().to_string();
    (!out.is_empty()).then_some(out)
}

/// The maximal runs of ASCII digits in `s`.
fn digit_runs(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|r| !r.is_empty())
}

/// Whether `word` occurs in `text` with no letter or digit on either side.
pub fn contains_word(text: &str, word: &str) -> bool {
    let word = word.trim();
    if word.is_empty() {
        return false;
    }
    let alnum = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    text.match_indices(word).any(|(i, w)| {
        !alnum(text[..i].chars().next_back()) && !alnum(text[i + w.len()..].chars().next())
    })
}

/// Cosine similarity of `a` and `b` about `centre` (0 when either is the centre).
fn centred_cosine(a: &[f32], b: &[f32], centre: &[f64]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for ((x, y), c) in a.iter().zip(b).zip(centre) {
        let (x, y) = (f64::from(*x) - c, f64::from(*y) - c);
        (ab, aa, bb) = (ab + x * y, aa + x * x, bb + y * y);
    }
    if aa <= 0.0 || bb <= 0.0 {
        0.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}

impl Pool {
    /// The problem's attempts, newest first.
    pub fn attempts(&self, key: &str) -> Vec<&Attempt> {
        self.problems
            .get(key)
            .map(|p| p.attempts.iter().rev().collect())
            .unwrap_or_default()
    }

    /// Problems and lessons held.
    pub fn sizes(&self) -> (usize, usize) {
        (self.problems.len(), self.lessons.len())
    }

    /// Adds the attempts of a problem drawn at `step`, keeping the newest `kept`; past
    /// `problems_kept` problems the least recently drawn goes.
    pub fn record(&mut self, key: &str, attempts: Vec<Attempt>, step: usize, spec: &LanpoSpec) {
        let p = self.problems.entry(key.to_string()).or_default();
        p.attempts.extend(attempts);
        while p.attempts.len() > spec.attempts_kept {
            p.attempts.pop_front();
        }
        p.seen = step;
        while self.problems.len() > spec.problems_kept {
            let oldest = self
                .problems
                .iter()
                .filter(|(k, _)| k.as_str() != key)
                .min_by_key(|(_, p)| p.seen)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.problems.remove(&k),
                None => break,
            };
        }
    }

    /// Counts a prompt embedding into the centre.
    pub fn observe(&mut self, embedding: &[f32]) {
        if self.centre_sum.len() != embedding.len() {
            self.centre_sum = vec![0.0; embedding.len()];
            self.centre_n = 0;
        }
        for (s, x) in self.centre_sum.iter_mut().zip(embedding) {
            *s += f64::from(*x);
        }
        self.centre_n += 1;
    }

    /// Adds a lesson; past `kept` the oldest goes.
    pub fn add_lesson(&mut self, lesson: Lesson, kept: usize) {
        self.lessons.push_back(lesson);
        while self.lessons.len() > kept {
            self.lessons.pop_front();
        }
    }

    /// The lessons relevant to problem `key` (prompt `embedding`, reference `answer`): from
    /// other problems, centred cosine ≥ `gamma`, without the answer as a word, distinct texts,
    /// the `k` most similar first, with their similarities.
    pub fn relevant(
        &self,
        key: &str,
        embedding: &[f32],
        answer: &str,
        k: usize,
        gamma: f64,
    ) -> Vec<(&str, f64)> {
        let n = self.centre_n.max(1) as f64;
        let centre: Vec<f64> = self.centre_sum.iter().map(|s| s / n).collect();
        let mut found: Vec<(&str, f64)> = self
            .lessons
            .iter()
            .filter(|l| l.source != key && !contains_word(&l.text, answer))
            .map(|l| {
                (
                    l.text.as_str(),
                    centred_cosine(&l.embedding, embedding, &centre),
                )
            })
            .filter(|(_, s)| *s >= gamma)
            .collect();
        found.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut shown: Vec<(&str, f64)> = Vec::new();
        for f in found {
            if shown.len() < k && !shown.iter().any(|s| s.0 == f.0) {
                shown.push(f);
            }
        }
        shown
    }

    /// Writes the pool into checkpoint `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string(self)?;
        std::fs::write(dir.join(POOL_FILE), text).context("writing LANPO's experience pool")
    }

    /// The pool stored in checkpoint `dir`, checked against the table's bounds and the
    /// policy's hidden size `dim`, so that a damaged or foreign file is named.
    pub fn load(dir: &Path, spec: &LanpoSpec, dim: usize) -> Result<Self> {
        let p = dir.join(POOL_FILE);
        let text = ember_train::io::read_to_string(&p)
            .with_context(|| format!("reading {}", p.display()))?;
        let pool: Pool = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: not a LANPO pool: {e}", p.display()))?;
        let bad = |m: String| anyhow!("{}: {m}", p.display());
        if pool.problems.len() > spec.problems_kept || pool.lessons.len() > spec.lessons_kept {
            return Err(bad(format!(
                "{} problems and {} lessons, more than lanpo.problems_kept = {} or \
                 lanpo.lessons_kept = {}",
                pool.problems.len(),
                pool.lessons.len(),
                spec.problems_kept,
                spec.lessons_kept
            )));
        }
        if pool
            .problems
            .values()
            .any(|pr| pr.attempts.len() > spec.attempts_kept)
        {
            return Err(bad(
                "a problem holds more attempts than lanpo.attempts_kept".into(),
            ));
        }
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        let dims_ok = pool
            .lessons
            .iter()
            .all(|l| l.embedding.len() == dim && finite(&l.embedding))
            && (pool.centre_sum.is_empty() || pool.centre_sum.len() == dim)
            && pool.centre_sum.iter().all(|x| x.is_finite());
        if !dims_ok {
            bail!(
                "{}: embeddings that are not finite or of another size than the policy's hidden \
                 size {dim}",
                p.display()
            );
        }
        Ok(pool)
    }
}

/// A run's LANPO state: the table, the pool, and the step in progress.
pub struct Lanpo {
    /// The `[lanpo]` table.
    pub spec: LanpoSpec,
    /// The experience pool.
    pub pool: Pool,
    /// The step between its rollout and its rewards.
    pub pending: Option<Pending>,
}

impl Lanpo {
    /// Whether the update scores the feedback samples on the plain prompt (not the one they
    /// were sampled with), so that π_old must be recomputed.
    pub fn scores_plain(&self) -> bool {
        self.spec.update_context == crate::llm::schema::UpdateContext::Removed
    }
}

/// A step between its rollout and its rewards: each problem's key and prompt embedding, and
/// each row's feedback (none for the samples drawn from scratch).
pub type Pending = (Vec<(String, Vec<f32>)>, Vec<Option<Feedback>>);

/// One feedback sample's context.
#[derive(Debug, Clone, PartialEq)]
pub struct Feedback {
    /// The text appended to the user message ([`render_feedback`]).
    pub text: String,
    /// An earlier attempt is shown.
    pub reflected: bool,
    /// Lessons shown.
    pub lessons: usize,
    /// Mean centred cosine of the shown lessons' problems (0 with none).
    pub similarity: f64,
}

/// The contexts of a step's `m` feedback samples per problem, problem-major. Problem `i` is
/// `problems[i]` (key, example, prompt embedding) and `fresh[i]` its attempts drawn from
/// scratch this step; feedback sample `j` reflects on attempt `j` of this step's then the
/// pool's (newest first), cycling, and every sample of a problem sees the same lessons.
pub fn plan(
    pool: &Pool,
    spec: &LanpoSpec,
    problems: &[(&str, &Example, &[f32])],
    fresh: &[Vec<String>],
    m: usize,
) -> Vec<Feedback> {
    let mut out = Vec::with_capacity(problems.len() * m);
    for ((key, e, emb), fresh) in problems.iter().zip(fresh) {
        let lessons = match spec.abstraction {
            true => pool.relevant(key, emb, &e.answer, spec.lessons_shown, spec.similarity),
            false => Vec::new(),
        };
        let texts: Vec<&str> = lessons.iter().map(|l| l.0).collect();
        let similarity = match lessons.len() {
            0 => 0.0,
            n => lessons.iter().map(|l| l.1).sum::<f64>() / n as f64,
        };
        let earlier: Vec<&str> = fresh
            .iter()
            .map(String::as_str)
            .chain(pool.attempts(key).into_iter().map(|a| a.text.as_str()))
            .filter(|a| !a.trim().is_empty())
            .collect();
        for j in 0..m {
            let attempt =
                (spec.reflection && !earlier.is_empty()).then(|| earlier[j % earlier.len()]);
            out.push(Feedback {
                text: render_feedback(&texts, attempt),
                reflected: attempt.is_some(),
                lessons: texts.len(),
                similarity,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
