//! The parts of an LLM RL step that `ember train` and `ember warmup` share: a recipe's update
//! schedule and optimizer, rescoring without gradients (old-policy and reference log-probs),
//! and the update itself (advantages, then `ember-train`'s epochs × mini-batches).

use crate::lm::Policy;
use crate::lm::score::{Scorer, completions, valid_mean};
use anyhow::Result;
use burn::tensor::Device;
use burn::tensor::{Int, Tensor, TensorData};
use ember_dist::World;
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::generate;
use ember_llm::{Generation, Llama, SamplingConfig};
use ember_run::fmt_metric;
use ember_tasks::task::Example;
use ember_train::{Actor, Optimizer, UpdateConfig, UpdateData, update};
use std::collections::BTreeMap;

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

/// What a KL term compares the policy with.
#[derive(Clone, Copy)]
pub enum Reference<'a> {
    /// A separate model (the warm-started tiny policy).
    Model(&'a Llama),
    /// The policy's own weights with its LoRA adapters off.
    AdaptersOff,
}

/// Which log-probs a rescoring writes: the old policy's (the sampler's) when `recompute_old`,
/// the reference's when `reference` is given.
#[derive(Clone, Copy)]
pub struct Rescoring<'a> {
    /// The model that sampled the rollout (its adapters off: the `AdaptersOff` reference).
    pub sampler: &'a Llama,
    /// Recompute the old policy's log-probs with `sampler`.
    pub recompute_old: bool,
    /// The KL reference, if any.
    pub reference: Option<Reference<'a>>,
}

/// Rescores `exp` (on the sampler's device) without gradients, as `how` says; the log-probs are
/// moved onto `ad`, the training device. With a multi-process `world`, each rank scores its
/// share of the rows and the shares are gathered.
pub fn rescore(
    mut batch: RolloutBatch,
    exp: &LlmExperience,
    world: Option<&World>,
    how: Rescoring<'_>,
    ad: &Device,
) -> Result<RolloutBatch> {
    let Rescoring {
        sampler,
        recompute_old,
        reference,
    } = how;
    if recompute_old {
        batch = batch.with_old_log_probs(score_rows(exp, sampler, world)?.to_device(ad))?;
    }
    if let Some(reference) = reference {
        let lp = match reference {
            Reference::Model(m) => score_rows(exp, m, world)?,
            Reference::AdaptersOff => {
                let off = LlmExperience {
                    adapters: false,
                    ..exp.clone()
                };
                score_rows(&off, sampler, world)?
            }
        };
        batch = batch.with_ref_log_probs(lp.to_device(ad))?;
    }
    Ok(batch)
}

/// `exp.score_all(model)`; with a `world`, this rank's contiguous share of the rows scored here
/// and every rank's share gathered in rank order (the same rows, the same order; every share is
/// `exp.response_len` columns wide).
fn score_rows(exp: &LlmExperience, model: &Llama, world: Option<&World>) -> Result<Tensor<2>> {
    let Some(w) = world.filter(|w| w.size() > 1) else {
        return Ok(exp.score_all(model));
    };
    let n = exp.tokens.dims()[0];
    let mine: Vec<usize> = w.shard(n).collect();
    let local = match mine.is_empty() {
        true => Vec::new(),
        false => model
            .score(exp, &mine, false)
            .log_probs
            .try_into_vec_as::<f32>()
            .map_err(|e| anyhow::anyhow!("reading log-probs: {e:?}"))?,
    };
    let all: Vec<f32> = w.gather_floats(&local, "rescoring gather")?.concat();
    let cols = exp.response_len;
    if Some(all.len()) != n.checked_mul(cols) {
        anyhow::bail!(
            "the ranks scored {} values for {n} rows of {cols}",
            all.len()
        );
    }
    let device = exp.tokens.device();
    Ok(Tensor::from_data(TensorData::new(all, [n, cols]), &device))
}

