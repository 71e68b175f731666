//! The policy update's entry point ([`update`]): one pass over the experience, or Lopti's two
//! (Yang et al. 2025, "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs", arXiv
//! 2505.12929, §4.2: the update split by π_old's probability of each step), each pass the
//! epochs × mini-batches × micro-batches of `update.rs`.

use crate::optim::Optimizer;
use crate::parallel::{Copies, Replicate};
use crate::update::{Actor, MicroLoss, PARTIAL, Steps, UpdateConfig, UpdateStats, select2};
use burn::tensor::Tensor;
use ember_engine::keys;
use ember_engine::{
    ActorInput, Advantages, EngineError, PolicyLossInput, PolicyLossKind, RolloutBatch, actor_loss,
    kl_penalty,
};
use std::collections::BTreeMap;

/// Runs the update and returns the new actor.
///
/// `batch` must carry `old_log_probs` (recomputed) or `rollout_log_probs` (bypass); `adv` is the
/// estimator's output for it. `order` permutes rows between epochs (pass a seeded shuffle for
/// reproducible runs, or identity). With [`UpdateSchedule::lopti_threshold`] the update runs
/// once per token set (`lopti`).
///
/// # Errors
/// Missing old log-probs, or any loss error (shapes, missing reference for KL, …).
pub fn update<A: Actor>(
    actor: A,
    optim: &mut Optimizer,
    data: UpdateData<'_, A::Experience>,
    cfg: &UpdateConfig,
    lr: f64,
    order: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<(A, UpdateStats), EngineError> {
    let old = data
        .batch
        .behaviour_log_probs()
        .cloned()
        .ok_or(EngineError::MissingInput {
            what: "policy update",
            input: "old_log_probs",
        })?;
    let pass = Pass {
        data,
        old,
        tokens: None,
    };
    match cfg.schedule.lopti_threshold {
        None => pass.run(actor, optim, cfg, lr, order),
        Some(_) => lopti(actor, optim, pass, cfg, lr, order),
    }
}

/// Lopti (Yang et al. 2025, §4.2; AR-Lopti `ray_trainer.py`): the steps whose π_old < η
/// (`cfg.schedule.lopti_threshold`; without one, a plain pass) take a
/// whole update first, then the others take one, against the same π_old; a set without steps
/// takes none. Metrics are the two passes' means (`actor/skipped_steps` their sum), plus
/// `actor/lopti_low_frac`, the share of valid steps in the first set.
fn lopti<A: Actor>(
    actor: A,
    optim: &mut Optimizer,
    pass: Pass<'_, A::Experience>,
    cfg: &UpdateConfig,
    lr: f64,
    order: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<(A, UpdateStats), EngineError> {
    let Some(eta) = cfg.schedule.lopti_threshold else {
        return pass.run(actor, optim, cfg, lr, order);
    };
    if let PolicyLossKind::Opmd { k2_coef, .. } = cfg.loss.policy
        && k2_coef != 0.0
    {
        return Err(EngineError::InvalidConfig {
            field: "train.lopti_threshold",
            value: eta.to_string(),
            reason: "OPMD's k2 term does not scale with the advantage, so both passes would apply it to every step; set k2_coef = 0 or drop Lopti",
        });
    }
    let mask = &pass.data.adv.mask;
    let low = pass.old.clone().exp().lower_elem(eta).float() * mask.clone();
    let high = mask.clone() - low.clone();
    let count = |t: &Tensor<2>| f64::from(t.clone().sum().into_scalar::<f32>());
    let (n_low, n_all) = (count(&low), count(mask));
    let mut actor = actor;
    let mut parts = Vec::new();
    for (tokens, n) in [(low, n_low), (high, n_all - n_low)] {
        if n <= 0.0 {
            continue;
        }
        let stage = Pass {
            tokens: Some(tokens),
            ..pass.clone()
        };
        let (next, stats) = stage.run(actor, optim, cfg, lr, order)?;
        actor = next;
        parts.push(stats);
    }
    let mut stats = merge_passes(parts);
    let frac = if n_all > 0.0 { n_low / n_all } else { 0.0 };
    stats.metrics.insert("actor/lopti_low_frac".into(), frac);
    Ok((actor, stats))
}

/// The passes' stats as one update's: counts summed; the loss terms (each pass's part over the
/// whole batch's normaliser) and `*/skipped_steps` summed, the ratio's extremes taken over both,
/// the other metrics averaged over the passes that logged them.
fn merge_passes(parts: Vec<UpdateStats>) -> UpdateStats {
    let mut out = UpdateStats::default();
    let mut seen: BTreeMap<String, (f64, f64, f64, f64)> = BTreeMap::new();
    for p in parts {
        out.optimizer_steps += p.optimizer_steps;
        out.skipped_steps += p.skipped_steps;
        for (k, v) in p.metrics {
            let e = seen
                .entry(k)
                .or_insert((0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY));
            *e = (e.0 + v, e.1 + 1.0, e.2.min(v), e.3.max(v));
        }
    }
    out.metrics = seen
        .into_iter()
        .map(|(k, (sum, n, lo, hi))| {
            let v = match k.as_str() {
                keys::ACTOR_RATIO_MAX => hi,
                keys::ACTOR_RATIO_MIN => lo,
                k if k.ends_with("/skipped_steps") || PARTIAL.contains(&k) => sum,
                _ => sum / n,
            };
            (k, v)
        })
        .collect();
    out
}

/// What one update trains on: the actor's inputs for the batch's rows (`experience`), the
/// rollout batch and the estimator's advantages for it.
pub struct UpdateData<'a, E> {
    /// The actor's inputs (tokens, latents, states) for the batch's rows.
    pub experience: &'a E,
    /// The rollout batch, with its old (or the sampler's) log-probs.
    pub batch: &'a RolloutBatch,
    /// The estimator's output for `batch`.
    pub adv: &'a Advantages,
}

impl<E> Clone for UpdateData<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for UpdateData<'_, E> {}

/// One pass of the update over `data`: all valid steps, or only `tokens` (`[rows, steps]`,
/// 0/1) whose advantages, KL and entropy terms alone count while the loss keeps the whole
/// batch's normaliser (Lopti's passes).
struct Pass<'a, E> {
    data: UpdateData<'a, E>,
    /// π_old (or the sampler's log-probs), `[rows, steps]`.
    old: Tensor<2>,
    tokens: Option<Tensor<2>>,
}

