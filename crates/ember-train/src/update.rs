//! The policy update: μ epochs over the experience, each split into mini-batches (one optimizer
//! step each), each mini-batch accumulated over micro-batches. The loss normalisers
//! ([`AggNorm`]) are those of the whole mini-batch, so accumulation equals one big batch
//! (verl `dp_actor.update_policy`).

use crate::micro::{Cut, mask_lengths};
use crate::optim::{Optimizer, StepReport};
use crate::parallel::{DataParallel, Replicate};
use crate::world::{gather_metrics, sum_gradients};
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Gradients, Int, Tensor, TensorData};
use ember_engine::keys;
use ember_engine::{ActorLossConfig, AggNorm, EngineError, Metrics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The rest of a backward pass that a checkpointed forward left to do: given the gradients of
/// the loss's own backward, it recomputes what the forward did not keep and returns every
/// parameter's gradient (what `GradientsParams::from_grads` gives for a forward that kept all).
pub struct Recompute(Box<dyn FnOnce(Gradients) -> GradientsParams + Send>);

impl Recompute {
    /// A recomputation that finishes the backward with `finish`.
    pub fn new(finish: impl FnOnce(Gradients) -> GradientsParams + Send + 'static) -> Self {
        Self(Box::new(finish))
    }

    /// Every parameter's gradient, from the gradients of the loss's backward.
    pub fn finish(self, grads: Gradients) -> GradientsParams {
        (self.0)(grads)
    }
}

impl std::fmt::Debug for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recompute")
    }
}

/// A micro-batch's loss, its metrics, and the recomputation that finishes its backward when
/// its forward was checkpointed.
pub(crate) struct MicroLoss {
    pub(crate) loss: Tensor<1>,
    pub(crate) metrics: Metrics,
    pub(crate) recompute: Option<Recompute>,
}

impl MicroLoss {
    /// The gradients of every parameter of `model` that the loss reaches.
    fn gradients<M: Module>(self, model: &M) -> GradientsParams {
        let grads = self.loss.backward();
        match self.recompute {
            None => GradientsParams::from_grads(grads, model),
            Some(r) => r.finish(grads),
        }
    }
}

/// Per-step log-probs (with gradient) and optionally entropies of some rows.
#[derive(Debug)]
pub struct Scored {
    /// `[rows, steps]`.
    pub log_probs: Tensor<2>,
    /// `[rows, steps]` full-distribution entropy.
    pub entropy: Option<Tensor<2>>,
    /// `[rows, steps]` a closed-form KL to the reference, when the actor computes one (the
    /// loss then uses it instead of an estimator on the reference's log-probs).
    pub kl: Option<Tensor<2>>,
    /// What finishes the backward when the forward was checkpointed (`None`: it kept all).
    pub recompute: Option<Recompute>,
}

/// A trainable policy over the steps of an experience batch.
pub trait Actor: Module + Clone {
    /// What the model needs to score steps (tokens for an LLM, latents for a flow model).
    type Experience: Replicate;

    /// Scores the steps of `rows` of `experience` (rows in the given order).
    fn score(&self, experience: &Self::Experience, rows: &[usize], with_entropy: bool) -> Scored;

    /// Per row of `experience`, the positions a pass over that row alone computes: what
    /// [`UpdateSchedule::micro_batch_tokens`] counts. `None` (the default): the steps up to each
    /// row's last valid step of the loss mask.
    fn row_tokens(&self, _experience: &Self::Experience) -> Option<Vec<usize>> {
        None
    }

    /// Whether a pass over a group's rows together costs less than over each apart (an LLM that
    /// runs a group's shared prompt once): a token budget then keeps each group in one
    /// micro-batch where it fits. Default false.
    fn shares_groups(&self) -> bool {
        false
    }
}

fn one() -> usize {
    1
}

