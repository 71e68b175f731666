//! Offline datasets of scored responses (the `[offline]` table's `data`: JSON lines, or Parquet
//! files or Hub dataset directories whose rows have the same keys), read with `file:line` errors, grouped by prompt and tokenized for the policy; and the lines `ember rollouts` writes.
//!
//! One JSON object per line, in one of three shapes (extra keys such as `answer` are kept):
//! - `{"prompt", "responses": [{"response", "reward", "truncated"?}, ...]}`: a prompt with
//!   several scored responses (what `ember rollouts` writes);
//! - `{"prompt", "response", "reward"}`: one scored response (lines of one prompt are grouped;
//!   `completion` is read as `response`, TRL's prompt-completion shape, for `sft`);
//! - `{"prompt", "chosen", "rejected", "chosen_reward"?, "rejected_reward"?}`: a preference pair
//!   (rewards 1 and 0 when absent, NeMo-Aligner's defaults).
//!
//! `prompt` is what the policy's prompt template receives: the compact task prompt (`12+34=`)
//! for the tiny character model, the question for a pretrained one. A reward may be `null`
//! (invalid: the response is kept out of pairs and baselines). Responses are encoded on their
//! own and end with the policy's stop token unless `truncated`.

use crate::lm::score::Scored;
use crate::lm::{Policy, Tok};
use anyhow::{Context, Result, anyhow, bail};
use ember_tasks::reward::Check;
use ember_tasks::task::Example;
use std::collections::BTreeMap;
use std::path::Path;

/// A prompt with its responses.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The prompt (see the module documentation).
    pub prompt: String,
    /// The responses.
    pub responses: Vec<Scored>,
    /// An explicit (chosen, rejected) pair of response indices.
    pub pair: Option<(usize, usize)>,
}

/// Reads a dataset (JSON lines, or Parquet: a `.parquet` file or a Hub dataset directory's
/// `train` shards): groups in order of first appearance.
pub fn load(path: &Path) -> Result<Vec<Group>> {
    let rows = ember_tasks::task::records(path)?;
    let mut groups: Vec<Group> = Vec::new();
    let mut by_prompt: BTreeMap<String, usize> = BTreeMap::new();
    for (file, line, v) in rows {
        let at = || format!("{}:{line}", file.display());
        let v = v.map_err(|e| anyhow!("{}: {e}", at()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| anyhow!("{}: a line must be a JSON object", at()))?;
        let group = group_of(obj, &at)?;
        if group.pair.is_none()
            && let [single] = &group.responses[..]
            && !obj.contains_key("responses")
            && let Some(&g) = by_prompt.get(&group.prompt)
        {
            groups[g].responses.push(single.clone());
            continue;
        }
        if group.pair.is_none() {
            by_prompt.insert(group.prompt.clone(), groups.len());
        }
        groups.push(group);
    }
    if groups.is_empty() {
        bail!("{}: no data", path.display());
    }
    Ok(groups)
}

/// One line in one of the three shapes (see the module documentation) as a group.
fn group_of(
    obj: &serde_json::Map<String, serde_json::Value>,
    at: &dyn Fn() -> String,
) -> Result<Group> {
    let text_of = |k: &str| -> Result<String> {
        match obj.get(k) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(_) => bail!("{}: \"{k}\" must be a string", at()),
            None => bail!("{}: no \"{k}\"", at()),
        }
    };
    let reward_of = |k: &str, default: Option<f32>| -> Result<Option<f32>> {
        match obj.get(k) {
            None => Ok(default),
            Some(serde_json::Value::Null) => Ok(None),
            Some(x) => match x.as_f64() {
                Some(r) if ember_engine::is_valid_reward(r) => Ok(Some(r as f32)),
                _ => bail!("{}: \"{k}\" must be a number within ±1e9 or null", at()),
            },
        }
    };
    let prompt = text_of("prompt")?;
    if prompt.is_empty() {
        bail!("{}: empty prompt", at());
    }
    let scored = |response, reward, truncated| Scored {
        response,
        reward,
        truncated,
    };
    let (responses, pair) = if let Some(rs) = obj.get("responses") {
        (responses_of(rs, at)?, None)
    } else if obj.contains_key("chosen") || obj.contains_key("rejected") {
        let chosen = scored(
            text_of("chosen")?,
            reward_of("chosen_reward", Some(1.0))?,
            false,
        );
        let rejected = scored(
            text_of("rejected")?,
            reward_of("rejected_reward", Some(0.0))?,
            false,
        );
        (vec![chosen, rejected], Some((0, 1)))
    } else if let Some(key) = ["response", "completion"]
        .into_iter()
        .find(|k| obj.contains_key(*k))
    {
        let truncated = obj.get("truncated").and_then(|t| t.as_bool());
        let one = scored(
            text_of(key)?,
            reward_of("reward", None)?,
            truncated.unwrap_or(false),
        );
        (vec![one], None)
    } else {
        bail!(
            "{}: a line needs \"responses\", \"response\" + \"reward\", or \"chosen\" + \
             \"rejected\"",
            at()
        );
    };
    Ok(Group {
        prompt,
        responses,
        pair,
    })
}

