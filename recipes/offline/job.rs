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
use crate::llm::build_policy;
use crate::llm::plop::Placing;
use crate::llm::read_reference;
use crate::llm::schema::Recipe;
use crate::llm::schema::{AlolValue, OfflineSpec, Pairs, Pool};
use crate::lm::step::{TokenRow, rows_generation};
use crate::lm::write_final;
use crate::lm::{Policy, evaluate, load_checkpoint, model_record, warm_up};
use crate::offline::data::{TokGroup, Unit, keep_first, load, tokenize};
use crate::offline::objective::{Scorer, group_micro_rows, objective_step};
use crate::offline::value::value_estimate;
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::tensor::Device;
use ember_engine::SplitMix64;
use ember_engine::keys;
use ember_llm::Llama;
use ember_llm::actor::LlmExperience;
use ember_run::{Row, Run, RunOptions, checkpoint};
use ember_tasks::task::{Example, TaskSet};
use ember_train::LrSchedule;
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
    ember_run::train::<OfflineJob>(&Placing::new(r), out, opts)
}

/// What an offline run is of: the recipe (its LoRA targets placed), its `[offline]` table, and
/// the run directory.
#[derive(Clone, Copy)]
struct Place<'a> {
    r: &'a Recipe,
    spec: &'a OfflineSpec,
    out: &'a Path,
}

/// The offline run between steps: the data and what a step draws from it, the frozen
/// reference's log-probs, the policy and its optimizer.
struct OfflineJob<'a> {
    at: Place<'a>,
    run: Run,
    eval: Vec<Example>,
    base: Device,
    ad: Device,
    policy: Policy,
    optim: ember_train::Optimizer,
    schedule: LrSchedule,
    rng: SplitMix64,
    groups: Vec<TokGroup>,
    units: Vec<Unit>,
    /// A-LoL's draw weights (each unit's positive advantage mass).
    weights: Option<Vec<f64>>,
    /// The reference's log-probs of every usable response, scored once.
    ref_lp: Vec<Vec<Vec<f32>>>,
    /// A-LoL's fitted V(x) per group (`value = "head"`).
    values: Option<Vec<f32>>,
    /// Prompts with something to draw.
    usable: usize,
    accuracy_before: f64,
    accuracy_after: f64,
    steps_done: usize,
}

impl<'a> OfflineJob<'a> {
    /// The data tokenized (before the warm-up: its tokens do not depend on the weights, and a
    /// bad file fails first), the policy warmed up or resumed, the reference scored.
    fn new(at: Place<'a>, mut run: Run, task: &TaskSet, base: Device) -> Result<Self> {
        let Place { r, spec, out } = at;
        let eval = task.held_out_set(r.header.seed, r.task.eval_size);
        let ad = base.clone().autodiff();
        let policy = build_policy(r, &ad)?;
        let data = dataset(spec, &policy, r.rollout.max_new_tokens)?;
        let reference_path = out.join("reference.bpk");
        // A resumed run's policy, RNG and accuracies; a fresh run's warm-up, reference and
        // first evaluation.
        let (policy, rng, accuracy_before, accuracy_after) = match run.resumed() {
            Some((dir, st)) => {
                let (rng, before, after) =
                    (SplitMix64(st.rng), st.accuracy_before, st.accuracy_after);
                (load_checkpoint(policy, dir)?, rng, before, after)
            }
            None => {
                let mut rng = SplitMix64(r.header.seed);
                let policy = fresh_start(policy, r, task, &mut rng, &reference_path, &ad)?;
                let a = evaluate(&policy, &eval, r.rollout.max_new_tokens, &base)?;
                run.log(Row::from([
                    ("step".to_string(), 0.0),
                    (keys::EVAL_ACCURACY.to_string(), a),
                ]))?;
                (policy, rng, a, a)
            }
        };
        run.say(&format!(
            "held-out accuracy at the start: {accuracy_before:.3}"
        ));
        let reference = match policy.lora {
            None => Some(read_reference(r, &policy, &reference_path, &ad)?),
            Some(_) => None,
        };
        let Dataset {
            path,
            groups,
            units,
            usable,
        } = data;
        let ref_lp = reference_log_probs(&groups, &usable, reference.as_ref(), &policy, &base)?;
        let values = match spec.objective.alol_value() {
            Some(AlolValue::Head) => {
                let v = value_estimate(&groups, &usable, reference.as_ref(), &policy, &base)?;
                run.say(&format!(
                    "A-LoL's value head: mean squared error {:.4} on the file's rewards (their \
                     mean alone: {:.4})",
                    v.mse, v.mse_of_mean
                ));
                Some(v.values)
            }
            _ => None,
        };
        let what = match spec.objective.pairwise() {
            Some(_) => "pairs",
            None => "groups",
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
        Ok(OfflineJob {
            at,
            eval,
            ad,
            optim,
            schedule: r.train.schedule.schedule(r.train.run.steps),
            rng,
            weights: priorities(spec, &groups, &units, values.as_deref()),
            values,
            groups,
            units,
            ref_lp,
            usable: usable.len(),
            accuracy_before,
            accuracy_after,
            steps_done: run.first_step(),
            run,
            base,
            policy,
        })
    }
}

impl<'a> ember_run::Job<'a> for OfflineJob<'a> {
    type Recipe = Placing<'a>;
    type Summary = Summary;

