//! `ember train` for LLM recipes with an `[offline]` table: the policy learns from a fixed
//! dataset of scored responses (`llm::offline`; `ember rollouts` writes one from the policy's
//! own samples) instead of fresh rollouts. It reads top to bottom: set-up (policy as a run of
//! the recipe starts, its frozen copy as the reference, the data tokenized, pairs or groups
//! chosen), then per step a batch of pairs or groups → the objective's loss → one optimizer step
//! → log, evaluation and checkpoint through the run kit, then the final model.
//!
//! Pairwise objectives (DPO, IPO, SimPO, RPO) compare each batch pair's sequence log-probs
//! under the policy and the reference (`ember_engine::preference_loss`). Group objectives run
//! the engine's estimator and actor loss on each prompt's stored responses, the reference's
//! log-probs standing for the behaviour policy's: A-LoL (group-mean baseline, clipped sequence
//! ratio, positives only; groups drawn in proportion to their positive advantage) and
//! REINFORCE-LOO (leave-one-out baseline, plain log-likelihood weighting).

use crate::common::run::open_run;
use crate::llm::schema::Recipe;
use crate::llm::schema::{OfflineSpec, Pairs};
use crate::llm::step::{Row, rows_generation};
use crate::llm::{Policy, evaluate, load_checkpoint, model_record, read_reference, warm_up};
use crate::llm::{build_policy, write_final};
use crate::offline::data::{TokGroup, keep_first, load, tokenize};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use ember_engine::*;
use ember_llm::Llama;
use ember_llm::actor::LlmExperience;
use ember_run::{Run, RunOptions, checkpoint};
use ember_tasks::task::{Example, Rng, TaskSet};
use ember_train::{Actor, UpdateConfig, UpdateSchedule, update};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// What an offline run reports at the end.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Held-out accuracy at the start.
    pub accuracy_before: f64,
    /// Held-out accuracy at the end.
    pub accuracy_after: f64,
    /// Stopped early with a checkpoint.
    pub interrupted: bool,
}

/// Runs the recipe's offline training into `out`.
pub fn train(r: &Recipe, out: &Path, opts: &RunOptions) -> Result<Summary> {
    let spec: &OfflineSpec = r
        .offline
        .as_ref()
        .context("the recipe has no [offline] table")?;
    let start = Instant::now();
    let curves = ("offline/loss", "eval/accuracy");
    let mut run = open_run(out, opts, (&r.name, r), r.train.run.run_loop(), curves)?;
    let task = r.task.build()?;
    let eval = task.held_out_set(r.seed, r.task.eval_size);
    let base = crate::common::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    // `targets = "plop"`: chosen now, or read back when resuming.
    let placed = crate::llm::plop::place(r, &task, &run, &base)?;
    let r = &placed;
    let max_new = r.rollout.max_new_tokens;
    let policy = build_policy(r, &ad)?;
    // The data first (its tokens do not depend on the weights): a bad file fails before the
    // warm-up.
    let Dataset {
        path,
        groups,
        units,
        usable,
    } = dataset(spec, &policy, max_new)?;
    let pairwise = spec.objective.pairwise();
    let reference_path = out.join("reference.bpk");
    let (policy, mut rng, accuracy_before, mut accuracy_after) = begin(
        &mut run,
        policy,
        (r, &task, &eval),
        &reference_path,
        (&base, &ad),
    )?;
    let mut policy = policy;
    run.say(&format!(
        "held-out accuracy at the start: {accuracy_before:.3}"
    ));
    let reference = match policy.lora {
        None => Some(read_reference(r, &policy, &reference_path, &ad)?),
        Some(_) => None,
    };

    // The reference is frozen: its log-probs of every usable response are scored once.
    let ref_lp = reference_log_probs(&groups, &usable, reference.as_ref(), &policy, &base)?;
    let weights = priorities(spec, &groups, &units);
    let what = if pairwise.is_some() {
        "pairs"
    } else {
        "groups"
    };
    run.say(&format!(
        "{} prompts in {}, {} usable for {} ({} {what})",
        groups.len(),
        path.display(),
        usable.len(),
        spec.objective.name(),
        units.len(),
    ));
    let mut optim = r.train.optim.init();
    if let Some((dir, _)) = run.resumed() {
        optim = checkpoint::load_optimizer(dir, optim)?;
    }
    let schedule = r.train.schedule.schedule(r.train.run.steps);

    let mut steps_done = run.first_step();
    let mut interrupted = false;
    for step in run.first_step()..r.train.run.steps {
        let t_step = Instant::now();
        let lr = schedule.at(step);
        let picked: Vec<Unit> = (0..spec.batch)
            .map(|_| units[draw(&mut rng, units.len(), weights.as_deref())])
            .collect();
        let mut row = BTreeMap::from([
            ("step".to_string(), (step + 1) as f64),
            ("actor/lr".to_string(), lr),
        ]);
        let refm = Scorer {
            ref_lp: &ref_lp,
            policy: &policy,
            base: &base,
            ad: &ad,
            micro_rows: group_micro_rows(r.train.update.micro_batch_rows),
        };
        let (m, loss) = objective_step(&refm, &groups, &picked, spec, &mut optim, lr)?;
        policy.model = m;
        row.extend(loss);
        row.insert("perf/step_s".into(), t_step.elapsed().as_secs_f64());

        let end = run.step_end(step + 1);
        let evaluated =
            (step + 1).is_multiple_of(r.train.run.eval_every) || step + 1 == r.train.run.steps;
        if evaluated {
            accuracy_after = evaluate(&policy, &eval, max_new, &base)?;
            row.insert("eval/accuracy".into(), accuracy_after);
        }
        steps_done = step + 1;
        let state = run.state(steps_done, rng.0, accuracy_before, accuracy_after);
        let stats = format!(
            "loss {:.4} acc {accuracy_after:.3}",
            row.get("offline/loss").copied().unwrap_or(f64::NAN)
        );
        let stop = run.end_step(end, row, evaluated, &stats, |d| {
            checkpoint::write_records(d, model_record(&policy), &optim, &state)
        })?;
        if stop {
            interrupted = true;
            break;
        }
    }
    let what = (usable.len(), units.len(), steps_done, interrupted);
    finish(
        run,
        &policy,
        (r, spec, out),
        (accuracy_before, accuracy_after),
        what,
        start,
    )
}

