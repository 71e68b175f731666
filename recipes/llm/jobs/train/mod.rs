//! `ember train` for LLM recipes: a policy (the tiny character-level Llama warmed up by
//! supervised steps, or a pretrained checkpoint with LoRA) trained on a task with verifiable
//! rewards, evaluated on a held-out split before and after. It reads top to bottom: set-up, then
//! per step rollout → reward → rescoring → filters → advantages and update → log, evaluation and
//! checkpoint (the run kit's end-of-step protocol). The set-up is in `setup.rs`.

use crate::llm::critic::{Critic, update_step};
use crate::llm::lanpo::Lanpo;
use crate::llm::pipeline::{Generator, Pipeline};
use crate::llm::plop::Placing;
use crate::llm::ranks;
use crate::llm::remote::Remote;
use crate::llm::replay::{Fresh, Replay};
use crate::llm::saved::{Extras, save_checkpoint};
use crate::llm::schema::Recipe;
use crate::llm::teacher::Teacher;
use crate::lm::score::{Scorer, completions, json_number, shown_samples, with_reward_parts};
use crate::lm::step::{
    Reference, Rescoring, SamplerRef, UpdateCtx, experience, greedy_baseline, keep_rows,
    prompt_features, rescore, rollout_metrics, stats_line,
};
use crate::lm::{Policy, evaluate, evaluate_sampled, write_final};
use anyhow::{Context, Result};
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use ember_dist::World;
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::{Generation, Llama, SamplingConfig};
use ember_run::{Row, Run, RunOptions, Timings};
use ember_tasks::task::{Example, TaskSet};
use ember_train::{DataParallel, Optimizer, UpdateConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

mod lanpo;
mod rounds;
mod setup;

/// What a run reports at the end.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Held-out accuracy after the warm-up.
    pub accuracy_before: f64,
    /// Held-out accuracy after RL.
    pub accuracy_after: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The run directory.
    pub out: PathBuf,
    /// RL steps done.
    pub steps_done: usize,
    /// Stopped early (Ctrl-C or `stop_after`) with a checkpoint to resume from.
    pub interrupted: bool,
}

/// Runs the recipe, writing into `out`: set-up, then per step rollout → reward → rescoring →
/// filters → advantages and update → log, evaluation and checkpoint, then the end.
pub fn train(r: &Recipe, out: &Path, opts: &RunOptions) -> Result<Summary> {
    ember_run::train::<Job>(&Placing::new(r), out, opts)
}

/// The run between steps: what every step uses and what a checkpoint holds.
struct Job<'a> {
    /// The recipe with its LoRA targets placed (`targets = "plop"`).
    r: &'a Recipe,
    out: &'a Path,
    run: Run,
    task: TaskSet,
    eval: Vec<Example>,
    base: Device,
    ad: Device,
    scorer: Scorer<'a>,
    rng: SplitMix64,
    policy: Policy,
    parts: PresetParts,
    upd: UpdateConfig,
    /// The tiny policy's KL reference (a LoRA policy's is its weights with adapters off).
    reference: Option<Llama>,
    optim: Optimizer,
    critic: Option<Critic>,
    replay: Option<Replay>,
    /// `backend = "openai"`: the servers that sample the rollouts (shared with the
    /// generation worker).
    remote: Option<Arc<Mutex<Remote>>>,
    /// The rollouts drawn ahead and their generation worker (none with Reinforce-Ada's
    /// rounds, which sample and score in turn).
    pipeline: Option<Pipeline>,
    /// `[teacher]`: the model that scores every sampled token.
    teacher: Option<Teacher>,
    /// `[lanpo]`: the experience pool and the step's feedback.
    lanpo: Option<Lanpo>,
    accuracy_before: f64,
    accuracy_after: f64,
    steps_done: usize,
    /// The ranks of a multi-process run (none in a single process).
    world: Option<World>,
    /// `EMBER_DIST_CHECK_EVERY`: the ranks compare their parameters this often (0: at the
    /// checkpoints and the last step only).
    check_every: usize,
    /// `[data_parallel]`'s group, from the set-up to the optimizer's.
    group: Option<Arc<DataParallel>>,
}

/// A step's rollout, scored and rescored, before the update.
struct Prepared {
    rollout: Kept,
    responses: Vec<Vec<u32>>,
    timing: Timings,
    shown: Vec<serde_json::Map<String, serde_json::Value>>,
}

/// A step's rollout batch, its experience on the host device, and the rows the filters keep.
struct Kept {
    batch: RolloutBatch,
    exp: LlmExperience,
    kept: Vec<usize>,
}

