//! Program synthesis against a knowledge base (Neural Symbolic Machines, Liang et al., ACL
//! 2017): questions about a generated world of countries, cities and rivers, answered by a
//! program a policy writes and a symbolic computer runs (`lisp.rs`), which also names the
//! words that keep the program valid (the sampler's mask). The reward is the answer's F1
//! against the gold answer; the gold program only checks that the question is answerable, and
//! is never shown (weak supervision).

pub mod kb;
pub mod lisp;

use crate::env::{EnvError, Environment, Episode, Feedback};
use ember_engine::SplitMix64;
use kb::{Kb, KbSpec, Kind};
use lisp::{Value, Word, Words};
use std::collections::BTreeMap;

/// A question: its words (the entity by its name), its entities (linked: `v0, v1, …` of the
/// computer), its gold answer, and the template it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    /// Index in [`ProgramTask::questions`].
    pub id: usize,
    /// The question's words.
    pub words: Vec<String>,
    /// The linked entities.
    pub entities: Vec<usize>,
    /// The gold answer (the gold program's).
    pub answer: Value,
    /// The template's index.
    pub template: usize,
}

/// `(entity kind, question with X for the entity, gold program)`.
const TEMPLATES: [(Kind, &str, &str); 23] = [
    (Kind::City, "which country is X in", "( hop v0 country )"),
    (
        Kind::City,
        "which rivers flow through X",
        "( hop v0 rivers )",
    ),
    (
        Kind::City,
        "what is the capital of the country of X",
        "( hop v0 country ) ( hop v1 capital )",
    ),
    (
        Kind::City,
        "how many cities are in the country of X",
        "( hop v0 country ) ( hop v1 cities ) ( count v2 )",
    ),
    (
        Kind::City,
        "what is the biggest city in the country of X",
        "( hop v0 country ) ( hop v1 cities ) ( argmax v2 population )",
    ),
    (
        Kind::City,
        "what is the oldest city in the country of X",
        "( hop v0 country ) ( hop v1 cities ) ( argmin v2 founded )",
    ),
    (
        Kind::City,
        "what is the longest river through X",
        "( hop v0 rivers ) ( argmax v1 length )",
    ),
    (
        Kind::City,
        "how many rivers flow through X",
        "( hop v0 rivers ) ( count v1 )",
    ),
    (Kind::Country, "which cities are in X", "( hop v0 cities )"),
    (
        Kind::Country,
        "what is the capital of X",
        "( hop v0 capital )",
    ),
    (
        Kind::Country,
        "how many cities are in X",
        "( hop v0 cities ) ( count v1 )",
    ),
    (
        Kind::Country,
        "what is the biggest city in X",
        "( hop v0 cities ) ( argmax v1 population )",
    ),
    (
        Kind::Country,
        "what is the smallest city in X",
        "( hop v0 cities ) ( argmin v1 population )",
    ),
    (
        Kind::Country,
        "what is the oldest city in X",
        "( hop v0 cities ) ( argmin v1 founded )",
    ),
    (
        Kind::Country,
        "what is the newest city in X",
        "( hop v0 cities ) ( argmax v1 founded )",
    ),
    (
        Kind::Country,
        "which rivers flow through X",
        "( hop v0 rivers )",
    ),
    (
        Kind::Country,
        "how many rivers flow through X",
        "( hop v0 rivers ) ( count v1 )",
    ),
    (
        Kind::Country,
        "what is the longest river through X",
        "( hop v0 rivers ) ( argmax v1 length )",
    ),
    (
        Kind::Country,
        "what is the shortest river through X",
        "( hop v0 rivers ) ( argmin v1 length )",
    ),
    (
        Kind::Country,
        "which rivers flow through the capital of X",
        "( hop v0 capital ) ( hop v1 rivers )",
    ),
    (
        Kind::River,
        "which countries does X flow through",
        "( hop v0 countries )",
    ),
    (
        Kind::River,
        "how many countries does X flow through",
        "( hop v0 countries ) ( count v1 )",
    ),
    (
        Kind::River,
        "which cities are in the countries X flows through",
        "( hop v0 countries ) ( hop v1 cities )",
    ),
];

/// The model's vocabulary: `<bos>`, `<sep>`, `<eos>`, the question words, the entity names,
/// then the program words ([`Words`]' order).
#[derive(Debug, Clone, PartialEq)]
pub struct Vocab {
    tokens: Vec<String>,
    index: BTreeMap<String, u32>,
    /// Where the program words start.
    program: usize,
    words: Words,
}

/// The beginning of a prompt.
pub const BOS: u32 = 0;
/// Between the question and the program.
pub const SEP: u32 = 1;
/// The end of a program (after `return`).
pub const EOS: u32 = 2;