    /// The run directory, the task and the device, the LoRA targets placed, then the job.
    fn setup(p: &'a Placing<'a>, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        let r = p.given();
        let spec: &OfflineSpec = r
            .offline
            .as_ref()
            .context("the recipe has no [offline] table")?;
        let curves = ("offline/loss", keys::EVAL_ACCURACY);
        let run = open_run(out, opts, &r.header.name, r, r.train.run.run_loop(), curves)?;
        let task = r.task.build()?;
        let base = crate::common::device::device(&r.header.device)?;
        let r = p.place(&task, &run, &base)?;
        OfflineJob::new(Place { r, spec, out }, run, &task, base)
    }

    fn run(&self) -> &Run {
        &self.run
    }

    /// A batch of pairs or groups → the objective's loss → one optimizer step → log,
    /// evaluation and checkpoint.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let Place { r, spec, .. } = self.at;
        let t_step = Instant::now();
        let lr = self.schedule.at(step);
        let n = self.units.len();
        let picked: Vec<Unit> = (0..spec.batch)
            .map(|_| self.units[draw(&mut self.rng, n, self.weights.as_deref())])
            .collect();
        let mut row = Row::from([
            ("step".to_string(), (step + 1) as f64),
            (keys::ACTOR_LR.to_string(), lr),
        ]);
        let refm = Scorer {
            ref_lp: &self.ref_lp,
            values: self.values.as_deref(),
            policy: &self.policy,
            base: &self.base,
            ad: &self.ad,
            micro_rows: group_micro_rows(r.train.update.micro_batch_rows),
        };
        let (m, loss) = objective_step(&refm, &self.groups, &picked, spec, &mut self.optim, lr)?;
        self.policy.model = m;
        row.extend(loss);
        row.insert(keys::PERF_STEP_S.into(), t_step.elapsed().as_secs_f64());

