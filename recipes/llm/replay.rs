//! ReRULE-style replay in the LLM job ([`ember_engine::replay`]): after each step's rollout,
//! groups drawn from the buffer are appended to the fresh batch (their stored sampler
//! log-probs become the batch's rollout log-probs, so the loss's truncated importance weights
//! correct their staleness), then the step's own hard groups are admitted. The buffer is
//! written into every checkpoint (`replay.json`), so a resumed run replays the same groups.

use crate::lm::step::{TokenRow, responses_and_log_probs, rows_generation};
use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::Device;
use ember_engine::*;
use ember_llm::Generation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The buffer's file in a checkpoint.
pub const REPLAY: &str = "replay.json";

/// One stored group: the prompt, each response with its sampler log-probs, the rewards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredGroup {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Response token ids (up to and including the stop token).
    pub responses: Vec<Vec<u32>>,
    /// The sampler's log-prob of each response token.
    pub log_probs: Vec<Vec<f32>>,
    /// Rewards (None: invalid, masked as at sampling time).
    pub rewards: Vec<Option<f32>>,
    /// Responses cut at `max_new_tokens`.
    pub truncated: Vec<bool>,
}

/// What a stored group may hold in this run.
pub struct Limits {
    /// Steps completed (no group can be younger).
    pub step: usize,
    /// The model's vocabulary.
    pub vocab: usize,
    /// The model's context.
    pub context: usize,
    /// `rollout.max_new_tokens`.
    pub max_new: usize,
    /// `rollout.samples_per_prompt`.
    pub samples: usize,
}

impl StoredGroup {
    /// One log-prob (finite, ≤ 0) per response token and one reward and flag per response;
    /// 1..=samples responses of 1..=max_new tokens; token ids inside the vocabulary; prompt plus
    /// response inside the context.
    fn check(&self, l: &Limits) -> std::result::Result<(), String> {
        let n = self.responses.len();
        if self.prompt.is_empty() || n == 0 || n > l.samples {
            return Err(format!(
                "an empty prompt, or {n} responses (1..={} expected)",
                l.samples
            ));
        }
        if self.log_probs.len() != n || self.rewards.len() != n || self.truncated.len() != n {
            return Err(format!("{n} responses but other lists of other lengths"));
        }
        for (r, lp) in self.responses.iter().zip(&self.log_probs) {
            if r.is_empty() || r.len() != lp.len() || r.len() > l.max_new {
                return Err(
                    "a response without tokens, longer than max_new_tokens, or with log-probs \
                     of another length"
                        .into(),
                );
            }
            if self.prompt.len() + r.len() > l.context {
                return Err(format!(
                    "prompt and response exceed the context of {}",
                    l.context
                ));
            }
            if lp.iter().any(|x| !(x.is_finite() && *x <= 0.0)) {
                return Err("a log-prob that is not finite or above 0".into());
            }
        }
        let ids = self.prompt.iter().chain(self.responses.iter().flatten());
        if let Some(bad) = ids.into_iter().find(|t| **t as usize >= l.vocab) {
            return Err(format!(
                "token id {bad} outside the vocabulary of {}",
                l.vocab
            ));
        }
        if self.rewards.iter().flatten().any(|r| !r.is_finite()) {
            return Err("a reward that is not finite".into());
        }
        Ok(())
    }
}

/// A run's replay: its settings and buffer.
pub struct Replay {
    /// Settings.
    pub cfg: ReplayConfig,
    /// The buffer.
    pub buffer: ReplayBuffer<StoredGroup>,
}

