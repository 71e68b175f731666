//! The parts of an LLM RL step that `ember train` and `ember warmup` share: a recipe's update
//! schedule and optimizer, rescoring without gradients (old-policy and reference log-probs),
//! and the update itself (advantages, then `ember-train`'s epochs × mini-batches).

use crate::llm::schema::Recipe;
use anyhow::Result;
use burn::tensor::Device;
use burn::tensor::{Int, Tensor, TensorData};
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::{Generation, Llama, SamplingConfig};
use ember_train::{Optimizer, UpdateConfig, update};
use std::collections::BTreeMap;

/// The rollout sampler of a recipe's step: its temperature, response length, group size and
/// prompt bucket, the policy's stop tokens, and the step's `seed`.
pub fn rollout_sampling(r: &Recipe, stop: &[u32], seed: u64) -> SamplingConfig {
    SamplingConfig {
        temperature: r.rollout.temperature,
        max_new_tokens: r.rollout.max_new_tokens,
        n: r.rollout.samples_per_prompt,
        seed,
        stop_tokens: stop.to_vec(),
        prompt_bucket: r.rollout.shape_bucket,
        ..SamplingConfig::default()
    }
}

/// ReMax's greedy pass (Li et al. 2024): the rollout sampler at temperature 0, one response per
/// prompt.
pub fn greedy_sampling(sc: &SamplingConfig) -> SamplingConfig {
    SamplingConfig {
        temperature: 0.0,
        n: 1,
        ..sc.clone()
    }
}

/// The experience of a rollout: prompt + response `tokens` and `mask`, scored at the sampler's
/// own temperature (`SamplingConfig::scoring_temperature`) with the adapters on.
pub fn experience(
    tokens: Tensor<2, Int>,
    mask: Tensor<2>,
    response_len: usize,
    sc: &SamplingConfig,
) -> LlmExperience {
    LlmExperience {
        tokens,
        mask,
        response_len,
        temperature: sc.scoring_temperature(),
        adapters: true,
    }
}

/// BASIS's prompt representations `[rows, d_model]`: the policy's final-normed hidden state at
/// each row's last prompt token (prompts are left-padded, so it is the last prompt column).
pub fn prompt_features(sampler: &Llama, g: &Generation) -> Tensor<2> {
    let (seq, mask) = g.sequences();
    features_at(sampler, seq, mask, g.prompt_tokens.dims()[1])
}

/// [`prompt_features`] of sequences `[rows, p + n]` (n ≥ 1) whose prompts fill the first `p`
/// columns.
pub fn features_at(sampler: &Llama, seq: Tensor<2, Int>, mask: Tensor<2>, p: usize) -> Tensor<2> {
    let rows = seq.dims()[0];
    let h = sampler.last_hidden(
        seq.slice([0..rows, 0..p + 1]),
        mask.slice([0..rows, 0..p + 1]),
        1,
        true,
    );
    let d = h.dims()[2];
    h.reshape([rows, d])
}

/// The update schedule of a recipe's RL phase with the resolved actor loss.
pub fn update_config(r: &Recipe, loss: ActorLossConfig) -> UpdateConfig {
    UpdateConfig {
        schedule: r.train.update,
        loss,
    }
}

/// The RL phase's AdamW (no weight decay; global gradient-norm clipping when `train.grad_clip`
/// > 0).
pub fn optimizer(r: &Recipe) -> Optimizer {
    r.train.optim.init()
}

/// What a KL term compares the policy with.
#[derive(Clone, Copy)]
pub enum Reference<'a> {
    /// A separate model (the warm-started tiny policy).
    Model(&'a Llama),
    /// The policy's own weights with its LoRA adapters off.
    AdaptersOff,
}

/// Rescores `exp` (on the sampler's device) without gradients: the old policy's log-probs with
/// `sampler` when `recompute_old`, the reference's when `reference` is given; both moved onto
/// `ad`, the training device.
pub fn rescore(
    mut batch: RolloutBatch,
    exp: &LlmExperience,
    sampler: &Llama,
    recompute_old: bool,
    reference: Option<Reference>,
    ad: &Device,
) -> Result<RolloutBatch> {
    if recompute_old {
        batch = batch.with_old_log_probs(exp.score_all(sampler).to_device(ad))?;
    }
    if let Some(reference) = reference {
        let lp = match reference {
            Reference::Model(m) => exp.score_all(m),
            Reference::AdaptersOff => LlmExperience {
                adapters: false,
                ..exp.clone()
            }
            .score_all(sampler),
        };
        batch = batch.with_ref_log_probs(lp.to_device(ad))?;
    }
    Ok(batch)
}