/// A `responses` list: scored responses, at least one, each reward within ±1e9 or null.
fn responses_of(rs: &serde_json::Value, at: &dyn Fn() -> String) -> Result<Vec<Scored>> {
    let responses: Vec<Scored> = serde_json::from_value(rs.clone()).map_err(|e| {
        anyhow!(
            "{}: \"responses\" must be a list of {{\"response\", \"reward\"}}: {e}",
            at()
        )
    })?;
    if responses.is_empty() {
        bail!("{}: \"responses\" is empty", at());
    }
    let beyond = |s: &Scored| {
        s.reward
            .is_some_and(|r| !ember_engine::is_valid_reward(r.into()))
    };
    if let Some(k) = responses.iter().position(beyond) {
        bail!(
            "{}: the \"reward\" of response {k} must be a number within ±1e9 or null",
            at()
        );
    }
    Ok(responses)
}

/// What a step draws: a group, and the pair of it for the pairwise objectives.
pub type Unit = (usize, Option<(usize, usize)>);

/// The units of `groups`: every (group, pair) for the pairwise objectives (each group's
/// [`TokGroup::pairs`]), the groups with two valid rewards for the other objectives, or with
/// one when `one` (SFT, and baselines over the step's responses).
pub fn units(groups: &[TokGroup], pairwise: bool, all_pairs: bool, one: bool) -> Vec<Unit> {
    if pairwise {
        let pairs = |(gi, g): (usize, &TokGroup)| {
            g.pairs(all_pairs).into_iter().map(move |p| (gi, Some(p)))
        };
        return groups.iter().enumerate().flat_map(pairs).collect();
    }
    let valid = |g: &TokGroup| {
        let ok = |x: &&f32| ember_engine::is_valid_reward(f64::from(**x));
        g.rewards.iter().filter(ok).count()
    };
    let need = if one { 1 } else { 2 };
    (0..groups.len())
        .filter(|&i| valid(&groups[i]) >= need)
        .map(|gi| (gi, None))
        .collect()
}

/// A group as token ids.
#[derive(Debug, Clone)]
pub struct TokGroup {
    /// Prompt ids (as the policy's template renders the prompt).
    pub prompt: Vec<u32>,
    /// Response ids (each ending with the stop token unless truncated).
    pub responses: Vec<Vec<u32>>,
    /// Rewards (NaN: invalid).
    pub rewards: Vec<f32>,
    /// The (chosen, rejected) pair: the dataset's, or the best and worst valid rewards when
    /// they differ; None when the group has no pair.
    pub pair: Option<(usize, usize)>,
    /// The pair is the dataset's own (a `chosen`/`rejected` line).
    pub explicit: bool,
}

impl TokGroup {
    /// How many pairs [`pairs`](Self::pairs) with `all` would list for a group without an
    /// explicit pair, counted without listing them.
    pub fn pair_count(&self) -> usize {
        let mut valid: Vec<f32> = self.rewards.iter().copied().filter(|r| valid(*r)).collect();
        valid.sort_by(f32::total_cmp);
        let n = valid.len();
        // Ordered pairs with different rewards: (n² − Σ_v c_v²) / 2 over the values' counts c_v.
        let same: usize = valid
            .chunk_by(|a, b| a == b)
            .map(|c| c.len().saturating_mul(c.len()))
            .fold(0, usize::saturating_add);
        n.saturating_mul(n).saturating_sub(same) / 2
    }

    /// The group's (chosen, rejected) pairs: its [`pair`](Self::pair), or with `all`, every
    /// ordered pair of valid responses whose rewards differ, the higher first (RPO's
    /// multi-response form; a dataset's explicit pair stays the only one).
    pub fn pairs(&self, all: bool) -> Vec<(usize, usize)> {
        if !all || self.explicit {
            return self.pair.into_iter().collect();
        }
        let r = &self.rewards;
        let mut out = Vec::new();
        for i in 0..r.len() {
            for j in 0..r.len() {
                if valid(r[i]) && valid(r[j]) && r[i] > r[j] {
                    out.push((i, j));
                }
            }
        }
        out
    }
}

/// The most (chosen, rejected) pairs `pairs = "all"` may list: each is kept as a draw, and one
/// prompt with n responses gives up to n²/4 of them with 0/1 rewards.
const MAX_PAIRS: usize = 1 << 22;

