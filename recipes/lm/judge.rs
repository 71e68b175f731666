//! A judge reward (`[reward.judge]`): another model, behind an OpenAI-compatible completions
//! endpoint (`ember serve`, vLLM, SGLang), reads each completion through a prompt template and
//! gives a verdict — the probability it puts on "yes" against "no" (log-probs through `echo`),
//! or a score it writes. One request per step for all completions (in chunks), identical
//! judge prompts asked once per run, the judge's time logged apart (`timing_s/judge`).

use super::endpoint::{Endpoint, choices};
use super::participant::{Backend, ChatFormat, Source};
use anyhow::{Result, bail};
use burn::tensor::Device;
use serde_json::{Value, json};
use std::collections::HashMap;

mod local;
mod spec;

pub use spec::{JudgeSpec, Verdict};

/// What a judge prompt is filled with.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    pub prompt: &'a str,
    pub completion: &'a str,
    pub answer: &'a str,
}

/// The judge, as errors name it.
const JUDGE: &str = "the judge";
/// The most judge prompts one request carries (two rows each for `yes_no`).
const CHUNK: usize = 32;
/// The most verdicts remembered; past it the memory starts again.
const CACHE: usize = 1 << 16;

/// A connected (or loaded) judge.
pub struct Judge {
    spec: JudgeSpec,
    backend: Backend,
    chat: Option<ChatFormat>,
    cache: HashMap<String, f32>,
}

impl Judge {
    /// The judge of a validated spec: its endpoint, or its model loaded on `device`.
    pub fn new(spec: &JudgeSpec, device: &Device) -> Result<Self> {
        let src = Source {
            table: "reward.judge",
            base_url: spec.base_url.as_deref(),
            model: spec.model.as_deref(),
            path: spec.path.as_deref(),
            api_key_env: spec.api_key_env.as_deref(),
            timeout_s: spec.request_timeout_s,
            retries: spec.request_retries,
        };
        let backend = Backend::open(&src, device)?;
        let chat = match spec.chat {
            true => Some(backend.chat_format("reward.judge.chat")?),
            false => None,
        };
        Ok(Self {
            spec: spec.clone(),
            backend,
            chat,
            cache: HashMap::new(),
        })
    }

    /// The judge prompt of an item (through the judge's chat template with `chat`).
    pub fn render(&self, it: &Item) -> Result<String> {
        let filled = self
            .spec
            .template
            .replace("{prompt}", it.prompt)
            .replace("{answer}", it.answer)
            .replace("{completion}", it.completion);
        let Some(c) = &self.chat else {
            return Ok(filled);
        };
        c.render(
            &[ember_llm::Message::new("user", &filled)],
            "reward.judge.chat",
        )
    }

    /// The verdicts of `items` (NaN where the judge gave none), and how many came from the
    /// memory of earlier requests.
    pub fn judge(&mut self, items: &[Item]) -> Result<(Vec<f32>, usize)> {
        let prompts = items
            .iter()
            .map(|it| self.render(it))
            .collect::<Result<Vec<String>>>()?;
        let mut seen = std::collections::HashSet::new();
        let asked: Vec<String> = prompts
            .iter()
            .filter(|p| !self.cache.contains_key(*p) && seen.insert(p.as_str()))
            .cloned()
            .collect();
        let hits = prompts.len() - asked.len();
        if self.cache.len() + asked.len() > CACHE {
            self.cache.clear();
        }
        for chunk in asked.chunks(CHUNK) {
            let verdicts = match (&self.backend, self.spec.verdict) {
                (Backend::Endpoint(e), Verdict::YesNo) => e.yes_no(chunk, &self.spec)?,
                (Backend::Local(m), Verdict::YesNo) => m.yes_no(chunk, &self.spec)?,
                (b, Verdict::Score) => b
                    .complete(chunk, self.spec.max_tokens, JUDGE)?
                    .iter()
                    .map(|t| score_of(t, self.spec.max_score))
                    .collect(),
            };
            self.cache.extend(chunk.iter().cloned().zip(verdicts));
        }
        let out = prompts.iter().map(|p| self.cache[p]).collect();
        Ok((out, hits))
    }
}

/// The judge's questions to an endpoint.
impl Endpoint {
    /// P(yes) against P(no) for each prompt: each prompt with either word scored by `echo`.
    fn yes_no(&self, prompts: &[String], spec: &JudgeSpec) -> Result<Vec<f32>> {
        let (yes, no) = (&spec.yes, &spec.no);
        let rows: Vec<String> = prompts
            .iter()
            .flat_map(|p| [format!("{p}{yes}"), format!("{p}{no}")])
            .collect();
        let body = json!({"model": self.model, "prompt": rows, "max_tokens": 0,
                          "echo": true, "logprobs": 1, "temperature": 0});
        let v = self.call("/v1/completions", Some(&body))?;
        let choices = choices(&v, rows.len(), JUDGE)?;
        let mut out = Vec::with_capacity(prompts.len());
        for pair in choices.chunks(2) {
            let lp_yes = word_log_prob(pair[0], yes)?;
            let lp_no = word_log_prob(pair[1], no)?;
            out.push(yes_probability(lp_yes, lp_no));
        }
        Ok(out)
    }
}