/// What an LLM update takes besides the model, its optimizers and the experience: the
/// estimator and update settings, the step and its learning rate, the row order of each epoch,
/// the step's metrics row (advantage and update metrics are added to it) and the rows whose
/// mean advantages the sample log shows.
pub struct UpdateCtx<'a> {
    /// The advantage estimator.
    pub adv_cfg: &'a AdvantageConfig,
    /// The update's schedule and loss.
    pub upd: &'a UpdateConfig,
    /// The RL step (CAPO's curriculum and the critic's warm-up read it).
    pub step: usize,
    /// The step's learning rate.
    pub lr: f64,
    /// Permutes rows between epochs.
    pub order: &'a mut dyn FnMut(usize) -> Vec<usize>,
    /// The step's metrics.
    pub row: &'a mut BTreeMap<String, f64>,
    /// Rows whose mean advantage is returned.
    pub shown: &'a [usize],
}

/// The update of one step: the advantages of `batch`, then `ember_train::update`. Returns the
/// new model and the mean advantage over the valid steps of each of the shown rows (one host
/// read; NaN for a masked-out row), for the sample log.
pub fn update_policy(
    model: Llama,
    optim: &mut Optimizer,
    exp: &LlmExperience,
    batch: &RolloutBatch,
    ctx: UpdateCtx,
) -> Result<(Llama, Vec<f64>)> {
    let UpdateCtx {
        adv_cfg,
        upd,
        step,
        lr,
        order,
        row,
        shown,
    } = ctx;
    let adv = compute_advantages(adv_cfg, batch, step)?;
    row.extend(adv.metrics.to_host());
    let shown_adv = row_means(&adv.advantages, &adv.mask, shown);
    let (model, stats) = update(
        model,
        optim,
        UpdateData {
            experience: exp,
            batch,
            adv: &adv,
        },
        upd,
        lr,
        order,
    )?;
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
pub struct TokenRow<'a> {
    /// Prompt ids.
    pub prompt: &'a [u32],
    /// Response ids.
    pub response: &'a [u32],
    /// Log-probs of the response tokens (zeros when None).
    pub log_probs: Option<&'a [f32]>,
    /// Cut at the length limit.
    pub truncated: bool,
}

/// One list of log-probs per row.
pub type RowLogProbs = Vec<Vec<f32>>;

/// Each row's response tokens and the sampler's log-probs of them (one host read), the
/// log-probs clamped to [−1e4, 0]: a sampled token's is finite, and JSON cannot hold others.
pub fn responses_and_log_probs(g: &Generation) -> Result<(Vec<Vec<u32>>, RowLogProbs)> {
    let ids = g.response_ids();
    let [rows, n] = g.log_probs.dims();
    let lp: Vec<f32> = g
        .log_probs
        .clone()
        .try_into_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("reading the rollout's log-probs: {e:?}"))?;
    let row = |r: usize| -> Vec<f32> {
        let len = ids[r].len();
        lp[r * n..r * n + len]
            .iter()
            .map(|x| x.clamp(-1e4, 0.0))
            .collect()
    };
    let lps = (0..rows).map(row).collect();
    Ok((ids, lps))
}

/// Rows as a [`Generation`]: prompts left-padded and responses right-padded with masked zeros,
/// as the sampler lays them out, so that scoring them equals scoring a rollout.
///
/// # Panics
/// When `rows` is empty or `group_ids` has another length.
pub fn rows_generation(rows: &[TokenRow], group_ids: Vec<usize>, device: &Device) -> Generation {
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
        // Drawn elsewhere (a server): counted as a batch that runs every row to the end.
        decode_positions: b * n,
    }
}

/// A sampler as a call takes it: the weights it samples with, its settings, the device.
#[derive(Clone, Copy)]
pub struct SamplerRef<'a> {
    /// The weights (no autodiff).
    pub model: &'a Llama,
    /// The sampling settings.
    pub config: &'a SamplingConfig,
    /// Where it samples.
    pub device: &'a Device,
}

impl<'a> SamplerRef<'a> {
    /// `model` sampling with `config` on `device`.
    pub fn new(model: &'a Llama, config: &'a SamplingConfig, device: &'a Device) -> Self {
        Self {
            model,
            config,
            device,
        }
    }
}

