//! `ember rollouts`: a dataset of the policy's own samples with their rewards, for the offline
//! objectives (`[offline]`). The recipe's policy as a run of it starts (warmed up, or a
//! checkpoint) samples `samples_per_prompt` responses to each of `prompts` training prompts at
//! the rollout temperature; each response is scored by the recipe's reward; one line per
//! prompt is written (`{"prompt", "answer", "responses": [{"response", "reward",
//! "truncated"}]}`, see `llm::offline`), atomically.

use crate::llm::plop::policy_at_start;
use crate::llm::schema::Recipe;
use crate::llm::setup::rollout_sampling;
use crate::lm::score::Scored;
use crate::lm::score::{Scorer, completions};
use anyhow::{Result, bail};
use burn::module::Module;
use ember_engine::SplitMix64;
use ember_llm::generate;
use ember_tasks::task::TaskSet;
use std::collections::BTreeMap;
use std::path::Path;

/// Prompts sampled per generation call.
const CHUNK: usize = 256;

/// What `ember rollouts` wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RolloutsReport {
    /// Prompts written.
    pub prompts: usize,
    /// Responses written.
    pub responses: usize,
    /// Mean valid reward.
    pub reward_mean: f64,
    /// Prompts whose responses do not all have the same reward (pairs for the pairwise
    /// objectives).
    pub prompts_with_pairs: usize,
}

/// Samples and writes the dataset to `out`.
pub fn rollouts(
    r: &Recipe,
    out: &Path,
    prompts: usize,
    checkpoint: Option<&Path>,
) -> Result<RolloutsReport> {
    if prompts == 0 || prompts > 1_000_000 {
        bail!("--prompts must be in 1..=1000000");
    }
    // The output's folder first: a bad path fails before the warm-up, not after the sampling.
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
    }
    let base = crate::common::device::device(&r.header.device)?;
    let ad = base.clone().autodiff();
    let task: TaskSet = r.task.build()?;
    let mut rng = SplitMix64(r.header.seed);
    let policy = policy_at_start(r, &task, checkpoint, &mut rng, &ad)?;
    let sampler = policy.model.valid();
    let max_new = r.rollout.max_new_tokens;
    let mut scorer = Scorer::new(&r.reward, &base)?;
    let mut lines = String::new();
    let (mut n_resp, mut sum, mut valid, mut pairs) = (0usize, 0f64, 0usize, 0usize);
    let mut left = prompts;
    while left > 0 {
        let k = left.min(CHUNK);
        left -= k;
        let examples = task.train(&mut rng, k);
        let ids = examples
            .iter()
            .map(|e| policy.prompt_ids(e, max_new))
            .collect::<Result<Vec<_>>>()?;
        let sc = rollout_sampling(r, &policy.stop, rng.next_u64());
        let g = generate(&sampler, &ids, &sc, &base)?;
        let ids = g.response_ids();
        let texts: Vec<String> = ids.iter().map(|x| policy.decode(x)).collect();
        let done = completions(&g, &examples, &ids, &texts);
        let rewards = scorer.score(1, &done, &mut BTreeMap::new())?;
        let mut per: Vec<Vec<Scored>> = vec![Vec::new(); examples.len()];
        for (row, gi) in g.group_ids.iter().enumerate() {
            let rw = rewards[row];
            let reward = ember_engine::is_valid_reward(rw.into()).then_some(rw);
            if let Some(x) = reward {
                sum += f64::from(x);
                valid += 1;
            }
            per[*gi].push(Scored {
                response: texts[row].clone(),
                reward,
                truncated: g.truncated[row],
            });
            n_resp += 1;
        }
        for (e, responses) in examples.iter().zip(per) {
            let finite: Vec<f32> = responses.iter().filter_map(|s| s.reward).collect();
            if finite.iter().any(|x| *x != finite[0]) {
                pairs += 1;
            }
            let prompt = match policy.tok {
                crate::lm::Tok::Char(_) => e.prompt.clone(),
                crate::lm::Tok::Real { .. } => e.question.clone(),
            };
            let line = serde_json::json!({
                "prompt": prompt, "answer": e.answer, "responses": responses,
            });
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
    }
    ember_run::write_atomic(out, lines.as_bytes())?;
    Ok(RolloutsReport {
        prompts,
        responses: n_resp,
        reward_mean: if valid > 0 {
            sum / valid as f64
        } else {
            f64::NAN
        },
        prompts_with_pairs: pairs,
    })
}
