//! `ember train` for `kind = "agent"` recipes: the tiny policy plays multi-turn episodes of an
//! environment; each step's trajectories (turns and observations in one row, observations
//! masked out of the loss) go through the preset's advantage estimator and the trainer, with
//! the run kit's logs, checkpoints and resume. Held-out success is the greedy policy's mean
//! reward on episodes fixed by a hash of their seeds.

use crate::agent::rollout::{Plays, Trajectories, TrajectoryTensors, rollout, warm_up};
use crate::agent::schema::{AgentRecipe, EnvSpec};
use crate::common::run::open_run;
use crate::lm::step::{UpdateCtx, update_policy};
use crate::lm::{Policy, load_checkpoint, model_record, policy_from_specs};
use anyhow::Result;
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::{Llama, SamplingConfig};
use ember_run::{Row, Run, RunOptions, Timings, checkpoint, fmt_metric};
use ember_tasks::env::builtin::{Calculator, GuessNumber};
use ember_tasks::env::external::ExternalEnv;
use ember_tasks::env::kernel::KernelGym;
use ember_tasks::env::{Environment, EpisodeSource};
use ember_train::{Optimizer, Turns, UpdateConfig, UpdateData, sequential_update};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// What a finished (or stopped) agent run reports.
#[derive(Debug, Clone)]
pub struct AgentSummary {
    /// Held-out success at the start.
    pub success_before: f64,
    /// Held-out success at the end.
    pub success_after: f64,
    /// Steps completed.
    pub steps_done: usize,
    /// Stopped by a signal or `--stop-after`.
    pub interrupted: bool,
}

/// The recipe's environment.
pub fn environment(r: &AgentRecipe, device: &Device) -> Result<Box<dyn Environment>> {
    Ok(match &r.env {
        EnvSpec::Guess { max } => Box::new(GuessNumber::new(*max, r.rollout.max_turns)),
        EnvSpec::Calculator {
            digits,
            instructions,
        } => {
            Box::new(Calculator::new(*digits, r.rollout.max_turns).with_instructions(*instructions))
        }
        EnvSpec::External(x) => Box::new(ExternalEnv::spawn(x)?),
        EnvSpec::Tutor(t) => Box::new(super::tutor::TutorEnv::new(t, r.rollout.max_turns, device)?),
        EnvSpec::KernelGym(g) => {
            let gym = KernelGym::new(g, r.rollout.max_turns)?;
            if g.remote.is_empty() {
                Box::new(gym)
            } else {
                let remote = crate::gym::remote::Remote::new(&g.remote, KernelGym::eval_config(g));
                Box::new(gym.with_executor(Box::new(remote)))
            }
        }
    })
}

/// Held-out success: the mean reward of one greedy episode per held-out seed, with the turns'
/// numbers as `eval/…` ([`Trajectories::turn_metrics`]).
fn evaluate(
    policy: &Policy,
    env: &mut dyn Environment,
    r: &AgentRecipe,
    device: &Device,
) -> Result<(f64, BTreeMap<String, f64>)> {
    let seeds = EpisodeSource::held_out_set(r.eval_episodes);
    let sc = SamplingConfig {
        temperature: 0.0,
        ..sampling(r, &policy.stop, 0)
    };
    let sampler = policy.model.valid();
    let plays = Plays {
        seeds: &seeds,
        samples: 1,
        max_turns: r.rollout.max_turns,
        sc: &sc,
    };
    let t = rollout(policy, &sampler, env, plays, device)?;
    Ok((mean(&t.rewards()), t.turn_metrics("eval/")))
}

fn sampling(r: &AgentRecipe, stop: &[u32], seed: u64) -> SamplingConfig {
    SamplingConfig {
        temperature: r.rollout.temperature,
        max_new_tokens: r.rollout.max_new_tokens,
        stop_tokens: stop.to_vec(),
        seed,
        ..SamplingConfig::default()
    }
}

fn mean(v: &[f32]) -> f64 {
    let valid: Vec<f64> = v
        .iter()
        .map(|x| f64::from(*x))
        .filter(|&x| ember_engine::is_valid_reward(x))
        .collect();
    valid.iter().sum::<f64>() / valid.len().max(1) as f64
}

/// Trains `r` into `out`: set-up, then per step episodes → advantages → update (whole
/// trajectories or turn by turn) → log, evaluation and checkpoint, then the summary.
pub fn train(r: &AgentRecipe, out: &Path, opts: &RunOptions) -> Result<AgentSummary> {
    ember_run::train::<AgentJob>(r, out, opts)
}