/// ReMax's baseline (Li et al. 2024, eq. 5): the reward of each prompt's greedy response.
pub fn greedy_baseline(
    scorer: &mut Scorer,
    step: usize,
    policy: &Policy,
    sampler: SamplerRef,
    prompts: &[Vec<u32>],
    examples: &[Example],
) -> Result<Vec<f32>> {
    let (sampler, sc, device) = (sampler.model, sampler.config, sampler.device);
    let gg = generate(sampler, prompts, &greedy_sampling(sc), device)?;
    let ids = gg.response_ids();
    let texts: Vec<String> = ids.iter().map(|r| policy.decode(r)).collect();
    let mut scratch = BTreeMap::new();
    scorer.score(
        step + 1,
        &completions(&gg, examples, &ids, &texts),
        &mut scratch,
    )
}

/// Keeps `rows` of the batch and of the experience (all of them: unchanged).
pub fn keep_rows(
    batch: RolloutBatch,
    exp: LlmExperience,
    rows: &[usize],
    ad: &Device,
) -> Result<(RolloutBatch, LlmExperience)> {
    if rows.len() == batch.dims()[0] {
        return Ok((batch, exp));
    }
    let idx: Vec<i64> = rows.iter().map(|x| *x as i64).collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), ad);
    let e = LlmExperience {
        tokens: exp.tokens.clone().select(0, idx.clone()),
        mask: exp.mask.clone().select(0, idx),
        ..exp
    };
    Ok((batch.select(rows)?, e))
}

/// Warns when step `step` (0-based) of run `name` has no valid reward among its samples: every
/// one is masked, so the step trains nothing (a reward program or environment answering only
/// `null`, NaN, ±inf or values beyond ±1e9 would otherwise run to the end in silence).
pub fn warn_if_nothing_valid(name: &str, step: usize, rewards: &[f32]) {
    if !rewards.is_empty() && valid_mean(rewards).1 == 0 {
        log::warn!(
            "[{name}] step {}: none of its {} rewards is valid (null, NaN, ±inf or beyond \
             ±1e9), so it trains nothing; see rollout/invalid_rewards",
            step + 1,
            rewards.len()
        );
    }
}

/// The rollout's metrics (verl's names where verl has them).
pub fn rollout_metrics(
    row: &mut BTreeMap<String, f64>,
    step: usize,
    rewards: &[f32],
    responses: &[Vec<u32>],
    g: &Generation,
    dropped_groups: usize,
) {
    row.insert("step".to_string(), (step + 1) as f64);
    let (mean, valid) = valid_mean(rewards);
    row.insert(keys::ROLLOUT_REWARD_MEAN.to_string(), mean);
    row.insert(
        "rollout/invalid_rewards".to_string(),
        (rewards.len() - valid) as f64,
    );
    let lengths: Vec<usize> = responses.iter().map(Vec::len).collect();
    row.insert(
        "rollout/response_length".to_string(),
        lengths.iter().sum::<usize>() as f64 / lengths.len().max(1) as f64,
    );
    row.insert(
        "rollout/truncated_fraction".to_string(),
        g.truncated.iter().filter(|t| **t).count() as f64 / g.truncated.len().max(1) as f64,
    );
    row.insert("rollout/dropped_groups".to_string(), dropped_groups as f64);
    // Positions the batched decode computed (prefill aside; finished rows leave the batch at
    // stop checks), of which Σ lengths were emitted.
    let computed = g.decode_positions as f64;
    row.insert("perf/decode_positions".to_string(), computed);
    row.insert(
        "perf/decode_efficiency".to_string(),
        lengths.iter().sum::<usize>() as f64 / computed.max(1.0),
    );
}

/// The progress line's numbers: reward, held-out accuracy, the KL to the reference where the
/// loss has one (`actor/kl_loss`), else the old-vs-new policy KL (`actor/approx_kl`), and
/// throughput.
pub fn stats_line(row: &BTreeMap<String, f64>, acc: f64) -> String {
    let kl = match row.get(keys::ACTOR_KL_LOSS) {
        Some(k) => format!("kl(ref) {}", fmt_metric(*k, 4)),
        None => format!(
            "kl(old) {}",
            fmt_metric(row.get("actor/approx_kl").copied().unwrap_or(0.0), 4)
        ),
    };
    format!(
        "reward {} acc {} {kl} {:.0} tok/s",
        fmt_metric(
            row.get(keys::ROLLOUT_REWARD_MEAN)
                .copied()
                .unwrap_or(f64::NAN),
            3
        ),
        fmt_metric(acc, 3),
        row.get(keys::PERF_TOKENS_PER_S).copied().unwrap_or(0.0),
    )
}
