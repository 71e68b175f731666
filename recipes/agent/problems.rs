//! The tutor's problems: the generated one-step word problems (each with a near-transfer
//! variant for the post-test), or a dataset's (GSM8K's form; the post-test is the problem
//! itself), and the number reading the tutor's scoring rests on.

use anyhow::{Context, Result, bail};
use ember_engine::SplitMix64;
use ember_tasks::env::EpisodeSource;

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

/// The integers in `text`, in order, with their byte spans. Thousands separators join groups
/// (`1,080` is one number: after a first group of 1–3 digits, each `,` followed by exactly three
/// digits), and a `-` directly before the digits and after a character that is not a digit, or
/// at the start, makes a negative number (`-5`, `x = -5`; `20-8` is 20 and 8).
pub(super) fn numbers(text: &str) -> Vec<(usize, usize, i64)> {
    let b = text.as_bytes();
    let digit = |k: usize| b.get(k).is_some_and(u8::is_ascii_digit);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !digit(i) {
            i += 1;
            continue;
        }
        let negative = i > 0 && b[i - 1] == b'-' && (i == 1 || !b[i - 2].is_ascii_digit());
        let first = i;
        while digit(i) {
            i += 1;
        }
        let mut value = text[first..i].to_string();
        if i - first <= 3 {
            while b.get(i) == Some(&b',') && (1..=3).all(|k| digit(i + k)) && !digit(i + 4) {
                value.push_str(&text[i + 1..i + 4]);
                i += 4;
            }
        }
        if let Ok(v) = value.parse::<i64>() {
            let start = if negative { first - 1 } else { first };
            out.push((start, i, if negative { -v } else { v }));
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

/// Where the episodes' problems come from.
#[derive(Debug, Clone)]
pub enum Problems {
    /// The three-story generator; the post-test is a near-transfer variant.
    Generated,
    /// A dataset's problems; the post-test is the problem itself. Held-out episodes
    /// ([`EpisodeSource::held_out`]) draw from the file's held-out lines (a hash of the
    /// question, 1 in 10), training episodes from the others. A problem whose text states its
    /// own answer is left out (quoting it would close the leak gate), as the generator draws
    /// such a problem again.
    File {
        /// The training lines' problems.
        train: Vec<Problem>,
        /// The held-out lines' problems.
        held_out: Vec<Problem>,
        /// How many of the file's problems stated their own answer and were left out.
        dropped: usize,
    },
}

impl Problems {
    /// The generator, or the problems of `path` (JSON lines or Parquet with `question` and
    /// `answer`; GSM8K's `#### n` read as n), every answer an integer.
    pub fn open(path: Option<&str>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self::Generated);
        };
        let file = ember_tasks::expand_path(path).context("env.problems")?;
        let data = ember_tasks::task::JsonlData::load(&file)
            .with_context(|| format!("env.problems = {path:?}"))?;
        let convert = |examples: &[ember_tasks::task::Example]| {
            examples
                .iter()
                .map(|e| match e.answer.parse::<i64>() {
                    Ok(answer) => Ok(Problem {
                        text: e.question.trim().to_string(),
                        answer,
                    }),
                    Err(_) => bail!(
                        "env.problems = {path:?}: the answer {:?} of {:?} is not an integer (the \
                         tutor scores the student's last number)",
                        e.answer,
                        e.question.chars().take(60).collect::<String>()
                    ),
                })
                .collect::<Result<Vec<_>>>()
        };
        let (mut train, mut held_out) = (
            convert(data.train_examples())?,
            convert(&data.held_out_set(usize::MAX))?,
        );
        let before = train.len() + held_out.len();
        train.retain(|p| !leaks(&p.text, p.answer));
        held_out.retain(|p| !leaks(&p.text, p.answer));
        if train.is_empty() || held_out.is_empty() {
            bail!(
                "env.problems = {path:?}: every {} problem states its own answer in its text \
                 (the leak gate would close on a quote of it)",
                if train.is_empty() {
                    "training"
                } else {
                    "held-out"
                }
            );
        }
        Ok(Self::File {
            dropped: before - train.len() - held_out.len(),
            train,
            held_out,
        })
    }

    /// Episode `seed`'s problem and its post-test item.
    pub fn episode(&self, seed: u64) -> (Problem, Problem) {
        match self {
            Self::Generated => (problem(seed, false), problem(seed, true)),
            Self::File {
                train, held_out, ..
            } => {
                let set = if EpisodeSource::held_out(seed) {
                    held_out
                } else {
                    train
                };
                let i = SplitMix64(seed).next_u64() % set.len().max(1) as u64;
                let p = set[i as usize].clone();
                (p.clone(), p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signs and thousands separators by hand.
    #[test]
    fn numbers_read_signs_and_thousands() {
        let text = "-5 and x = -7, 20-8, 1,080 and 1,2,3 and 12,3456 or 1,234,567";
        let v: Vec<i64> = numbers(text).iter().map(|n| n.2).collect();
        assert_eq!(v, [-5, -7, 20, 8, 1080, 1, 2, 3, 12, 3456, 1_234_567]);
        assert_eq!(numbers("so 3 - -2 = 5")[1], (7, 9, -2));
        assert_eq!(last_number("It is 1,080."), Some(1080));
        assert!(leaks("The total is 1,080 now", 1080));
        assert!(!leaks("The total is 1080 now", -1080));
    }

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

    /// A dataset's problems: GSM8K's `#### n` read as n, each episode's post-test item is its
    /// problem, held-out seeds draw held-out lines and training seeds the others, a problem that
    /// states its own answer is left out; an answer that is not an integer, or a file whose
    /// problems all state their answers, is refused, naming the file and the problem.
    #[test]
    fn dataset_problems() {
        let dir = std::env::temp_dir().join(format!("ember-tutor-problems-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.jsonl");
        let lines: Vec<String> = (0..60)
            .map(|i| {
                format!(
                    "{{\"question\": \"Q{i}: 2 + {i}?\", \"answer\": \"2 + {i}\\n#### {}\"}}",
                    i + 2
                )
            })
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        let p = Problems::open(path.to_str()).unwrap();
        let Problems::File {
            train,
            held_out,
            dropped,
        } = &p
        else {
            panic!("a file gives its problems");
        };
        // Only "Q0: 2 + 0?" states its own answer (2): it is left out.
        assert_eq!((train.len() + held_out.len(), *dropped), (59, 1));
        for seed in 0..200 {
            let (first, post) = p.episode(seed);
            assert_eq!(first, post);
            let i: i64 = first.text[1..first.text.find(':').unwrap()]
                .parse()
                .unwrap();
            assert_eq!(first.answer, i + 2);
            let set = if EpisodeSource::held_out(seed) {
                held_out
            } else {
                train
            };
            assert!(set.contains(&first), "seed {seed}");
        }
        std::fs::write(
            &path,
            format!(
                "{}\n{{\"question\": \"Half?\", \"answer\": \"2.5\"}}",
                lines.join("\n")
            ),
        )
        .unwrap();
        let e = format!("{:#}", Problems::open(path.to_str()).unwrap_err());
        assert!(
            e.contains("the answer \"2.5\" of \"Half?\" is not an integer"),
            "{e}"
        );
        let quoting: String = (0..40)
            .map(|i| format!("{{\"question\": \"Is it {i}?\", \"answer\": \"{i}\"}}\n"))
            .collect();
        std::fs::write(&path, quoting).unwrap();
        let e = format!("{:#}", Problems::open(path.to_str()).unwrap_err());
        assert!(e.contains("states its own answer"), "{e}");
        let missing = format!(
            "{:#}",
            Problems::open(Some("/nonexistent/p.jsonl")).unwrap_err()
        );
        assert!(missing.contains("env.problems"), "{missing}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
