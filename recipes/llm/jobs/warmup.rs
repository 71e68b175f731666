//! `ember warmup`: runs every shape a recipe's job will use (rollout prefill and decode at each
//! bucketed prompt width, rescoring and the training update at each bucketed prompt × response
//! width, the held-out evaluation) before the run, so that GPU kernels are compiled and
//! autotuned ahead of time and stored in the persistent kernel cache (`kernel_cache`).
//!
//! It runs the whole set `passes` times and times each pass: on a GPU, pass 1 of the first
//! process pays compilation and autotuning ("first run"), later passes are warm in memory, and
//! pass 1 of a second process shows what the persistent cache saves ("warm start"). The weights
//! are the recipe's initial ones (no supervised warm-up); the numbers they produce are thrown
//! away.

use crate::llm::build_policy;
use crate::llm::critic::{Critic, update_step};
use crate::llm::schema::Recipe;
use crate::llm::setup::{optimizer, rollout_sampling, update_config};
use crate::lm::step::{
    Reference, Rescoring, UpdateCtx, experience, features_at, greedy_sampling, rescore,
};
use crate::lm::{Policy, evaluate};
use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor};
use ember_engine::*;
use ember_llm::Llama;
use ember_llm::actor::LlmExperience;
use ember_llm::cache::bucketed;
use ember_llm::generate;
use ember_run::say;
use ember_train::{Optimizer, UpdateConfig};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Options of `ember warmup`.
#[derive(Debug, Clone)]
pub struct WarmupOptions {
    /// How many times to run the whole shape set (≥ 1).
    pub passes: usize,
    /// Training prompts sampled to find the prompt widths.
    pub prompt_samples: usize,
    /// Also run the held-out evaluation.
    pub eval: bool,
    /// No progress lines on stderr.
    pub quiet: bool,
}

impl Default for WarmupOptions {
    fn default() -> Self {
        Self {
            passes: 2,
            prompt_samples: 256,
            eval: true,
            quiet: false,
        }
    }
}

/// Seconds spent in one pass over the shape set, by phase.
#[derive(Debug, Clone, Serialize)]
pub struct PassTimes {
    /// 1-based pass number.
    pub pass: usize,
    /// Rollout generation (prefill + decode) at every prompt width.
    pub generate_s: f64,
    /// Rescoring without gradients (old-policy and reference log-probs).
    pub rescore_s: f64,
    /// Training updates (forward, backward, optimizer step).
    pub train_s: f64,
    /// Held-out evaluation (greedy generation).
    pub eval_s: f64,
    /// The whole pass.
    pub total_s: f64,
}

/// What `ember warmup` ran and how long it took.
#[derive(Debug, Clone, Serialize)]
pub struct WarmupReport {
    /// Recipe name.
    pub recipe: String,
    /// The device, as burn prints it.
    pub device: String,
    /// Where compiled kernels and autotune results persist.
    pub kernel_cache: String,
    /// Rows per rollout batch (prompts × samples per prompt).
    pub rollout_rows: usize,
    /// Prompt widths (prefill lengths) run.
    pub prompt_widths: Vec<usize>,
    /// Response widths run by rescoring and training.
    pub response_widths: Vec<usize>,
    /// Notes on shapes the warm-up cannot cover.
    pub notes: Vec<String>,
    /// One entry per pass.
    pub passes: Vec<PassTimes>,
}

/// The shapes of a recipe's job.
struct Shapes {
    /// Prompt batches (token ids), one per prefill width.
    prompt_batches: Vec<(usize, Vec<Vec<u32>>)>,
    response_widths: Vec<usize>,
    notes: Vec<String>,
}

fn shapes(r: &Recipe, policy: &Policy, opts: &WarmupOptions) -> Result<Shapes> {
    let task = r.task.build()?;
    let bucket = r.rollout.shape_bucket;
    let max_new = r.rollout.max_new_tokens;
    let mut rng = SplitMix64(r.header.seed ^ 0x5741_524d);
    let examples = task.train(&mut rng, opts.prompt_samples.max(1));
    if examples.is_empty() {
        bail!("the task produced no training prompts");
    }
    let mut by_width: BTreeMap<usize, Vec<Vec<u32>>> = BTreeMap::new();
    for e in &examples {
        let ids = policy.prompt_ids(e, max_new)?;
        by_width
            .entry(bucketed(ids.len(), bucket))
            .or_default()
            .push(ids);
    }
    let mut notes = Vec::new();
    if bucket <= 1 {
        notes.push(
            "rollout.shape_bucket is 0: prefill and training shapes follow the exact prompt and \
             response lengths, so a GPU run will still compile new kernels; set \
             rollout.shape_bucket (16 or 32) for a complete warm-up"
                .to_string(),
        );
    }
    let k = r.rollout.prompts_per_step;
    // Each batch holds one prompt of its width and the shortest prompts for the rest, so its
    // longest prompt (the prefill width) is that width.
    let shortest: Vec<Vec<u32>> = by_width.values().flatten().take(k).cloned().collect();
    let prompt_batches = by_width
        .iter()
        .map(|(w, ids)| {
            let mut batch = vec![ids[0].clone()];
            batch.extend(shortest.iter().cycle().take(k.saturating_sub(1)).cloned());
            (*w, batch)
        })
        .collect();
    let response_widths = if bucket > 1 {
        (1..=max_new.div_ceil(bucket)).map(|i| i * bucket).collect()
    } else {
        vec![max_new]
    };
    let parts = r.algorithm_parts();
    if parts.dynamic_sampling {
        notes.push(
            "dynamic sampling drops groups, so training may also see fewer rows than a full \
             rollout batch; those row counts are not warmed"
                .to_string(),
        );
    }
    if parts.replay.is_some() {
        notes.push(
            "replayed groups add rows to later steps' batches (and their responses may be \
             longer than this step's); those row counts are not warmed"
                .to_string(),
        );
    }
    Ok(Shapes {
        prompt_batches,
        response_widths,
        notes,
    })
}