/// An error when `pairs = "all"` would list more than [`MAX_PAIRS`] pairs (20 000 responses to
/// one prompt would give 10⁸, gigabytes of draws), naming the largest group and the fix.
pub fn check_pair_count(groups: &[TokGroup], path: &std::path::Path) -> Result<()> {
    let counts: Vec<usize> = groups.iter().map(TokGroup::pair_count).collect();
    let total = counts.iter().fold(0usize, |a, &c| a.saturating_add(c));
    if total > MAX_PAIRS {
        let (gi, most) = counts
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| **c)
            .map_or((0, 0), |(i, c)| (i, *c));
        bail!(
            "{}: pairs = \"all\" makes {total} pairs (group {gi} alone {most}), more than \
             {MAX_PAIRS}; keep fewer responses per prompt with offline.responses",
            path.display()
        );
    }
    Ok(())
}

/// Each group with its first `k` responses only (an explicit pair needs both of its own); the
/// responses-per-prompt ablation.
pub fn keep_first(groups: Vec<Group>, k: usize) -> Vec<Group> {
    groups
        .into_iter()
        .map(|mut g| {
            g.responses.truncate(k);
            g.pair = g.pair.filter(|&(a, b)| a < k && b < k);
            g
        })
        .collect()
}

/// Tokenizes every group for `policy`, checking prompt + response against `max_new` and the
/// context.
pub fn tokenize(policy: &Policy, groups: &[Group], max_new: usize) -> Result<Vec<TokGroup>> {
    groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let e = Example {
                prompt: g.prompt.clone(),
                answer: String::new(),
                question: g.prompt.clone(),
                check: Check::Numeric,
                messages: Vec::new(),
                columns: serde_json::Map::new(),
            };
            let prompt = policy
                .prompt_ids(&e, max_new)
                .with_context(|| format!("group {gi} (prompt {:?})", g.prompt))?;
            let stop = policy.stop.first().copied();
            let mut responses = Vec::with_capacity(g.responses.len());
            for s in &g.responses {
                let mut ids = match &policy.tok {
                    Tok::Char(vocab) => vocab
                        .encode(&s.response)
                        .map_err(|m| anyhow!("group {gi}: response {:?}: {m}", s.response))?,
                    Tok::Real { tok, .. } => tok.encode(&s.response)?,
                };
                if let (false, Some(t)) = (s.truncated, stop) {
                    ids.push(t);
                }
                if ids.is_empty() || ids.len() > max_new {
                    bail!(
                        "group {gi}: a response of {} tokens; rollout.max_new_tokens = {max_new} \
                         bounds them (and an empty one cannot be trained on)",
                        ids.len()
                    );
                }
                responses.push(ids);
            }
            let rewards: Vec<f32> = g
                .responses
                .iter()
                .map(|s| s.reward.unwrap_or(f32::NAN))
                .collect();
            let pair = g.pair.or_else(|| best_and_worst(&rewards));
            Ok(TokGroup {
                prompt,
                responses,
                rewards,
                pair,
                explicit: g.pair.is_some(),
            })
        })
        .collect()
}

/// A reward that counts (the engine's rule).
fn valid(r: f32) -> bool {
    ember_engine::is_valid_reward(r.into())
}

