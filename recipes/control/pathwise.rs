//! `[gradient]`: the control job's iteration when it trains by a gradient through the
//! simulator (first-order, zeroth-order, DDCG or IVW-H) instead of PPO, and the surrogate loss
//! each estimator's gradient comes from (shared with the study in `study.rs`).

use crate::control::schema::{Estimator, GradientSpec};
use crate::control::state::ControlJob;
use anyhow::Result;
use burn::tensor::Tensor;
use ember_control::{
    DdcgConfig, GaussianPolicy, GradientSamples, PathwiseSamples, blend, ddcg_weight, ivw_h,
    pathwise_samples, policy_surrogate, trace_variance,
};
use ember_engine::keys;
use ember_engine::{PolicyLossInput, PolicyLossKind, policy_loss};
use ember_run::{Row, Timings};
use ember_train::accumulated_step;

/// The surrogate loss whose gradient by θ is minus the estimator's policy gradient, and the
/// first-order samples' weight in it (`[1]`: 1 first-order, 0 zeroth-order, DDCG's α, IVW-H's
/// mean α over steps and action dimensions). The zeroth-order gradient goes through the engine's
/// REINFORCE loss (`PolicyLossKind::Vanilla` on the per-step advantages G_t − b_t), the others
/// are action-space mixtures carried through the policy ([`policy_surrogate`]).
pub fn surrogate(
    policy: &GaussianPolicy,
    s: &PathwiseSamples,
    g: &GradientSpec,
) -> Result<(Tensor<1>, Tensor<1>)> {
    let [n, h, a] = s.first.dims();
    let device = s.returns.device();
    let (mixed, alpha) = match g.estimator {
        Estimator::First => (s.first.clone(), Tensor::ones([1], &device)),
        Estimator::Ddcg => {
            let cfg = DdcgConfig {
                c: g.ddcg_c,
                ..DdcgConfig::default()
            };
            let alpha = ddcg_weight(&flat(s), g.sigma, cfg);
            let w = alpha.clone().reshape([1, 1, 1]);
            (blend(s.first.clone(), s.zeroth.clone(), w), alpha)
        }
        Estimator::IvwH => {
            let (alpha, mixed) = ivw_h(s.zeroth.clone(), s.first.clone());
            (mixed, alpha.mean())
        }
        Estimator::Zeroth => {
            let [_, _, o] = s.obs.dims();
            let lp = policy.log_prob(
                s.obs.clone().reshape([n * h, o]),
                s.actions.clone().reshape([n * h, a]),
            );
            let lp = lp.reshape([n, h]);
            let input = PolicyLossInput {
                old_log_probs: lp.clone().detach(),
                log_probs: lp,
                advantages: s.advantages.clone(),
                mask: Tensor::ones([n, h], &device),
                ref_log_probs: None,
            };
            let l = policy_loss(&PolicyLossKind::Vanilla, &input)?;
            return Ok((l.per_step.sum() / n as f32, Tensor::zeros([1], &device)));
        }
    };
    Ok((policy_surrogate(policy, s.obs.clone(), mixed), alpha))
}

/// The samples as one `[n, steps · act]` gradient per episode (DDCG's test and the logged
/// variances).
fn flat(s: &PathwiseSamples) -> GradientSamples {
    let [n, h, a] = s.first.dims();
    GradientSamples {
        values: s.returns.clone(),
        first: s.first.clone().reshape([n, h * a]),
        zeroth: s.zeroth.clone().reshape([n, h * a]),
    }
}

impl ControlJob<'_> {
    /// One `[gradient]` iteration: `env.episodes` noisy episodes (and their noise-free
    /// baselines) on the autodiff device, one optimizer step on the estimator's gradient.
    /// Logs the return, the first-order weight and both estimators' trace variances.
    pub(super) fn pathwise_round(
        &mut self,
        step: usize,
        g: &GradientSpec,
        row: &mut Row,
        timing: &mut Timings,
    ) -> Result<()> {
        let (n, h) = (self.r.env.episodes, self.horizon);
        let state = self.env.reset(n, &mut self.rng, &self.ad);
        self.ad.seed(self.rng.next_u64());
        let policy = self.protagonist.policy.clone().with_fixed_std();
        let s = timing.time("gen", || {
            pathwise_samples(&policy, &self.env, state, h, g.sigma)
        });
        let (loss, alpha) = surrogate(&policy, &s, g)?;
        let lr = self.schedule.at(step);
        let optim = &mut self.protagonist.optim;
        let (p, _, report) = timing.time("update_actor", || {
            accumulated_step(policy, optim, lr, 1, |_, _| loss.clone())
        });
        self.protagonist.policy = p;
        let f = flat(&s);
        let stats = Tensor::cat(
            vec![
                s.returns.mean(),
                alpha,
                trace_variance(f.first),
                trace_variance(f.zeroth),
            ],
            0,
        );
        let v: Vec<f32> = stats.into_data().try_to_vec().unwrap_or_default();
        let names = [
            keys::ROLLOUT_RETURN_MEAN,
            "gradient/first_weight",
            "gradient/first_variance",
            "gradient/zeroth_variance",
        ];
        row.extend(
            names
                .iter()
                .zip(v)
                .map(|(k, v)| (k.to_string(), f64::from(v))),
        );
        row.insert("policy/std".into(), f64::from(g.sigma));
        row.insert(keys::ACTOR_LR.into(), lr);
        row.insert(keys::ACTOR_GRAD_NORM.into(), report.grad_norm);
        Ok(())
    }
}