/// Waits for the device's queued work, so that a phase's time includes its kernels.
fn sync(device: &Device) -> Result<()> {
    device
        .sync()
        .map_err(|e| anyhow::anyhow!("device error while warming up: {e:?}"))
}

/// What every pass reuses: the recipe, its shapes and parts, the devices, and the synthetic
/// batch (alternating rewards in groups of `samples_per_prompt`).
struct Plan<'a> {
    r: &'a Recipe,
    sh: Shapes,
    parts: PresetParts,
    upd: UpdateConfig,
    base: Device,
    ad: Device,
    rows: usize,
    widths: Vec<usize>,
    /// The policy's stop tokens.
    stop: Vec<u32>,
}

/// Runs the recipe's shapes `opts.passes` times; see the module documentation.
pub fn warmup(r: &Recipe, opts: &WarmupOptions) -> Result<WarmupReport> {
    if opts.passes == 0 {
        bail!("--passes must be at least 1");
    }
    let base = crate::common::device::device(&r.header.device)?;
    let ad = base.clone().autodiff();
    let task = r.task.build()?;
    let placed = crate::llm::plop::resolve(r, &task, None, false, &base)?.0;
    let r = &placed;
    let mut policy = build_policy(r, &ad)?;
    let sh = shapes(r, &policy, opts)?;
    let eval = task.held_out_set(r.header.seed, r.task.eval_size);
    let parts = r.algorithm_parts();
    let mut optim = optimizer(r);
    // PPO's critic: valued, then trained after the actor, as in the job.
    let mut critic = Critic::new(r, &policy, &ad);
    // The update's shapes are timed as the job runs them: sharded with `[data_parallel]`.
    if let Some(g) = crate::common::device::data_parallel(&r.header.device, r.data_parallel)? {
        optim = optim.with_data_parallel(g.clone());
        critic = critic.map(|c| c.with_data_parallel(g));
    }
    let (n, k) = (r.rollout.samples_per_prompt, r.rollout.prompts_per_step);
    let widths: Vec<usize> = sh.prompt_batches.iter().map(|(w, _)| *w).collect();
    say(
        opts.quiet,
        &format!(
            "[{}] warm-up on {base:?}: rollout {k}×{n} rows, prompt widths {widths:?}, response \
             widths {:?}; kernel cache {}",
            r.header.name,
            sh.response_widths,
            crate::common::kernel_cache::describe()
        ),
    );
    let plan = Plan {
        r,
        upd: update_config(r, parts.loss),
        sh,
        parts,
        base,
        ad,
        rows: k * n,
        widths,
        stop: policy.stop.clone(),
    };
    let mut passes = Vec::new();
    for pass in 1..=opts.passes {
        let t_pass = Instant::now();
        let mut t = PassTimes {
            pass,
            generate_s: 0.0,
            rescore_s: 0.0,
            train_s: 0.0,
            eval_s: 0.0,
            total_s: 0.0,
        };
        let sampler = policy.model.valid();
        t.generate_s = plan.generate(&policy, &sampler)?;
        for &w in &plan.widths {
            for &nw in &plan.sh.response_widths {
                let model = policy.model;
                let shape = (w, nw, &sampler, &mut t);
                policy.model = plan.train(shape, model, critic.as_mut(), &mut optim)?;
            }
        }
        if opts.eval && !eval.is_empty() {
            let t0 = Instant::now();
            evaluate(&policy, &eval, r.rollout.max_new_tokens, &plan.base)?;
            t.eval_s = t0.elapsed().as_secs_f64();
        }
        t.total_s = t_pass.elapsed().as_secs_f64();
        say(
            opts.quiet,
            &format!(
                "[{}] pass {pass}: {:.2} s (generate {:.2}, rescore {:.2}, train {:.2}, eval {:.2})",
                r.header.name, t.total_s, t.generate_s, t.rescore_s, t.train_s, t.eval_s
            ),
        );
        passes.push(t);
    }
    Ok(WarmupReport {
        recipe: r.header.name.clone(),
        device: format!("{:?}", plan.base),
        kernel_cache: crate::common::kernel_cache::describe(),
        rollout_rows: plan.rows,
        prompt_widths: plan.widths,
        response_widths: plan.sh.response_widths,
        notes: plan.sh.notes,
        passes,
    })
}

