//! Rewards of a step's completions: the recipe's weighted terms (verifiable, format, external
//! program, Python functions) with their metrics, and the rows shown in `samples.jsonl`.

use crate::lm::judge::{Item as JudgeItem, Judge};
use crate::lm::reward::RewardSpec;
use anyhow::{Result, bail};
use ember_engine::REWARD_LIMIT;
use ember_llm::Generation;
use ember_tasks::reward::{ExternalReward, RewardItem, TrainerState, check, format_reward};
use ember_tasks::task::Example;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The completions of a generation, a row each: their token ids and decoded texts.
pub fn completions<'a>(
    g: &'a Generation,
    examples: &'a [Example],
    ids: &'a [Vec<u32>],
    texts: &'a [String],
) -> Completions<'a> {
    Completions {
        ids,
        examples: g.group_ids.iter().map(|gi| &examples[*gi]).collect(),
        groups: &g.group_ids,
        prompts: g
            .group_ids
            .iter()
            .map(|gi| examples[*gi].question.clone())
            .collect(),
        texts,
        stopped: g.truncated.iter().map(|t| !t).collect(),
    }
}

/// The first `n` rows of a rollout for `samples.jsonl` (their `advantage` is added after the
/// update): prompt, completion, reference answer, reward (null when invalid), response length in
/// tokens, and why it ended (`stop`: a stop token; `length`: `max_new_tokens`).
pub fn shown_samples(
    n: usize,
    g: &Generation,
    examples: &[Example],
    texts: &[String],
    responses: &[Vec<u32>],
    rewards: &[f32],
) -> Vec<serde_json::Map<String, serde_json::Value>> {
    (0..n.min(texts.len()))
        .map(|i| {
            let e = &examples[g.group_ids[i]];
            let mut m = serde_json::Map::new();
            m.insert("prompt".into(), e.question.clone().into());
            m.insert("completion".into(), texts[i].clone().into());
            m.insert("answer".into(), e.answer.clone().into());
            let valid = rewards[i].abs() <= REWARD_LIMIT;
            let reward = if valid {
                f64::from(rewards[i])
            } else {
                f64::NAN
            };
            m.insert("reward".into(), json_number(reward));
            m.insert("advantage".into(), serde_json::Value::Null);
            m.insert("length".into(), responses[i].len().into());
            m.insert(
                "stop_reason".into(),
                if g.truncated[i] { "length" } else { "stop" }.into(),
            );
            m.insert("group".into(), g.group_ids[i].into());
            m
        })
        .collect()
}

/// A JSON number, or null when not finite.
pub fn json_number(x: f64) -> serde_json::Value {
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// The mean of the valid rewards (finite, within ±`REWARD_LIMIT`, as the engine counts them)
/// and how many there are.
pub fn valid_mean(rewards: &[f32]) -> (f64, usize) {
    let valid: Vec<f64> = rewards
        .iter()
        .filter(|x| x.abs() <= REWARD_LIMIT)
        .map(|x| f64::from(*x))
        .collect();
    (
        valid.iter().sum::<f64>() / valid.len().max(1) as f64,
        valid.len(),
    )
}

/// Scores completions: the weighted sum of the recipe's reward terms, per row; adds the terms'
/// means to `row`.
pub struct Scorer<'a> {
    spec: &'a RewardSpec,
    external: Option<ExternalReward>,
    python: Option<ExternalReward>,
    judge: Option<Judge>,
    /// The run's steps and the epochs one step covers (TRL's `trainer_state`), when training.
    schedule: Option<(usize, f64)>,
    /// The last [`Scorer::score`]'s terms, each unweighted, a value per row (see
    /// [`Scorer::take_parts`]).
    parts: Vec<Vec<f32>>,
}

/// The completions of one step, a row each.
pub struct Completions<'a> {
    /// The example each row answers.
    examples: Vec<&'a Example>,
    /// Prompt index of each row.
    groups: &'a [usize],
    /// The question each row answers.
    prompts: Vec<String>,
    /// Response token ids.
    ids: &'a [Vec<u32>],
    /// Decoded responses.
    texts: &'a [String],
    /// Whether each response ended with a stop token.
    stopped: Vec<bool>,
}