/// The run between steps: what every step uses and what a checkpoint holds.
struct AgentJob<'a> {
    r: &'a AgentRecipe,
    out: &'a Path,
    run: Run,
    base: Device,
    ad: Device,
    env: Box<dyn Environment>,
    policy: Policy,
    rng: SplitMix64,
    parts: PresetParts,
    upd: UpdateConfig,
    optim: Optimizer,
    /// Held-out success at the start and after the last evaluation.
    before: f64,
    after: f64,
    steps_done: usize,
}

impl<'a> AgentJob<'a> {
    /// The run directory, environment and policy (warmed up and evaluated, or resumed), the
    /// optimizer.
    fn new(r: &'a AgentRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        let curves = (keys::ROLLOUT_REWARD_MEAN, keys::EVAL_SUCCESS);
        let mut run = open_run(out, opts, &r.header.name, r, r.train.run.run_loop(), curves)?;
        let parts = r.algorithm_parts();
        let base = crate::common::device::device(&r.header.device)?;
        let ad = base.clone().autodiff();
        let mut env = environment(r, &base)?;
        let mut policy = policy_from_specs(
            r.model.as_ref(),
            r.pretrained.as_ref(),
            r.header.seed,
            &ad,
            None,
        )?;
        policy.model = policy
            .model
            .with_checkpointing(r.train.run.checkpoint_activations);
        // A chat template that cannot extend a conversation is refused now, not at the first
        // turn.
        policy.turn_end()?;
        let mut rng = SplitMix64(r.header.seed);
        let mut optim = r.train.optim.init();
        let (before, after) = match run.resumed() {
            Some((dir, st)) => {
                policy = load_checkpoint(policy, dir)?;
                rng = SplitMix64(st.rng);
                optim = checkpoint::load_optimizer(dir, optim)?;
                (st.accuracy_before, st.accuracy_after)
            }
            None => {
                if let Some(w) = &r.warmup {
                    let t0 = Instant::now();
                    policy = warm_up(policy, env.as_ref(), w, &mut rng, &ad)?;
                    let secs = t0.elapsed().as_secs_f64();
                    run.say(&format!("warm-up: {} steps in {secs:.1} s", w.steps));
                }
                let (s, mut row) = evaluate(&policy, env.as_mut(), r, &base)?;
                row.insert("step".to_string(), 0.0);
                row.insert(keys::EVAL_SUCCESS.to_string(), s);
                run.log(row)?;
                (s, s)
            }
        };
        run.say(&format!("held-out success at the start: {before:.3}"));
        Ok(Self {
            upd: UpdateConfig {
                schedule: r.train.update,
                loss: parts.loss,
            },
            steps_done: run.first_step(),
            r,
            out,
            run,
            base,
            ad,
            env,
            policy,
            rng,
            parts,
            optim,
            before,
            after,
        })
    }

    /// A step's episodes and their batch: the turn rewards sit on each turn's last token; the
    /// outcome slot is 0, or NaN for an episode with an invalid turn reward (masked and
    /// counted). Outcome estimators then see the sum of the turn rewards, turn-level ones each
    /// turn's.
    fn play(&mut self) -> Result<(Trajectories, TrajectoryTensors, RolloutBatch)> {
        let (r, ad) = (self.r, &self.ad);
        let seeds = EpisodeSource::train(&mut self.rng, r.rollout.prompts_per_step);
        let sampler = self.policy.model.valid();
        let sc = sampling(r, &self.policy.stop, self.rng.next_u64());
        let plays = Plays {
            seeds: &seeds,
            samples: r.rollout.samples_per_prompt,
            max_turns: r.rollout.max_turns,
            sc: &sc,
        };
        let t = rollout(&self.policy, &sampler, self.env.as_mut(), plays, &self.base)?;
        let x = t.tensors(&self.base)?;
        let valid = |x: f32| is_valid_reward(x.into());
        let outcome: Vec<f32> = t
            .turn_rewards
            .iter()
            .map(|r| {
                let sane = r.iter().all(|&x| valid(x)) && valid(r.iter().sum::<f32>());
                if sane { 0.0 } else { f32::NAN }
            })
            .collect();
        if t.turns().iter().all(|n| *n == 0) {
            anyhow::bail!(
                "no episode could take a turn: the first observation plus \
                 rollout.max_new_tokens = {} exceeds the model's context",
                r.rollout.max_new_tokens
            );
        }
        crate::lm::step::warn_if_nothing_valid(&r.header.name, self.steps_done, &outcome);
        // Rows made invalid above contribute no per-step reward either.
        let turn_rewards = x.turn_rewards.clone();
        let insane = turn_rewards.clone().abs().greater_elem(REWARD_LIMIT);
        let turn_rewards = turn_rewards
            .clone()
            .mask_fill(turn_rewards.is_finite().bool_not(), 0.0)
            .mask_fill(insane, 0.0);
        let batch = RolloutBatch::new(
            x.loss_mask.clone().to_device(ad),
            Tensor::from_floats(outcome.as_slice(), ad),
            &t.group_ids,
        )?
        .with_token_rewards(turn_rewards.to_device(ad))?
        .with_turns(x.turn_ids.clone().to_device(ad))?
        .with_rollout_log_probs(x.log_probs.clone().to_device(ad))?;
        let batch = match &x.update_mask {
            Some(keep) => batch.with_update_mask(keep.clone().to_device(ad))?,
            None => batch,
        };
        Ok((t, x, batch))
    }

