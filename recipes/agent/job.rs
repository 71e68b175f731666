//! `ember train` for `kind = "agent"` recipes: the tiny policy plays multi-turn episodes of an
//! environment; each step's trajectories (turns and observations in one row, observations
//! masked out of the loss) go through the preset's advantage estimator and the trainer, with
//! the run kit's logs, checkpoints and resume. Held-out success is the greedy policy's mean
//! reward on episodes fixed by a hash of their seeds.

use crate::agent::rollout::{Trajectories, rollout, warm_up};
use crate::agent::schema::{AgentRecipe, EnvSpec};
use crate::llm::step::update_policy;
use crate::llm::{Policy, load_checkpoint, model_record, policy_from_specs};
use anyhow::Result;
use burn::module::Module;
use burn::tensor::{Device, Tensor};
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::{Llama, SamplingConfig};
use ember_run::{Run, RunOptions, RunSpec, checkpoint, fmt_metric};
use ember_tasks::env::builtin::{Calculator, GuessNumber};
use ember_tasks::env::external::ExternalEnv;
use ember_tasks::env::{Environment, EpisodeSource};
use ember_tasks::task::Rng;
use ember_train::{UpdateConfig, sequential_update};
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
pub fn environment(r: &AgentRecipe) -> Result<Box<dyn Environment>> {
    Ok(match &r.env {
        EnvSpec::Guess { max } => Box::new(GuessNumber::new(*max, r.rollout.max_turns)),
        EnvSpec::Calculator {
            digits,
            instructions,
        } => {
            Box::new(Calculator::new(*digits, r.rollout.max_turns).with_instructions(*instructions))
        }
        EnvSpec::External(x) => Box::new(ExternalEnv::spawn(x)?),
    })
}

