//! PPO's learned critic in the LLM job: a [`ValueModel`] built from the policy after its
//! warm-up, its own AdamW, stored in every checkpoint beside the policy; and the step's update
//! with it: values → GAE → actor update → (PACT: importance weights towards the updated
//! policy) → critic update.

use crate::llm::schema::Recipe;
use crate::lm::Policy;
use crate::lm::step::{UpdateCtx, row_means, update_policy};
use anyhow::{Context, Result, anyhow};
use burn::module::{Module, ParamGroup};
use burn::store::ModuleRecord;
use burn::tensor::Device;
use ember_engine::*;
use ember_llm::actor::LlmExperience;
use ember_llm::{Llama, ValueModel};
use ember_train::{
    CriticBatch, CriticData, CriticStep, Optimizer, UpdateData, critic_update, update,
};
use std::path::Path;

/// The critic's record in a checkpoint (the whole model, or a LoRA critic's adapters and head).
pub const CRITIC: &str = "critic.bpk";
/// The critic optimizer's record.
pub const CRITIC_OPTIM: &str = "critic_optim.bpk";

/// Rows scored at once when the critic values a rollout without gradients.
const VALUE_CHUNK: usize = 64;

/// A run's critic.
pub struct Critic {
    /// The value model (on the training device).
    pub model: ValueModel,
    /// Its AdamW.
    pub optim: Optimizer,
    /// The value loss and PACT.
    pub cfg: CriticConfig,
    /// Its constant learning rate.
    pub lr: f64,
    /// Steps that train the critic only.
    pub warmup_steps: usize,
    /// Only LoRA adapters and the head are trained and stored.
    lora: bool,
}

impl Critic {
    /// The recipe's critic, initialised from the policy's current weights; None when the
    /// algorithm has none.
    pub fn new(r: &Recipe, policy: &Policy, ad: &Device) -> Option<Self> {
        let cfg = r.algorithm_parts().critic?;
        let spec = r.critic.as_ref();
        Some(Self {
            model: ValueModel::from_policy(policy.model.clone(), ad),
            optim: r.train.optim.init(),
            cfg,
            lr: spec.and_then(|s| s.lr).unwrap_or(r.train.schedule.lr),
            warmup_steps: spec.map_or(0, |s| s.warmup_steps),
            lora: policy.lora.is_some(),
        })
    }

    /// Its updates summed over the ranks of `world` too.
    #[must_use]
    pub fn with_world(self, world: ember_dist::World) -> Self {
        Self {
            optim: self.optim.with_world(world),
            ..self
        }
    }

    /// The critic's updates run data-parallel over `group` (as the policy's do).
    #[must_use]
    pub fn with_data_parallel(self, group: std::sync::Arc<ember_train::DataParallel>) -> Self {
        Self {
            optim: self.optim.with_data_parallel(group),
            ..self
        }
    }

    fn record(&self) -> ModuleRecord {
        if self.lora {
            self.model
                .clone()
                .into_record_group(ParamGroup::from_any_predicates(vec![
                    ".lora.",
                    "value_head",
                ]))
        } else {
            self.model.clone().into_record()
        }
    }

    /// Writes the critic and its optimizer into checkpoint `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.record()
            .save(dir.join(CRITIC))
            .map_err(|e| anyhow!("writing the critic's record: {e}"))?;
        self.optim
            .to_record()
            .save(dir.join(CRITIC_OPTIM))
            .map_err(|e| anyhow!("writing the critic optimizer's record: {e}"))?;
        Ok(())
    }

    /// The critic and its optimizer stored in checkpoint `dir`.
    pub fn load(self, dir: &Path) -> Result<Self> {
        let p = dir.join(CRITIC);
        let rec = ModuleRecord::load(&p)
            .map_err(|e| anyhow!("reading {}: {e}", p.display()))?
            .allow_partial(self.lora);
        let model = self
            .model
            .try_load_record(rec)
            .map_err(|e| anyhow!("applying {}: {e}", p.display()))?;
        let p = dir.join(CRITIC_OPTIM);
        let rec = burn::optim::OptimizerRecord::load(&p)
            .map_err(|e| anyhow!("reading {}: {e}", p.display()))?;
        Ok(Self {
            model,
            optim: self.optim.load_record(rec),
            ..self
        })
    }
}