/// Epochs, mini-batches and micro-batches of one update (verl's `ppo_epochs`,
/// `ppo_mini_batch_size`, `ppo_micro_batch_size`, as counts).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateSchedule {
    /// μ: passes over the experience.
    #[serde(default = "one")]
    pub epochs: usize,
    /// Optimizer steps per epoch.
    #[serde(default = "one")]
    pub mini_batches: usize,
    /// Rows per forward/backward (gradient accumulation inside a mini-batch); 0 = whole
    /// mini-batch. This and `micro_batch_tokens` bound what one device holds at once: where
    /// data-parallel replicas share a device (CPU shards), each gets its share of them.
    #[serde(default)]
    pub micro_batch_rows: usize,
    /// Positions per forward/backward: a micro-batch's rows × its longest row's tokens
    /// ([`Actor::row_tokens`]) stays within this, with each mini-batch's rows sorted longest
    /// first (verl's `use_dynamic_bsz`, `ppo_max_token_len_per_gpu`); 0 = no bound. A row
    /// longer than the bound is a micro-batch of its own; a group stays whole where it fits and
    /// the actor shares its prompt ([`Actor::shares_groups`]). With `micro_batch_rows` both
    /// bounds hold.
    #[serde(default)]
    pub micro_batch_tokens: usize,
    /// Lopti's low-probability token isolation (Yang et al. 2025, arXiv 2505.12929, §4.2;
    /// AR-Lopti `ray_trainer.py`, `seperate_prob`): η in (0, 1). The update runs twice, first
    /// on the steps whose π_old < η, then on the others; each pass keeps the whole batch's
    /// normaliser and its KL and entropy terms on its own steps. `None`: one update.
    #[serde(default)]
    pub lopti_threshold: Option<f32>,
}

impl Default for UpdateSchedule {
    fn default() -> Self {
        Self {
            epochs: 1,
            mini_batches: 1,
            micro_batch_rows: 0,
            micro_batch_tokens: 0,
            lopti_threshold: None,
        }
    }
}

/// One update: its schedule and the actor objective.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateConfig {
    /// Epochs × mini-batches × micro-batches.
    #[serde(default)]
    pub schedule: UpdateSchedule,
    /// The actor objective.
    #[serde(default)]
    pub loss: ActorLossConfig,
}

/// Host metrics of an update, averaged over micro-batches, plus counts.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    /// `actor/*`, `mismatch/*` means.
    pub metrics: BTreeMap<String, f64>,
    /// Optimizer steps taken.
    pub optimizer_steps: usize,
    /// Optimizer steps skipped because a micro-batch's loss or the gradient norm was not finite
    /// (also the metric `actor/skipped_steps`).
    pub skipped_steps: usize,
}

/// `rows` as an index tensor on `device`.
pub(crate) fn index(rows: &[usize], device: &Device) -> Tensor<1, Int> {
    let v: Vec<i64> = rows.iter().map(|x| *x as i64).collect();
    Tensor::<1, Int>::from_data(TensorData::new(v, [rows.len()]), device)
}

pub(crate) fn select2(t: &Tensor<2>, idx: &Tensor<1, Int>) -> Tensor<2> {
    t.clone().select(0, idx.clone())
}

/// The metrics that are sums over the steps of a micro-batch divided by the mini-batch's
/// normaliser ([`AggNorm`]): parts of the mini-batch's value.
pub(crate) const PARTIAL: [&str; 5] = [
    keys::ACTOR_PG_LOSS,
    keys::ACTOR_KL_LOSS,
    "actor/entropy",
    keys::ACTOR_LOSS,
    keys::CRITIC_VF_LOSS,
];

