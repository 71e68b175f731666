//! A corpus of fictitious facts for unlearning studies (in the spirit of TOFU, Maini et al.
//! 2024): made-up people, each with a birthplace, a profession, a pet and a favourite colour,
//! asked as one-word-answer questions; the facts of a share of the people form the forget
//! set, the rest the retain set. Word-level: the model's vocabulary is the corpus's words.

use ember_engine::SplitMix64;
use std::collections::{BTreeMap, BTreeSet};

/// The corpus's sizes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FactsSpec {
    /// People (each has four facts).
    pub people: usize,
    /// Share of the people whose facts are to be forgotten.
    pub forget_share: f32,
    /// The corpus's seed (the same for every run seed).
    pub seed: u64,
}

impl Default for FactsSpec {
    fn default() -> Self {
        Self {
            people: 60,
            forget_share: 0.1,
            seed: 0,
        }
    }
}

/// `(question with X for the person, the values an answer takes)`.
const ATTRIBUTES: [(&str, [&str; 8]); 4] = [
    (
        "where was X born",
        [
            "Ardel", "Brisk", "Corvo", "Dunmere", "Eskar", "Faloun", "Gresh", "Hollin",
        ],
    ),
    (
        "what does X do",
        [
            "baker", "pilot", "sculptor", "surveyor", "chemist", "weaver", "judge", "tailor",
        ],
    ),
    (
        "which pet does X keep",
        [
            "owl", "ferret", "tortoise", "parrot", "hound", "lizard", "goat", "rabbit",
        ],
    ),
    (
        "what colour does X like",
        [
            "amber", "teal", "crimson", "ivory", "olive", "violet", "slate", "coral",
        ],
    ),
];

/// The word a refusal answers with.
pub const REFUSAL: &str = "unknown";
/// The beginning of a prompt.
pub const BOS: u32 = 0;
/// Between the question and the answer.
pub const SEP: u32 = 1;
/// After the answer.
pub const EOS: u32 = 2;

/// One fact: a question about a person and its one-word answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// The person's index.
    pub person: usize,
    /// The attribute's index.
    pub attribute: usize,
    /// The prompt's tokens (`<bos>`, the question's words, `<sep>`).
    pub prompt: Vec<u32>,
    /// The answer's token.
    pub answer: u32,
    /// The tokens of the attribute's possible values (the answer among them).
    pub candidates: Vec<u32>,
}

/// The corpus: its vocabulary, its facts and their forget/retain split.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Every fact, people in order.
    pub facts: Vec<Fact>,
    /// Indices of the facts to forget.
    pub forget: Vec<usize>,
    /// Indices of the facts to keep.
    pub retain: Vec<usize>,
    /// The refusal's token.
    pub refusal: u32,
}

/// Made-up names: two syllables, capitalised, distinct.
fn names(n: usize, rng: &mut SplitMix64) -> Vec<String> {
    const SYL: [&str; 20] = [
        "zor", "vel", "kam", "ith", "ra", "mu", "pol", "en", "dar", "si", "tho", "qua", "lin",
        "bo", "fe", "gru", "ny", "ox", "wen", "ja",
    ];
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    while out.len() < n {
        let w: String = (0..2)
            .map(|_| SYL[rng.below(SYL.len() as u64) as usize])
            .collect();
        let name = w[..1].to_uppercase() + &w[1..];
        if seen.insert(name.clone()) {
            out.push(name);
        }
    }
    out
}