/// The end: the final model (unless stopped), the summary; `(prompts usable, draws, steps
/// done, interrupted)`.
fn finish(
    mut run: Run,
    policy: &Policy,
    (r, spec, out): (&Recipe, &OfflineSpec, &Path),
    (accuracy_before, accuracy_after): (f64, f64),
    (usable, draws, steps_done, interrupted): (usize, usize, usize, bool),
    start: Instant,
) -> Result<Summary> {
    if !interrupted {
        write_final(policy, r, out)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    run.finish(&serde_json::json!({
        "name": r.name, "objective": spec.objective.name(), "seed": r.seed,
        "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
        "seconds": seconds, "steps_done": steps_done, "interrupted": interrupted,
        "prompts_usable": usable, "draws": draws,
    }))?;
    if !interrupted {
        run.say(&format!(
            "held-out accuracy {accuracy_before:.3} -> {accuracy_after:.3} in {seconds:.0} s"
        ));
    }
    Ok(Summary {
        accuracy_before,
        accuracy_after,
        interrupted,
    })
}

/// The offline data as a run uses it: its path, the tokenized groups, what a step draws, and
/// the prompts that have something to draw.
struct Dataset {
    path: std::path::PathBuf,
    groups: Vec<TokGroup>,
    units: Vec<Unit>,
    usable: Vec<usize>,
}

/// Reads and tokenizes the data: groups with a pair (pairwise objectives) or with two valid
/// rewards (group objectives); an error when no prompt has one.
fn dataset(spec: &OfflineSpec, policy: &Policy, max_new: usize) -> Result<Dataset> {
    let path = spec.path()?;
    let raw = load(&path).with_context(|| {
        format!(
            "the [offline] data ({}); `ember rollouts <recipe> --out <file>` writes one",
            spec.data
        )
    })?;
    let raw = match spec.responses {
        Some(k) => keep_first(raw, k),
        None => raw,
    };
    let mut groups = tokenize(policy, &raw, max_new)
        .with_context(|| format!("tokenizing {}", path.display()))?;
    // SFT: every response a demonstration (reward 1, so A = 1 and the loss is −log π).
    let sft = spec.objective.is_sft();
    groups
        .iter_mut()
        .filter(|_| sft)
        .for_each(|g| g.rewards.fill(1.0));
    let pairwise = spec.objective.pairwise();
    if pairwise.is_some() && spec.pairs == Pairs::All {
        crate::offline::data::check_pair_count(&groups, &path)?;
    }
    let units =
        crate::offline::data::units(&groups, pairwise.is_some(), spec.pairs == Pairs::All, sft);
    let mut usable: Vec<usize> = units.iter().map(|u| u.0).collect();
    usable.dedup();
    if usable.is_empty() {
        bail!(
            "{}: no prompt has {} for objective {:?}",
            path.display(),
            if pairwise.is_some() {
                "two responses with different rewards (or an explicit pair)"
            } else if sft {
                "a response"
            } else {
                "two responses with valid rewards"
            },
            spec.objective.name()
        );
    }
    Ok(Dataset {
        path,
        groups,
        units,
        usable,
    })
}

/// A resumed run's policy, RNG and accuracies; a fresh run's warm-up, reference and first
/// evaluation.
fn begin(
    run: &mut Run,
    policy: Policy,
    (r, task, eval): (&Recipe, &TaskSet, &[Example]),
    reference_path: &Path,
    (base, ad): (&Device, &Device),
) -> Result<(Policy, Rng, f64, f64)> {
    if let Some((dir, st)) = run.resumed() {
        let policy = load_checkpoint(policy, dir)?;
        return Ok((policy, Rng(st.rng), st.accuracy_before, st.accuracy_after));
    }
    let mut rng = Rng(r.seed);
    let policy = fresh_start(policy, r, task, &mut rng, reference_path, ad)?;
    let a = evaluate(&policy, eval, r.rollout.max_new_tokens, base)?;
    run.log(BTreeMap::from([
        ("step".to_string(), 0.0),
        ("eval/accuracy".to_string(), a),
    ]))?;
    Ok((policy, rng, a, a))
}

/// A fresh run's policy: the tiny model warmed up, and its frozen copy written as the
/// reference (a LoRA policy's reference is its weights with adapters off).
fn fresh_start(
    mut policy: Policy,
    r: &Recipe,
    task: &TaskSet,
    rng: &mut Rng,
    reference_path: &Path,
    ad: &Device,
) -> Result<Policy> {
    if let (Some(w), None) = (&r.warmup, &policy.lora) {
        let vocab = policy.vocab();
        policy.model = warm_up(policy.model, vocab, w, task, rng, ad)?;
    }
    if policy.lora.is_none() {
        let record = policy.model.clone().into_record();
        ember_train::io::write_atomic_with(reference_path, |tmp| {
            record.save(tmp).map_err(|e| anyhow!("{e}"))
        })?;
    }
    Ok(policy)
}

/// A-LoL's priority (all three variants): each group's summed positive advantage; uniform
/// draws for the other objectives.
fn priorities(spec: &OfflineSpec, groups: &[TokGroup], units: &[Unit]) -> Option<Vec<f64>> {
    spec.objective
        .is_alol()
        .then(|| units.iter().map(|u| positive_mass(&groups[u.0])).collect())
}

/// One optimizer step of the objective on the drawn units: pairwise or group.
fn objective_step(
    refm: &Scorer,
    groups: &[TokGroup],
    picked: &[Unit],
    spec: &OfflineSpec,
    optim: &mut ember_train::Optimizer,
    lr: f64,
) -> Result<(Llama, BTreeMap<String, f64>)> {
    match (spec.objective.pairwise(), spec.objective.group()) {
        (Some(kind), _) => pair_step(refm, groups, picked, &kind, spec, optim, lr),
        (None, Some((adv_cfg, loss))) => group_step(refm, groups, picked, adv_cfg, loss, optim, lr),
        (None, None) => bail!("objective {:?} has no loss", spec.objective.name()),
    }
}

/// What a step draws: a group, and for the pairwise objectives one of its (chosen, rejected)
/// pairs.
use crate::offline::data::Unit;

/// Σ_i max(0, R_i − mean R) over a group's valid rewards.
fn positive_mass(g: &TokGroup) -> f64 {
    let v: Vec<f64> = g
        .rewards
        .iter()
        .map(|x| f64::from(*x))
        .filter(|&x| ember_engine::is_valid_reward(x))
        .collect();
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    v.iter().map(|x| (x - mean).max(0.0)).sum()
}

/// An index below `n`: uniform, or in proportion to `weights` (uniform when they are all 0).
fn draw(rng: &mut Rng, n: usize, weights: Option<&[f64]>) -> usize {
    let total: f64 = weights.map_or(0.0, |w| w.iter().sum());
    match weights {
        Some(w) if total > 0.0 => {
            let mut u = rng.uniform(0.0, total);
            for (i, x) in w.iter().enumerate() {
                if u < *x {
                    return i;
                }
                u -= x;
            }
            w.len() - 1
        }
        _ => rng.below(n as u64) as usize,
    }
}

/// The reference's per-token log-probs of every response of the `usable` groups (`[group]
/// [response][token]`, empty for the others): the tiny policy's frozen copy, or a LoRA policy
/// with its adapters off, scored in chunks without gradients and read to the host once.
fn reference_log_probs(
    groups: &[TokGroup],
    usable: &[usize],
    reference: Option<&Llama>,
    policy: &Policy,
    base: &Device,
) -> Result<Vec<Vec<Vec<f32>>>> {
    const CHUNK: usize = 256;
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); groups.len()];
    let all: Vec<(usize, usize)> = usable
        .iter()
        .flat_map(|&gi| (0..groups[gi].responses.len()).map(move |ri| (gi, ri)))
        .collect();
    let sampler = policy.model.valid();
    for chunk in all.chunks(CHUNK) {
        let rows: Vec<Row> = chunk
            .iter()
            .map(|&(gi, ri)| Row {
                prompt: &groups[gi].prompt,
                response: &groups[gi].responses[ri],
                log_probs: None,
                truncated: false,
            })
            .collect();
        let g = rows_generation(&rows, (0..rows.len()).collect(), base);
        let (seq, mask) = g.sequences();
        let n = g.tokens.dims()[1];
        let exp = LlmExperience {
            tokens: seq,
            mask,
            response_len: n,
            temperature: 1.0,
            // The tiny reference has no adapters; a LoRA policy is its own reference with
            // them off.
            adapters: reference.is_some(),
        };
        let lp = match reference {
            Some(m) => exp.score_all(m),
            None => exp.score_all(&sampler),
        };
        let v: Vec<f32> = lp
            .try_into_vec_as::<f32>()
            .map_err(|e| anyhow!("reading the reference's log-probs: {e:?}"))?;
        for (k, &(gi, ri)) in chunk.iter().enumerate() {
            let len = groups[gi].responses[ri].len();
            out[gi].push(v[k * n..k * n + len].to_vec());
        }
    }
    Ok(out)
}

