//! The image job's set-up: the run directory, the data and reward model, the pretrained DiT
//! with fresh adapters, the optimizer, and a resumed run's state or the first evaluation.

use super::FlowJob;
use super::state::{FLOW_STATE, FlowState, RAM_EMA, eval_row, with_adapters};
use crate::common::run::{RunLoop, open_run};
use crate::flow::digits::Digits;
use crate::flow::images::{evaluate, grid, pretrained};
use crate::flow::schema::{FlowAlgorithm, FlowRecipe};
use anyhow::{Context, Result, anyhow};
use burn::module::Module;
use burn::store::ModuleRecord;
use ember_engine::*;
use ember_flow::{DigitClassifier, sde_coefs, sigmas};
use ember_run::{RunOptions, checkpoint};
use ember_tasks::expand_path;
use ember_train::{Optimizer, UpdateConfig};
use std::path::Path;

impl<'a> FlowJob<'a> {
    /// Opens the run directory and builds everything a step uses.
    pub(super) fn new(r: &'a FlowRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        let run_loop = RunLoop {
            steps: r.rl.run.steps,
            checkpoint_every: r.rl.run.checkpoint_every,
            keep_checkpoints: r.rl.run.keep_checkpoints,
        };
        let curves = ("reward/class_prob", keys::EVAL_ACCURACY);
        let run = open_run(out, opts, &r.header.name, r, run_loop, curves)?;
        let digits = Digits::load(&expand_path(&r.data.digits)?)?;
        let base = crate::common::device::device(&r.header.device)?;
        let ad = base.clone().autodiff();
        let group = crate::common::device::data_parallel(&r.header.device, r.data_parallel)?;
        let classifier = DigitClassifier::load(&expand_path(&r.data.classifier)?, &base)?;
        let (model, pretrain_seconds) = pretrained(r, &digits, &ad, run.quiet())?;
        let model = with_adapters(model, r, &ad)?;
        let mut optim = optimizer(r);
        if let Some(g) = group {
            run.say(&format!(
                "data-parallel update: {} devices, {} reduction (policy-gradient methods; RAM's \
                 regression runs on the first device)",
                g.devices().len(),
                g.reduce()
            ));
            optim = optim.with_data_parallel(g);
        }
        let state = FlowState {
            before: Default::default(),
            after: Default::default(),
            pretrain_seconds,
        };
        let k = if r.rl.run.train_timesteps == 0 {
            r.sampler.steps
        } else {
            r.rl.run.train_timesteps
        };
        let job = Self {
            coefs: sde_coefs(
                &sigmas(r.sampler.steps, r.sampler.shift),
                r.sampler.noise_level,
            )?,
            ode: sde_coefs(&sigmas(r.sampler.eval_steps, r.sampler.shift), 0.0)?,
            trained: (0..k).collect(),
            adv_cfg: advantage_config(r),
            upd: update_config(r),
            schedule: r.rl.schedule.schedule(r.rl.run.steps),
            rng: SplitMix64(r.header.seed),
            ema: None,
            last_eval: None,
            steps_done: run.first_step(),
            r,
            out,
            run,
            base,
            ad,
            classifier,
            model,
            optim,
            state,
        };
        job.start()
    }

    /// A resumed run's adapters, average, optimizer, RNG and state; a fresh run's first
    /// evaluation.
    fn start(mut self) -> Result<Self> {
        let r = self.r;
        if let Some((dir, st)) = self.run.resumed() {
            let p = dir.join(checkpoint::MODEL);
            self.model = self
                .model
                .try_load_record(checkpoint::read_model(dir, true)?)
                .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
            if r.rl.run.ram_ema > 0.0 {
                let p = dir.join(RAM_EMA);
                let rec = ModuleRecord::load(&p)
                    .map_err(|e| anyhow!("reading {}: {e}", p.display()))?
                    .allow_partial(true);
                let ema = self.model.clone().try_load_record(rec);
                self.ema = Some(ema.map_err(|e| anyhow!("applying {}: {e}", p.display()))?);
            }
            self.optim = checkpoint::load_optimizer(dir, self.optim)?;
            self.rng = SplitMix64(st.rng);
            let p = dir.join(FLOW_STATE);
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            self.state =
                serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        } else {
            let (before, images) = evaluate(&self.model.valid(), &self.classifier, r, &self.base)?;
            let path = self.out.join("samples_before.png");
            grid(&path, &images, r.eval.samples_per_class)?;
            self.run.log(eval_row(0, &before))?;
            (self.state.before, self.state.after) = (before, before);
        }
        if r.rl.run.ram_ema > 0.0 && self.ema.is_none() {
            self.ema = Some(self.model.clone());
        }
        let b = self.state.before;
        self.run.say(&format!(
            "pretrained: accuracy {:.3}, p(class) {:.3}, diversity {:.2}",
            b.accuracy, b.class_prob, b.diversity
        ));
        Ok(self)
    }
}

/// The RL phase's AdamW (`[rl]`'s `adam_eps`, `grad_clip`, `weight_decay`).
fn optimizer(r: &FlowRecipe) -> Optimizer {
    r.rl.optim.init()
}

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
        clip: Some(r.rl.run.adv_clip),
        ..AdvantageConfig::new(kind)
    }
}

/// Per-step PPO clip of the denoising steps' ratio, token-mean aggregation, k3 KL to the
/// adapter-free model when `rl.kl_coef` > 0.
fn update_config(r: &FlowRecipe) -> UpdateConfig {
    UpdateConfig {
        schedule: r.rl.update,
        loss: ActorLossConfig {
            policy: PolicyLossKind::Ppo {
                clip_low: r.rl.run.clip_low,
                clip_high: r.rl.run.clip_high,
                dual_clip: None,
            },
            agg: LossAgg::TokenMean,
            kl: (r.rl.run.kl_coef > 0.0).then_some(KlLoss {
                estimator: KlEstimator::K3,
                coef: r.rl.run.kl_coef,
            }),
            entropy_coef: 0.0,
            mismatch: None,
        },
    }
}