impl Vocab {
    fn new(kb: &Kb, words: Words) -> Self {
        let mut tokens: Vec<String> = ["<bos>", "<sep>", "<eos>"].map(String::from).to_vec();
        let mut q: Vec<&str> = TEMPLATES
            .iter()
            .flat_map(|t| t.1.split(' '))
            .filter(|w| *w != "X")
            .collect();
        q.sort_unstable();
        q.dedup();
        tokens.extend(q.iter().map(|w| w.to_string()));
        tokens.extend(kb.names.iter().cloned());
        let program = tokens.len();
        tokens.extend(
            (0..words.len())
                .filter_map(|i| words.word(i))
                .map(|w| words.text(w, kb)),
        );
        let index = tokens[..program]
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Self {
            tokens,
            index,
            program,
            words,
        }
    }

    /// The vocabulary's size.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never: the special tokens are always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The token of program word `w`.
    pub fn token(&self, w: Word) -> u32 {
        (self.program + self.words.index(w)) as u32
    }

    /// The program word of token `t`, if it is one.
    pub fn word(&self, t: u32) -> Option<Word> {
        (t as usize)
            .checked_sub(self.program)
            .and_then(|i| self.words.word(i))
    }

    /// The text of token `t` (`?` past the end).
    pub fn text(&self, t: u32) -> &str {
        self.tokens.get(t as usize).map_or("?", String::as_str)
    }
}

/// The questions of a world, their held-out split (about one in five, by a hash of the
/// template and the entity under the world's seed) and the model's vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramTask {
    /// The world.
    pub kb: Kb,
    /// The program words.
    pub words: Words,
    /// Expressions a program may hold.
    pub max_exprs: usize,
    /// Every answerable question.
    pub questions: Vec<Question>,
    /// Training question ids.
    pub train: Vec<usize>,
    /// Held-out question ids.
    pub held_out: Vec<usize>,
    /// The model's vocabulary.
    pub vocab: Vocab,
}

impl ProgramTask {
    /// The task of world `spec` with programs of at most `max_exprs` expressions (1..=6).
    ///
    /// # Errors
    /// A message naming the key out of range.
    pub fn new(spec: &KbSpec, max_exprs: usize) -> Result<Self, String> {
        kb::check_spec(spec)?;
        if !(1..=6).contains(&max_exprs) {
            return Err(format!("max_exprs = {max_exprs} must be in 1..=6"));
        }
        let kb = Kb::generate(spec);
        let words = Words {
            vars: 1 + max_exprs,
            relations: kb.relations.len(),
            attributes: kb.attributes.len(),
        };
        let mut questions = Vec::new();
        for (t, (kind, text, gold)) in TEMPLATES.iter().enumerate() {
            let mut program: Vec<Word> = gold
                .split(' ')
                .filter_map(|s| words.parse(s, &kb))
                .collect();
            program.push(Word::Return);
            for e in kb.of_kind(*kind) {
                let Ok(answer) = lisp::run(&kb, words, &[e], max_exprs, &program) else {
                    continue;
                };
                let words = text
                    .split(' ')
                    .map(|w| {
                        if w == "X" {
                            kb.names[e].clone()
                        } else {
                            w.into()
                        }
                    })
                    .collect();
                questions.push(Question {
                    id: questions.len(),
                    words,
                    entities: vec![e],
                    answer,
                    template: t,
                });
            }
        }
        let held = |q: &Question| {
            let h = (q.template as u64) << 32 | q.entities[0] as u64;
            SplitMix64(spec.seed ^ h.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .next_u64()
                .is_multiple_of(5)
        };
        let (held_out, train): (Vec<usize>, Vec<usize>) = questions
            .iter()
            .map(|q| q.id)
            .partition(|i| held(&questions[*i]));
        if train.is_empty() || held_out.is_empty() {
            return Err(format!(
                "the world of kb = {{ countries = {}, cities_per_country = {}, rivers = {} }} \
                 gives {} training and {} held-out questions: both must be non-empty (raise \
                 kb.countries or kb.rivers)",
                spec.countries,
                spec.cities_per_country,
                spec.rivers,
                train.len(),
                held_out.len()
            ));
        }
        let vocab = Vocab::new(&kb, words);
        Ok(Self {
            kb,
            words,
            max_exprs,
            questions,
            train,
            held_out,
            vocab,
        })
    }

    /// The prompt of question `q`: `<bos>`, its words, `<sep>`.
    pub fn prompt(&self, q: &Question) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = vec![BOS];
        out.extend(q.words.iter().filter_map(|w| v.index.get(w).copied()));
        out.push(SEP);
        out
    }