/// A written verdict as a reward: its first number over `max_score`, clamped to [0, 1]; NaN
/// (invalid) without a number.
fn score_of(text: &str, max_score: f64) -> f32 {
    first_number(text).map_or(f32::NAN, |x| (x / max_score).clamp(0.0, 1.0) as f32)
}

/// The log-probability of `word` at the end of an echoed prompt: the sum over the trailing
/// tokens whose text makes up the word (token boundaries, not offsets, so servers that count
/// offsets in bytes or characters agree).
fn word_log_prob(choice: &Value, word: &str) -> Result<f64> {
    let lp = &choice["logprobs"];
    let (Some(tokens), Some(lps)) = (lp["tokens"].as_array(), lp["token_logprobs"].as_array())
    else {
        bail!("the judge's answer has no echoed log-probs (does the endpoint support echo?)");
    };
    let mut tail = String::new();
    let mut sum = 0.0;
    for (t, x) in tokens.iter().zip(lps).rev() {
        let (Some(t), Some(x)) = (t.as_str(), x.as_f64()) else {
            break;
        };
        tail.insert_str(0, t);
        sum += x;
        if tail == word {
            return Ok(sum);
        }
        if tail.len() >= word.len() {
            break;
        }
    }
    bail!(
        "the judge's tokens do not end with {word:?} on a token boundary (its tokenizer merged it \
         with the prompt's end: end reward.judge.template with a space-free boundary)"
    )
}

/// P(yes) / (P(yes) + P(no)) from the two log-probabilities: the logistic of their difference.
pub fn yes_probability(lp_yes: f64, lp_no: f64) -> f32 {
    (1.0 / (1.0 + (lp_no - lp_yes).exp())) as f32
}

/// The first decimal number of `text` (a sign, digits, an optional fraction).
pub fn first_number(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let start = b.iter().position(u8::is_ascii_digit)?;
    let mut end = start;
    while end < b.len() && (b[end].is_ascii_digit() || b[end] == b'.') {
        end += 1;
    }
    let neg = start > 0 && b[start - 1] == b'-';
    let x: f64 = text[start..end].trim_end_matches('.').parse().ok()?;
    Some(if neg { -x } else { x })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-worked: log-probs −0.5 and −2.0 give 1 / (1 + e^−1.5) = 0.817574.
    #[test]
    fn verdicts_by_hand() {
        assert!((yes_probability(-0.5, -2.0) - 0.817_574).abs() < 1e-6);
        assert!((yes_probability(-3.0, -3.0) - 0.5).abs() < 1e-7);
        assert_eq!(first_number("Score: 7/10"), Some(7.0));
        assert_eq!(first_number(" 8.5."), Some(8.5));
        assert_eq!(first_number("-3 points"), Some(-3.0));
        assert_eq!(first_number("no digits"), None);
        assert!((score_of("8 out of 10", 10.0) - 0.8).abs() < 1e-7);
        assert_eq!(score_of("Score: 12", 10.0), 1.0);
        assert!(score_of("no idea", 10.0).is_nan());
        let echoed = json!({"logprobs": {"tokens": ["Q", ":", " y", "es"],
                                         "token_logprobs": [null, -1.0, -0.25, -0.5]}});
        assert!((word_log_prob(&echoed, " yes").unwrap() + 0.75).abs() < 1e-12);
        let e = word_log_prob(&echoed, " no").unwrap_err().to_string();
        assert!(e.contains("token boundary"), "{e}");
    }

    /// Judge prompts asked before (or twice in one batch) are not asked again: with every
    /// rendered prompt remembered, judging needs no endpoint (this one does not exist).
    #[test]
    fn identical_judge_prompts_are_asked_once() {
        let spec: JudgeSpec = toml::from_str(
            r#"base_url = "http://127.0.0.1:9"
               model = "m"
               verdict = "yes_no"
               template = "Q {prompt} A {completion} ({answer})?"
               request_retries = 0"#,
        )
        .unwrap();
        spec.validate().unwrap();
        for (change, named) in [
            ("path = \"m.gguf\"", "give base_url"),
            ("template = \"no completion\"", "no {completion}"),
            ("yes = \" no\"", "two different"),
            ("base_url = \"ftp://x\"", "http://"),
        ] {
            let mut bad: toml::Table = toml::to_string(&spec).unwrap().parse().unwrap();
            let (k, v) = change.split_once(" = ").unwrap();
            bad.insert(
                k.into(),
                toml::from_str::<toml::Table>(&format!("v = {v}")).unwrap()["v"].clone(),
            );
            let bad: JudgeSpec = bad.try_into().unwrap();
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(named), "{change}: {e}");
        }
        let mut judge = Judge::new(&spec, &Device::default()).unwrap();
        let item = |completion| Item {
            prompt: "1+1",
            completion,
            answer: "2",
        };
        let items = [item("2"), item("3"), item("2")];
        assert_eq!(judge.render(&items[1]).unwrap(), "Q 1+1 A 3 (2)?");
        judge.cache.insert(judge.render(&items[0]).unwrap(), 0.75);
        judge.cache.insert(judge.render(&items[1]).unwrap(), 0.25);
        let (verdicts, hits) = judge.judge(&items).unwrap();
        assert_eq!((verdicts, hits), (vec![0.75, 0.25, 0.75], 3));
        let e = judge.judge(&[item("4")]).unwrap_err().to_string();
        assert!(e.contains("127.0.0.1:9/v1/completions"), "{e}");
    }
}