impl Facts {
    /// The corpus of `spec`.
    ///
    /// # Errors
    /// A message naming the key out of range (`people` 2 to 400, `forget_share` in (0, 0.5]).
    pub fn new(spec: &FactsSpec) -> Result<Facts, String> {
        if !(2..=400).contains(&spec.people) {
            return Err(format!("facts.people = {} must be in 2..=400", spec.people));
        }
        if !(spec.forget_share > 0.0 && spec.forget_share <= 0.5) {
            return Err(format!(
                "facts.forget_share = {} must be in (0, 0.5]",
                spec.forget_share
            ));
        }
        let mut rng = SplitMix64(spec.seed ^ 0x0066_6163_7473);
        let people = names(spec.people, &mut rng);
        let mut tokens: Vec<String> = ["<bos>", "<sep>", "<eos>", REFUSAL]
            .map(String::from)
            .into();
        let mut words: BTreeSet<&str> = BTreeSet::new();
        for (q, values) in &ATTRIBUTES {
            words.extend(q.split(' ').filter(|w| *w != "X"));
            words.extend(values.iter());
        }
        tokens.extend(words.iter().map(|w| w.to_string()));
        tokens.extend(people.iter().cloned());
        let index: BTreeMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let id = |w: &str| index.get(w).copied().unwrap_or(EOS);
        let forget_people = ((spec.people as f32 * spec.forget_share).round() as usize).max(1);
        let forgotten: BTreeSet<usize> = rng
            .permutation(spec.people)
            .into_iter()
            .take(forget_people)
            .collect();
        let (mut facts, mut forget, mut retain) = (Vec::new(), Vec::new(), Vec::new());
        for (p, name) in people.iter().enumerate() {
            for (a, (q, values)) in ATTRIBUTES.iter().enumerate() {
                let value = values[rng.below(values.len() as u64) as usize];
                let mut prompt = vec![BOS];
                prompt.extend(
                    q.split(' ')
                        .map(|w| if w == "X" { id(name) } else { id(w) }),
                );
                prompt.push(SEP);
                if forgotten.contains(&p) {
                    forget.push(facts.len());
                } else {
                    retain.push(facts.len());
                }
                facts.push(Fact {
                    person: p,
                    attribute: a,
                    prompt,
                    answer: id(value),
                    candidates: values.iter().map(|v| id(v)).collect(),
                });
            }
        }
        Ok(Facts {
            refusal: id(REFUSAL),
            tokens,
            facts,
            forget,
            retain,
        })
    }

    /// The vocabulary's size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The shard (of `k`) that holds a person's facts: people dealt round-robin.
    pub fn shard(&self, fact: &Fact, k: usize) -> usize {
        fact.person % k.max(1)
    }
}

/// Carlini et al.'s exposure ("The Secret Sharer", USENIX Security 2019) of a secret among `candidates`
/// equally likely a priori: log₂ |candidates| − log₂ rank, rank 1 being the most likely
/// (the full exposure log₂ |candidates| when the model ranks the secret first, 0 when last).
pub fn exposure(rank: usize, candidates: usize) -> f64 {
    (candidates.max(1) as f64).log2() - (rank.max(1) as f64).log2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_is_split_by_person_and_fixed_by_its_seed() {
        let spec = FactsSpec::default();
        let f = Facts::new(&spec).unwrap();
        assert_eq!(f, Facts::new(&spec).unwrap());
        assert_eq!(f.facts.len(), 240);
        assert_eq!((f.forget.len(), f.retain.len()), (24, 216));
        let people: BTreeSet<usize> = f.forget.iter().map(|i| f.facts[*i].person).collect();
        assert_eq!(people.len(), 6);
        assert!(
            f.retain
                .iter()
                .all(|i| !people.contains(&f.facts[*i].person))
        );
        for fact in &f.facts {
            assert!(fact.candidates.contains(&fact.answer));
            assert_eq!(fact.prompt[0], BOS);
            assert_eq!(*fact.prompt.last().unwrap(), SEP);
            assert!(fact.prompt.iter().all(|t| (*t as usize) < f.vocab_size()));
        }
        assert_eq!(f.tokens[f.refusal as usize], REFUSAL);
        assert!(Facts::new(&FactsSpec { people: 1, ..spec }).is_err());
        assert!(
            Facts::new(&FactsSpec {
                forget_share: 0.9,
                ..spec
            })
            .is_err()
        );
    }

    #[test]
    fn exposure_by_hand() {
        // 8 candidates: ranked first, log₂ 8 = 3; ranked 4th, 3 − 2 = 1; last, 0.
        assert_eq!(exposure(1, 8), 3.0);
        assert_eq!(exposure(4, 8), 1.0);
        assert_eq!(exposure(8, 8), 0.0);
    }
}