/// What a step scores with: the reference's stored log-probs, the policy, the devices, and the
/// rows per forward/backward of a group step.
struct Scorer<'a> {
    ref_lp: &'a [Vec<Vec<f32>>],
    policy: &'a Policy,
    base: &'a Device,
    ad: &'a Device,
    micro_rows: usize,
}

/// Rows per forward/backward of a group objective's step: `train.micro_batch_rows`, or 256 when
/// it is 0. A step takes every response of its groups, and a dataset may give one prompt
/// thousands of them: one pass over all of them held memory in proportion (8.2 GB for 20 000
/// responses × 4 draws), where micro-batches accumulate the same gradient in bounded memory.
fn group_micro_rows(configured: usize) -> usize {
    if configured == 0 { 256 } else { configured }
}

impl Scorer<'_> {
    /// Response `ri` of group `gi` as a row carrying the reference's log-probs.
    fn row<'g>(&'g self, groups: &'g [TokGroup], gi: usize, ri: usize) -> Row<'g> {
        Row {
            prompt: &groups[gi].prompt,
            response: &groups[gi].responses[ri],
            log_probs: Some(&self.ref_lp[gi][ri]),
            truncated: false,
        }
    }

    /// The rows as experience on the training device, and the reference's per-token log-probs
    /// `[rows, n]` (from the rows; 0 on padding).
    fn rows(&self, rows: &[Row], groups: Vec<usize>) -> Result<(LlmExperience, Tensor<2>)> {
        let g = rows_generation(rows, groups, self.base);
        let (seq, mask) = g.sequences();
        let exp = LlmExperience {
            tokens: seq.to_device(self.ad),
            mask: mask.to_device(self.ad),
            response_len: g.tokens.dims()[1],
            temperature: 1.0,
            adapters: true,
        };
        Ok((exp, g.log_probs.to_device(self.ad)))
    }
}

