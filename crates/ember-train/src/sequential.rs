//! SeeUPO's turn-by-turn sequential update (Hu et al. 2026, arXiv 2602.06554, §4; AgentEvolver
//! `seeupo` branch, the `sequential_update` loop of `ba_ray_trainer.py`): one [`update`] per
//! turn index in the schedule's order, each on that turn's steps only, its advantages weighted
//! by the accumulated clipped ratio of the turns already updated
//! ([`TurnUpdates::accumulate`]), its old log-probs those of the policy as it stands before that
//! turn's update.

use crate::optim::Optimizer;
use crate::pass::{UpdateData, update};
use crate::update::{Actor, Means, UpdateConfig, UpdateStats};
use burn::tensor::Tensor;
use ember_engine::keys;
use ember_engine::{Advantages, EngineError, Metrics, TurnUpdates, turn_count, turn_mask};

/// How a turn-by-turn update runs: each turn's update, the turns' order, and the actor's
/// log-probs between two turns.
pub struct Turns<'a, A> {
    /// Each turn's update.
    pub cfg: &'a UpdateConfig,
    /// The turns and their order.
    pub turns: &'a TurnUpdates,
    /// The current actor's `[batch, steps]` log-probs, without gradient.
    pub rescore: &'a mut dyn FnMut(&A) -> Tensor<2>,
}

/// Runs SeeUPO's turn-by-turn updates and returns the new actor.
///
/// `batch` must carry `turn_ids` and old (or rollout) log-probs; `adv` is the estimator's output
/// for the whole trajectories. `rescore(actor)` returns the current actor's `[batch, steps]`
/// log-probs without gradient (called once between two turn updates: the log-probs after turn
/// k's update are the old log-probs of the next turn's). The metrics are the turn updates'
/// means plus `seeupo/turn_updates` and `seeupo/ratio_mean` (the mean accumulated ratio of the
/// rows the last turn update weighted; 1 with a single turn).
///
/// # Errors
/// Missing turn ids or old log-probs, or any error of [`update`].
pub fn sequential_update<A: Actor>(
    mut actor: A,
    optim: &mut Optimizer,
    data: UpdateData<'_, A::Experience>,
    how: Turns<'_, A>,
    lr: f64,
    order: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<(A, UpdateStats), EngineError> {
    let Turns {
        cfg,
        turns,
        rescore,
    } = how;
    turns.validate()?;
    let UpdateData {
        experience,
        batch,
        adv,
    } = data;
    let missing = |input| EngineError::MissingInput {
        what: "sequential (SeeUPO) update",
        input,
    };
    let turn_ids = batch.turn_ids.clone().ok_or(missing("turn_ids"))?;
    let mut old = batch
        .behaviour_log_probs()
        .cloned()
        .ok_or(missing("old_log_probs"))?;
    let [b, _] = batch.dims();
    let schedule = turns.order(turn_count(&turn_ids));
    let mut ratio: Option<Tensor<1>> = None;
    let mut sums = Means::default();
    let mut total = UpdateStats::default();
    let mut ratio_mean = 1.0;
    for (i, &k) in schedule.iter().enumerate() {
        let mask = turn_mask(&adv.mask, &turn_ids, k);
        let a = match &ratio {
            Some(m) => adv.advantages.clone() * m.clone().reshape([b, 1]),
            None => adv.advantages.clone(),
        } * mask.clone();
        if let Some(m) = &ratio {
            let rows = mask
                .clone()
                .sum_dim(1)
                .reshape([b])
                .greater_elem(0.0)
                .float();
            let mean = (m.clone() * rows.clone()).sum() / rows.sum().clamp_min(1.0);
            ratio_mean = f64::from(mean.into_scalar::<f32>());
        }
        let turn_adv = Advantages {
            advantages: a.clone(),
            returns: a,
            mask: mask.clone(),
            metrics: Metrics::new(),
        };
        let turn_batch = batch.clone().with_old_log_probs(old.clone())?;
        let (next, stats) = update(
            actor,
            optim,
            UpdateData {
                experience,
                batch: &turn_batch,
                adv: &turn_adv,
            },
            cfg,
            lr,
            order,
        )?;
        actor = next;
        total.optimizer_steps += stats.optimizer_steps;
        total.skipped_steps += stats.skipped_steps;
        for (key, v) in stats.metrics {
            sums.add(key, v);
        }
        if i + 1 < schedule.len() {
            let new = rescore(&actor);
            ratio = Some(turns.accumulate(ratio, &old, &new, &mask));
            old = new;
        }
    }
    total.metrics = sums.finish();
    total
        .metrics
        .insert(keys::ACTOR_SKIPPED_STEPS.into(), total.skipped_steps as f64);
    total
        .metrics
        .insert("seeupo/turn_updates".into(), schedule.len() as f64);
    total.metrics.insert("seeupo/ratio_mean".into(), ratio_mean);
    Ok((actor, total))
}