impl<'a> Scorer<'a> {
    /// The recipe's reward terms; spawns the external reward program when there is one.
    pub fn new(spec: &'a RewardSpec, device: &burn::tensor::Device) -> Result<Self> {
        Ok(Self {
            spec,
            external: spec
                .external
                .as_ref()
                .map(ExternalReward::spawn)
                .transpose()?,
            python: match &spec.python {
                Some(p) => Some(ExternalReward::spawn_python(p)?),
                None => None,
            },
            judge: spec
                .judge
                .as_ref()
                .map(|j| Judge::new(j, device))
                .transpose()?,
            schedule: None,
            parts: Vec::new(),
        })
    }

    /// Sends reward programs the run's progress: `max_steps` steps of `epochs_per_step`
    /// passes over the training prompts each.
    pub fn with_schedule(mut self, max_steps: usize, epochs_per_step: f64) -> Self {
        self.schedule = Some((max_steps, epochs_per_step));
        self
    }

    /// The reward's terms of the last [`Scorer::score`], each as its own values before the
    /// weighted sum (a value per row), for BNPO's advantage decomposition: correctness and the
    /// format reward where their weight is not 0, each reward program's reward (the Python
    /// adapter's functions one by one), the judge's verdicts where their weight is not 0.
    pub fn take_parts(&mut self) -> Vec<Vec<f32>> {
        std::mem::take(&mut self.parts)
    }

    /// The weighted sum of the recipe's reward terms of each row of `c` (scored at `step`), the
    /// terms' means added to `row`.
    pub fn score(
        &mut self,
        step: usize,
        c: &Completions,
        row: &mut BTreeMap<String, f64>,
    ) -> Result<Vec<f32>> {
        let Completions {
            examples,
            groups,
            prompts,
            ids,
            texts,
            stopped,
        } = c;
        let texts: &[String] = texts;
        let n = texts.len().max(1) as f64;
        let correct: Vec<f32> = examples
            .iter()
            .zip(texts)
            .map(|(e, t)| check(&e.check, t, &e.answer))
            .collect();
        row.insert(
            "reward/correct_mean".into(),
            correct.iter().map(|x| f64::from(*x)).sum::<f64>() / n,
        );
        let mut rewards: Vec<f32> = correct.iter().map(|c| self.spec.correct * c).collect();
        let mut parts = Vec::new();
        if self.spec.correct != 0.0 {
            parts.push(correct.clone());
        }
        if self.spec.format != 0.0 {
            let f: Vec<f32> = texts
                .iter()
                .zip(stopped)
                .map(|(t, s)| format_reward(t, *s))
                .collect();
            row.insert(
                "reward/format_mean".into(),
                f.iter().map(|x| f64::from(*x)).sum::<f64>() / n,
            );
            for (r, v) in rewards.iter_mut().zip(&f) {
                *r += self.spec.format * v;
            }
            parts.push(f);
        }
        let items: Vec<RewardItem> = (0..texts.len())
            .map(|i| RewardItem {
                prompt: &prompts[i],
                completion: &texts[i],
                answer: &examples[i].answer,
                group: groups[i],
                columns: &examples[i].columns,
                messages: &examples[i].messages,
                completion_ids: ids.get(i).map_or(&[], Vec::as_slice),
            })
            .collect();
        // `step` counts from 1: the steps completed before this batch are one fewer.
        let state = self.schedule.map(|(max_steps, per_step)| TrainerState {
            global_step: step.saturating_sub(1),
            max_steps,
            epoch: step.saturating_sub(1) as f64 * per_step,
        });
        let programs = [
            (
                self.external.as_mut(),
                self.spec.external.as_ref().map(|s| s.weight),
                "external",
            ),
            (
                self.python.as_mut(),
                self.spec.python.as_ref().map(|_| 1.0),
                "python",
            ),
        ];
        for (program, weight, what) in programs {
            let (Some(program), Some(weight)) = (program, weight) else {
                continue;
            };
            let scores = program.score_at(step, &items, state)?;
            row.insert(format!("reward/{what}_mean"), valid_mean(&scores.rewards).0);
            for (name, values) in &scores.components {
                let key = format!("reward/{name}");
                if row.contains_key(&key) {
                    bail!("reward component `{name}` of reward.{what} repeats the metric {key}");
                }
                row.insert(key, valid_mean(values).0);
            }
            for (name, x) in &scores.metrics {
                let key = format!("reward/{name}");
                if row.contains_key(&key) {
                    bail!("metric `{name}` logged by reward.{what} repeats the metric {key}");
                }
                row.insert(key, *x);
            }
            for (r, x) in rewards.iter_mut().zip(&scores.rewards) {
                *r += weight * x;
            }
            // The Python adapter's components are its weighted functions; an external
            // program's are free-form, so its reward is one term.
            match (what, scores.components.is_empty()) {
                ("python", false) => parts.extend(scores.components.into_iter().map(|(_, v)| v)),
                _ if weight != 0.0 => parts.push(scores.rewards),
                _ => {}
            }
        }
        if let (Some(judge), Some(spec)) = (self.judge.as_mut(), self.spec.judge.as_ref()) {
            let verdicts = add_judged(judge, spec.weight, &items, &mut rewards, row)?;
            if spec.weight != 0.0 {
                parts.push(verdicts);
            }
        }
        self.parts = parts;
        Ok(rewards)
    }
}

