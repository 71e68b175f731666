//! `ember train` for LLM recipes: a policy (the tiny character-level Llama warmed up by
//! supervised steps, or a pretrained checkpoint with LoRA) trained on a task with verifiable
//! rewards, evaluated on a held-out split before and after. It reads top to bottom: set-up, then
//! per step rollout → reward → rescoring → filters → advantages and update → log, evaluation and
//! checkpoint (the run kit's end-of-step protocol). Also `ember eval`.

use crate::llm::adaptive::ada_rollout;
use crate::llm::critic::{Critic, update_step};
use crate::llm::remote::Remote;
use crate::llm::replay::{Limits, Replay};
use crate::llm::schema::{Recipe, RolloutBackend};
use crate::llm::score::{Scorer, completions, json_number, shown_samples, valid_mean};
use crate::llm::step::{
    Reference, experience, greedy_sampling, optimizer, prompt_features, rescore, rollout_sampling,
    update_config,
};
use crate::llm::{
    Policy, build_policy, build_policy_with, evaluate, evaluate_sampled, load_checkpoint,
    model_record, read_reference, warm_up, write_final,
};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::{Generation, Llama, SamplingConfig, generate};
use ember_run::{Run, RunOptions, RunSpec, checkpoint, fmt_metric};
use ember_tasks::task::{Example, Rng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

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

/// Runs the recipe, writing into `out`.
pub fn train(r: &Recipe, out: &Path, opts: &RunOptions) -> Result<Summary> {
    // ---- Set-up: run directory, task, reward, policy (warmed up or resumed), reference.
    let start = Instant::now();
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
            curves: ("rollout/reward_mean", "eval/accuracy"),
        },
    )?;
    let task = r.task.build()?;
    let eval = task.held_out_set(r.seed, r.task.eval_size);
    if eval.is_empty() {
        bail!("the task's held-out split is empty");
    }
    let base = crate::common::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    // `[data_parallel]`: checked before the warm-up and the first evaluation.
    let group = crate::common::device::data_parallel(&r.device, r.data_parallel)?;
    // `targets = "plop"`: chosen now, or read back when resuming.
    let placed = crate::llm::plop::place(r, &task, &run, &base)?;
    let r = &placed;
    let mut scorer = Scorer::new(&r.reward)?;
    let max_new = r.rollout.max_new_tokens;
    let mut rng = Rng(r.seed);
    let mut policy = build_policy(r, &ad)?;
    // Every prompt of a dataset is checked now (tokens, context length), not at the step that
    // first draws it, which would stop every resumed run at the same step.
    for e in task.dataset_train().iter().chain(&eval) {
        policy
            .prompt_ids(e, max_new)
            .context("checking the task's prompts before the run")?;
    }
    let reference_path = out.join("reference.bpk");
    let (accuracy_before, mut accuracy_after) = match run.resumed() {
        Some((dir, st)) => {
            policy = load_checkpoint(policy, dir)?;
            rng = Rng(st.rng);
            (st.accuracy_before, st.accuracy_after)
        }
        None => {
            if let (Some(w), None) = (&r.warmup, &policy.lora) {
                let t0 = Instant::now();
                policy.model = warm_up(policy.model, w, &task, &mut rng, &ad)?;
                run.say(&format!(
                    "warm-up: {} steps in {:.1} s",
                    w.steps,
                    t0.elapsed().as_secs_f64()
                ));
            }
            if r.train.run.kl_coef > 0.0 && policy.lora.is_none() {
                let record = policy.model.clone().into_record();
                ember_train::io::write_atomic_with(&reference_path, |tmp| {
                    record.save(tmp).map_err(|e| anyhow!("{e}"))
                })
                .with_context(|| format!("writing {}", reference_path.display()))?;
            }
            let a = evaluate(&policy, &eval, max_new, &base)?;
            run.log(BTreeMap::from([
                ("step".to_string(), 0.0),
                ("eval/accuracy".to_string(), a),
            ]))?;
            (a, a)
        }
    };
    run.say(&format!(
        "held-out accuracy at the start: {accuracy_before:.3}"
    ));
    let parts = r.algorithm_parts();
    let upd = update_config(r, parts.loss);
    let reference = load_reference(r, &policy, &reference_path, &ad)?;
    let kl_reference = (r.train.run.kl_coef > 0.0).then_some(match &reference {
        Some(m) => Reference::Model(m),
        None => Reference::AdaptersOff,
    });
    let mut optim = optimizer(r);
    // PPO's critic starts from the policy as the warm-up left it.
    let mut critic = Critic::new(r, &policy, &ad);
    if let Some(g) = group {
        run.say(&format!(
            "data-parallel update: {} devices, {} reduction",
            g.devices().len(),
            g.reduce()
        ));
        optim = optim.with_data_parallel(g.clone());
        critic = critic.map(|c| c.with_data_parallel(g));
    }
    let mut replay = parts.replay.map(|cfg| Replay {
        cfg,
        buffer: ReplayBuffer::default(),
    });
    if let Some((dir, _)) = run.resumed() {
        optim = checkpoint::load_optimizer(dir, optim)?;
        critic = critic.map(|c| c.load(dir)).transpose()?;
        let limits = Limits {
            step: run.first_step(),
            vocab: policy.model.vocab_size(),
            context: policy.model.max_positions(),
            max_new,
            samples: r.rollout.samples_per_prompt,
        };
        replay = replay.map(|rp| rp.load(dir, &limits)).transpose()?;
    }
    let schedule = r.train.schedule.schedule(r.train.run.steps);
    // `backend = "openai"`: the servers that sample the rollouts.
    let mut remote = match r.rollout.backend {
        RolloutBackend::Local => None,
        RolloutBackend::Openai => Some(Remote::connect(
            &r.rollout.base_urls,
            r.rollout.model.as_deref().unwrap_or_default(),
            r.rollout.request_timeout_s.unwrap_or(600.0),
            r.rollout.request_retries.unwrap_or(3),
            &format!("{}-{}", r.name, std::process::id()),
            &out.join("serving"),
        )?),
    };

    // ---- The RL steps.
    let mut steps_done = run.first_step();
    let mut interrupted = false;
    for step in run.first_step()..r.train.run.steps {
        let t_step = Instant::now();
        let mut row = BTreeMap::new();
        let rng_at_start = rng.0;
        let replay_at_start = replay.as_ref().map(|rp| rp.buffer.clone());
        // Everything before the update: an error here leaves the weights as the last completed
        // step left them, so the run writes that step's checkpoint before it ends.
        let mut before_update = || -> Result<_> {
            // Rollout: n samples of each prompt from the current policy.
            let examples = task.train(&mut rng, r.rollout.prompts_per_step);
            let prompts = examples
                .iter()
                .map(|e| policy.prompt_ids(e, max_new))
                .collect::<Result<Vec<_>>>()?;
            let sampler = policy.model.valid();
            let sc = rollout_sampling(r, &policy.stop, rng.next_u64());
            // Reinforce-Ada draws in rounds, scoring each as it comes; otherwise one draw, here
            // or on the servers (which get this step's adapter first).
            let (g, scored, pool_stats) = match &parts.adaptive {
                None if remote.is_some() => {
                    let rm = remote.as_mut().context("the openai backend")?;
                    let t_sync = Instant::now();
                    rm.sync(&policy, step)?;
                    row.insert("timing_s/sync".into(), t_sync.elapsed().as_secs_f64());
                    let vocab = policy.model.vocab_size();
                    (rm.generate(&prompts, &sc, vocab, &base)?, None, None)
                }
                None => (generate(&sampler, &prompts, &sc, &base)?, None, None),
                Some(ada) => {
                    let a = ada_rollout(
                        ada,
                        r.rollout.samples_per_prompt,
                        &sampler,
                        &prompts,
                        &examples,
                        &sc,
                        &base,
                        (&mut scorer, step + 1, &mut row),
                        &|ids| policy.decode(ids),
                    )?;
                    row.insert("rollout/ada_rounds".into(), a.rounds as f64);
                    row.insert("rollout/ada_samples_drawn".into(), a.drawn as f64);
                    row.insert("rollout/ada_unfinished_prompts".into(), a.unfinished as f64);
                    row.insert("rollout/tokens_drawn".into(), a.tokens_drawn as f64);
                    row.insert("rollout/ada_reward_mean_drawn".into(), a.reward_mean_drawn);
                    let stats = ada.global_stats.then_some((a.pool_mean, a.pool_std));
                    (a.generation, Some(a.rewards), stats)
                }
            };
            let g = g.padded(r.rollout.shape_bucket);
            let responses = g.response_ids();
            // Phase wall times as verl logs them (`timing_s/*`; with Reinforce-Ada `gen` holds
            // the rounds' rewards too); `response_ids` above already waited for the device.
            let mut timing = vec![("timing_s/gen", t_step.elapsed().as_secs_f64())];

            // Reward: the recipe's weighted terms, per row.
            let texts: Vec<String> = responses.iter().map(|r| policy.decode(r)).collect();
            let rewards = match scored {
                Some(r) => r,
                None => scorer.score(step + 1, &completions(&g, &examples, &texts), &mut row)?,
            };

            // Rescoring: old-policy and reference log-probs without gradients; ReMax's greedy
            // baseline.
            // ReRULE: replayed hard groups join the fresh ones; their stored sampler
            // log-probs are the rollout log-probs whose staleness the loss's IS corrects.
            let mixed = match replay.as_mut() {
                Some(rp) => rp.mix((step, r.train.run.steps), &prompts, &g, &rewards, &mut row)?,
                None => None,
            };
            let (gt, rt) = match &mixed {
                Some((g2, r2)) => (g2, r2.as_slice()),
                None => (&g, rewards.as_slice()),
            };
            let (seq, seq_mask) = gt.sequences();
            let host_exp = experience(seq, seq_mask, gt.tokens.dims()[1], &sc);
            let mut batch = RolloutBatch::new(
                gt.mask.clone().to_device(&ad),
                Tensor::from_floats(rt, &ad),
                &gt.group_ids,
            )?
            .with_rollout_log_probs(gt.log_probs.clone().to_device(&ad))?;
            if let Some((mean, std)) = pool_stats {
                batch = batch.with_group_stats(
                    Tensor::from_floats(mean.as_slice(), &ad),
                    Tensor::from_floats(std.as_slice(), &ad),
                )?;
            }
            if let Some(o) = &r.reward.overlong {
                o.apply(&mut batch)?;
            }
            let t_ref = Instant::now();
            // Replayed rows were sampled by an older policy, and servers compute their own
            // numbers: π_old is recomputed.
            let recompute =
                r.train.run.recompute_old_log_probs || replay.is_some() || remote.is_some();
            batch = rescore(batch, &host_exp, &sampler, recompute, kl_reference, &ad)?;
            if recompute || kl_reference.is_some() {
                let _ = base.sync();
                timing.push(("timing_s/ref", t_ref.elapsed().as_secs_f64()));
            }
            if parts.advantage.kind.needs_features() {
                batch = batch.with_features(prompt_features(&sampler, gt).to_device(&ad))?;
            }
            if parts.advantage.kind.needs_greedy_baseline() {
                let baseline = greedy_baseline(
                    &mut scorer,
                    step,
                    &policy,
                    (&sampler, &sc, &base),
                    &prompts,
                    &examples,
                )?;
                let per_row: Vec<f32> = g.group_ids.iter().map(|gi| baseline[*gi]).collect();
                batch =
                    batch.with_baseline_rewards(Tensor::from_floats(per_row.as_slice(), &ad))?;
            }

            // Filters: DAPO's dynamic sampling drops groups whose rewards are all equal.
            let (kept_rows, dropped_groups) = if parts.dynamic_sampling {
                dynamic_sampling_keep(&batch)
            } else {
                ((0..batch.dims()[0]).collect(), 0)
            };
            rollout_metrics(&mut row, step, &rewards, &responses, &g, dropped_groups);
            let shown = shown_samples(
                r.train.run.log_samples,
                &g,
                &examples,
                &texts,
                &responses,
                &rewards,
            );
            Ok((batch, host_exp, kept_rows, responses, timing, shown))
        };
        let (batch, host_exp, kept_rows, responses, mut timing, mut shown) = match before_update() {
            Ok(p) => p,
            Err(e) => {
                let state = run.state(steps_done, rng_at_start, accuracy_before, accuracy_after);
                if let (Some(rp), Some(b)) = (replay.as_mut(), replay_at_start) {
                    rp.buffer = b;
                }
                let extra = (critic.as_ref(), replay.as_ref());
                return Err(run.checkpoint_after_error(steps_done, e, |d| {
                    save_checkpoint(d, &policy, &optim, extra, &state)
                }));
            }
        };
        let lr = schedule.at(step);
        row.insert("actor/lr".to_string(), lr);

        // Advantages and update.
        if !kept_rows.is_empty() {
            let exp = LlmExperience {
                tokens: host_exp.tokens.to_device(&ad),
                mask: host_exp.mask.to_device(&ad),
                ..host_exp
            };
            let (batch, exp) = keep_rows(batch, exp, &kept_rows, &ad)?;
            // The shown rows' places in the kept batch (a row dropped by dynamic sampling has
            // no advantage).
            let places: Vec<(usize, usize)> = (0..shown.len())
                .filter_map(|i| Some((i, kept_rows.iter().position(|k| *k == i)?)))
                .collect();
            let mut order_rng = Rng(rng.next_u64());
            let t_update = Instant::now();
            let kept_places: Vec<usize> = places.iter().map(|p| p.1).collect();
            let shown_adv;
            let mut order = |n| order_rng.permutation(n);
            (policy.model, shown_adv) = update_step(
                policy.model,
                critic.as_mut(),
                &mut optim,
                (&exp, &base, &ad),
                batch,
                &parts.advantage,
                &upd,
                (step, lr),
                &mut order,
                &mut row,
                &kept_places,
            )?;
            for ((i, _), a) in places.iter().zip(shown_adv) {
                shown[*i].insert("advantage".into(), json_number(a));
            }
            let _ = ad.sync();
            // With a critic this includes its values, PACT's rescoring and its update (also
            // logged alone as `timing_s/update_critic`).
            timing.push(("timing_s/update_actor", t_update.elapsed().as_secs_f64()));
        }
        let secs = t_step.elapsed().as_secs_f64();
        let tokens: usize = responses.iter().map(Vec::len).sum();
        row.insert("perf/step_s".to_string(), secs);
        row.insert("perf/tokens_per_s".to_string(), tokens as f64 / secs);
        row.extend(timing.into_iter().map(|(k, v)| (k.to_string(), v)));

        // Log, evaluation, checkpoint.
        let end = run.step_end(step + 1);
        let evaluated = (step + 1) % r.train.run.eval_every == 0 || step + 1 == r.train.run.steps;
        if evaluated {
            let t_eval = Instant::now();
            accuracy_after = evaluate(&policy, &eval, max_new, &base)?;
            row.insert("eval/accuracy".to_string(), accuracy_after);
            if r.eval.samples > 0 {
                // Seeded by the step, apart from the training RNG: evaluating changes nothing
                // of the run.
                let how = (
                    r.eval.samples,
                    r.eval.temperature,
                    r.seed ^ ((step as u64 + 1) << 20),
                );
                row.extend(evaluate_sampled(&policy, &eval, max_new, how, &base)?);
            }
            row.insert("timing_s/eval".to_string(), t_eval.elapsed().as_secs_f64());
        }
        steps_done = step + 1;
        let state = run.state(steps_done, rng.0, accuracy_before, accuracy_after);
        let stats = stats_line(&row, accuracy_after);
        // The samples before the row and its checkpoint: a kill in between leaves them past
        // the checkpoint, where resuming cuts them.
        run.samples(step + 1, &shown, evaluated)?;
        let extra = (critic.as_ref(), replay.as_ref());
        let stop = run.end_step(end, row, evaluated, &stats, |d| {
            save_checkpoint(d, &policy, &optim, extra, &state)
        })?;
        if stop {
            interrupted = true;
            break;
        }
    }

    // ---- The end: final model, summary.
    if !interrupted {
        write_final(&policy, r, out)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    run.finish(&serde_json::json!({
        "name": r.name, "algorithm": r.algorithm.name(), "seed": r.seed,
        "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
        "seconds": seconds, "steps_done": steps_done, "interrupted": interrupted,
    }))?;
    if !interrupted {
        run.say(&format!(
            "held-out accuracy {accuracy_before:.3} -> {accuracy_after:.3} in {seconds:.0} s; run \
             directory {}",
            out.display()
        ));
    }
    Ok(Summary {
        accuracy_before,
        accuracy_after,
        seconds,
        out: out.to_path_buf(),
        steps_done,
        interrupted,
    })
}