impl<E> Clone for Pass<'_, E> {
    fn clone(&self) -> Self {
        Self {
            data: self.data,
            old: self.old.clone(),
            tokens: self.tokens.clone(),
        }
    }
}

impl<E: Replicate> Pass<'_, E> {
    fn run<A: Actor<Experience = E>>(
        &self,
        actor: A,
        optim: &mut Optimizer,
        cfg: &UpdateConfig,
        lr: f64,
        order: &mut dyn FnMut(usize) -> Vec<usize>,
    ) -> Result<(A, UpdateStats), EngineError> {
        let UpdateData {
            experience,
            batch,
            adv,
        } = self.data;
        let with_entropy = cfg.loss.entropy_coef != 0.0;
        let steps = Steps {
            schedule: &cfg.schedule,
            mask: &adv.mask,
            tokens: (cfg.schedule.micro_batch_tokens > 0)
                .then(|| actor.row_tokens(experience))
                .flatten(),
            groups: actor.shares_groups().then(|| batch.groups.ids()),
            area: "actor",
            loss_key: keys::ACTOR_LOSS,
            lr,
            only: self.tokens.as_ref(),
        };
        let copies = Copies::new(optim.data_parallel().map(AsRef::as_ref), experience);
        steps.run(actor, optim, order, |actor, replica, chunk, idx, norm| {
            let mut scored = actor.score(copies.get(replica), chunk, with_entropy);
            let recompute = scored.recompute.take();
            let d = scored.log_probs.device();
            let pick = |t: &Tensor<2>| select2(t, idx).to_device(&d);
            let only = |t: Tensor<2>| match &self.tokens {
                Some(s) => t * pick(s),
                None => t,
            };
            let ref_log_probs = batch.ref_log_probs.as_ref().map(pick);
            // A pass over some tokens keeps its KL on them: the per-step KL is formed here.
            let kl = match (&self.tokens, scored.kl, &cfg.loss.kl, &ref_log_probs) {
                (Some(_), None, Some(k), Some(r)) => {
                    Some(kl_penalty(scored.log_probs.clone(), r.clone(), k.estimator))
                }
                (_, kl, _, _) => kl,
            };
            let input = ActorInput {
                policy: PolicyLossInput {
                    log_probs: scored.log_probs,
                    old_log_probs: pick(&self.old),
                    advantages: only(pick(&adv.advantages)),
                    mask: pick(&adv.mask),
                    ref_log_probs,
                },
                entropy: scored.entropy.map(only),
                rollout_log_probs: batch.rollout_log_probs.as_ref().map(pick),
                kl: kl.map(only),
            };
            let (loss, metrics) = actor_loss(&cfg.loss, &input, norm)?;
            Ok(MicroLoss {
                loss,
                metrics,
                recompute,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(steps: usize, metrics: &[(&str, f64)]) -> UpdateStats {
        UpdateStats {
            metrics: metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            optimizer_steps: steps,
            skipped_steps: 0,
        }
    }

    /// Lopti's two passes as one update: each pass's loss terms are its part over the whole
    /// batch's normaliser (summed), the ratio's extremes are the passes' extremes, skipped
    /// steps add up, the other metrics are averaged over the passes that logged them.
    #[test]
    fn passes_merge_as_one_update() {
        let a = stats(
            2,
            &[
                ("actor/pg_loss", 0.25),
                ("actor/ratio_max", 1.5),
                ("actor/ratio_min", 0.5),
                ("actor/clipfrac", 0.2),
                ("actor/skipped_steps", 1.0),
                ("actor/grad_norm", 3.0),
            ],
        );
        let b = stats(
            1,
            &[
                ("actor/pg_loss", -0.75),
                ("actor/ratio_max", 2.5),
                ("actor/ratio_min", 0.75),
                ("actor/clipfrac", 0.4),
                ("actor/skipped_steps", 2.0),
            ],
        );
        let m = merge_passes(vec![a, b]);
        assert_eq!(m.optimizer_steps, 3);
        let get = |k: &str| m.metrics[k];
        assert_eq!(get("actor/pg_loss"), -0.5);
        assert_eq!(get("actor/ratio_max"), 2.5);
        assert_eq!(get("actor/ratio_min"), 0.5);
        assert!((get("actor/clipfrac") - 0.3).abs() < 1e-12);
        assert_eq!(get("actor/skipped_steps"), 3.0);
        assert_eq!(get("actor/grad_norm"), 3.0);
    }
}