/// A step's samples as scored: each row's example, completion text and reward.
struct StepSamples<'a> {
    examples: &'a [ember_tasks::task::Example],
    texts: &'a [String],
    rewards: &'a [f32],
}

/// A step's rollout as sampled (beside its generation): the prompts, the sampler and its
/// settings, and the rewards and pool statistics when Reinforce-Ada's rounds scored them.
struct Sampled {
    examples: Vec<Example>,
    prompts: Vec<Vec<u32>>,
    sampler: Llama,
    sc: SamplingConfig,
    scored: Option<Vec<f32>>,
    pool_stats: Option<(Vec<f32>, Vec<f32>)>,
}

impl Job<'_> {
    /// The learning rate of step `step` (the recipe's schedule).
    fn lr_at(&self, step: usize) -> f64 {
        let t = &self.r.train;
        t.schedule.schedule(t.run.steps).at(step)
    }

    /// What a KL term compares with: the separate reference, or the adapters-off weights.
    fn kl_reference(&self) -> Option<Reference<'_>> {
        self.r.own_kl_reference().then_some(match &self.reference {
            Some(m) => Reference::Model(m),
            None => Reference::AdaptersOff,
        })
    }

    /// Rollout, reward, rescoring and filters.
    fn prepare(&mut self, step: usize, row: &mut Row, t_step: Instant) -> Result<Prepared> {
        let r = self.r;
        let (mut sampled, g) = self.sample(step, row)?;
        let g = g.padded(r.rollout.shape_bucket);
        let responses = g.response_ids();
        // Phase wall times as verl logs them (`timing_s/*`; with Reinforce-Ada `gen` holds the
        // rounds' rewards too); `response_ids` above already waited for the device.
        let mut timing = Timings::default();
        timing.add("gen", t_step.elapsed().as_secs_f64());
        // Reward: the recipe's weighted terms, per row.
        let texts: Vec<String> = responses.iter().map(|r| self.policy.decode(r)).collect();
        let examples = &sampled.examples;
        let rewards = match sampled.scored.take() {
            Some(r) => r,
            None => {
                let done = completions(&g, examples, &responses, &texts);
                // Over several ranks, rank 0 scores and the others take its rewards (a judge or
                // a reward program need not give every rank the same numbers).
                let scorer = &mut self.scorer;
                let score = || scorer.score(step + 1, &done, row);
                ranks::scored_on_rank_zero(self.world.as_ref(), score)?
            }
        };
        // ReRULE: replayed hard groups join the fresh ones, their sampler's log-probs as μ.
        let mixed = match self.replay.as_mut() {
            Some(rp) => {
                let fresh = Fresh {
                    prompts: &sampled.prompts,
                    g: &g,
                    rewards: &rewards,
                };
                rp.mix([step, r.train.run.steps], fresh, row)?
            }
            None => None,
        };
        let (gt, rt) = match &mixed {
            Some((g2, r2)) => (g2, r2.as_slice()),
            None => (&g, rewards.as_slice()),
        };
        let (mut batch, exp) = self.rescored(step, &sampled, (&g, gt, rt), &mut timing, row)?;
        if let AdvantageKind::Bnpo { decompose: true } = self.parts.advantage.kind {
            let elsewhere = self.world.is_some() || mixed.is_some();
            batch = with_reward_parts(batch, &self.scorer.take_parts(), elsewhere)?;
        }
        // Filters: DAPO's dynamic sampling drops groups whose rewards are all equal.
        let (kept, dropped_groups) = if self.parts.dynamic_sampling {
            dynamic_sampling_keep(&batch)
        } else {
            ((0..batch.dims()[0]).collect(), 0)
        };
        rollout_metrics(row, step, &rewards, &responses, &g, dropped_groups);
        crate::lm::step::warn_if_nothing_valid(&r.header.name, step, &rewards);
        let n = r.train.run.log_samples;
        let mut shown = shown_samples(n, &g, examples, &texts, &responses, &rewards);
        let scored = StepSamples {
            examples,
            texts: &texts,
            rewards: &rewards,
        };
        self.learn_from_step(step, scored, &mut shown, row)?;
        Ok(Prepared {
            rollout: Kept { batch, exp, kept },
            responses,
            timing,
            shown,
        })
    }

    /// Rollout: n samples of each prompt. Reinforce-Ada draws in rounds, scoring each as it
    /// comes; otherwise the pipeline gives the step's rollout, drawn `max_staleness` steps ago
    /// (or now) and generated by its worker, here or on the servers.
    fn sample(&mut self, step: usize, row: &mut Row) -> Result<(Sampled, Generation)> {
        if self.parts.adaptive.is_some() {
            return self.sample_in_rounds(step, row);
        } else if self.lanpo.is_some() {
            return self.sample_with_feedback(step, row);
        }
        self.fill(step, row)?;
        let pl = self
            .pipeline
            .as_mut()
            .context("a run without rounds has a pipeline")?;
        let (draw, p, waited) = pl.take(step)?;
        let g = match (&self.world, &draw.shard) {
            (Some(w), Some(s)) => ranks::gathered(w, &draw.prompts, s, &p.g, &self.base)?,
            _ => p.g,
        };
        let stale = (step - draw.version) as f64;
        row.insert("staleness/mean".into(), stale);
        row.insert("staleness/max".into(), stale);
        Timings::record(row, "wait_rollout", waited);
        Timings::record(row, "generator_idle", p.idle_s);
        if let Some((up, resent)) = p.health {
            row.insert("rollout/servers_healthy".into(), up as f64);
            row.insert("rollout/resent_rows".into(), resent as f64);
        }
        let sampled = Sampled {
            examples: draw.examples,
            prompts: draw.prompts,
            sampler: self.policy.model.valid(),
            sc: draw.sc,
            scored: None,
            pool_stats: None,
        };
        Ok((sampled, g))
    }

    /// Draws the rollouts of the steps the bound lets run ahead (step t's at once when it is 0)
    /// and hands them to the worker with the current weights (pushed to the servers first).
    fn fill(&mut self, step: usize, row: &mut Row) -> Result<()> {
        let steps = self.r.train.run.steps;
        let vocab = self.policy.model.vocab_size();
        while let Some(next) = self
            .pipeline
            .as_ref()
            .and_then(|p| p.next_to_draw(step, steps))
        {
            let draw = self.draw(next, step)?;
            let source = match &self.remote {
                Some(rm) => {
                    let t_sync = Instant::now();
                    rm.lock()
                        .map_err(|_| anyhow::anyhow!("the servers' client is broken"))?
                        .sync(&self.policy, step)?;
                    Timings::record(row, "sync", t_sync.elapsed().as_secs_f64());
                    Generator::Remote(rm.clone())
                }
                None => Generator::Local(Box::new(self.policy.model.valid())),
            };
            let pl = self.pipeline.as_mut().context("fill needs the pipeline")?;
            pl.launch(draw, source, vocab)?;
        }
        Ok(())
    }

    /// The batch of `gt` (the fresh generation `g` and any replayed groups) with rewards `rt`:
    /// the overlong penalty, old-policy and reference log-probs without gradients, the
    /// teacher's part, BASIS's features and ReMax's greedy baseline.
    fn rescored(
        &mut self,
        step: usize,
        s: &Sampled,
        (g, gt, rt): (&Generation, &Generation, &[f32]),
        timing: &mut Timings,
        row: &mut Row,
    ) -> Result<(RolloutBatch, LlmExperience)> {
        let (r, ad) = (self.r, &self.ad);
        let (seq, seq_mask) = gt.sequences();
        let host_exp = experience(seq, seq_mask, gt.tokens.dims()[1], &s.sc);
        let mut batch = RolloutBatch::new(
            gt.mask.clone().to_device(ad),
            Tensor::from_floats(rt, ad),
            &gt.group_ids,
        )?
        .with_rollout_log_probs(gt.log_probs.clone().to_device(ad))?;
        if let Some((mean, std)) = &s.pool_stats {
            batch = batch.with_group_stats(
                Tensor::from_floats(mean.as_slice(), ad),
                Tensor::from_floats(std.as_slice(), ad),
            )?;
        }
        if let Some(o) = &r.reward.overlong {
            o.apply(&mut batch)?;
        }
        let t_ref = Instant::now();
        // Replayed rows were sampled by an older policy, and servers compute their own
        // numbers: π_old is recomputed.
        // Rows sampled k updates ago get the current weights' log-probs as π_old (decoupled
        // PPO's proximal policy; the loss's mismatch correction weighs the sampler's against it).
        // LANPO's feedback samples are scored without the context they were sampled with.
        let plain = self.lanpo.as_ref().is_some_and(Lanpo::scores_plain);
        let stale = r.rollout.max_staleness > 0 || plain;
        let recompute = r.train.run.recompute_old_log_probs
            || self.replay.is_some()
            || self.remote.is_some()
            || stale;
        let kl_reference = self.kl_reference();
        let world = self.world.as_ref();
        let how = Rescoring {
            sampler: &s.sampler,
            recompute_old: recompute,
            reference: kl_reference,
        };
        batch = rescore(batch, &host_exp, world, how, ad)?;
        if recompute || kl_reference.is_some() {
            let _ = self.base.sync();
            timing.add("ref", t_ref.elapsed().as_secs_f64());
        }
        if let Some(t) = &self.teacher {
            let t_teacher = Instant::now();
            batch = t.apply(batch, &host_exp, ad, row)?;
            timing.add("teacher", t_teacher.elapsed().as_secs_f64());
        }
        let kind = self.parts.advantage.kind;
        if kind.needs_features() {
            batch = batch.with_features(prompt_features(&s.sampler, gt).to_device(ad))?;
        }
        if kind.needs_greedy_baseline() {
            let baseline = greedy_baseline(
                &mut self.scorer,
                step,
                &self.policy,
                SamplerRef::new(&s.sampler, &s.sc, &self.base),
                &s.prompts,
                &s.examples,
            )?;
            let per_row: Vec<f32> = g.group_ids.iter().map(|gi| baseline[*gi]).collect();
            batch = batch.with_baseline_rewards(Tensor::from_floats(per_row.as_slice(), ad))?;
        }
        Ok((batch, host_exp))
    }

    /// Advantages and the update of the kept rows; the shown samples get their advantages.
    fn update(
        mut self,
        step: usize,
        rollout: Kept,
        shown: &mut [serde_json::Map<String, serde_json::Value>],
        row: &mut Row,
    ) -> Result<Self> {
        let Kept {
            batch,
            exp: host,
            kept,
        } = rollout;
        let lr = self.lr_at(step);
        let ad = &self.ad;
        let exp = LlmExperience {
            tokens: host.tokens.to_device(ad),
            mask: host.mask.to_device(ad),
            ..host
        };
        let (batch, exp) = keep_rows(batch, exp, &kept, ad)?;
        // The shown rows' places in the kept batch (dynamic sampling's dropped rows have none).
        let places: Vec<(usize, usize)> = (0..shown.len())
            .filter_map(|i| Some((i, kept.iter().position(|k| *k == i)?)))
            .collect();
        let mut order_rng = SplitMix64(self.rng.next_u64());
        let kept_places: Vec<usize> = places.iter().map(|p| p.1).collect();
        // Mini- and micro-batches of whole groups when the schedule cuts the batch, so that a
        // group's rows share their prompt's pass (`Llama::with_shared_prefix`).
        let ids = batch.groups.ids().to_vec();
        let s = &self.upd.schedule;
        let cut = s.mini_batches > 1 || s.micro_batch_rows > 0 || s.micro_batch_tokens > 0;
        let whole_groups = cut && self.policy.model.shared_prefix();
        let mut order = |n: usize| match whole_groups && n == ids.len() {
            true => order_rng.group_permutation(&ids),
            false => order_rng.permutation(n),
        };
        let (model, shown_adv) = update_step(
            self.policy.model,
            self.critic.as_mut(),
            &mut self.optim,
            (&exp, &self.base, ad),
            batch,
            UpdateCtx {
                adv_cfg: &self.parts.advantage,
                upd: &self.upd,
                step,
                lr,
                order: &mut order,
                row,
                shown: &kept_places,
            },
        )?;
        self.policy.model = model;
        for ((i, _), a) in places.iter().zip(shown_adv) {
            shown[*i].insert("advantage".into(), json_number(a));
        }
        let _ = self.ad.sync();
        Ok(self)
    }

    /// Evaluation when due, then the log row, the samples and the checkpoint (the run kit's
    /// end-of-step protocol); returns whether the run stops.
    fn end_step(
        &mut self,
        step: usize,
        mut row: Row,
        shown: &[serde_json::Map<String, serde_json::Value>],
    ) -> Result<bool> {
        let r = self.r;
        let end = self.run.step_end(step + 1);
        let evaluated =
            (step + 1).is_multiple_of(r.train.run.eval_every) || step + 1 == r.train.run.steps;
        if evaluated {
            let t_eval = Instant::now();
            let max_new = r.rollout.max_new_tokens;
            self.accuracy_after = evaluate(&self.policy, &self.eval, max_new, &self.base)?;
            row.insert(keys::EVAL_ACCURACY.to_string(), self.accuracy_after);
            if r.eval.samples > 0 {
                // Seeded by the step, apart from the training RNG: evaluating changes nothing
                // of the run.
                let seed = r.header.seed ^ ((step as u64 + 1) << 20);
                let (policy, eval) = (&self.policy, &self.eval);
                let sampled = evaluate_sampled(policy, eval, max_new, &r.eval, seed, &self.base);
                row.extend(sampled?);
            }
            Timings::record(&mut row, "eval", t_eval.elapsed().as_secs_f64());
        }
        self.steps_done = step + 1;
        if let Some(w) = &self.world {
            let due = [
                self.check_every,
                r.train.run.checkpoint_every,
                r.train.run.steps,
            ];
            ranks::check_step(w, &self.policy.model, due, step + 1, &mut row)?;
        }
        let (before, after) = (self.accuracy_before, self.accuracy_after);
        let state = self.run.state(self.steps_done, self.rng.0, before, after);
        let stats = stats_line(&row, after);
        // The samples before the row and its checkpoint: a kill in between leaves them past
        // the checkpoint, where resuming cuts them.
        self.run.samples(step + 1, shown, evaluated)?;
        if let Some(pl) = self.pipeline.as_mut() {
            pl.step_done();
        }
        let extra = Extras {
            critic: self.critic.as_ref(),
            replay: self.replay.as_ref(),
            lanpo: self.lanpo.as_ref(),
        };
        let (policy, optim, pl) = (&self.policy, &self.optim, self.pipeline.as_mut());
        self.run.end_step(end, row, evaluated, &stats, |d| {
            save_checkpoint(d, policy, optim, extra, &state)?;
            pl.map_or(Ok(()), |p| p.save(d))
        })
    }
}

