//! The LLM job's set-up: the policy checked against the task, a fresh run's warm-up,
//! reference and first evaluation or a resumed run's state, the optimizer, critic, replay,
//! data-parallel group and servers.

use super::Job;
use crate::common::run::open_run;
use crate::llm::build_policy;
use crate::llm::critic::Critic;
use crate::llm::lanpo::{Lanpo, Pool};
use crate::llm::pipeline::Draw;
use crate::llm::pipeline::Pipeline;
use crate::llm::plop::Placing;
use crate::llm::ranks;
use crate::llm::remote::Remote;
use crate::llm::replay::{Limits, Replay, StoredGroup};
use crate::llm::saved::load_reference;
use crate::llm::saved::{Extras, save_checkpoint};
use crate::llm::schema::{Recipe, RolloutBackend};
use crate::llm::setup::{optimizer, rollout_sampling, update_config};
use crate::llm::teacher::Teacher;
use crate::lm::score::Scorer;
use crate::lm::{evaluate, load_checkpoint, warm_up};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::tensor::Device;
use ember_dist::World;
use ember_engine::ReplayBuffer;
use ember_engine::SplitMix64;
use ember_engine::keys;
use ember_run::{Run, RunOptions, checkpoint};
use ember_tasks::task::TaskSet;
use ember_train::broadcast_trained;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

impl<'a> Job<'a> {
    /// Opens the run directory, places the LoRA targets, builds the job; checks what several
    /// ranks cannot run and the data-parallel group before the run directory or the warm-up.
    pub(super) fn open(p: &'a Placing<'a>, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        let r = p.given();
        let curves = (keys::ROLLOUT_REWARD_MEAN, keys::EVAL_ACCURACY);
        if let Some(w) = opts.world.as_ref().filter(|w| w.size() > 1) {
            ranks::supported(r, w)?;
        }
        let run = open_run(out, opts, &r.header.name, r, r.train.run.run_loop(), curves)?;
        let task = r.task.build()?;
        let base = crate::common::device::device(&r.header.device)?;
        let group = crate::common::device::data_parallel(&r.header.device, r.data_parallel)?;
        // `targets = "plop"`: chosen now, or read back when resuming.
        let placed = p.place(&task, &run, &base)?;
        let mut job = Job::new(placed, out, run, task, base)?;
        if let Some(w) = opts.world.as_ref().filter(|w| w.size() > 1) {
            job.check_every = ranks::check_every(w)?;
            job.world = Some(w.clone());
        }
        job.group = group;
        Ok(job)
    }

    /// The task, the policy (every prompt checked against its context now, not at the step
    /// that first draws it, which would stop every resumed run at the same step), the reward.
    fn new(r: &'a Recipe, out: &'a Path, run: Run, task: TaskSet, base: Device) -> Result<Self> {
        let eval = task.held_out_set(r.header.seed, r.task.eval_size);
        if eval.is_empty() {
            bail!("the task's held-out split is empty");
        }
        let ad = base.clone().autodiff();
        let policy = build_policy(r, &ad)?;
        for e in task.dataset_train().iter().chain(&eval) {
            policy
                .prompt_ids(e, r.rollout.max_new_tokens)
                .context("checking the task's prompts before the run")?;
        }
        let parts = r.algorithm_parts();
        // TRL's `epoch` for reward functions: passes over a dataset's training prompts (0 for
        // generated tasks, which have no fixed set).
        let train_size = task.dataset_train().len();
        let per_step = match train_size {
            0 => 0.0,
            n => r.rollout.prompts_per_step as f64 / n as f64,
        };
        Ok(Self {
            scorer: Scorer::new(&r.reward, &base)?.with_schedule(r.train.run.steps, per_step),
            rng: SplitMix64(r.header.seed),
            upd: update_config(r, parts.loss),
            optim: optimizer(r),
            critic: None,
            replay: None,
            remote: None,
            pipeline: parts
                .adaptive
                .is_none()
                .then(|| Pipeline::new(r.rollout.max_staleness, &base)),
            teacher: match &r.teacher {
                Some(t) => Some(Teacher::new(t, &base, &policy, &eval[0].prompt)?),
                None => None,
            },
            reference: None,
            lanpo: r.lanpo.clone().map(|spec| Lanpo {
                spec,
                pool: Pool::default(),
                pending: None,
            }),
            world: None,
            check_every: 0,
            accuracy_before: 0.0,
            accuracy_after: 0.0,
            steps_done: run.first_step(),
            r,
            group: None,
            out,
            run,
            task,
            eval,
            base,
            ad,
            policy,
            parts,
        })
    }