/// One step's update: [`update_with_critic`] when the run has a critic, else the critic-free
/// [`update_policy`]. `exp` is the rollout on the training device `ad`; `base` is the
/// sampler's device (the critic's no-grad scoring runs there). Returns the new policy model and
/// the mean advantage of each of `shown` rows.
pub fn update_step(
    model: Llama,
    critic: Option<&mut Critic>,
    optim: &mut Optimizer,
    devices: (&LlmExperience, &Device, &Device),
    batch: RolloutBatch,
    ctx: UpdateCtx,
) -> Result<(Llama, Vec<f64>)> {
    match critic {
        Some(c) => update_with_critic(model, c, optim, devices, batch, ctx),
        None => update_policy(model, optim, devices.0, &batch, ctx),
    }
}

/// One step's update with a critic: values → GAE → actor (after the critic-only warm-up) →
/// PACT's weights → critic.
pub fn update_with_critic(
    model: Llama,
    critic: &mut Critic,
    optim: &mut Optimizer,
    (exp, base, ad): (&LlmExperience, &Device, &Device),
    batch: RolloutBatch,
    ctx: UpdateCtx,
) -> Result<(Llama, Vec<f64>)> {
    let UpdateCtx {
        adv_cfg,
        upd,
        step,
        lr,
        order,
        row,
        shown,
    } = ctx;
    let host_exp = &LlmExperience {
        tokens: exp.tokens.clone().to_device(base),
        mask: exp.mask.clone().to_device(base),
        ..exp.clone()
    };
    let values = host_exp
        .values_all(&critic.model.valid(), VALUE_CHUNK)
        .to_device(ad);
    let batch = batch.with_values(values.clone())?;
    let adv = compute_advantages(adv_cfg, &batch, step)?;
    let returns = adv.returns.clone();
    let mut m = adv.metrics.clone();
    m.push(
        "critic/vf_explained_var",
        explained_variance(values.clone(), returns.clone(), adv.mask.clone())?,
    );
    m.push(
        "critic/values_mean",
        ember_engine::masked_mean(values.clone(), adv.mask.clone()),
    );
    m.push(
        "critic/returns_mean",
        ember_engine::masked_mean(returns.clone(), adv.mask.clone()),
    );
    row.extend(m.to_host());
    let shown_adv = row_means(&adv.advantages, &adv.mask, shown);

    // The actor first (after the critic-only warm-up steps).
    let model = if step >= critic.warmup_steps {
        let (model, stats) = update(
            model,
            optim,
            UpdateData {
                experience: exp,
                batch: &batch,
                adv: &adv,
            },
            upd,
            lr,
            order,
        )?;
        row.extend(stats.metrics);
        model
    } else {
        model
    };

    // PACT: the rollout's steps weighted towards the policy just updated.
    let weights = match &critic.cfg.pact {
        Some(pact) => {
            let new = host_exp.score_all(&model.valid()).to_device(ad);
            let old = batch
                .behaviour_log_probs()
                .cloned()
                .context("the batch has no old log-probs")?;
            let (w, metrics) = pact_weights(pact, new, old, adv.mask.clone())?;
            row.extend(metrics.to_host());
            Some(w)
        }
        None => None,
    };
    let data = CriticBatch {
        values,
        returns,
        mask: adv.mask.clone(),
        weights,
    };
    let t_critic = std::time::Instant::now();
    let model_c = critic.model.clone();
    let how = CriticStep {
        cfg: &critic.cfg,
        schedule: &upd.schedule,
        lr: critic.lr,
    };
    let data = CriticData {
        experience: exp,
        batch: &data,
    };
    let (next, stats) = critic_update(model_c, &mut critic.optim, data, how, order)?;
    critic.model = next;
    let _ = ad.sync();
    ember_run::Timings::record(row, "update_critic", t_critic.elapsed().as_secs_f64());
    row.extend(stats.metrics);
    row.insert("critic/lr".into(), critic.lr);
    Ok((model, shown_adv))
}