/// The update of one step: the advantages of `batch` (their metrics added to `row`), then
/// `ember_train::update` (its metrics added to `row`). `order` permutes rows between epochs.
/// Returns the new model and the mean advantage over the valid steps of each of `shown` rows
/// (one host read; NaN for a masked-out row), for the sample log.
#[allow(clippy::too_many_arguments)]
pub fn update_policy(
    model: Llama,
    optim: &mut Optimizer,
    exp: &LlmExperience,
    batch: &RolloutBatch,
    adv_cfg: &AdvantageConfig,
    upd: &UpdateConfig,
    step: usize,
    lr: f64,
    order: &mut dyn FnMut(usize) -> Vec<usize>,
    row: &mut BTreeMap<String, f64>,
    shown: &[usize],
) -> Result<(Llama, Vec<f64>)> {
    let adv = compute_advantages(adv_cfg, batch, step)?;
    row.extend(adv.metrics.to_host());
    let shown_adv = row_means(&adv.advantages, &adv.mask, shown);
    let (model, stats) = update(model, optim, exp, batch, &adv, upd, lr, order)?;
    row.extend(stats.metrics);
    Ok((model, shown_adv))
}

/// Σ x·m / Σ m over the steps of each of `rows` (NaN where Σ m = 0), read to the host at once.
pub(crate) fn row_means(x: &Tensor<2>, mask: &Tensor<2>, rows: &[usize]) -> Vec<f64> {
    if rows.is_empty() {
        return Vec::new();
    }
    let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &x.device());
    let (x, m) = (
        x.clone().select(0, idx.clone()),
        mask.clone().select(0, idx),
    );
    let sums = Tensor::cat(vec![(x * m.clone()).sum_dim(1), m.sum_dim(1)], 1);
    let v = sums.into_data().try_to_vec::<f32>().unwrap_or_default();
    v.chunks(2)
        .map(|p| {
            if p[1] > 0.0 {
                f64::from(p[0] / p[1])
            } else {
                f64::NAN
            }
        })
        .collect()
}

/// One row of a generation built from token ids: a prompt, a response and (optionally) the
/// sampler's log-prob of each response token.
pub struct Row<'a> {
    /// Prompt ids.
    pub prompt: &'a [u32],
    /// Response ids.
    pub response: &'a [u32],
    /// Log-probs of the response tokens (zeros when None).
    pub log_probs: Option<&'a [f32]>,
    /// Cut at the length limit.
    pub truncated: bool,
}

/// Rows as a [`Generation`]: prompts left-padded and responses right-padded with masked zeros,
/// as the sampler lays them out, so that scoring them equals scoring a rollout.
///
/// # Panics
/// When `rows` is empty or `group_ids` has another length.
pub fn rows_generation(rows: &[Row], group_ids: Vec<usize>, device: &Device) -> Generation {
    assert!(!rows.is_empty() && rows.len() == group_ids.len());
    let p = rows
        .iter()
        .map(|r| r.prompt.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let n = rows
        .iter()
        .map(|r| r.response.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let (mut pt, mut pm, mut tk, mut lp, mut m) = (vec![], vec![], vec![], vec![], vec![]);
    let mut truncated = Vec::with_capacity(rows.len());
    for r in rows {
        let pad = p - r.prompt.len();
        pt.extend(std::iter::repeat_n(0i64, pad).chain(r.prompt.iter().map(|x| i64::from(*x))));
        pm.extend(std::iter::repeat_n(0f32, pad).chain(std::iter::repeat_n(1f32, r.prompt.len())));
        let tail = n - r.response.len();
        tk.extend(
            r.response
                .iter()
                .map(|x| i64::from(*x))
                .chain(std::iter::repeat_n(0, tail)),
        );
        match r.log_probs {
            Some(l) => lp.extend(l.iter().copied().chain(std::iter::repeat_n(0f32, tail))),
            None => lp.extend(std::iter::repeat_n(0f32, n)),
        }
        m.extend(
            std::iter::repeat_n(1f32, r.response.len()).chain(std::iter::repeat_n(0f32, tail)),
        );
        truncated.push(r.truncated);
    }
    let b = rows.len();
    let int = |v: Vec<i64>, c| Tensor::<2, Int>::from_data(TensorData::new(v, [b, c]), device);
    let float = |v: Vec<f32>, c| Tensor::<2>::from_data(TensorData::new(v, [b, c]), device);
    Generation {
        prompt_tokens: int(pt, p),
        prompt_mask: float(pm, p),
        tokens: int(tk, n),
        log_probs: float(lp, n),
        mask: float(m, n),
        group_ids,
        truncated,
    }
}