/// A checkpoint: the policy (or its adapters), its optimizer, the critic and its optimizer
/// and the replay buffer when the run has them, and the host state.
fn save_checkpoint(
    d: &Path,
    policy: &Policy,
    optim: &ember_train::Optimizer,
    (critic, replay): (Option<&Critic>, Option<&Replay>),
    state: &checkpoint::TrainState,
) -> Result<()> {
    checkpoint::write_records(d, model_record(policy), optim, state)?;
    if let Some(c) = critic {
        c.save(d)?;
    }
    replay.map_or(Ok(()), |rp| rp.save(d))
}

/// The KL reference of the tiny policy: the warm-started weights saved at the start of the run
/// (a LoRA policy's reference is its own weights with adapters off, so none is loaded).
fn load_reference(r: &Recipe, policy: &Policy, path: &Path, ad: &Device) -> Result<Option<Llama>> {
    if !(r.train.run.kl_coef > 0.0 && policy.lora.is_none()) {
        return Ok(None);
    }
    read_reference(r, policy, path, ad).map(Some)
}

/// ReMax's baseline (Li et al. 2024, eq. 5): the reward of each prompt's greedy response.
fn greedy_baseline(
    scorer: &mut Scorer,
    step: usize,
    policy: &Policy,
    (sampler, sc, device): (&Llama, &SamplingConfig, &Device),
    prompts: &[Vec<u32>],
    examples: &[Example],
) -> Result<Vec<f32>> {
    let gg = generate(sampler, prompts, &greedy_sampling(sc), device)?;
    let texts: Vec<String> = gg.response_ids().iter().map(|r| policy.decode(r)).collect();
    let mut scratch = BTreeMap::new();
    scorer.score(step + 1, &completions(&gg, examples, &texts), &mut scratch)
}