impl Plan<'_> {
    /// Generation at every prompt width (and the greedy baseline's where the estimator needs
    /// it), in seconds.
    fn generate(&self, policy: &Policy, sampler: &Llama) -> Result<f64> {
        let r = self.r;
        let mut seconds = 0.0;
        for (i, (w, prompts)) in self.sh.prompt_batches.iter().enumerate() {
            let t0 = Instant::now();
            // The job's sampler with its stop tokens (the per-step "finished" bookkeeping
            // compiles kernels of its own); random weights rarely stop early, so decode steps
            // still run.
            let sc = rollout_sampling(r, &policy.stop, r.header.seed.wrapping_add(i as u64));
            let g = generate(sampler, prompts, &sc, &self.base)
                .with_context(|| format!("generating at prompt width {w}"))?
                .padded(r.rollout.shape_bucket);
            // The job's padding and concatenation of prompt and response.
            let _ = g.sequences();
            if self.parts.advantage.kind.needs_greedy_baseline() {
                generate(sampler, prompts, &greedy_sampling(&sc), &self.base)?;
            }
            drop(g);
            sync(&self.base)?;
            seconds += t0.elapsed().as_secs_f64();
        }
        Ok(seconds)
    }

    /// Rescoring and the training update at prompt width `w` and response width `nw`, timed
    /// into `t`; returns the updated model.
    fn train(
        &self,
        (w, nw, sampler, t): (usize, usize, &Llama, &mut PassTimes),
        model: Llama,
        critic: Option<&mut Critic>,
        optim: &mut Optimizer,
    ) -> Result<Llama> {
        let (r, rows, ad) = (self.r, self.rows, &self.ad);
        let n = r.rollout.samples_per_prompt;
        let group_ids: Vec<usize> = (0..rows).map(|i| i / n).collect();
        let rewards: Vec<f32> = (0..rows).map(|i| (i % 2) as f32).collect();
        let tokens = Tensor::<2, Int>::zeros([rows, w + nw], &self.base);
        let mask = Tensor::<2>::ones([rows, w + nw], &self.base);
        let exp = experience(tokens, mask, nw, &rollout_sampling(r, &self.stop, 0));
        let t0 = Instant::now();
        let mut batch = RolloutBatch::new(
            Tensor::<2>::ones([rows, nw], ad),
            Tensor::from_floats(rewards.as_slice(), ad),
            &group_ids,
        )?
        .with_rollout_log_probs(Tensor::<2>::zeros([rows, nw], ad))?;
        // The job's rescoring (the tiny policy's separate reference model has the policy's
        // shapes, so the adapters-off pass stands in for it).
        let how = Rescoring {
            sampler,
            recompute_old: r.train.run.recompute_old_log_probs,
            reference: (r.train.run.kl_coef > 0.0).then_some(Reference::AdaptersOff),
        };
        batch = rescore(batch, &exp, None, how, ad)?;
        if self.parts.advantage.kind.needs_greedy_baseline() {
            batch = batch.with_baseline_rewards(Tensor::<1>::zeros([rows], ad))?;
        }
        if self.parts.advantage.kind.needs_features() {
            let f = features_at(sampler, exp.tokens.clone(), exp.mask.clone(), w);
            batch = batch.with_features(f.to_device(ad))?;
        }
        sync(&self.base)?;
        t.rescore_s += t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let exp = LlmExperience {
            tokens: exp.tokens.to_device(ad),
            mask: exp.mask.to_device(ad),
            ..exp
        };
        // The job reads the advantage and update metrics every step: their reductions are
        // kernels too.
        let mut row = BTreeMap::new();
        let mut order = |m: usize| (0..m).collect::<Vec<_>>();
        let lr = r.train.schedule.lr;
        let (model, _) = update_step(
            model,
            critic,
            optim,
            (&exp, &self.base, ad),
            batch,
            UpdateCtx {
                adv_cfg: &self.parts.advantage,
                upd: &self.upd,
                step: 0,
                lr,
                order: &mut order,
                row: &mut row,
                shown: &[],
            },
        )
        .with_context(|| format!("training at prompt width {w}, response width {nw}"))?;
        sync(ad)?;
        t.train_s += t0.elapsed().as_secs_f64();
        Ok(model)
    }
}