/// Epochs × mini-batches × micro-batches of one model's update (the actor's or the critic's):
/// the loss normalisers are the mini-batch's, a mini-batch without a valid step takes no step,
/// and a non-finite loss or gradient norm skips the step. Metrics are logged under `area`
/// (`<area>/grad_norm`, `<area>/skipped_steps`; the loss's own keys as it names them).
pub(crate) struct Steps<'a> {
    pub(crate) schedule: &'a UpdateSchedule,
    /// `[rows, steps]` valid steps of the whole batch.
    pub(crate) mask: &'a Tensor<2>,
    /// Per row, the positions a pass computes (the token budget's measure); `None`: the mask's.
    pub(crate) tokens: Option<Vec<usize>>,
    /// Per row, its group, where a token budget keeps groups whole ([`Actor::shares_groups`]).
    pub(crate) groups: Option<&'a [usize]>,
    pub(crate) area: &'static str,
    /// The metric holding the total loss (a non-finite value skips the step).
    pub(crate) loss_key: &'static str,
    pub(crate) lr: f64,
    /// `[rows, steps]` the steps this pass trains, where it trains only some (Lopti's passes):
    /// a mini-batch without one of them takes no step. `None`: the mask's.
    pub(crate) only: Option<&'a Tensor<2>>,
}