    /// The reward of `program` (tokens, `<eos>` and anything after it ignored) on `q`: the F1
    /// of its answer, 0 when the computer refuses it or it never returns.
    pub fn reward(&self, q: &Question, program: &[u32]) -> f32 {
        let words: Option<Vec<Word>> = program
            .iter()
            .take_while(|t| **t != EOS)
            .map(|t| self.vocab.word(*t))
            .collect();
        words
            .and_then(|w| lisp::run(&self.kb, self.words, &q.entities, self.max_exprs, &w).ok())
            .map_or(0.0, |a| lisp::f1(&a, &q.answer))
    }

    /// A computer for question `q`.
    pub fn computer(&self, q: &Question) -> lisp::Computer<'_> {
        lisp::Computer::new(&self.kb, self.words, &q.entities, self.max_exprs)
    }

    /// The tokens `q`'s program may draw after `drawn` (its response so far): the computer's
    /// allowed words, `<eos>` once it has returned, nothing after `<eos>` or a refused word.
    pub fn allowed(&self, q: &Question, drawn: &[u32]) -> Vec<u32> {
        self.writing(q).allowed(drawn)
    }

    /// [`allowed`](Self::allowed) before each token of `program` (one list per token).
    pub fn allowed_along(&self, q: &Question, program: &[u32]) -> Vec<Vec<u32>> {
        let mut w = self.writing(q);
        (0..program.len())
            .map(|k| w.allowed(&program[..k]))
            .collect()
    }

    /// A program being written for `q`, token by token.
    pub fn writing(&self, q: &Question) -> Writing<'_> {
        Writing {
            task: self,
            computer: self.computer(q),
            seen: 0,
            state: State::Writing,
        }
    }

    /// Program tokens as text, space-separated (up to `<eos>`).
    pub fn program_text(&self, program: &[u32]) -> String {
        let words: Vec<&str> = program
            .iter()
            .take_while(|t| **t != EOS)
            .map(|t| self.vocab.text(*t))
            .collect();
        words.join(" ")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Writing,
    Ended,
    Refused,
}

/// A program being written, fed its tokens as they are drawn (each is run once).
#[derive(Debug, Clone)]
pub struct Writing<'t> {
    task: &'t ProgramTask,
    computer: lisp::Computer<'t>,
    seen: usize,
    state: State,
}

impl Writing<'_> {
    /// The tokens allowed after `drawn`, whose first tokens are those of earlier calls (the
    /// new ones are run): as [`ProgramTask::allowed`].
    pub fn allowed(&mut self, drawn: &[u32]) -> Vec<u32> {
        for t in drawn.get(self.seen..).unwrap_or_default() {
            self.state = match (self.state, self.task.vocab.word(*t)) {
                (State::Writing, Some(w)) if self.computer.push(w).is_ok() => State::Writing,
                (State::Writing, None) if *t == EOS && self.computer.is_done() => State::Ended,
                _ => State::Refused,
            };
        }
        self.seen = self.seen.max(drawn.len());
        match self.state {
            State::Writing if self.computer.is_done() => vec![EOS],
            State::Writing => {
                let v = &self.task.vocab;
                self.computer
                    .allowed()
                    .into_iter()
                    .map(|w| v.token(w))
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// The task as a single-turn [`Environment`]: an episode's seed picks a question (held out
/// when [`crate::env::EpisodeSource`] holds the seed out, else a training one), the
/// observation is the question, the action a program as space-separated words, the reward its
/// answer's F1.
#[derive(Debug, Clone)]
pub struct ProgramEnv {
    task: ProgramTask,
    running: BTreeMap<usize, usize>,
}

impl ProgramEnv {
    /// The environment over `task`.
    pub fn new(task: ProgramTask) -> Self {
        Self {
            task,
            running: BTreeMap::new(),
        }
    }
}

impl Environment for ProgramEnv {
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError> {
        let t = &self.task;
        episodes
            .iter()
            .map(|e| {
                let pool = if crate::env::EpisodeSource::held_out(e.seed) {
                    &t.held_out
                } else {
                    &t.train
                };
                let q = *pool
                    .get((e.seed % pool.len().max(1) as u64) as usize)
                    .ok_or_else(|| EnvError::Protocol("the task has no questions".into()))?;
                self.running.insert(e.id, q);
                Ok(t.questions[q].words.join(" "))
            })
            .collect()
    }

    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError> {
        let t = &self.task;
        actions
            .iter()
            .map(|(id, text)| {
                let q = self
                    .running
                    .remove(id)
                    .ok_or_else(|| EnvError::Protocol(format!("episode {id} is not running")))?;
                let words: Option<Vec<Word>> = text
                    .split_whitespace()
                    .map(|s| t.words.parse(s, &t.kb))
                    .collect();
                let q = &t.questions[q];
                let reward = words
                    .and_then(|w| lisp::run(&t.kb, t.words, &q.entities, t.max_exprs, &w).ok())
                    .map_or(0.0, |a| lisp::f1(&a, &q.answer));
                Ok(Feedback {
                    observation: String::new(),
                    reward,
                    done: true,
                    ..Default::default()
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