/// Held-out success: the mean reward of one greedy episode per held-out seed.
fn evaluate(
    policy: &Policy,
    env: &mut dyn Environment,
    r: &AgentRecipe,
    device: &Device,
) -> Result<f64> {
    let seeds = EpisodeSource::held_out_set(r.eval_episodes);
    let sc = SamplingConfig {
        temperature: 0.0,
        ..sampling(r, &policy.stop, 0)
    };
    let sampler = policy.model.valid();
    let t = rollout(
        policy,
        &sampler,
        env,
        &seeds,
        1,
        r.rollout.max_turns,
        &sc,
        device,
    )?;
    Ok(mean(&t.rewards()))
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

/// Trains `r` into `out`.
pub fn train(r: &AgentRecipe, out: &Path, opts: &RunOptions) -> Result<AgentSummary> {
    let resolved = toml::to_string_pretty(r)?;
    let mut run = Run::open(
        out,
        opts,
        &RunSpec {
            name: &r.name,
            resolved: &resolved,
            steps: r.train.run.steps,
            checkpoint_every: r.train.run.checkpoint_every,
            keep_checkpoints: r.train.run.keep_checkpoints,
            curves: ("rollout/reward_mean", "eval/success"),
        },
    )?;
    let parts = r.algorithm_parts();
    let base = crate::common::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let mut env = environment(r)?;
    let mut policy = policy_from_specs(r.model.as_ref(), r.pretrained.as_ref(), r.seed, &ad, None)?;
    // A chat template that cannot extend a conversation is refused now, not at the first turn.
    policy.turn_end()?;
    let mut rng = Rng(r.seed);
    let (before, mut after) = match run.resumed() {
        Some((dir, st)) => {
            policy = load_checkpoint(policy, dir)?;
            rng = Rng(st.rng);
            (st.accuracy_before, st.accuracy_after)
        }
        None => {
            if let Some(w) = &r.warmup {
                let t0 = Instant::now();
                policy = warm_up(
                    policy,
                    env.as_ref(),
                    (w.steps, w.batch, w.lr),
                    &mut rng,
                    &ad,
                )?;
                run.say(&format!(
                    "warm-up: {} steps in {:.1} s",
                    w.steps,
                    t0.elapsed().as_secs_f64()
                ));
            }
            let s = evaluate(&policy, env.as_mut(), r, &base)?;
            run.log(BTreeMap::from([
                ("step".to_string(), 0.0),
                ("eval/success".to_string(), s),
            ]))?;
            (s, s)
        }
    };
    run.say(&format!("held-out success at the start: {before:.3}"));
    let upd = UpdateConfig {
        schedule: r.train.update,
        loss: parts.loss,
    };
    let mut optim = r.train.optim.init();
    if let Some((dir, _)) = run.resumed() {
        optim = checkpoint::load_optimizer(dir, optim)?;
    }
    let schedule = r.train.schedule.schedule(r.train.run.steps);
    let mut steps_done = run.first_step();
    let mut interrupted = false;
    for step in run.first_step()..r.train.run.steps {
        let t_step = Instant::now();
        let rng_at_start = rng.0;
        let mut row = BTreeMap::new();
        let played = (|| -> Result<_> {
            let seeds = EpisodeSource::train(&mut rng, r.rollout.episodes_per_step);
            let sampler = policy.model.valid();
            let sc = sampling(r, &policy.stop, rng.next_u64());
            let t = rollout(
                &policy,
                &sampler,
                env.as_mut(),
                &seeds,
                r.rollout.samples_per_episode,
                r.rollout.max_turns,
                &sc,
                &base,
            )?;
            let x = t.tensors(&base)?;
            // The turn rewards sit on each turn's last token; the outcome slot is 0, or NaN for
            // an episode with a non-finite turn reward (invalid, masked and counted). Outcome
            // estimators then see the sum of the turn rewards, turn-level ones each turn's.
            let outcome: Vec<f32> = t
                .turn_rewards
                .iter()
                .map(|r| {
                    let sane = r.iter().all(|x| x.abs() <= REWARD_LIMIT)
                        && r.iter().sum::<f32>().abs() <= REWARD_LIMIT;
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
            // Rows made invalid above contribute no per-step reward either.
            let turn_rewards = x.turn_rewards.clone();
            let insane = turn_rewards.clone().abs().greater_elem(REWARD_LIMIT);
            let turn_rewards = turn_rewards
                .clone()
                .mask_fill(turn_rewards.is_finite().bool_not(), 0.0)
                .mask_fill(insane, 0.0);
            let batch = RolloutBatch::new(
                x.loss_mask.clone().to_device(&ad),
                Tensor::from_floats(outcome.as_slice(), &ad),
                &t.group_ids,
            )?
            .with_token_rewards(turn_rewards.to_device(&ad))?
            .with_turns(x.turn_ids.clone().to_device(&ad))?
            .with_rollout_log_probs(x.log_probs.clone().to_device(&ad))?;
            Ok((t, x, batch))
        })();
        let (t, x, batch) = match played {
            Ok(p) => p,
            Err(e) => {
                let state = run.state(steps_done, rng_at_start, before, after);
                return Err(run.checkpoint_after_error(steps_done, e, |d| {
                    checkpoint::write_records(d, model_record(&policy), &optim, &state)
                }));
            }
        };
        let t_gen = t_step.elapsed().as_secs_f64();
        trajectory_metrics(&mut row, step, &t);
        let lr = schedule.at(step);
        row.insert("actor/lr".into(), lr);
        let exp = LlmExperience {
            tokens: x.tokens.clone().to_device(&ad),
            mask: x.attention.clone().to_device(&ad),
            response_len: x.region,
            temperature: sampling(r, &policy.stop, 0).scoring_temperature(),
            adapters: true,
        };
        let mut order_rng = Rng(rng.next_u64());
        let t_update = Instant::now();
        policy.model = match &parts.turn_updates {
            None => {
                update_policy(
                    policy.model,
                    &mut optim,
                    &exp,
                    &batch,
                    &parts.advantage,
                    &upd,
                    step,
                    lr,
                    &mut |n| order_rng.permutation(n),
                    &mut row,
                    &[],
                )?
                .0
            }
            Some(turns) => {
                let adv = compute_advantages(&parts.advantage, &batch, step)?;
                row.extend(adv.metrics.to_host());
                // Rescoring between turn updates runs without the autodiff graph, in the
                // update's micro-batches.
                let host_exp = LlmExperience {
                    tokens: x.tokens.clone(),
                    mask: x.attention.clone(),
                    ..exp.clone()
                };
                let (model, stats) = sequential_update(
                    policy.model,
                    &mut optim,
                    &exp,
                    &batch,
                    &adv,
                    &upd,
                    turns,
                    lr,
                    &mut |n| order_rng.permutation(n),
                    &mut |m: &Llama| {
                        host_exp
                            .score_all_chunked(&m.valid(), upd.schedule.micro_batch_rows)
                            .to_device(&ad)
                    },
                )?;
                row.extend(stats.metrics);
                model
            }
        };
        let _ = ad.sync();
        let secs = t_step.elapsed().as_secs_f64();
        let tokens: f64 = policy_tokens(&t);
        row.insert("timing_s/gen".into(), t_gen - t.env_seconds);
        row.insert("timing_s/env".into(), t.env_seconds);
        row.insert(
            "timing_s/update_actor".into(),
            t_update.elapsed().as_secs_f64(),
        );
        row.insert("perf/step_s".into(), secs);
        row.insert("perf/tokens_per_s".into(), tokens / secs);
        row.insert("perf/env_share".into(), t.env_seconds / secs);

        let end = run.step_end(step + 1);
        let evaluated = (step + 1) % r.train.run.eval_every == 0 || step + 1 == r.train.run.steps;
        if evaluated {
            let t_eval = Instant::now();
            after = evaluate(&policy, env.as_mut(), r, &base)?;
            row.insert("eval/success".into(), after);
            row.insert("timing_s/eval".into(), t_eval.elapsed().as_secs_f64());
        }
        steps_done = step + 1;
        let state = run.state(steps_done, rng.0, before, after);
        let stats = format!(
            "reward {} success {} turns {:.1} {:.0} tok/s",
            fmt_metric(
                row.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
                3
            ),
            fmt_metric(after, 3),
            row.get("rollout/turns_mean").copied().unwrap_or(0.0),
            row.get("perf/tokens_per_s").copied().unwrap_or(0.0),
        );
        let shown = shown(&t, r.train.run.log_samples);
        run.samples(step + 1, &shown, evaluated)?;
        let stop = run.end_step(end, row, evaluated, &stats, |d| {
            checkpoint::write_records(d, model_record(&policy), &optim, &state)
        })?;
        if stop {
            interrupted = true;
            break;
        }
    }
    run.finish(&serde_json::json!({
        "name": r.name, "algorithm": r.algorithm.name(), "seed": r.seed,
        "success_before": before, "success_after": after,
        "steps_done": steps_done, "interrupted": interrupted,
    }))?;
    if !interrupted {
        run.say(&format!(
            "held-out success {before:.3} -> {after:.3}; run directory {}",
            out.display()
        ));
    }
    Ok(AgentSummary {
        success_before: before,
        success_after: after,
        steps_done,
        interrupted,
    })
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
    row.insert("rollout/reward_mean".into(), mean(&rewards));
    row.insert(
        "rollout/turns_mean".into(),
        t.turns().iter().sum::<usize>() as f64 / n,
    );
    row.insert(
        "rollout/unfinished_fraction".into(),
        t.unfinished.iter().filter(|u| **u).count() as f64 / n,
    );
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