    /// A resumed run's policy and RNG; a fresh run's warm-up, KL reference and first
    /// evaluation.
    pub(super) fn begin(mut self) -> Result<Self> {
        let r = self.r;
        let reference_path = self.out.join("reference.bpk");
        if let Some((dir, st)) = self.run.resumed() {
            self.policy = load_checkpoint(self.policy, dir)?;
            self.rng = SplitMix64(st.rng);
            (self.accuracy_before, self.accuracy_after) = (st.accuracy_before, st.accuracy_after);
        } else {
            if let (Some(w), None) = (&r.warmup, &self.policy.lora) {
                let t0 = Instant::now();
                let vocab = self.policy.vocab();
                let model = self.policy.model;
                let (task, ad) = (&self.task, &self.ad);
                let (model, steps) = warm_up(model, vocab, w, task, &mut self.rng, ad)?;
                self.policy.model = model;
                let secs = t0.elapsed().as_secs_f64();
                let why = match w.until_accuracy {
                    Some(a) if steps < w.steps => format!(" (training accuracy reached {a})"),
                    _ => String::new(),
                };
                self.run
                    .say(&format!("warm-up: {steps} steps{why} in {secs:.1} s"));
            }
            let writer = self.world.as_ref().is_none_or(World::is_writer);
            if r.own_kl_reference() && self.policy.lora.is_none() && writer {
                let record = self.policy.model.clone().into_record();
                ember_train::io::write_atomic_with(&reference_path, |tmp| {
                    record.save(tmp).map_err(|e| anyhow!("{e}"))
                })
                .with_context(|| format!("writing {}", reference_path.display()))?;
            }
            let a = evaluate(
                &self.policy,
                &self.eval,
                r.rollout.max_new_tokens,
                &self.base,
            )?;
            self.run.log(BTreeMap::from([
                ("step".to_string(), 0.0),
                (keys::EVAL_ACCURACY.to_string(), a),
            ]))?;
            (self.accuracy_before, self.accuracy_after) = (a, a);
        }
        let before = self.accuracy_before;
        self.run
            .say(&format!("held-out accuracy at the start: {before:.3}"));
        if let Some(w) = &self.world {
            // Rank 0's weights on every rank (as DDP starts), and its reference written before
            // any rank reads it.
            self.policy.model = broadcast_trained(w, self.policy.model)?;
            w.any(false, "reference written")?;
        }
        self.reference = load_reference(r, &self.policy, &reference_path, &self.ad)?;
        Ok(self)
    }

    /// The error path of a step: the last completed step's checkpoint (with the RNG and the
    /// replay buffer as that step left them), and the error naming how to resume.
    pub(super) fn fail(
        &mut self,
        e: anyhow::Error,
        rng_at_start: u64,
        replay_at_start: Option<ReplayBuffer<StoredGroup>>,
    ) -> anyhow::Error {
        let (before, after) = (self.accuracy_before, self.accuracy_after);
        let state = self.run.state(self.steps_done, rng_at_start, before, after);
        if let (Some(rp), Some(b)) = (self.replay.as_mut(), replay_at_start) {
            rp.buffer = b;
        }
        if let Some(pl) = self.pipeline.as_mut() {
            pl.rewind(self.steps_done);
        }
        let extra = Extras {
            critic: self.critic.as_ref(),
            replay: self.replay.as_ref(),
            lanpo: self.lanpo.as_ref(),
        };
        let (policy, optim, pl) = (&self.policy, &self.optim, self.pipeline.as_mut());
        self.run.checkpoint_after_error(self.steps_done, e, |d| {
            save_checkpoint(d, policy, optim, extra, &state)?;
            pl.map_or(Ok(()), |p| p.save(d))
        })
    }