impl<'a> ember_run::Job<'a> for Job<'a> {
    type Recipe = Placing<'a>;
    type Summary = Summary;

    fn setup(r: &'a Placing<'a>, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        Self::open(r, out, opts)
    }

    fn start(self) -> Result<Self> {
        let mut job = self.begin()?;
        job.prepare_update()?;
        Ok(job)
    }

    fn run(&self) -> &Run {
        &self.run
    }

    /// One RL step; returns whether the run stops after it.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let t_step = Instant::now();
        if let Some(w) = &self.world {
            w.set_step(step + 1);
        }
        let mut row = Row::new();
        let rng_at_start = self.rng.0;
        let replay_at_start = self.replay.as_ref().map(|rp| rp.buffer.clone());
        // Everything before the update: an error here leaves the weights as the last completed
        // step left them, so the run writes that step's checkpoint before it ends.
        let prepared = match self.prepare(step, &mut row, t_step) {
            Ok(p) => p,
            Err(e) => return Err(self.fail(e, rng_at_start, replay_at_start)),
        };
        row.insert(keys::ACTOR_LR.to_string(), self.lr_at(step));
        let Prepared {
            rollout,
            responses,
            mut timing,
            mut shown,
        } = prepared;
        if !rollout.kept.is_empty() {
            let t_update = Instant::now();
            self = self.update(step, rollout, &mut shown, &mut row)?;
            // With a critic this includes its values, PACT's rescoring and its update (also
            // logged alone as `timing_s/update_critic`).
            timing.add("update_actor", t_update.elapsed().as_secs_f64());
        }
        let secs = t_step.elapsed().as_secs_f64();
        let tokens: usize = responses.iter().map(Vec::len).sum();
        row.insert(keys::PERF_STEP_S.to_string(), secs);
        row.insert(keys::PERF_TOKENS_PER_S.to_string(), tokens as f64 / secs);
        timing.log(&mut row);
        let stop = self.end_step(step, row, &shown)?;
        Ok((self, stop))
    }

    /// The end: the final model (unless stopped), the summary.
    fn finish(mut self, interrupted: bool, seconds: f64) -> Result<Summary> {
        let r = self.r;
        let writer = self.world.as_ref().is_none_or(World::is_writer);
        if !interrupted && writer {
            write_final(&self.policy, r.pretrained.as_ref(), self.out)?;
        }
        let (before, after) = (self.accuracy_before, self.accuracy_after);
        self.run.finish(&serde_json::json!({
            "name": r.header.name, "algorithm": r.algorithm.name(), "seed": r.header.seed,
            "accuracy_before": before, "accuracy_after": after,
            "seconds": seconds, "steps_done": self.steps_done, "interrupted": interrupted,
        }))?;
        if !interrupted {
            self.run.say(&format!(
                "held-out accuracy {before:.3} -> {after:.3} in {seconds:.0} s; run directory {}",
                self.out.display()
            ));
        }
        Ok(Summary {
            accuracy_before: before,
            accuracy_after: after,
            seconds,
            out: self.out.to_path_buf(),
            steps_done: self.steps_done,
            interrupted,
        })
    }
}