/// The judge's verdicts, weighted, into `rewards`; its mean, memory hits and time into `row`;
/// returns the verdicts.
fn add_judged(
    judge: &mut Judge,
    weight: f32,
    items: &[RewardItem],
    rewards: &mut [f32],
    row: &mut BTreeMap<String, f64>,
) -> Result<Vec<f32>> {
    let t = std::time::Instant::now();
    let asked: Vec<JudgeItem> = items
        .iter()
        .map(|it| JudgeItem {
            prompt: it.prompt,
            completion: it.completion,
            answer: it.answer,
        })
        .collect();
    let (verdicts, hits) = judge.judge(&asked)?;
    row.insert("reward/judge_mean".into(), valid_mean(&verdicts).0);
    row.insert("judge/cache_hits".into(), hits as f64);
    ember_run::Timings::record(row, "judge", t.elapsed().as_secs_f64());
    if weight != 0.0 {
        for (r, x) in rewards.iter_mut().zip(&verdicts) {
            *r += weight * x;
        }
    }
    Ok(verdicts)
}

/// One scored response as a dataset line holds it (`ember rollouts` writes them, the offline
/// job reads them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scored {
    /// The response text.
    pub response: String,
    /// Its reward (None: invalid).
    pub reward: Option<f32>,
    /// Cut at the length limit (no stop token is appended).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// The batch with the reward's terms (`parts`, a value per row each) for BNPO's advantage
/// decomposition. `elsewhere`: some rows' terms were not scored here (replayed groups, or
/// another rank's rows), which the decomposition cannot take.
pub fn with_reward_parts(
    batch: ember_engine::RolloutBatch,
    parts: &[Vec<f32>],
    elsewhere: bool,
) -> Result<ember_engine::RolloutBatch> {
    let rows = batch.dims()[0];
    if parts.is_empty() {
        bail!("[advantage] decompose = true: no reward term has a weight other than 0");
    }
    if elsewhere || parts.iter().any(|p| p.len() != rows) {
        bail!(
            "[advantage] decompose = true needs each reward term of every row, scored in this \
             process this step: not with [replay], Reinforce-Ada's rounds, LANPO or several \
             processes"
        );
    }
    let k = parts.len();
    let flat: Vec<f32> = (0..rows)
        .flat_map(|r| parts.iter().map(move |p| p[r]))
        .collect();
    let device = batch.mask.device();
    let t = burn::tensor::Tensor::<2>::from_data(
        burn::tensor::TensorData::new(flat, [rows, k]),
        &device,
    );
    Ok(batch.with_reward_parts(t)?)
}