/// One pairwise step: chosen rows then rejected rows, sequence sums, the objective, one
/// optimizer step.
fn pair_step(
    s: &Scorer,
    groups: &[TokGroup],
    picked: &[Unit],
    kind: &PreferenceLoss,
    spec: &OfflineSpec,
    optim: &mut ember_train::Optimizer,
    lr: f64,
) -> Result<(Llama, BTreeMap<String, f64>)> {
    let b = picked.len();
    let mut rows = Vec::with_capacity(2 * b);
    let mut rewards = Vec::with_capacity(2 * b);
    for side in 0..2 {
        for &(gi, pair) in picked {
            let g = &groups[gi];
            let (w, l) = pair.context("a pairwise draw without a pair")?;
            let i = if side == 0 { w } else { l };
            rows.push(s.row(groups, gi, i));
            let r = g.rewards[i];
            rewards.push(if ember_engine::is_valid_reward(r.into()) {
                r
            } else {
                0.0
            });
        }
    }
    let (exp, ref_lp) = s.rows(&rows, (0..2 * b).collect())?;
    let mask = exp.mask.clone().slice([
        0..2 * b,
        exp.mask.dims()[1] - exp.response_len..exp.mask.dims()[1],
    ]);
    let model = s.policy.model.clone();
    let all: Vec<usize> = (0..2 * b).collect();
    let lp = model.score(&exp, &all, false).log_probs * mask.clone();
    let sums = lp.sum_dim(1).reshape([2 * b]);
    let ref_sums = ref_lp.sum_dim(1).reshape([2 * b]);
    let lens = mask.sum_dim(1).reshape([2 * b]);
    let r = Tensor::<1>::from_floats(rewards.as_slice(), s.ad);
    let half = |t: &Tensor<1>, k: usize| t.clone().narrow(0, k * b, b);
    let input = PairInput {
        chosen: half(&sums, 0),
        rejected: half(&sums, 1),
        chosen_ref: half(&ref_sums, 0),
        rejected_ref: half(&ref_sums, 1),
        chosen_len: half(&lens, 0),
        rejected_len: half(&lens, 1),
        chosen_reward: half(&r, 0),
        rejected_reward: half(&r, 1),
    };
    let (loss, metrics) = preference_loss(kind, &input, spec.average_log_probs)?;
    let mut out = metrics.to_host();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let (model, report) = optim.step(lr, model, grads);
    out.insert("actor/grad_norm".into(), report.grad_norm);
    out.insert(
        "offline/loss".into(),
        out.get("preference/loss").copied().unwrap_or(f64::NAN),
    );
    Ok((model, out))
}