impl Replay {
    /// The buffer's state in checkpoint `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string(&self.buffer)?;
        std::fs::write(dir.join(REPLAY), text).context("writing the replay buffer")
    }

    /// `self` with the buffer stored in checkpoint `dir` of a run resumed after `limits.step`
    /// steps; every group is checked against the run's limits, so a damaged or foreign file is
    /// named instead of reaching the model.
    pub fn load(self, dir: &Path, limits: &Limits) -> Result<Self> {
        let p = dir.join(REPLAY);
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let buffer: ReplayBuffer<StoredGroup> = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: not a replay buffer: {e}", p.display()))?;
        if buffer.len() > self.cfg.capacity {
            bail!(
                "{}: {} groups, more than replay.capacity = {}",
                p.display(),
                buffer.len(),
                self.cfg.capacity
            );
        }
        for (i, e) in buffer.entries().enumerate() {
            let bad = |m: String| anyhow!("{}: group {i}: {m}", p.display());
            if e.step == 0 || e.step > limits.step || e.replays >= self.cfg.max_replays {
                return Err(bad(format!(
                    "sampled at step {} and replayed {} times, impossible after step {}",
                    e.step, e.replays, limits.step
                )));
            }
            e.group.check(limits).map_err(bad)?;
        }
        Ok(Self { buffer, ..self })
    }

    /// Step `step` (0-based) of `steps`: the training generation and rewards, that is `fresh`'s `g`
    /// (padded fresh rows, groups 0..prompts) followed by the groups replayed at this step
    /// (new group ids after the fresh ones); then the step's hard groups are admitted. Logs
    /// `replay/*` into `row`. `None` when nothing is replayed (train on `g` as it is).
    pub fn mix(
        &mut self,
        [step, steps]: [usize; 2],
        fresh: Fresh<'_>,
        row: &mut BTreeMap<String, f64>,
    ) -> Result<Option<(Generation, Vec<f32>)>> {
        let Fresh {
            prompts,
            g,
            rewards,
        } = fresh;
        let k = self.cfg.replays_at(step, steps, prompts.len());
        let drawn = self.buffer.draw(&self.cfg, k);
        let mut admitted = 0;
        // The step's groups are read to the host only while they may be admitted.
        if self.cfg.admits_at(step, steps) {
            for grp in self.fresh_groups(prompts, g, rewards)? {
                let r: Vec<f32> = grp.rewards.iter().map(|x| x.unwrap_or(f32::NAN)).collect();
                if self.cfg.admits(&r) {
                    self.buffer.push(&self.cfg, step + 1, grp);
                    admitted += 1;
                }
            }
        }
        row.insert("replay/admitted".into(), admitted as f64);
        row.insert("replay/buffer_groups".into(), self.buffer.len() as f64);
        row.insert("replay/evicted_total".into(), self.buffer.evicted as f64);
        row.insert("replay/replayed_groups".into(), drawn.len() as f64);
        if drawn.is_empty() {
            return Ok(None);
        }
        let age = drawn
            .iter()
            .map(|e| (step + 1).saturating_sub(e.step) as f64)
            .sum::<f64>();
        row.insert("replay/mean_age".into(), age / drawn.len() as f64);
        let old = replayed(&drawn, prompts.len(), &g.tokens.device());
        let rows_old: usize = drawn.iter().map(|e| e.group.responses.len()).sum();
        row.insert("replay/replayed_rows".into(), rows_old as f64);
        let mut all_rewards = rewards.to_vec();
        for e in &drawn {
            all_rewards.extend(e.group.rewards.iter().map(|r| r.unwrap_or(f32::NAN)));
        }
        let mut ids = g.group_ids.clone();
        ids.extend(&old.group_ids);
        let n = g.group_ids.len();
        let mixed = Generation::stack(
            vec![
                (g.clone(), (0..n).collect()),
                (old, (0..rows_old).collect()),
            ],
            ids,
        );
        Ok(Some((mixed, all_rewards)))
    }

    /// This step's groups as they would be stored (one host read of the log-probs).
    fn fresh_groups(
        &self,
        prompts: &[Vec<u32>],
        g: &Generation,
        rewards: &[f32],
    ) -> Result<Vec<StoredGroup>> {
        let (ids, lps) = responses_and_log_probs(g)?;
        let mut out: Vec<StoredGroup> = prompts
            .iter()
            .map(|p| StoredGroup {
                prompt: p.clone(),
                responses: Vec::new(),
                log_probs: Vec::new(),
                rewards: Vec::new(),
                truncated: Vec::new(),
            })
            .collect();
        for (r, row_lp) in lps.into_iter().enumerate() {
            let grp = out
                .get_mut(g.group_ids[r])
                .context("a rollout row names a prompt outside the step")?;
            grp.responses.push(ids[r].clone());
            grp.log_probs.push(row_lp);
            grp.rewards
                .push(ember_engine::is_valid_reward(rewards[r].into()).then_some(rewards[r]));
            grp.truncated.push(g.truncated[r]);
        }
        Ok(out)
    }
}

/// A step's fresh rollout: its prompts, their generation and its rewards.
pub struct Fresh<'a> {
    /// The prompts, one per group.
    pub prompts: &'a [Vec<u32>],
    /// The generation (rows grouped by prompt).
    pub g: &'a Generation,
    /// Each row's reward.
    pub rewards: &'a [f32],
}

/// The stored groups as a generation (prompts left-padded, responses right-padded with masked
/// zeros), their group ids numbered from `first_group`.
fn replayed(
    entries: &[ReplayEntry<StoredGroup>],
    first_group: usize,
    device: &Device,
) -> Generation {
    let mut rows = Vec::new();
    let mut group_ids = Vec::new();
    for (gi, e) in entries.iter().enumerate() {
        let s = &e.group;
        for (j, resp) in s.responses.iter().enumerate() {
            rows.push(TokenRow {
                prompt: &s.prompt,
                response: resp,
                log_probs: Some(&s.log_probs[j]),
                truncated: s.truncated[j],
            });
            group_ids.push(first_group + gi);
        }
    }
    rows_generation(&rows, group_ids, device)
}