    /// The rollout of step `next`, drawn at step `now`: its prompts and sampling seed.
    pub(super) fn draw(&mut self, next: usize, now: usize) -> Result<Draw> {
        let r = self.r;
        let examples = self.task.train(&mut self.rng, r.rollout.prompts_per_step);
        let prompts = examples
            .iter()
            .map(|e| self.policy.prompt_ids(e, r.rollout.max_new_tokens))
            .collect::<Result<Vec<_>>>()?;
        let sc = rollout_sampling(r, &self.policy.stop, self.rng.next_u64());
        let shard = self
            .world
            .as_ref()
            .map(|w| ranks::shard(w, prompts.len(), sc.n));
        Ok(Draw {
            step: next,
            version: now,
            examples,
            prompts,
            sc,
            shard,
        })
    }

    /// The optimizer, PPO's critic (from the policy as the warm-up left it), replay, the
    /// data-parallel group, what a resumed run's checkpoint holds of them, and the servers.
    pub(super) fn prepare_update(&mut self) -> Result<()> {
        let r = self.r;
        self.critic = Critic::new(r, &self.policy, &self.ad);
        if let Some(g) = self.group.take() {
            self.run.say(&format!(
                "data-parallel update: {} devices, {} reduction",
                g.devices().len(),
                g.reduce()
            ));
            self.optim = optimizer(r).with_data_parallel(g.clone());
            self.critic = self.critic.take().map(|c| c.with_data_parallel(g));
        }
        if let Some(w) = &self.world {
            self.run.say(&format!(
                "{} ranks over {} ({}), rank 0 writing the run directory",
                w.size(),
                w.engine(),
                w.launch().launcher.name()
            ));
            self.optim = std::mem::replace(&mut self.optim, optimizer(r)).with_world(w.clone());
            self.critic = self.critic.take().map(|c| c.with_world(w.clone()));
        }
        self.replay = self.parts.replay.map(|cfg| Replay {
            cfg,
            buffer: ReplayBuffer::default(),
        });
        if let Some((dir, _)) = self.run.resumed() {
            let optim = std::mem::replace(&mut self.optim, optimizer(r));
            self.optim = checkpoint::load_optimizer(dir, optim)?;
            self.critic = self.critic.take().map(|c| c.load(dir)).transpose()?;
            if let Some(l) = self.lanpo.as_mut() {
                l.pool = Pool::load(dir, &l.spec, self.policy.config.d_model)?;
            }
            let limits = Limits {
                step: self.run.first_step(),
                vocab: self.policy.model.vocab_size(),
                context: self.policy.model.max_positions(),
                max_new: r.rollout.max_new_tokens,
                samples: r.rollout.samples_per_prompt,
            };
            self.replay = self
                .replay
                .take()
                .map(|rp| rp.load(dir, &limits))
                .transpose()?;
            if let Some(pl) = self.pipeline.as_mut() {
                let stop = self.policy.stop.clone();
                let sc_of = |seed| rollout_sampling(r, &stop, seed);
                pl.load(dir, &limits, &sc_of)?;
            }
        }
        self.remote = match r.rollout.backend {
            RolloutBackend::Local => None,
            RolloutBackend::Openai => {
                let tag = format!("{}-{}", r.header.name, std::process::id());
                let mut rm = Remote::connect(&r.rollout, &tag, &self.out.join("serving"))?;
                // A rollout k steps stale needs its step's adapter while k newer are pushed.
                rm.keep_versions(r.rollout.max_staleness + 1);
                Some(Arc::new(Mutex::new(rm)))
            }
        };
        Ok(())
    }
}