impl Steps<'_> {
    /// The loss normalisers of the mini-batch `part` (the whole mask's), or `None` when it has
    /// no valid step, or none of [`Steps::only`]'s: such a mini-batch has no gradient, and AdamW
    /// would still move the weights by its momentum, so it takes no step (SeeUPO's turn
    /// updates, whose masks keep one turn, and Lopti's passes meet this with several
    /// mini-batches). One host read per mini-batch with `only`.
    fn norm_of(&self, part: &[usize], device: &Device) -> Option<AggNorm> {
        let idx = index(part, device);
        let norm = AggNorm::of_mask(&select2(self.mask, &idx));
        let active = match self.only {
            Some(o) => select2(o, &idx).sum().into_scalar::<f32>() > 0.0,
            None => true,
        };
        (norm.tokens > 0.0 && active).then_some(norm)
    }

    /// Runs the schedule; `loss(model, replica, rows, rows as an index tensor, norm)` builds one
    /// micro-batch's scalar loss and metrics (`loss_key` is checked for finiteness) on `model`'s
    /// device; `replica` is the data-parallel replica's position (0 without a group), the index
    /// tensor is on the mask's device. With the optimizer's data-parallel group each mini-batch
    /// is cut into one shard per device, run in one thread each, and the gradients summed.
    pub(crate) fn run<M: Module + Clone + Send>(
        &self,
        mut model: M,
        optim: &mut Optimizer,
        order: &mut dyn FnMut(usize) -> Vec<usize>,
        loss: impl Fn(&M, usize, &[usize], &Tensor<1, Int>, AggNorm) -> Result<MicroLoss, EngineError>
        + Sync,
    ) -> Result<(M, UpdateStats), EngineError> {
        let [rows, _] = self.mask.dims();
        let device = self.mask.device();
        let mut sums = Means::default();
        let mut ratio = RatioSpread::default();
        let mut stats = UpdateStats::default();
        let mini = self.schedule.mini_batches.clamp(1, rows.max(1));
        let group = optim.data_parallel().cloned();
        let world = optim.world().cloned();
        // The replicas on the other devices: forked once, their trained weights refreshed after
        // each optimizer step.
        let mut replicas: Vec<M> = group.as_ref().map_or_else(Vec::new, |dp| dp.fork(&model));
        // Replicas sharing the model's device run their passes at once: they share its bounds.
        let sharing = group.as_ref().map_or(1, |dp| dp.on_first_device());
        let share = |bound: usize| bound.div_ceil(sharing);
        let max_tokens = share(self.schedule.micro_batch_tokens);
        let from_mask;
        let tokens: &[usize] = match (&self.tokens, max_tokens) {
            (_, 0) => &[],
            (Some(t), _) => t,
            (None, _) => {
                from_mask = mask_lengths(self.mask);
                &from_mask
            }
        };
        let cut = Cut {
            max_rows: share(self.schedule.micro_batch_rows),
            max_tokens,
            tokens,
            groups: self.groups,
        };
        for _ in 0..self.schedule.epochs.max(1) {
            let perm = order(rows);
            for m in 0..mini {
                let part: Vec<usize> = perm[m * rows / mini..(m + 1) * rows / mini].to_vec();
                if part.is_empty() {
                    continue;
                }
                let Some(norm) = self.norm_of(&part, &device) else {
                    continue;
                };
                let shard = |replica: &M, k: usize, rows: &[usize]| {
                    let mut acc = GradientsAccumulator::<M>::new();
                    let mut host = Vec::new();
                    for chunk in cut.micro_batches(rows) {
                        let chunk = chunk.as_slice();
                        let micro = loss(replica, k, chunk, &index(chunk, &device), norm)?;
                        host.push(micro.metrics.to_host().into_iter().collect());
                        acc.accumulate(replica, micro.gradients(replica));
                    }
                    Ok::<_, EngineError>((acc.grads(), host))
                };
                // Across processes, this rank's share of the mini-batch (the normaliser above
                // is the whole mini-batch's), then over its own devices.
                let mine = match &world {
                    Some(w) => &part[w.shard(part.len())],
                    None => &part[..],
                };
                let results = run_shards(group.as_deref(), &model, &replicas, mine, &shard);
                let (mut grads, hosts) = split(results)?;
                let hosts = match &world {
                    Some(w) => gather_metrics(w, hosts)?,
                    None => hosts,
                };
                let finite = self.merge(hosts, &mut sums, &mut ratio);
                let grads = match &group {
                    Some(dp) => dp.sum(&model, grads),
                    None => grads.pop().unwrap_or_default(),
                };
                let (grads, norm) = match &world {
                    Some(w) => {
                        let (g, n) = sum_gradients(w, &model, grads)?;
                        (g, Some(n))
                    }
                    None => (grads, None),
                };
                // A non-finite loss or gradient norm would make every weight NaN: the
                // mini-batch's step is skipped and counted instead.
                let applied = finite && {
                    let (next, report) = match norm {
                        Some(n) => optim.step_with_norm(self.lr, model, grads, n),
                        None => optim.step(self.lr, model, grads),
                    };
                    model = next;
                    sums.add(format!("{}/grad_norm", self.area), report.grad_norm);
                    report.applied
                };
                if applied {
                    if let Some(dp) = &group {
                        replicas = dp.sync_trained(&model, replicas);
                    }
                    stats.optimizer_steps += 1;
                } else {
                    stats.skipped_steps += 1;
                }
            }
        }
        stats.metrics = sums.finish();
        stats.metrics.extend(ratio.finish());
        stats.metrics.insert(
            format!("{}/skipped_steps", self.area),
            stats.skipped_steps as f64,
        );
        Ok((model, stats))
    }

    /// Adds a mini-batch's shares' host metrics (each micro-batch's list, on every rank) to
    /// `sums` and returns whether the loss was finite in all of them. Loss terms are divided by
    /// the whole mini-batch's normaliser, so a micro-batch's (or a share's) value is a part of
    /// the mini-batch's: those add up within the mini-batch; the ratio's spread is pooled over
    /// the steps of every share (`ratio`); extremes keep the extreme; the other metrics
    /// (fractions, means) are averaged, weighed by each share's valid steps.
    fn merge(&self, hosts: HostMetrics, sums: &mut Means, ratio: &mut RatioSpread) -> bool {
        let mut finite = true;
        let mut parts: BTreeMap<String, f64> = BTreeMap::new();
        let mut means = ShareMeans::default();
        for share in hosts {
            // A share's means weigh by its valid steps (the loss reports them beside the
            // ratio's spread), so a mini-batch split over ranks or micro-batches averages as
            // the whole mini-batch does.
            let steps = share.iter().find(|(k, _)| k == RATIO_COUNT).map(|e| e.1);
            for (k, v) in ratio.take(share) {
                if k == self.loss_key && !v.is_finite() {
                    finite = false;
                }
                if PARTIAL.contains(&k.as_str()) {
                    *parts.entry(k).or_insert(0.0) += v;
                } else if extreme(&k).is_some() {
                    sums.add(k, v);
                } else {
                    means.add(k, v, steps);
                }
            }
        }
        for (k, v) in parts.into_iter().chain(means.finish()) {
            sums.add(k, v);
        }
        finite
    }
}

