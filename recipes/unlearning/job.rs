//! The unlearning job: a supervised stage teaches every fact of the corpus (the forget facts
//! too, except for `retrain`), then the method makes the model forget the forget facts while
//! keeping the retain facts, and the run kit's end-of-step protocol logs the forget and retain
//! metrics, checkpoints and resumes exactly. Every fact's answer is one word, so each loss is
//! on the answer position's distribution.

use super::eval::{answer_log_probs, evaluate, host};
use super::schema::{Method, UnlearningRecipe};
use super::state::{Learner, UnlearningJob, save_state};
use super::targets::{Groups, HardGroup, admit_hard, loo_target, reinforce_targets, replay_target};
use anyhow::Result;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_engine::*;
use ember_run::Row;
use ember_run::{RunOptions, fmt_metric};
use ember_tasks::facts::Facts;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// What a run reports (also `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct UnlearningSummary {
    /// Run name.
    pub name: String,
    /// The method.
    pub method: Method,
    /// The metrics after the supervised stage (`forget/*`, `retain/*`).
    pub learned: BTreeMap<String, f64>,
    /// The metrics at the end.
    pub after: BTreeMap<String, f64>,
    /// Steps done.
    pub steps: usize,
    /// Seconds.
    pub seconds: f64,
    /// Stopped by a signal or `--stop-after`.
    pub interrupted: bool,
}

/// Runs the recipe, writing into `out`.
pub fn train(r: &UnlearningRecipe, out: &Path, opts: &RunOptions) -> Result<UnlearningSummary> {
    ember_run::train::<UnlearningJob>(r, out, opts)
}

