//! The control job: per iteration, a batch of episodes sampled on the device, the learner's
//! critic values, GAE (the engine's, with the time limit's cut bootstrapped), PPO's clipped
//! update of the learner's Gaussian policy and its critic's regression (`ember-train`'s), then
//! the run kit's end-of-step protocol (metrics, evaluation, checkpoint, exact resume). With an
//! adversary (RARL, Pinto et al. 2017, Algorithm 1), an iteration is N_μ such rounds of the
//! protagonist against the fixed adversary, then N_ν of the adversary (reward −r) against the
//! fixed protagonist.

use crate::control::schema::ControlRecipe;
use crate::control::state::{ControlJob, Player, eval_row, evaluate, robustness, save_state};
use anyhow::Result;
use burn::module::Module;
use burn::tensor::Tensor;
use ember_control::{Adversary, ControlExperience, Rollout, Side, rollout};
use ember_engine::*;
use ember_run::{Row, RunOptions, Timings, fmt_metric};
use ember_train::{
    CriticBatch, CriticData, CriticStep, UpdateConfig, UpdateData, critic_update, update,
};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// What a run reports (also `summary.json`).
#[derive(Debug, Clone, Serialize)]
pub struct ControlSummary {
    /// Run name.
    pub name: String,
    /// Mean evaluation return of the initial policy.
    pub before: f64,
    /// Mean evaluation return after training (without the adversary).
    pub after: f64,
    /// Iterations done.
    pub steps: usize,
    /// Environment steps sampled for training (both players' rollouts).
    pub env_steps: usize,
    /// Seconds of training.
    pub seconds: f64,
    /// Stopped by Ctrl-C.
    pub interrupted: bool,
    /// `(mass multiplier, friction, mean return)` of the final protagonist over the recipe's
    /// grid (`eval.masses` × `eval.frictions`), without the adversary.
    pub robustness: Vec<(f32, f32, f64)>,
}

/// Runs the recipe, writing into `out`.
pub fn train(r: &ControlRecipe, out: &Path, opts: &RunOptions) -> Result<ControlSummary> {
    ember_run::train::<ControlJob>(r, out, opts)
}

/// A round's experience, on the training device: `[rows, steps]` each, rows being the
/// update's (whole episodes or segments).
struct Experience {
    exp: ControlExperience,
    batch: RolloutBatch,
    adv: Advantages,
    values: Tensor<2>,
}

