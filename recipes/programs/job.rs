//! The program-synthesis job (Neural Symbolic Machines, Liang et al. 2017): per step, programs
//! sampled for a batch of training questions with the computer's mask on the sampler, their
//! answers' F1 as rewards, the memory of each question's best program updated, then one
//! REINFORCE-family update (the method's rows and advantages) through the engine, and the run
//! kit's end-of-step protocol (metrics, evaluation, checkpoint, exact resume).

use super::methods::{self, Group};
use super::schema::{Method, ProgramsRecipe};
use super::state::{ProgramsJob, eval_row, save_state};
use anyhow::Result;
use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use ember_engine::*;
use ember_llm::{ConstrainedExperience, ConstrainedLlama, SamplingConfig, TokenConstraint};
use ember_run::{Row, RunOptions, Timings, fmt_metric};
use ember_tasks::program::{EOS, ProgramTask, Writing};
use ember_train::{Actor, Replicate, UpdateConfig, UpdateData, UpdateSchedule, update};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What a run reports (also `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct ProgramsSummary {
    /// Run name.
    pub name: String,
    /// The method.
    pub method: Method,
    /// Held-out accuracy (answer F1 = 1, greedy programs) before training.
    pub before: f64,
    /// Held-out accuracy after training.
    pub after: f64,
    /// Held-out mean F1 after training.
    pub f1_after: f64,
    /// Steps done.
    pub steps: usize,
    /// Training questions with a remembered program.
    pub remembered: usize,
    /// Seconds of training.
    pub seconds: f64,
    /// Stopped by a signal or `--stop-after`.
    pub interrupted: bool,
}

/// Runs the recipe, writing into `out`.
pub fn train(r: &ProgramsRecipe, out: &Path, opts: &RunOptions) -> Result<ProgramsSummary> {
    ember_run::train::<ProgramsJob>(r, out, opts)
}

/// The task's mask for the sampler: row r writes the program of `questions[r]`.
pub(super) struct Mask<'t> {
    pub(super) rows: Vec<Writing<'t>>,
}

impl TokenConstraint for Mask<'_> {
    fn allowed(&mut self, row: usize, drawn: &[u32]) -> Vec<u32> {
        self.rows
            .get_mut(row)
            .map_or_else(Vec::new, |w| w.allowed(drawn))
    }
}

/// Programs of questions: `(question id, tokens with <eos>)`.
pub(super) type Programs = Vec<(usize, Vec<u32>)>;

impl ProgramsJob<'_> {
    /// `train.samples_per_prompt` programs for each of `questions` (prompt-major), drawn under the mask.
    fn sample(&self, questions: &[usize], seed: u64) -> Result<Programs> {
        let t = &self.r.train.run;
        let cfg = self.sampling(t.samples_per_prompt, t.temperature, seed);
        sample_programs(&self.task, &self.model.valid(), questions, &cfg, &self.base)
    }

    /// The sampler's settings: programs end at `<eos>` within 5 tokens per expression + 2.
    pub(super) fn sampling(&self, n: usize, temperature: f32, seed: u64) -> SamplingConfig {
        SamplingConfig {
            n,
            temperature,
            seed,
            max_new_tokens: 5 * self.r.max_exprs + 2,
            stop_tokens: vec![EOS],
            ..SamplingConfig::default()
        }
    }

    /// Remembers the best programs, then the method's rows and advantages.
    fn rows(
        &mut self,
        method: Method,
        qs: &[usize],
        sampled: &Programs,
        rewards: &[f32],
        row: &mut Row,
    ) -> (Programs, Vec<f32>) {
        let k = self.r.train.run.samples_per_prompt;
        // MAPO splits at the buffer as it was before this step: a new good sample is an
        // out-of-buffer sample of this step, then joins the buffer.
        let mapo = (method == Method::Mapo).then(|| self.mapo_rows(qs, sampled, rewards));
        for ((q, p), r) in sampled.iter().zip(rewards) {
            methods::remember(&mut self.memory, *q, p, *r);
        }
        let mean = rewards.iter().sum::<f32>() / rewards.len().max(1) as f32;
        let solved = rewards.chunks(k).filter(|g| g.contains(&1.0)).count();
        row.insert(keys::ROLLOUT_REWARD_MEAN.into(), f64::from(mean));
        row.insert("rollout/solved".into(), solved as f64 / qs.len() as f64);
        row.insert("memory/questions".into(), self.memory.len() as f64);
        let best = |q: &usize| {
            let b = self.memory.get(q).and_then(|l| l.first());
            b.map(|b| (b.program.clone(), b.reward))
        };
        match method {
            Method::Mapo => mapo.unwrap_or_default(),
            Method::IterativeMl => {
                let rows: Programs = qs
                    .iter()
                    .filter_map(|q| best(q).map(|b| (*q, b.0)))
                    .collect();
                let adv = vec![1.0; rows.len()];
                (rows, adv)
            }
            method => {
                let alpha = if method == Method::Augmented {
                    self.r.train.run.alpha
                } else {
                    0.0
                };
                let mut rows = Programs::new();
                let mut groups = Vec::new();
                for (g, q) in qs.iter().enumerate() {
                    let part = g * k..(g + 1) * k;
                    rows.extend(sampled[part.clone()].iter().cloned());
                    let b = best(q).filter(|_| alpha > 0.0);
                    if let Some((p, _)) = &b {
                        rows.push((*q, p.clone()));
                    }
                    groups.push(Group {
                        rewards: rewards[part].to_vec(),
                        best: b.map(|x| x.1),
                    });
                }
                (rows, methods::augmented_advantages(&groups, alpha))
            }
        }
    }

    /// One optimizer step of the engine's REINFORCE loss over `rows` with advantages `adv`
    /// (none without rows: iterative ML before any program is found).
    fn update(&mut self, step: usize, rows: Programs, adv: Vec<f32>, row: &mut Row) -> Result<()> {
        row.insert("update/rows".into(), rows.len() as f64);
        if rows.is_empty() {
            return Ok(());
        }
        let exp = experience(&self.task, &rows, self.r.train.run.temperature, &self.ad);
        let on_base = Replicate::to_device(&exp, &self.base);
        let old = Actor::score(&self.model.valid(), &on_base, &all(&rows), false);
        let (n, t) = (exp.response_len, exp.tokens.dims()[1]);
        let mask = exp.mask.clone().slice([0..rows.len(), t - n..t]);
        let groups: Vec<usize> = rows.iter().map(|(q, _)| *q).collect();
        let batch =
            RolloutBatch::new(mask.clone(), Tensor::zeros([rows.len()], &self.ad), &groups)?
                .with_old_log_probs(old.log_probs.to_device(&self.ad))?;
        let a = Tensor::<1>::from_data(TensorData::new(adv, [rows.len()]), &self.ad);
        let advantages = a.reshape([rows.len(), 1]).expand([rows.len(), n]) * mask.clone();
        let adv = Advantages {
            returns: advantages.clone(),
            advantages,
            mask,
            metrics: Metrics::new(),
        };
        let schedule = UpdateSchedule {
            mini_batches: self.r.train.update.mini_batches.min(rows.len()),
            ..self.r.train.update
        };
        let cfg = UpdateConfig {
            schedule,
            loss: ActorLossConfig {
                policy: PolicyLossKind::Vanilla,
                agg: LossAgg::SeqMeanTokenSum,
                kl: None,
                entropy_coef: 0.0,
                mismatch: None,
            },
        };
        let lr = self.schedule.at(step);
        let mut order_rng = SplitMix64(self.rng.next_u64());
        let mut order = |k| order_rng.permutation(k);
        let (model, stats) = update(
            self.model.clone(),
            &mut self.optim,
            UpdateData {
                experience: &exp,
                batch: &batch,
                adv: &adv,
            },
            &cfg,
            lr,
            &mut order,
        )?;
        self.model = model;
        row.insert(keys::ACTOR_LR.into(), lr);
        row.extend(stats.metrics);
        Ok(())
    }

    /// Log, evaluation, checkpoint; returns whether the run stops.
    fn end_step(&mut self, done: usize, mut row: Row) -> Result<bool> {
        let end = self.run.step_end(done);
        let evaluated = done.is_multiple_of(self.r.eval.every) || done == self.r.train.run.steps;
        if evaluated || end.stop {
            (self.after, self.f1_after) = self.evaluate()?;
            if evaluated {
                row.extend(eval_row(done, self.after, self.f1_after));
            }
        }
        let stats = format!(
            "reward {} held-out {} ({:.2} s)",
            fmt_metric(row[keys::ROLLOUT_REWARD_MEAN], 3),
            fmt_metric(self.after, 3),
            row[keys::PERF_STEP_S],
        );
        let ts = self.run.state(done, self.rng.0, self.before, self.after);
        let (model, optim, memory) = (&self.model, &self.optim, &self.memory);
        self.run.end_step(end, row, evaluated, &stats, |d| {
            save_state(d, model, optim, memory, &ts)
        })
    }

    /// Held-out accuracy and mean F1 of greedy programs.
    pub(super) fn evaluate(&self) -> Result<(f64, f64)> {
        let qs = &self.task.held_out;
        let cfg = self.sampling(1, 0.0, 0);
        let programs = sample_programs(&self.task, &self.model.valid(), qs, &cfg, &self.base)?;
        let f1: Vec<f32> = programs
            .iter()
            .map(|(q, p)| self.task.reward(&self.task.questions[*q], p))
            .collect();
        let n = f1.len().max(1) as f64;
        let right = f1.iter().filter(|x| **x == 1.0).count() as f64;
        Ok((right / n, f1.iter().map(|x| f64::from(*x)).sum::<f64>() / n))
    }
}

fn all(rows: &Programs) -> Vec<usize> {
    (0..rows.len()).collect()
}

/// `cfg.n` programs for each question, sampled from `model` under the task's mask.
pub(super) fn sample_programs(
    task: &ProgramTask,
    model: &ConstrainedLlama,
    questions: &[usize],
    cfg: &SamplingConfig,
    device: &Device,
) -> Result<Programs> {
    let prompts: Vec<Vec<u32>> = questions
        .iter()
        .map(|q| task.prompt(&task.questions[*q]))
        .collect();
    let owners: Vec<usize> = questions
        .iter()
        .flat_map(|q| std::iter::repeat_n(*q, cfg.n))
        .collect();
    let mut mask = Mask {
        rows: owners
            .iter()
            .map(|q| task.writing(&task.questions[*q]))
            .collect(),
    };
    let out = ember_llm::generate_constrained(&model.llama, &prompts, cfg, device, &mut mask)?;
    let drawn = out.generation.response_ids();
    Ok(owners.into_iter().zip(drawn).collect())
}

/// The rows as sequences (prompt left-padded, program right-padded) with the masks the sampler
/// drew them under (replayed through the computer), on `device`.
pub(super) fn experience(
    task: &ProgramTask,
    rows: &Programs,
    temperature: f32,
    device: &Device,
) -> ConstrainedExperience {
    let prompts: Vec<Vec<u32>> = rows
        .iter()
        .map(|(q, _)| task.prompt(&task.questions[*q]))
        .collect();
    let (pt, pm) = ember_llm::left_pad(&prompts, device);
    let n = rows.iter().map(|r| r.1.len()).max().unwrap_or(1).max(1);
    let v = task.vocab.len();
    let (b, mut toks, mut mask) = (
        rows.len(),
        vec![0i64; rows.len() * n],
        vec![0f32; rows.len() * n],
    );
    let mut allowed = vec![true; b * n * v];
    for (i, (q, p)) in rows.iter().enumerate() {
        let along = task.allowed_along(&task.questions[*q], p);
        for (j, (t, ok)) in p.iter().zip(along).enumerate() {
            toks[i * n + j] = i64::from(*t);
            mask[i * n + j] = 1.0;
            let slot = &mut allowed[(i * n + j) * v..(i * n + j + 1) * v];
            slot.fill(false);
            for a in ok {
                slot[a as usize] = true;
            }
        }
    }
    let rt = Tensor::from_data(TensorData::new(toks, [b, n]), device);
    let rm = Tensor::from_data(TensorData::new(mask, [b, n]), device);
    ConstrainedExperience {
        tokens: Tensor::cat(vec![pt, rt], 1),
        mask: Tensor::cat(vec![pm, rm], 1),
        allowed: Tensor::from_data(TensorData::new(allowed, [b, n, v]), device),
        response_len: n,
        temperature,
    }
}

impl<'a> ember_run::Job<'a> for ProgramsJob<'a> {
    type Recipe = ProgramsRecipe;
    type Summary = ProgramsSummary;

    fn setup(r: &'a ProgramsRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        ProgramsJob::open(r, out, opts)
    }

    fn start(self) -> Result<Self> {
        self.begin()
    }

    fn run(&self) -> &ember_run::Run {
        &self.run
    }

    /// One step; returns whether the run stops after it.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let t = Instant::now();
        let mut row = Row::new();
        let n = self.r.train.run.questions;
        let qs: Vec<usize> = (0..n)
            .map(|_| self.task.train[self.rng.below(self.task.train.len() as u64) as usize])
            .collect();
        let t_loop = &self.r.train.run;
        if t_loop.ml_steps > 0 && step == t_loop.ml_steps && t_loop.reset_after_ml {
            (self.model, self.optim) = super::state::fresh(self.r, &self.task, &self.ad, 1);
            row.insert("memory/reset".into(), 1.0);
        }
        let seed = self.rng.next_u64();
        let mut timing = Timings::default();
        let sampled = timing.time("gen", || self.sample(&qs, seed))?;
        let rewards: Vec<f32> = sampled
            .iter()
            .map(|(q, p)| self.task.reward(&self.task.questions[*q], p))
            .collect();
        let method = match self.r.train.run.ml_steps {
            m if step < m => Method::IterativeMl,
            _ => self.r.train.run.method,
        };
        let (rows, adv) = self.rows(method, &qs, &sampled, &rewards, &mut row);
        timing.time("update_actor", || self.update(step, rows, adv, &mut row))?;
        timing.log(&mut row);
        let done = step + 1;
        self.steps_done = done;
        row.insert("step".into(), done as f64);
        row.insert(keys::PERF_STEP_S.into(), t.elapsed().as_secs_f64());
        let stop = self.end_step(done, row)?;
        Ok((self, stop))
    }

    /// The summary.
    fn finish(mut self, interrupted: bool, seconds: f64) -> Result<ProgramsSummary> {
        let summary = ProgramsSummary {
            name: self.r.header.name.clone(),
            method: self.r.train.run.method,
            before: self.before,
            after: self.after,
            f1_after: self.f1_after,
            steps: self.steps_done,
            remembered: self.memory.len(),
            seconds,
            interrupted,
        };
        self.run.finish(&serde_json::to_value(&summary)?)?;
        self.run.say(&format!(
            "held-out accuracy {:.3} -> {:.3} ({:?}, {} steps, {:.0} s)",
            summary.before, summary.after, summary.method, summary.steps, seconds
        ));
        Ok(summary)
    }
}