    /// The update: whole trajectories through the preset's estimator and loss, or SeeUPO's
    /// turn-by-turn updates, rescoring between turns without the autodiff graph.
    fn update(
        mut self,
        step: usize,
        x: &TrajectoryTensors,
        batch: &RolloutBatch,
        row: &mut Row,
    ) -> Result<Self> {
        let (r, ad) = (self.r, &self.ad);
        let lr = r.train.schedule.schedule(r.train.run.steps).at(step);
        row.insert(keys::ACTOR_LR.into(), lr);
        let exp = LlmExperience {
            tokens: x.tokens.clone().to_device(ad),
            mask: x.attention.clone().to_device(ad),
            response_len: x.region,
            temperature: sampling(r, &self.policy.stop, 0).scoring_temperature(),
            adapters: true,
        };
        let mut order_rng = SplitMix64(self.rng.next_u64());
        let mut order = |n| order_rng.permutation(n);
        let (adv_cfg, upd) = (&self.parts.advantage, &self.upd);
        self.policy.model = match &self.parts.turn_updates {
            None => {
                let (model, optim) = (self.policy.model, &mut self.optim);
                let order = &mut order;
                let ctx = UpdateCtx {
                    adv_cfg,
                    upd,
                    step,
                    lr,
                    order,
                    row,
                    shown: &[],
                };
                update_policy(model, optim, &exp, batch, ctx)?.0
            }
            Some(turns) => {
                let adv = compute_advantages(adv_cfg, batch, step)?;
                row.extend(adv.metrics.to_host());
                let host_exp = LlmExperience {
                    tokens: x.tokens.clone(),
                    mask: x.attention.clone(),
                    ..exp.clone()
                };
                let (model, stats) = sequential_update(
                    self.policy.model,
                    &mut self.optim,
                    UpdateData {
                        experience: &exp,
                        batch,
                        adv: &adv,
                    },
                    Turns {
                        cfg: upd,
                        turns,
                        rescore: &mut |m: &Llama| {
                            host_exp
                                .score_all_chunked(&m.valid(), upd.schedule.micro_batch_rows)
                                .to_device(ad)
                        },
                    },
                    lr,
                    &mut order,
                )?;
                row.extend(stats.metrics);
                model
            }
        };
        Ok(self)
    }

    /// Evaluation when due, then the log row, the samples and the checkpoint; returns whether
    /// the run stops.
    fn end_step(&mut self, step: usize, mut row: Row, t: &Trajectories) -> Result<bool> {
        let r = self.r;
        let end = self.run.step_end(step + 1);
        let evaluated =
            (step + 1).is_multiple_of(r.train.run.eval_every) || step + 1 == r.train.run.steps;
        if evaluated {
            let t_eval = Instant::now();
            let (after, numbers) = evaluate(&self.policy, self.env.as_mut(), r, &self.base)?;
            self.after = after;
            row.extend(numbers);
            row.insert(keys::EVAL_SUCCESS.into(), self.after);
            Timings::record(&mut row, "eval", t_eval.elapsed().as_secs_f64());
        }
        self.steps_done = step + 1;
        let state = self
            .run
            .state(self.steps_done, self.rng.0, self.before, self.after);
        let stats = format!(
            "reward {} success {} turns {:.1} {:.0} tok/s",
            fmt_metric(
                row.get(keys::ROLLOUT_REWARD_MEAN)
                    .copied()
                    .unwrap_or(f64::NAN),
                3
            ),
            fmt_metric(self.after, 3),
            row.get("rollout/turns_mean").copied().unwrap_or(0.0),
            row.get(keys::PERF_TOKENS_PER_S).copied().unwrap_or(0.0),
        );
        let shown = shown(t, r.train.run.log_samples);
        self.run.samples(step + 1, &shown, evaluated)?;
        let (policy, optim) = (&self.policy, &self.optim);
        self.run.end_step(end, row, evaluated, &stats, |d| {
            checkpoint::write_records(d, model_record(policy), optim, &state)
        })
    }
}