impl ControlJob<'_> {
    /// One rollout of both players and the update of `learner` (its metrics prefixed
    /// `adversary/` for the adversary; the last round's are logged), each phase's seconds
    /// added to `timing`.
    fn round(
        &mut self,
        step: usize,
        learner: Side,
        row: &mut Row,
        timing: &mut Timings,
    ) -> Result<()> {
        let mut own = Row::new();
        let ro = timing.time("gen", || self.play())?;
        let e = self.experience(step, &ro, learner, &mut own)?;
        let seed = self.rng.next_u64();
        let lr = self.schedule.at(step);
        let player = match learner {
            Side::Protagonist => &mut self.protagonist,
            Side::Adversary => self.adversary.as_mut().unwrap_or_else(|| unreachable!()),
        };
        let r = self.r;
        timing.time("update_actor", || {
            update_player(player, e, r, lr, seed, &mut own)
        })?;
        let prefix = match learner {
            Side::Protagonist => "",
            Side::Adversary => "adversary/",
        };
        row.extend(own.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
        Ok(())
    }

    /// A batch of episodes from fresh initial states, both players sampling.
    fn play(&mut self) -> Result<Rollout> {
        let (n, h) = (self.r.env.episodes, self.horizon);
        let state = self.env.reset(n, &mut self.rng, &self.base);
        self.base.seed(self.rng.next_u64());
        let nu = self.adversary.as_ref().map(|a| a.policy.valid());
        let adv = nu.as_ref().zip(self.r.adversary()).map(|(p, a)| Adversary {
            policy: p,
            max_force: a.max_force,
        });
        Ok(rollout(
            &self.protagonist.policy.valid(),
            adv,
            &self.env,
            state,
            h,
            true,
        ))
    }

    /// The learner's view of a rollout: its actions and log-probs, its reward (r, or −r for
    /// the adversary: zero-sum), its critic's values, GAE's advantages and returns.
    fn experience(
        &self,
        step: usize,
        ro: &Rollout,
        learner: Side,
        row: &mut Row,
    ) -> Result<Experience> {
        let (r, n, h) = (self.r, self.r.env.episodes, self.horizon);
        let (player, actions, log_probs, side) = match (learner, &self.adversary, &ro.adversary) {
            (Side::Adversary, Some(p), Some((a, lp))) => (p, a, lp, Side::Adversary),
            _ => (
                &self.protagonist,
                &ro.actions,
                &ro.log_probs,
                Side::Protagonist,
            ),
        };
        let critic = player.critic.valid();
        let o = self.env.obs_dim();
        let values = critic
            .value(ro.obs.clone().reshape([n * h, o]))
            .reshape([n, h]);
        let last = critic.value(ro.last_obs.clone());
        let run = &r.ppo.run;
        let rewards = ro.learner_rewards(side, last, run.gamma, run.reward_scale);
        log_rollout(ro, &player.policy, row);
        let groups: Vec<usize> = (0..n).collect();
        let ad = &self.ad;
        let batch = RolloutBatch::new(
            ro.mask.clone().to_device(ad),
            Tensor::zeros([n], ad),
            &groups,
        )?
        .with_token_rewards(rewards.to_device(ad))?
        .with_values(values.clone().to_device(ad))?
        .with_old_log_probs(log_probs.clone().to_device(ad))?;
        let kind = AdvantageKind::Gae {
            gamma: r.ppo.run.gamma,
            lambda: r.ppo.run.lambda,
            whiten: true,
        };
        let adv = compute_advantages(&AdvantageConfig::new(kind), &batch, step)?;
        let exp = ControlExperience {
            obs: ro.obs.clone().to_device(ad),
            actions: actions.clone().to_device(ad),
        };
        Ok(self.segmented(exp, batch, adv, values.to_device(ad)))
    }

    /// The experience cut into the update's rows (`ppo.segment`).
    fn segmented(
        &self,
        exp: ControlExperience,
        batch: RolloutBatch,
        adv: Advantages,
        values: Tensor<2>,
    ) -> Experience {
        let seg = self.r.ppo.run.segment;
        if seg == 0 {
            return Experience {
                exp,
                batch,
                adv,
                values,
            };
        }
        let rows = self.r.env.episodes * self.horizon / seg;
        let cut = |t: Tensor<2>| t.reshape([rows, seg]);
        let old = batch.old_log_probs.map(cut);
        let mask = cut(adv.mask);
        let groups: Vec<usize> = (0..rows).collect();
        let ad = &self.ad;
        let mut b = RolloutBatch::new(mask.clone(), Tensor::zeros([rows], ad), &groups)
            .unwrap_or_else(|e| unreachable!("a reshaped batch is well formed: {e}"));
        b.old_log_probs = old;
        Experience {
            exp: exp.segments(seg),
            batch: b,
            adv: Advantages {
                advantages: cut(adv.advantages),
                returns: cut(adv.returns),
                mask,
                metrics: adv.metrics,
            },
            values: cut(values),
        }
    }

    /// Log, evaluation, checkpoint; returns whether the run stops.
    fn end_step(&mut self, done: usize, mut row: Row) -> Result<bool> {
        let r = self.r;
        let end = self.run.step_end(done);
        let evaluated = done.is_multiple_of(r.eval.every) || done == r.ppo.run.steps;
        if evaluated || end.stop {
            let mu = self.protagonist.policy.valid();
            self.after = evaluate(&mu, None, &self.env, self.horizon, r, &self.base);
            if evaluated {
                row.extend(eval_row(done, self.after));
                if let (Some(nu), Some(a)) = (&self.adversary, r.adversary()) {
                    let nu = nu.policy.valid();
                    let adv = Adversary {
                        policy: &nu,
                        max_force: a.max_force,
                    };
                    let with = evaluate(&mu, Some(adv), &self.env, self.horizon, r, &self.base);
                    row.insert("eval/return_with_adversary".into(), with);
                }
            }
        }
        let stats = format!(
            "return {} eval {} std {} ({:.2} s)",
            fmt_metric(row[keys::ROLLOUT_RETURN_MEAN], 1),
            fmt_metric(self.after, 1),
            fmt_metric(row["policy/std"], 3),
            row[keys::PERF_STEP_S],
        );
        let ts = self.run.state(done, self.rng.0, self.before, self.after);
        let (p, a) = (&self.protagonist, self.adversary.as_ref());
        self.run
            .end_step(end, row, evaluated, &stats, |d| save_state(d, p, a, &ts))
    }
}

/// The rollout's metrics (`rollout/*` of the protagonist's reward; the learner's std).
fn log_rollout(ro: &Rollout, policy: &ember_control::GaussianPolicy, row: &mut Row) {
    let host = Tensor::cat(
        vec![
            ro.returns().mean().reshape([1]),
            ro.mask.clone().sum_dim(1).mean().reshape([1]),
            policy.log_std().exp().mean().reshape([1]),
        ],
        0,
    );
    let v: Vec<f32> = host.into_data().try_to_vec().unwrap_or_default();
    if let [ret, len, std] = v[..] {
        row.insert(keys::ROLLOUT_RETURN_MEAN.into(), f64::from(ret));
        row.insert("rollout/length_mean".into(), f64::from(len));
        row.insert("policy/std".into(), f64::from(std));
    }
}

