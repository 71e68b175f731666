//! One optimizer step of an offline objective on the units a step drew: pairwise objectives
//! (DPO, IPO, SimPO, RPO) on each pair's sequence log-probs under the policy and the
//! reference, group objectives (A-LoL, REINFORCE-LOO, SFT) through the engine's estimator and
//! actor loss in micro-batches.

use crate::llm::schema::{OfflineSpec, Pool};
use crate::lm::Policy;
use crate::lm::step::{TokenRow, rows_generation};
use crate::offline::data::{TokGroup, Unit};
use anyhow::{Context, Result, bail};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use ember_engine::*;
use ember_llm::Llama;
use ember_llm::actor::LlmExperience;
use ember_train::{Actor, UpdateConfig, UpdateData, UpdateSchedule, update};
use std::collections::BTreeMap;

/// One optimizer step of the objective on the drawn units: pairwise or group.
pub(super) fn objective_step(
    refm: &Scorer,
    groups: &[TokGroup],
    picked: &[Unit],
    spec: &OfflineSpec,
    optim: &mut ember_train::Optimizer,
    lr: f64,
) -> Result<(Llama, BTreeMap<String, f64>)> {
    match (spec.objective.pairwise(), spec.objective.group()) {
        (Some(_), _) => pair_step(refm, groups, picked, spec, optim, lr),
        (None, Some(_)) => group_step(refm, groups, picked, spec, optim, lr),
        (None, None) => bail!("objective {:?} has no loss", spec.objective.name()),
    }
}

/// What a step scores with: the reference's stored log-probs, the policy, the devices, and the
/// rows per forward/backward of a group step.
pub(super) struct Scorer<'a> {
    pub(super) ref_lp: &'a [Vec<Vec<f32>>],
    /// A-LoL's fitted V(x) per group, when the objective asks for it.
    pub(super) values: Option<&'a [f32]>,
    pub(super) policy: &'a Policy,
    pub(super) base: &'a Device,
    pub(super) ad: &'a Device,
    pub(super) micro_rows: usize,
}

/// Rows per forward/backward of a group objective's step: `train.micro_batch_rows`, or 256 when
/// it is 0. A step takes every response of its groups, and a dataset may give one prompt
/// thousands of them: one pass over all of them held memory in proportion (8.2 GB for 20 000
/// responses × 4 draws), where micro-batches accumulate the same gradient in bounded memory.
pub(super) fn group_micro_rows(configured: usize) -> usize {
    if configured == 0 { 256 } else { configured }
}

impl Scorer<'_> {
    /// Response `ri` of group `gi` as a row carrying the reference's log-probs.
    fn row<'g>(&'g self, groups: &'g [TokGroup], gi: usize, ri: usize) -> TokenRow<'g> {
        TokenRow {
            prompt: &groups[gi].prompt,
            response: &groups[gi].responses[ri],
            log_probs: Some(&self.ref_lp[gi][ri]),
            truncated: false,
        }
    }

    /// The rows as experience on the training device, and the reference's per-token log-probs
    /// `[rows, n]` (from the rows; 0 on padding).
    fn rows(&self, rows: &[TokenRow], groups: Vec<usize>) -> Result<(LlmExperience, Tensor<2>)> {
        let g = rows_generation(rows, groups, self.base);
        let (seq, mask) = g.sequences();
        let exp = LlmExperience {
            tokens: seq.to_device(self.ad),
            mask: mask.to_device(self.ad),
            response_len: g.tokens.dims()[1],
            temperature: 1.0,
            adapters: true,
        };
        Ok((exp, g.log_probs.to_device(self.ad)))
    }
}