/// The indices of the highest and lowest valid reward (the first of equals), when they differ.
fn best_and_worst(rewards: &[f32]) -> Option<(usize, usize)> {
    let valid = rewards.iter().enumerate().filter(|(_, r)| valid(**r));
    let best = valid
        .clone()
        .fold(None, |b: Option<(usize, f32)>, (i, &r)| match b {
            Some((_, br)) if br >= r => b,
            _ => Some((i, r)),
        })?;
    let worst = valid.fold(None, |w: Option<(usize, f32)>, (i, &r)| match w {
        Some((_, wr)) if wr <= r => w,
        _ => Some((i, r)),
    })?;
    (best.1 > worst.1).then_some((best.0, worst.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// All pairs: every ordered pair of valid responses with different rewards, higher first;
    /// an explicit pair stays alone; `keep_first` cuts responses and drops a pair it cuts.
    #[test]
    fn all_pairs_and_first_k() {
        let g = TokGroup {
            prompt: vec![1],
            responses: vec![vec![2]; 4],
            rewards: vec![1.0, 0.0, f32::NAN, 0.5],
            pair: Some((0, 1)),
            explicit: false,
        };
        assert_eq!(g.pairs(false), vec![(0, 1)]);
        assert_eq!(g.pairs(true), vec![(0, 1), (0, 3), (3, 1)]);
        assert_eq!(g.pair_count(), 3);
        let ties = TokGroup {
            rewards: vec![1.0, 1.0, 0.0, 0.0, f32::NAN],
            responses: vec![vec![2]; 5],
            pair: None,
            ..g.clone()
        };
        assert_eq!((ties.pair_count(), ties.pairs(true).len()), (4, 4));
        let e = TokGroup {
            explicit: true,
            ..g.clone()
        };
        assert_eq!(e.pairs(true), vec![(0, 1)]);
        let s = |x: f32| Scored {
            response: "a".into(),
            reward: Some(x),
            truncated: false,
        };
        let kept = keep_first(
            vec![Group {
                prompt: "p".into(),
                responses: vec![s(1.0), s(0.0), s(0.5)],
                pair: Some((0, 2)),
            }],
            2,
        );
        assert_eq!(kept[0].responses.len(), 2);
        assert_eq!(kept[0].pair, None);
    }

    #[test]
    fn pairs_are_best_and_worst() {
        assert_eq!(best_and_worst(&[0.0, 1.0, 0.5, 1.0]), Some((1, 0)));
        assert_eq!(best_and_worst(&[1.0, 1.0]), None);
        assert_eq!(best_and_worst(&[f32::NAN, 0.0, 1.0]), Some((2, 1)));
        assert_eq!(best_and_worst(&[f32::NAN]), None);
    }

    #[test]
    fn the_three_shapes_and_their_errors() {
        let dir = std::env::temp_dir().join(format!("ember-offline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.jsonl");
        std::fs::write(
            &p,
            concat!(
                r#"{"prompt": "1+1=", "responses": [{"response": "2", "reward": 1}, {"response": "3", "reward": null, "truncated": true}]}"#,
                "\n",
                r#"{"prompt": "2+2=", "response": "4", "reward": 1.0}"#,
                "\n\n",
                r#"{"prompt": "2+2=", "response": "5", "reward": 0}"#,
                "\n",
                r#"{"prompt": "3+3=", "chosen": "6", "rejected": "7"}"#,
                "\n",
            ),
        )
        .unwrap();
        let g = load(&p).unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g[0].responses[1].reward, None);
        assert!(g[0].responses[1].truncated);
        assert_eq!(g[1].responses.len(), 2);
        assert_eq!(g[2].pair, Some((0, 1)));
        assert_eq!(g[2].responses[0].reward, Some(1.0));
        for (line, needle) in [
            ("not json", ":1: not JSON"),
            ("[1]", "must be a JSON object"),
            (r#"{"prompt": "x"}"#, "needs \"responses\""),
            (
                r#"{"prompt": 3, "response": "a"}"#,
                "\"prompt\" must be a string",
            ),
            (
                r#"{"prompt": "x", "response": "a", "reward": "high"}"#,
                "\"reward\" must be a number",
            ),
            (
                r#"{"prompt": "x", "responses": []}"#,
                "\"responses\" is empty",
            ),
            (
                r#"{"prompt": "x", "responses": [{"text": "a"}]}"#,
                "must be a list of",
            ),
            (r#"{"prompt": "x", "chosen": "a"}"#, "no \"rejected\""),
            (
                r#"{"prompt": "", "response": "a", "reward": 1}"#,
                "empty prompt",
            ),
        ] {
            std::fs::write(&p, line).unwrap();
            let e = format!("{:#}", load(&p).unwrap_err());
            assert!(e.contains(needle), "{line}: {e}");
        }
        std::fs::write(&p, "\n").unwrap();
        assert!(format!("{:#}", load(&p).unwrap_err()).contains("no data"));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Parquet files written by pyarrow (`scripts/make_parquet_fixtures.py`) read as the same
    /// rows as JSONL do: a `responses` list of structs, a null reward, preference pairs.
    #[test]
    fn parquet_reads_as_jsonl_does() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/data");
        for name in ["scored", "pairs"] {
            let lines = load(&data.join(format!("{name}.jsonl"))).unwrap();
            let rows = load(&data.join(format!("{name}.parquet"))).unwrap();
            assert_eq!(rows, lines, "{name}");
        }
        let scored = load(&data.join("scored.parquet")).unwrap();
        assert_eq!(scored.len(), 4);
        assert_eq!(scored[2].responses[1].reward, None);
        assert!(scored[0].responses[2].truncated);
        let pairs = load(&data.join("pairs.parquet")).unwrap();
        assert_eq!(pairs[0].pair, Some((0, 1)));
        assert_eq!(pairs[0].responses[0].reward, Some(0.7));
        // A Parquet file without the keys is named by file and row.
        let e = format!("{:#}", load(&data.join("chat-snappy.parquet")).unwrap_err());
        assert!(e.contains("chat-snappy.parquet:1: no \"prompt\""), "{e}");
    }
}