/// Keeps `rows` of the batch and of the experience (all of them: unchanged).
fn keep_rows(
    batch: RolloutBatch,
    exp: LlmExperience,
    rows: &[usize],
    ad: &Device,
) -> Result<(RolloutBatch, LlmExperience)> {
    if rows.len() == batch.dims()[0] {
        return Ok((batch, exp));
    }
    let idx: Vec<i64> = rows.iter().map(|x| *x as i64).collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), ad);
    let e = LlmExperience {
        tokens: exp.tokens.clone().select(0, idx.clone()),
        mask: exp.mask.clone().select(0, idx),
        ..exp
    };
    Ok((batch.select(rows)?, e))
}

/// The rollout's metrics (verl's names where verl has them).
fn rollout_metrics(
    row: &mut BTreeMap<String, f64>,
    step: usize,
    rewards: &[f32],
    responses: &[Vec<u32>],
    g: &Generation,
    dropped_groups: usize,
) {
    row.insert("step".to_string(), (step + 1) as f64);
    let (mean, valid) = valid_mean(rewards);
    row.insert("rollout/reward_mean".to_string(), mean);
    row.insert(
        "rollout/invalid_rewards".to_string(),
        (rewards.len() - valid) as f64,
    );
    let lengths: Vec<usize> = responses.iter().map(Vec::len).collect();
    row.insert(
        "rollout/response_length".to_string(),
        lengths.iter().sum::<usize>() as f64 / lengths.len().max(1) as f64,
    );
    row.insert(
        "rollout/truncated_fraction".to_string(),
        g.truncated.iter().filter(|t| **t).count() as f64 / g.truncated.len().max(1) as f64,
    );
    row.insert("rollout/dropped_groups".to_string(), dropped_groups as f64);
}