/// One pairwise step (`spec`'s objective): chosen rows then rejected rows, sequence sums, the objective, one
/// optimizer step.
fn pair_step(
    s: &Scorer,
    groups: &[TokGroup],
    picked: &[Unit],
    spec: &OfflineSpec,
    optim: &mut ember_train::Optimizer,
    lr: f64,
) -> Result<(Llama, BTreeMap<String, f64>)> {
    let Some(kind) = spec.objective.pairwise() else {
        bail!("objective {:?} is not pairwise", spec.objective.name());
    };
    let b = picked.len();
    let mut rows = Vec::with_capacity(2 * b);
    let mut rewards = Vec::with_capacity(2 * b);
    for side in 0..2 {
        for &(gi, pair) in picked {
            let g = &groups[gi];
            let (w, l) = pair.context("a pairwise draw without a pair")?;
            let i = if side == 0 { w } else { l };
            rows.push(s.row(groups, gi, i));
            let r = g.rewards[i];
            rewards.push(if ember_engine::is_valid_reward(r.into()) {
                r
            } else {
                0.0
            });
        }
    }
    let (exp, ref_lp) = s.rows(&rows, (0..2 * b).collect())?;
    let mask = exp.mask.clone().slice([
        0..2 * b,
        exp.mask.dims()[1] - exp.response_len..exp.mask.dims()[1],
    ]);
    let model = s.policy.model.clone();
    let all: Vec<usize> = (0..2 * b).collect();
    let lp = model.score(&exp, &all, false).log_probs * mask.clone();
    let sums = lp.sum_dim(1).reshape([2 * b]);
    let ref_sums = ref_lp.sum_dim(1).reshape([2 * b]);
    let lens = mask.sum_dim(1).reshape([2 * b]);
    let r = Tensor::<1>::from_floats(rewards.as_slice(), s.ad);
    let half = |t: &Tensor<1>, k: usize| t.clone().narrow(0, k * b, b);
    let input = PairInput {
        chosen: half(&sums, 0),
        rejected: half(&sums, 1),
        chosen_ref: half(&ref_sums, 0),
        rejected_ref: half(&ref_sums, 1),
        chosen_len: half(&lens, 0),
        rejected_len: half(&lens, 1),
        chosen_reward: half(&r, 0),
        rejected_reward: half(&r, 1),
    };
    let (loss, metrics) = preference_loss(&kind, &input, spec.average_log_probs)?;
    let mut out = metrics.to_host();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let (model, report) = optim.step(lr, model, grads);
    out.insert(keys::ACTOR_GRAD_NORM.into(), report.grad_norm);
    out.insert(
        "offline/loss".into(),
        out.get("preference/loss").copied().unwrap_or(f64::NAN),
    );
    Ok((model, out))
}

/// One group step: every stored response of the picked prompts through the engine's estimator
/// and actor loss, the reference's log-probs as the behaviour policy's. With `pool = "batch"`
/// every response of the step is in one group, so a group baseline is the step's mean.
fn group_step(
    s: &Scorer,
    groups: &[TokGroup],
    picked: &[Unit],
    spec: &OfflineSpec,
    optim: &mut ember_train::Optimizer,
    lr: f64,
) -> Result<(Llama, BTreeMap<String, f64>)> {
    let (adv_cfg, loss) = spec
        .objective
        .group()
        .context("a group step needs a group objective")?;
    let one_pool = spec.objective.pool() == Pool::Batch;
    let mut rows = Vec::new();
    let (mut ids, mut rewards, mut baselines) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &(gi, _)) in picked.iter().enumerate() {
        let g = &groups[gi];
        for i in 0..g.responses.len() {
            rows.push(s.row(groups, gi, i));
            ids.push(if one_pool { 0 } else { k });
            rewards.push(g.rewards[i]);
            baselines.push(s.values.map_or(0.0, |v| v[gi]));
        }
    }
    let (exp, ref_lp) = s.rows(&rows, ids.clone())?;
    let n = exp.response_len;
    let t = exp.mask.dims()[1];
    let mask = exp.mask.clone().slice([0..rows.len(), t - n..t]);
    let mut batch = RolloutBatch::new(mask, Tensor::from_floats(rewards.as_slice(), s.ad), &ids)?
        .with_old_log_probs(ref_lp.clone())?
        .with_ref_log_probs(ref_lp)?;
    if s.values.is_some() {
        batch = batch.with_baseline_rewards(Tensor::from_floats(baselines.as_slice(), s.ad))?;
    }
    let adv = compute_advantages(&adv_cfg, &batch, 0)?;
    let mut out = adv.metrics.to_host();
    let cfg = UpdateConfig {
        schedule: UpdateSchedule {
            micro_batch_rows: s.micro_rows,
            ..UpdateSchedule::default()
        },
        loss,
    };
    let (model, stats) = update(
        s.policy.model.clone(),
        optim,
        UpdateData {
            experience: &exp,
            batch: &batch,
            adv: &adv,
        },
        &cfg,
        lr,
        &mut |m| (0..m).collect(),
    )?;
    out.extend(stats.metrics);
    out.insert(
        "offline/loss".into(),
        out.get(keys::ACTOR_LOSS).copied().unwrap_or(f64::NAN),
    );
    Ok((model, out))
}