impl UnlearningJob<'_> {
    /// `n` facts drawn from `pool`.
    fn draw(&mut self, pool: &[usize], n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| pool[self.rng.below(pool.len() as u64) as usize])
            .collect()
    }

    /// A supervised step of the model on every fact (the retain facts for `retrain`), and of
    /// each teacher on its shard.
    fn learn(&mut self, row: &mut Row) {
        let f = &self.facts;
        let pool: Vec<usize> = match self.r.forget.method {
            Method::Retrain => f.retain.clone(),
            _ => (0..f.facts.len()).collect(),
        };
        let batch = self.draw(&pool, self.r.learn.batch);
        let targets = self.one_hot(&batch);
        let loss = soft_step(
            &mut self.learner,
            &self.facts,
            &batch,
            targets,
            self.r.learn.lr,
            &self.ad,
        );
        row.insert("learn/loss".into(), loss);
        let k = self.teachers.len();
        for shard in 0..k {
            let own: Vec<usize> = (0..self.facts.facts.len())
                .filter(|i| self.facts.shard(&self.facts.facts[*i], k) == shard)
                .collect();
            let batch = self.draw(&own, self.r.learn.batch);
            let targets = self.one_hot(&batch);
            let lr = self.r.learn.lr;
            soft_step(
                &mut self.teachers[shard],
                &self.facts,
                &batch,
                targets,
                lr,
                &self.ad,
            );
        }
    }

    /// `[rows, vocab]` one-hot targets of the facts' answers, times `weight` per row.
    fn one_hot(&self, batch: &[usize]) -> Vec<Vec<f32>> {
        let v = self.facts.vocab_size();
        batch
            .iter()
            .map(|i| {
                let mut t = vec![0.0; v];
                t[self.facts.facts[*i].answer as usize] = 1.0;
                t
            })
            .collect()
    }

    /// Gradient ascent on a batch of forget facts, descent on retain facts at `retain_weight`:
    /// L = (1/B)[Σ_forget log π(a) − w·Σ_retain log π(a)].
    fn ascend(&mut self, row: &mut Row) {
        let fs = self.r.forget.clone();
        let forget = self.draw(&self.facts.forget.clone(), fs.batch);
        let retain = self.draw(&self.facts.retain.clone(), fs.retain_batch);
        let mut targets: Vec<Vec<f32>> = self.one_hot(&forget);
        for t in &mut targets {
            t.iter_mut().for_each(|x| *x = -*x);
        }
        self.forget_step(forget, targets, retain, fs.retain_weight, row);
    }

    /// One step of the forget stage's loss: the forget facts with their `targets`, then the
    /// retain facts' answers at `weight`; logs `forget/loss`.
    fn forget_step(
        &mut self,
        forget: Vec<usize>,
        mut targets: Vec<Vec<f32>>,
        retain: Vec<usize>,
        weight: f32,
        row: &mut Row,
    ) {
        let mut keep = self.one_hot(&retain);
        for t in &mut keep {
            t.iter_mut().for_each(|x| *x *= weight);
        }
        targets.extend(keep);
        let batch: Vec<usize> = forget.into_iter().chain(retain).collect();
        let lr = self.r.forget.lr;
        let loss = soft_step(
            &mut self.learner,
            &self.facts,
            &batch,
            targets,
            lr,
            &self.ad,
        );
        row.insert("forget/loss".into(), loss);
    }

    /// RULE's rejection steering: the refusal as the answer of a batch drawn from the first
    /// `steering_share` of the forget facts, the answers of retain facts.
    fn steer(&mut self, row: &mut Row) {
        let fs = self.r.forget.clone();
        let f = &self.facts.forget;
        let shown = ((f.len() as f32 * fs.steering_share).ceil() as usize).clamp(1, f.len());
        let pool: Vec<usize> = f.iter().take(shown).copied().collect();
        let forget = self.draw(&pool, fs.batch);
        let retain = self.draw(&self.facts.retain.clone(), fs.retain_batch);
        let v = self.facts.vocab_size();
        let targets: Vec<Vec<f32>> = forget
            .iter()
            .map(|_| {
                let mut t = vec![0.0; v];
                t[self.facts.refusal as usize] = 1.0;
                t
            })
            .collect();
        self.forget_step(forget, targets, retain, 1.0, row);
    }

    /// The leave-one-out ensemble: each forget fact's target is the mean distribution of the
    /// teachers whose shard does not hold it (they never saw it); retain facts keep their
    /// answers at `retain_weight`. L = −(1/B) Σ_rows Σ_v q(v) log π(v).
    fn distil(&mut self, row: &mut Row) {
        let fs = self.r.forget.clone();
        let forget = self.draw(&self.facts.forget.clone(), fs.batch);
        let retain = self.draw(&self.facts.retain.clone(), fs.retain_batch);
        let k = self.teachers.len();
        let probs: Vec<Vec<f32>> = self
            .teachers
            .iter()
            .map(|t| {
                host(answer_log_probs(&t.model.valid(), &self.facts, &forget, &self.base).exp())
            })
            .collect();
        let v = self.facts.vocab_size();
        let targets: Vec<Vec<f32>> = forget
            .iter()
            .enumerate()
            .map(|(r, i)| {
                let own = self.facts.shard(&self.facts.facts[*i], k);
                let rows: Vec<&[f32]> = probs.iter().map(|p| &p[r * v..(r + 1) * v]).collect();
                loo_target(&rows, own)
            })
            .collect();
        self.forget_step(forget, targets, retain, fs.retain_weight, row);
    }

    /// RULE: `samples` answers per prompt; reward 1 for the refusal on a forget prompt and for
    /// the right answer on a retain prompt; GRPO's advantages (the engine's); L = −(1/N) Σ
    /// A·log π(answer). ReRULE adds `replay` stored hard groups (importance-weighted), then
    /// stores this step's hard groups.
    fn rule(&mut self, step: usize, row: &mut Row) -> Result<()> {
        let fs = self.r.forget.clone();
        let mut prompts = self.draw(&self.facts.forget.clone(), fs.batch);
        prompts.extend(self.draw(&self.facts.retain.clone(), fs.retain_batch));
        let n = fs.samples_per_prompt;
        let model = self.learner.model.valid();
        let lp = answer_log_probs(&model, &self.facts, &prompts, &self.base);
        let lp_host = host(lp.clone());
        let u: Vec<f32> = (0..prompts.len() * n)
            .map(|_| self.rng.next_f32())
            .collect();
        let idx = Tensor::<1, Int>::arange(0..prompts.len() as i64, &self.base)
            .reshape([prompts.len(), 1])
            .repeat_dim(1, n)
            .reshape([prompts.len() * n]);
        let drawn = ember_llm::sample_rows_with(lp.select(0, idx), &u);
        let tokens: Vec<u32> = drawn
            .try_into_vec_as::<i64>()
            .unwrap_or_default()
            .iter()
            .map(|t| *t as u32)
            .collect();
        let rewards = self.rule_rewards(&prompts, &tokens, n);
        row.insert(
            keys::ROLLOUT_REWARD_MEAN.into(),
            f64::from(rewards.iter().sum::<f32>() / rewards.len() as f32),
        );
        let groups: Vec<usize> = (0..tokens.len()).map(|j| j / n).collect();
        let batch = RolloutBatch::new(
            Tensor::ones([tokens.len(), 1], &self.ad),
            Tensor::from_data(TensorData::new(rewards.clone(), [tokens.len()]), &self.ad),
            &groups,
        )?;
        let kind = AdvantageConfig::new(AdvantageKind::default());
        let adv = compute_advantages(&kind, &batch, step)?;
        row.extend(adv.metrics.to_host());
        let a = host(adv.advantages);
        let v = self.facts.vocab_size();
        let mut targets = reinforce_targets(&tokens, &a, n, v);
        let mut rows = prompts.clone();
        if fs.method == Method::Rerule {
            let take = self.hard.len().min(fs.replay);
            let replayed: Vec<HardGroup> = self.hard.drain(self.hard.len() - take..).collect();
            row.insert("forget/replayed".into(), replayed.len() as f64);
            let facts: Vec<usize> = replayed.iter().map(|g| g.fact).collect();
            if !facts.is_empty() {
                let now = host(answer_log_probs(&model, &self.facts, &facts, &self.base));
                for (k, g) in replayed.iter().enumerate() {
                    targets.push(replay_target(g, &now[k * v..(k + 1) * v]));
                }
                rows.extend(facts);
            }
            let groups = Groups {
                prompts: &prompts,
                tokens: &tokens,
                lp: &lp_host,
                rewards: &rewards,
                adv: &a,
                n,
            };
            admit_hard(&mut self.hard, groups);
        }
        let loss = soft_step(
            &mut self.learner,
            &self.facts,
            &rows,
            targets,
            fs.lr,
            &self.ad,
        );
        row.insert("forget/loss".into(), loss);
        Ok(())
    }

    /// RULE's reward of each sampled answer: 1 for the refusal on a forget prompt, 1 for the
    /// right answer on a retain prompt, else 0.
    fn rule_rewards(&self, prompts: &[usize], tokens: &[u32], n: usize) -> Vec<f32> {
        let forget: std::collections::BTreeSet<usize> = self.facts.forget.iter().copied().collect();
        tokens
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let fact = prompts[j / n];
                let want = if forget.contains(&fact) {
                    self.facts.refusal
                } else {
                    self.facts.facts[fact].answer
                };
                f32::from(u8::from(*t == want))
            })
            .collect()
    }

    /// Log, evaluation, checkpoint; returns whether the run stops.
    fn end_step(&mut self, done: usize, mut row: Row) -> Result<bool> {
        let end = self.run.step_end(done);
        let last = done == self.r.total_steps();
        let evaluated =
            done.is_multiple_of(self.r.eval_every) || last || done == self.r.learn.steps;
        if evaluated || end.stop {
            self.latest = evaluate(&self.learner.model.valid(), &self.facts, &self.base);
            if done == self.r.learn.steps {
                self.learned = self.latest.clone();
            }
            if evaluated {
                row.extend(self.latest.clone());
            }
        }
        let stats = format!(
            "forget acc {} retain acc {} ({:.2} s)",
            fmt_metric(self.latest["forget/accuracy"], 3),
            fmt_metric(self.latest["retain/accuracy"], 3),
            row[keys::PERF_STEP_S],
        );
        // The run kit's two accuracies: the latest forget and retain accuracy (the whole
        // metrics are in `unlearning.json`).
        let acc = |k: &str| self.latest.get(k).copied().unwrap_or(0.0);
        let ts = self.run.state(
            done,
            self.rng.0,
            acc("forget/accuracy"),
            acc("retain/accuracy"),
        );
        let (learner, teachers, hard, learned) =
            (&self.learner, &self.teachers, &self.hard, &self.learned);
        self.run.end_step(end, row, evaluated, &stats, |d| {
            save_state(
                d,
                learner,
                teachers.as_slice(),
                hard.as_slice(),
                learned,
                &ts,
            )
        })
    }
}