/// The progress line's numbers: reward, held-out accuracy, the KL to the reference where the
/// loss has one (`actor/kl_loss`), else the old-vs-new policy KL (`actor/approx_kl`), and
/// throughput.
fn stats_line(row: &BTreeMap<String, f64>, acc: f64) -> String {
    let kl = match row.get("actor/kl_loss") {
        Some(k) => format!("kl(ref) {}", fmt_metric(*k, 4)),
        None => format!(
            "kl(old) {}",
            fmt_metric(row.get("actor/approx_kl").copied().unwrap_or(0.0), 4)
        ),
    };
    format!(
        "reward {} acc {} {kl} {:.0} tok/s",
        fmt_metric(
            row.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
            3
        ),
        fmt_metric(acc, 3),
        row.get("perf/tokens_per_s").copied().unwrap_or(0.0),
    )
}

/// `ember eval`: greedy held-out accuracy of a run's final model (or of a checkpoint).
pub fn evaluate_run(
    run: &Path,
    checkpoint_dir: Option<&Path>,
    eval_size: Option<usize>,
) -> Result<f64> {
    let rp = run.join("recipe.resolved.toml");
    let text = std::fs::read_to_string(&rp).with_context(|| format!("reading {}", rp.display()))?;
    let mut r = crate::llm::plop::apply_recorded(&crate::llm::schema::parse(&text, &[])?, run)?;
    if let Some(n) = eval_size {
        r.task.eval_size = n;
    }
    let task = r.task.build()?;
    let eval = task.held_out_set(r.seed, r.task.eval_size);
    let base = crate::common::device::device(&r.device)?;
    let final_dir = run.join("final");
    let policy = match checkpoint_dir {
        Some(d) => load_checkpoint(build_policy(&r, &base)?, d)?,
        None if !final_dir.exists() => bail!(
            "{} has no final/ model (did the run finish?); pass --checkpoint <dir>",
            run.display()
        ),
        None if r.pretrained.is_some() => build_policy_with(&r, &base, Some(&final_dir))?,
        None => Policy {
            model: ember_llm::load(&final_dir, &base)?.model,
            ..build_policy(&r, &base)?
        },
    };
    evaluate(&policy, &eval, r.rollout.max_new_tokens, &base)
}