/// One group step: every stored response of the picked prompts through the engine's estimator
/// and actor loss, the reference's log-probs as the behaviour policy's.
fn group_step(
    s: &Scorer,
    groups: &[TokGroup],
    picked: &[Unit],
    adv_cfg: AdvantageConfig,
    loss: ActorLossConfig,
    optim: &mut ember_train::Optimizer,
    lr: f64,
) -> Result<(Llama, BTreeMap<String, f64>)> {
    let mut rows = Vec::new();
    let (mut ids, mut rewards) = (Vec::new(), Vec::new());
    for (k, &(gi, _)) in picked.iter().enumerate() {
        let g = &groups[gi];
        for i in 0..g.responses.len() {
            rows.push(s.row(groups, gi, i));
            ids.push(k);
            rewards.push(g.rewards[i]);
        }
    }
    let (exp, ref_lp) = s.rows(&rows, ids.clone())?;
    let n = exp.response_len;
    let t = exp.mask.dims()[1];
    let mask = exp.mask.clone().slice([0..rows.len(), t - n..t]);
    let batch = RolloutBatch::new(mask, Tensor::from_floats(rewards.as_slice(), s.ad), &ids)?
        .with_old_log_probs(ref_lp.clone())?
        .with_ref_log_probs(ref_lp)?;
    let adv = compute_advantages(&adv_cfg, &batch, 0)?;
    let mut out = adv.metrics.to_host();
    let cfg = UpdateConfig {
        schedule: UpdateSchedule {
            micro_batch_rows: s.micro_rows,
            ..UpdateSchedule::default()
        },
        loss,
    };
    let (model, stats) = update(
        s.policy.model.clone(),
        optim,
        (&exp, &batch, &adv),
        &cfg,
        lr,
        &mut |m| (0..m).collect(),
    )?;
    out.extend(stats.metrics);
    out.insert(
        "offline/loss".into(),
        out.get("actor/loss").copied().unwrap_or(f64::NAN),
    );
    Ok((model, out))
}