/// One optimizer step of L = −(1/B) Σ_rows Σ_v target(v)·log π(v) at the answer position
/// (one-hot targets: supervised learning; negative ones: ascent; a distribution:
/// distillation; advantages on the sampled answers: REINFORCE); the loss.
fn soft_step(
    l: &mut Learner,
    f: &Facts,
    batch: &[usize],
    targets: Vec<Vec<f32>>,
    lr: f64,
    ad: &Device,
) -> f64 {
    let (b, v) = (batch.len(), f.vocab_size());
    let flat: Vec<f32> = targets.into_iter().flatten().collect();
    let q = Tensor::<2>::from_data(TensorData::new(flat, [b, v]), ad);
    let lp = answer_log_probs(&l.model, f, batch, ad);
    let loss = (lp * q).sum().neg() / b as f32;
    let value = f64::from(loss.clone().into_scalar::<f32>());
    let grads = GradientsParams::from_grads(loss.backward(), &l.model);
    let model = l.model.clone();
    l.model = l.optim.step(lr, model, grads).0;
    value
}

impl<'a> ember_run::Job<'a> for UnlearningJob<'a> {
    type Recipe = UnlearningRecipe;
    type Summary = UnlearningSummary;

    fn setup(r: &'a UnlearningRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        UnlearningJob::open(r, out, opts)
    }

    fn start(self) -> Result<Self> {
        self.begin()
    }

    fn run(&self) -> &ember_run::Run {
        &self.run
    }

    /// One step of the stage `step` falls in; returns whether the run stops after it.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let t = Instant::now();
        let mut row = Row::new();
        if step < self.r.learn.steps {
            self.learn(&mut row);
        } else {
            match self.r.forget.method {
                Method::GradientAscent => self.ascend(&mut row),
                Method::Rule | Method::Rerule
                    if step - self.r.learn.steps < self.r.forget.steering_steps =>
                {
                    self.steer(&mut row)
                }
                Method::Rule | Method::Rerule => self.rule(step, &mut row)?,
                Method::LooEnsemble => self.distil(&mut row),
                Method::None | Method::Retrain => {}
            }
        }
        let done = step + 1;
        self.steps_done = done;
        row.insert("step".into(), done as f64);
        row.insert(keys::PERF_STEP_S.into(), t.elapsed().as_secs_f64());
        let stop = self.end_step(done, row)?;
        Ok((self, stop))
    }

    /// The summary.
    fn finish(mut self, interrupted: bool, seconds: f64) -> Result<UnlearningSummary> {
        let summary = UnlearningSummary {
            name: self.r.header.name.clone(),
            method: self.r.forget.method,
            learned: self.learned.clone(),
            after: self.latest.clone(),
            steps: self.steps_done,
            seconds,
            interrupted,
        };
        self.run.finish(&serde_json::to_value(&summary)?)?;
        let m = |k: &str| summary.after.get(k).copied().unwrap_or(f64::NAN);
        self.run.say(&format!(
            "{:?}: forget accuracy {:.3}, exposure {:.2}; retain accuracy {:.3} ({:.0} s)",
            summary.method,
            m("forget/accuracy"),
            m("forget/exposure"),
            m("retain/accuracy"),
            seconds
        ));
        Ok(summary)
    }
}