/// A mini-batch's means over its shares: weighed by each share's valid steps where the shares
/// report them, a plain mean where they do not (or where none has a step); non-finite values
/// left out, as [`Means`] does.
#[derive(Default)]
struct ShareMeans(BTreeMap<String, [f64; 4]>);

impl ShareMeans {
    fn add(&mut self, key: String, v: f64, steps: Option<f64>) {
        if !v.is_finite() {
            self.0.entry(key).or_default();
            return;
        }
        let w = steps.unwrap_or(1.0);
        let e = self.0.entry(key).or_default();
        *e = [e[0] + w * v, e[1] + w, e[2] + v, e[3] + 1.0];
    }

    fn finish(self) -> impl Iterator<Item = (String, f64)> {
        self.0.into_iter().map(|(k, [wv, w, v, n])| {
            let mean = match (w > 0.0, n > 0.0) {
                (true, _) => wv / w,
                (false, true) => v / n,
                (false, false) => f64::NAN,
            };
            (k, mean)
        })
    }
}

/// A mini-batch's metrics as its shares read them: one list per micro-batch, on every rank.
type HostMetrics = Vec<Vec<(String, f64)>>;

/// The shards' gradients and their micro-batches' host metrics, or the first error.
fn split(results: Vec<ShardResult>) -> Result<(Vec<GradientsParams>, HostMetrics), EngineError> {
    let mut grads = Vec::with_capacity(results.len());
    let mut hosts = Vec::with_capacity(results.len());
    for r in results {
        let (g, h) = r?;
        grads.push(g);
        hosts.extend(h);
    }
    Ok((grads, hosts))
}

/// A shard's accumulated gradients and its micro-batches' host metrics.
type ShardResult = Result<(GradientsParams, HostMetrics), EngineError>;

/// The ratio's spread as the loss reports it for one micro-batch (`ember_engine`'s
/// `ratio_spread`): its valid steps, extremes, mean and standard deviation.
const RATIO_KEYS: [&str; 5] = [
    RATIO_COUNT,
    keys::ACTOR_RATIO_MAX,
    keys::ACTOR_RATIO_MIN,
    keys::ACTOR_RATIO_MEAN,
    keys::ACTOR_RATIO_STD,
];

/// The number of valid steps behind a micro-batch's ratio metrics; it weighs the pooling and is
/// not logged.
const RATIO_COUNT: &str = keys::ACTOR_RATIO_COUNT;

/// The ratio's spread over every micro-batch of an update, on every rank, as one spread over
/// all their valid steps: the extremes of the shares that have steps, the mean weighed by
/// steps, the pooled deviation `σ² = Σ nᵢ (σᵢ² + (μᵢ − μ)²) / Σ nᵢ` (the law of total variance).
/// So `actor/ratio_max` is the batch's maximum however its rows are split over ranks.
#[derive(Default)]
pub(crate) struct RatioSpread {
    /// Per share with valid steps: (steps, max, min, mean, std).
    shares: Vec<[f64; 5]>,
    seen: bool,
}

impl RatioSpread {
    /// Takes a share's ratio metrics out of its list and returns the rest.
    fn take(&mut self, share: Vec<(String, f64)>) -> std::vec::IntoIter<(String, f64)> {
        let (mine, rest): (Vec<_>, Vec<_>) = share
            .into_iter()
            .partition(|(k, _)| RATIO_KEYS.contains(&k.as_str()));
        if let Some(v) = RATIO_KEYS
            .map(|k| mine.iter().find(|(m, _)| m == k).map(|e| e.1))
            .into_iter()
            .collect::<Option<Vec<f64>>>()
        {
            self.seen = true;
            if v[0] > 0.0 {
                self.shares.push([v[0], v[1], v[2], v[3], v[4]]);
            }
        }
        rest.into_iter()
    }