/// Policy tokens generated.
fn policy_tokens(t: &Trajectories) -> f64 {
    t.segments
        .iter()
        .flatten()
        .filter(|s| s.log_probs.is_some())
        .map(|s| s.ids.len() as f64)
        .sum()
}

fn trajectory_metrics(row: &mut BTreeMap<String, f64>, step: usize, t: &Trajectories) {
    let rewards = t.rewards();
    let n = rewards.len().max(1) as f64;
    row.insert("step".into(), (step + 1) as f64);
    row.insert(keys::ROLLOUT_REWARD_MEAN.into(), mean(&rewards));
    row.insert(
        "rollout/turns_mean".into(),
        t.turns().iter().sum::<usize>() as f64 / n,
    );
    row.insert(
        "rollout/unfinished_fraction".into(),
        t.unfinished.iter().filter(|u| **u).count() as f64 / n,
    );
    row.extend(t.turn_metrics("rollout/"));
}

/// The first `n` trajectories for `samples.jsonl`: the transcript, reward and turns.
fn shown(t: &Trajectories, n: usize) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let rewards = t.rewards();
    (0..n.min(rewards.len()))
        .map(|i| {
            let mut m = serde_json::Map::new();
            m.insert("transcript".into(), t.texts[i].join(" | ").into());
            m.insert(
                "reward".into(),
                serde_json::Number::from_f64(f64::from(rewards[i]))
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
            );
            m.insert("turns".into(), t.turn_rewards[i].len().into());
            m.insert("group".into(), t.group_ids[i].into());
            m
        })
        .collect()
}

impl<'a> ember_run::Job<'a> for AgentJob<'a> {
    type Recipe = AgentRecipe;
    type Summary = AgentSummary;

    fn setup(r: &'a AgentRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        Self::new(r, out, opts)
    }

    fn run(&self) -> &ember_run::Run {
        &self.run
    }

    /// One RL step; returns whether the run stops after it.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let t_step = Instant::now();
        let rng_at_start = self.rng.0;
        let mut row = Row::new();
        // An error before the update leaves the weights as the last completed step left them,
        // so the run writes that step's checkpoint before it ends.
        let (t, x, batch) = match self.play() {
            Ok(p) => p,
            Err(e) => {
                let done = self.steps_done;
                let state = self.run.state(done, rng_at_start, self.before, self.after);
                let (policy, optim) = (&self.policy, &self.optim);
                return Err(self.run.checkpoint_after_error(done, e, |d| {
                    checkpoint::write_records(d, model_record(policy), optim, &state)
                }));
            }
        };
        let t_gen = t_step.elapsed().as_secs_f64();
        trajectory_metrics(&mut row, step, &t);
        let t_update = Instant::now();
        self = self.update(step, &x, &batch, &mut row)?;
        let _ = self.ad.sync();
        let secs = t_step.elapsed().as_secs_f64();
        let tokens: f64 = policy_tokens(&t);
        Timings::record(&mut row, "gen", t_gen - t.env_seconds);
        Timings::record(&mut row, "env", t.env_seconds);
        Timings::record(&mut row, "update_actor", t_update.elapsed().as_secs_f64());
        row.insert(keys::PERF_STEP_S.into(), secs);
        row.insert(keys::PERF_TOKENS_PER_S.into(), tokens / secs);
        row.insert("perf/env_share".into(), t.env_seconds / secs);
        let stop = self.end_step(step, row, &t)?;
        Ok((self, stop))
    }

    /// The summary.
    fn finish(mut self, interrupted: bool, _seconds: f64) -> Result<AgentSummary> {
        let r = self.r;
        let (before, after) = (self.before, self.after);
        self.run.finish(&serde_json::json!({
            "name": r.header.name, "algorithm": r.algorithm.name(), "seed": r.header.seed,
            "success_before": before, "success_after": after,
            "steps_done": self.steps_done, "interrupted": interrupted,
        }))?;
        if !interrupted {
            self.run.say(&format!(
                "held-out success {before:.3} -> {after:.3}; run directory {}",
                self.out.display()
            ));
        }
        Ok(AgentSummary {
            success_before: before,
            success_after: after,
            steps_done: self.steps_done,
            interrupted,
        })
    }
}
