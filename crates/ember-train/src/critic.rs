//! The critic's update: GAE's returns regressed by the clipped value loss
//! ([`ember_engine::value_loss`]) over the same epochs × mini-batches × micro-batches schedule as
//! the actor's, with the critic's own optimizer (verl `dp_critic.update_critic`).

use crate::optim::Optimizer;
use crate::parallel::{Copies, Replicate};
use crate::update::{MicroLoss, Steps, UpdateSchedule, UpdateStats, select2};
use burn::module::Module;
use burn::tensor::Tensor;
use ember_engine::keys;
use ember_engine::{CriticConfig, EngineError, ValueLossInput, value_loss};

/// A value model over the steps of an experience batch.
pub trait Critic: Module + Clone {
    /// What the model reads (the same experience as the actor's).
    type Experience: Replicate;

    /// V(s_t) `[rows, steps]` of `rows` of `experience` (rows in the given order).
    fn values(&self, experience: &Self::Experience, rows: &[usize]) -> Tensor<2>;
}

/// The critic's regression data of one step, `[rows, steps]` each.
#[derive(Debug, Clone)]
pub struct CriticBatch {
    /// V(s_t) of the critic that scored the rollout (the value clip's centre).
    pub values: Tensor<2>,
    /// Targets: GAE's returns.
    pub returns: Tensor<2>,
    /// Valid steps.
    pub mask: Tensor<2>,
    /// PACT's importance weights (None: unweighted).
    pub weights: Option<Tensor<2>>,
}

/// What one critic update regresses: the critic's inputs for the batch's rows and their
/// values, returns and mask.
pub struct CriticData<'a, E> {
    /// The critic's inputs (the actor's experience) for the batch's rows.
    pub experience: &'a E,
    /// The rows' values, returns, mask and weights.
    pub batch: &'a CriticBatch,
}

/// How one step's critic update runs: its loss, its passes and its learning rate.
#[derive(Debug, Clone, Copy)]
pub struct CriticStep<'a> {
    /// The value loss.
    pub cfg: &'a CriticConfig,
    /// Epochs × mini-batches × micro-batches (the actor's).
    pub schedule: &'a UpdateSchedule,
    /// The critic's learning rate this step.
    pub lr: f64,
}

/// Runs the critic's update and returns the new critic and its `critic/*` metrics.
///
/// # Errors
/// Shapes that differ, or an invalid [`CriticConfig`].
pub fn critic_update<C: Critic>(
    critic: C,
    optim: &mut Optimizer,
    data: CriticData<'_, C::Experience>,
    how: CriticStep<'_>,
    order: &mut dyn FnMut(usize) -> Vec<usize>,
) -> Result<(C, UpdateStats), EngineError> {
    let CriticStep { cfg, schedule, lr } = how;
    let CriticData { experience, batch } = data;
    cfg.validate()?;
    let steps = Steps {
        schedule,
        mask: &batch.mask,
        tokens: None,
        groups: None,
        area: "critic",
        loss_key: keys::CRITIC_VF_LOSS,
        lr,
        only: None,
    };
    let copies = Copies::new(optim.data_parallel().map(AsRef::as_ref), experience);
    steps.run(critic, optim, order, |critic, replica, chunk, idx, norm| {
        let vpreds = critic.values(copies.get(replica), chunk);
        let d = vpreds.device();
        let pick = |t: &Tensor<2>| select2(t, idx).to_device(&d);
        let input = ValueLossInput {
            vpreds,
            values: pick(&batch.values),
            returns: pick(&batch.returns),
            mask: pick(&batch.mask),
            weights: batch.weights.as_ref().map(pick),
        };
        let (loss, metrics) = value_loss(cfg, &input, norm)?;
        Ok(MicroLoss {
            loss,
            metrics,
            recompute: None,
        })
    })
}