    /// The pooled metrics (none when no share reported them; ρ ≡ 1 when none had a step).
    fn finish(self) -> Vec<(String, f64)> {
        if !self.seen {
            return Vec::new();
        }
        let n: f64 = self.shares.iter().map(|s| s[0]).sum();
        let (max, min, mean, std) = if n > 0.0 {
            let mean = self.shares.iter().map(|s| s[0] * s[3]).sum::<f64>() / n;
            let var = self
                .shares
                .iter()
                .map(|s| s[0] * (s[4] * s[4] + (s[3] - mean).powi(2)))
                .sum::<f64>()
                / n;
            let max = self
                .shares
                .iter()
                .map(|s| s[1])
                .fold(f64::NEG_INFINITY, f64::max);
            let min = self
                .shares
                .iter()
                .map(|s| s[2])
                .fold(f64::INFINITY, f64::min);
            (max, min, mean, var.sqrt())
        } else {
            (1.0, 1.0, 1.0, 0.0)
        };
        [max, min, mean, std]
            .into_iter()
            .zip(&RATIO_KEYS[1..])
            .map(|(v, k)| (k.to_string(), v))
            .collect()
    }
}

/// Runs `shard` on each replica's rows of `part`: one thread per device with a data-parallel
/// group, in this thread without one. Each runs on a worker of the CPU backend's pool
/// (`ember_kernels::on_workers`; a shard blocks on nothing), so that its parallel products
/// split between that worker and the others instead of waking every worker while it waits.
fn run_shards<M: Module + Clone + Send>(
    group: Option<&DataParallel>,
    model: &M,
    replicas: &[M],
    part: &[usize],
    shard: &(impl Fn(&M, usize, &[usize]) -> ShardResult + Sync),
) -> Vec<ShardResult> {
    let Some(dp) = group else {
        // A clone (its tensors shared) moves to the worker: `M` need not be `Sync`.
        let model = model.clone();
        return vec![ember_kernels::on_workers(move || shard(&model, 0, part))];
    };
    let shards = dp.shards(part);
    std::thread::scope(|s| {
        let handles: Vec<_> = shards
            .iter()
            .enumerate()
            .map(|(k, rows)| {
                let replica = match k {
                    0 => model.clone(),
                    _ => replicas[k - 1].clone(),
                };
                s.spawn(move || ember_kernels::on_workers(move || shard(&replica, k, rows)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Means of host metrics over the micro-batches (or updates) that report them, but the
/// extremes of a key named `…_max` or `…_min` (a maximum over shares is the maximum of theirs);
/// non-finite values are left out, and a key with none is NaN.
#[derive(Default)]
pub(crate) struct Means(BTreeMap<String, (f64, usize)>);

/// The reduction a key's name asks for, when it is an extreme.
fn extreme(key: &str) -> Option<fn(f64, f64) -> f64> {
    match key {
        k if k.ends_with("_max") => Some(f64::max),
        k if k.ends_with("_min") => Some(f64::min),
        _ => None,
    }
}

impl Means {
    /// Adds one value of `key`.
    pub(crate) fn add(&mut self, key: String, v: f64) {
        let pick = extreme(&key);
        let e = self.0.entry(key).or_insert((0.0, 0));
        if v.is_finite() {
            e.0 = match (e.1, pick) {
                (0, _) => v,
                (_, Some(f)) => f(e.0, v),
                (_, None) => e.0 + v,
            };
            e.1 += 1;
        }
    }

    /// The means (and extremes).
    pub(crate) fn finish(self) -> BTreeMap<String, f64> {
        self.0
            .into_iter()
            .map(|(k, (s, n))| {
                let v = match (n, extreme(&k)) {
                    (0, _) => f64::NAN,
                    (_, Some(_)) => s,
                    _ => s / n as f64,
                };
                (k, v)
            })
            .collect()
    }
}

/// One optimizer step on the sum of `parts` losses, each part's gradients accumulated before the
/// step so that memory holds one part's graph at a time: the update of regression losses (RAM's
/// reward-corrected target, flow matching) and supervised steps. `loss(model, i)` builds part
/// `i`'s scalar loss. Returns the new model, the sum of the parts' loss values (one host read
/// per part) and the step's report. When that sum or the gradient norm is not finite the step
/// is skipped (the weights are returned unchanged, `applied` is false), as [`crate::update()`] does.
pub fn accumulated_step<M: Module + Clone>(
    model: M,
    optim: &mut Optimizer,
    lr: f64,
    parts: usize,
    mut loss: impl FnMut(&M, usize) -> Tensor<1>,
) -> (M, f64, StepReport) {
    let mut acc = GradientsAccumulator::<M>::new();
    let mut total = 0.0;
    for i in 0..parts.max(1) {
        let l = loss(&model, i);
        total += f64::from(l.clone().into_scalar::<f32>());
        acc.accumulate(&model, GradientsParams::from_grads(l.backward(), &model));
    }
    if !total.is_finite() {
        let report = StepReport {
            grad_norm: f64::NAN,
            applied: false,
        };
        return (model, total, report);
    }
    let (model, report) = optim.step(lr, model, acc.grads());
    (model, total, report)
}

#[cfg(test)]
mod tests {
    use super::{Means, RatioSpread};

    /// A micro-batch's ratio metrics: (steps, max, min, mean, std).
    fn share(v: [f64; 5]) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = super::RATIO_KEYS
            .iter()
            .zip(v)
            .map(|(k, x)| (k.to_string(), x))
            .collect();
        out.push(("actor/clipfrac".into(), 0.5));
        out
    }

    /// Two shares of a batch's steps, ρ = [1.0, 1.2] and [0.9, 1.0, 1.1], and one share with
    /// no step, pool to the spread of the five values worked by hand: mean 5.2 / 5 = 1.04,
    /// variance 5.46 / 5 − 1.04² = 0.0104, maximum 1.2, minimum 0.9.
    #[test]
    fn the_ratio_spread_pools_shares_as_one_batch() {
        let mut pool = RatioSpread::default();
        let a = share([2.0, 1.2, 1.0, 1.1, 0.1]);
        let b = share([3.0, 1.1, 0.9, 1.0, (0.02f64 / 3.0).sqrt()]);
        let empty = share([0.0, 1.0, 1.0, 1.0, 0.0]);
        let rest: Vec<(String, f64)> = [a, b, empty]
            .into_iter()
            .flat_map(|s| pool.take(s))
            .collect();
        assert_eq!(rest.len(), 3, "the other metrics pass through: {rest:?}");
        let got: std::collections::BTreeMap<String, f64> = pool.finish().into_iter().collect();
        assert!(!got.contains_key("actor/ratio_count"), "{got:?}");
        let want = [
            ("actor/ratio_max", 1.2),
            ("actor/ratio_min", 0.9),
            ("actor/ratio_mean", 1.04),
            ("actor/ratio_std", 0.0104f64.sqrt()),
        ];
        for (k, v) in want {
            assert!((got[k] - v).abs() < 1e-12, "{k}: {} vs {v}", got[k]);
        }
        let mut none = RatioSpread::default();
        let _ = none.take(share([0.0, 1.0, 1.0, 1.0, 0.0])).count();
        assert_eq!(none.finish()[0], ("actor/ratio_max".to_string(), 1.0));
        assert!(RatioSpread::default().finish().is_empty());
    }

    /// Keys named as extremes keep the extreme over the shares; others are means.
    #[test]
    fn means_keep_extremes_where_the_name_says() {
        let mut m = Means::default();
        for v in [1.5, 3.0, f64::NEG_INFINITY, 2.0] {
            m.add("mismatch/is_ratio_max".into(), v);
            m.add("mismatch/is_weight_mean".into(), v);
            m.add("x_min".into(), v);
        }
        let got = m.finish();
        assert_eq!(got["mismatch/is_ratio_max"], 3.0);
        assert_eq!(got["x_min"], 1.5);
        assert!((got["mismatch/is_weight_mean"] - 6.5 / 3.0).abs() < 1e-12);
    }
}