/// PPO's update of a player's policy, then its critic's regression onto GAE's returns.
fn update_player(
    player: &mut Player,
    e: Experience,
    r: &ControlRecipe,
    lr: f64,
    seed: u64,
    row: &mut Row,
) -> Result<()> {
    row.extend(e.adv.metrics.to_host());
    row.insert(keys::ACTOR_LR.into(), lr);
    let cfg = UpdateConfig {
        schedule: r.ppo.update,
        loss: ActorLossConfig {
            policy: PolicyLossKind::Ppo {
                clip_low: r.ppo.run.clip_low,
                clip_high: r.ppo.run.clip_high,
                dual_clip: None,
            },
            agg: LossAgg::TokenMean,
            kl: None,
            entropy_coef: r.ppo.run.entropy_coef,
            mismatch: None,
        },
    };
    let mut order_rng = SplitMix64(seed);
    let mut order = |k| order_rng.permutation(k);
    let batch = UpdateData {
        experience: &e.exp,
        batch: &e.batch,
        adv: &e.adv,
    };
    let (p, stats) = update(
        player.policy.clone(),
        &mut player.optim,
        batch,
        &cfg,
        lr,
        &mut order,
    )?;
    player.policy = p;
    row.extend(stats.metrics);
    let critic_lr = match r.ppo.run.critic_lr {
        0.0 => lr,
        c => c * lr / r.ppo.schedule.lr,
    };
    let cb = CriticBatch {
        values: e.values,
        returns: e.adv.returns,
        mask: e.adv.mask,
        weights: None,
    };
    let ccfg = CriticConfig {
        value_clip: r.ppo.run.value_clip,
        ..CriticConfig::default()
    };
    let how = CriticStep {
        cfg: &ccfg,
        schedule: &r.ppo.update,
        lr: critic_lr,
    };
    let data = CriticData {
        experience: &e.exp,
        batch: &cb,
    };
    let (c, stats) = critic_update(
        player.critic.clone(),
        &mut player.critic_optim,
        data,
        how,
        &mut order,
    )?;
    player.critic = c;
    row.extend(stats.metrics);
    Ok(())
}

impl<'a> ember_run::Job<'a> for ControlJob<'a> {
    type Recipe = ControlRecipe;
    type Summary = ControlSummary;

    fn setup(r: &'a ControlRecipe, out: &'a Path, opts: &RunOptions) -> Result<Self> {
        ControlJob::open(r, out, opts)
    }

    fn start(self) -> Result<Self> {
        self.begin()
    }

    fn run(&self) -> &ember_run::Run {
        &self.run
    }

    /// One iteration; returns whether the run stops after it.
    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        let t = Instant::now();
        let mut row = Row::new();
        let mut timing = Timings::default();
        if let Some(g) = self.r.gradient {
            self.pathwise_round(step, &g, &mut row, &mut timing)?;
        } else {
            let (n_mu, n_nu) = self
                .r
                .adversary()
                .map_or((1, 0), |a| (a.protagonist_iters, a.adversary_iters));
            for _ in 0..n_mu {
                self.round(step, Side::Protagonist, &mut row, &mut timing)?;
            }
            for _ in 0..n_nu {
                self.round(step, Side::Adversary, &mut row, &mut timing)?;
            }
        }
        timing.log(&mut row);
        let done = step + 1;
        self.steps_done = done;
        row.insert("step".into(), done as f64);
        row.insert(keys::PERF_STEP_S.into(), t.elapsed().as_secs_f64());
        let stop = self.end_step(done, row)?;
        Ok((self, stop))
    }

    /// The robustness grid and the summary.
    fn finish(mut self, interrupted: bool, seconds: f64) -> Result<ControlSummary> {
        let r = self.r;
        let mu = self.protagonist.policy.valid();
        let grid = robustness(&mu, r, self.horizon, &self.base)?;
        // Under `[gradient]` each noisy episode has its noise-free baseline.
        let rounds = match (r.adversary(), r.gradient) {
            (_, Some(_)) => 2,
            (Some(a), None) => a.protagonist_iters + a.adversary_iters,
            (None, None) => 1,
        };
        let summary = ControlSummary {
            name: r.header.name.clone(),
            before: self.before,
            after: self.after,
            steps: self.steps_done,
            env_steps: self.steps_done * rounds * r.env.episodes * self.horizon,
            seconds,
            interrupted,
            robustness: grid,
        };
        self.run.finish(&serde_json::to_value(&summary)?)?;
        self.run.say(&format!(
            "evaluation return {:.1} -> {:.1} ({} iterations, {} environment steps, {:.0} s)",
            summary.before, summary.after, summary.steps, summary.env_steps, seconds
        ));
        Ok(summary)
    }
}