        let end = self.run.step_end(step + 1);
        let evaluated =
            (step + 1).is_multiple_of(r.train.run.eval_every) || step + 1 == r.train.run.steps;
        if evaluated {
            let max_new = r.rollout.max_new_tokens;
            self.accuracy_after = evaluate(&self.policy, &self.eval, max_new, &self.base)?;
            row.insert(keys::EVAL_ACCURACY.into(), self.accuracy_after);
        }
        self.steps_done = step + 1;
        let (before, after) = (self.accuracy_before, self.accuracy_after);
        let state = self.run.state(self.steps_done, self.rng.0, before, after);
        let stats = format!(
            "loss {:.4} acc {after:.3}",
            row.get("offline/loss").copied().unwrap_or(f64::NAN)
        );
        let (policy, optim) = (&self.policy, &self.optim);
        let stop = self.run.end_step(end, row, evaluated, &stats, |d| {
            checkpoint::write_records(d, model_record(policy), optim, &state)
        })?;
        Ok((self, stop))
    }

    /// The end: the final model (unless stopped), the summary.
    fn finish(mut self, interrupted: bool, seconds: f64) -> Result<Summary> {
        let Place { r, spec, out } = self.at;
        if !interrupted {
            write_final(&self.policy, r.pretrained.as_ref(), out)?;
        }
        let (accuracy_before, accuracy_after) = (self.accuracy_before, self.accuracy_after);
        self.run.finish(&serde_json::json!({
            "name": r.header.name, "objective": spec.objective.name(), "seed": r.header.seed,
            "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
            "seconds": seconds, "steps_done": self.steps_done, "interrupted": interrupted,
            "prompts_usable": self.usable, "draws": self.units.len(),
        }))?;
        if !interrupted {
            self.run.say(&format!(
                "held-out accuracy {accuracy_before:.3} -> {accuracy_after:.3} in {seconds:.0} s"
            ));
        }
        Ok(Summary {
            accuracy_before,
            accuracy_after,
            interrupted,
        })
    }
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
    // A baseline over the step's responses needs one valid reward per prompt, not two.
    let one = sft || spec.objective.pool() == Pool::Batch;
    let units =
        crate::offline::data::units(&groups, pairwise.is_some(), spec.pairs == Pairs::All, one);
    let mut usable: Vec<usize> = units.iter().map(|u| u.0).collect();
    usable.dedup();
    if usable.is_empty() {
        bail!(
            "{}: no prompt has {} for objective {:?}",
            path.display(),
            if pairwise.is_some() {
                "two responses with different rewards (or an explicit pair)"
            } else if one {
                "a response with a valid reward"
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

/// A fresh run's policy: the tiny model warmed up, and its frozen copy written as the
/// reference (a LoRA policy's reference is its weights with adapters off).
fn fresh_start(
    mut policy: Policy,
    r: &Recipe,
    task: &TaskSet,
    rng: &mut SplitMix64,
    reference_path: &Path,
    ad: &Device,
) -> Result<Policy> {
    if let (Some(w), None) = (&r.warmup, &policy.lora) {
        let vocab = policy.vocab();
        policy.model = warm_up(policy.model, vocab, w, task, rng, ad)?.0;
    }
    if policy.lora.is_none() {
        let record = policy.model.clone().into_record();
        ember_train::io::write_atomic_with(reference_path, |tmp| {
            record.save(tmp).map_err(|e| anyhow!("{e}"))
        })?;
    }
    Ok(policy)
}

/// A-LoL's priority (all three variants): each group's summed positive advantage (against its
/// fitted V(x) when `values` are given); uniform draws for the other objectives.
fn priorities(
    spec: &OfflineSpec,
    groups: &[TokGroup],
    units: &[Unit],
    values: Option<&[f32]>,
) -> Option<Vec<f64>> {
    let mass = |gi: usize| positive_mass(&groups[gi], values.map(|v| f64::from(v[gi])));
    spec.objective
        .is_alol()
        .then(|| units.iter().map(|u| mass(u.0)).collect())
}

/// Σ_i max(0, R_i − V) over a group's valid rewards, V the given value or their mean.
fn positive_mass(g: &TokGroup, value: Option<f64>) -> f64 {
    let v: Vec<f64> = g
        .rewards
        .iter()
        .map(|x| f64::from(*x))
        .filter(|&x| ember_engine::is_valid_reward(x))
        .collect();
    let mean = value.unwrap_or_else(|| v.iter().sum::<f64>() / v.len().max(1) as f64);
    v.iter().map(|x| (x - mean).max(0.0)).sum()
}

/// An index below `n`: uniform, or in proportion to `weights` (uniform when they are all 0).
fn draw(rng: &mut SplitMix64, n: usize, weights: Option<&[f64]>) -> usize {
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
        let rows: Vec<TokenRow> = chunk
            .iter()
            .map(|&(gi, ri)| TokenRow {
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
