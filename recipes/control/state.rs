//! The control job's state between iterations (`ControlJob`), its set-up (the run directory,
//! the environment, fresh players or a resumed run's), what a checkpoint holds beside the run
//! kit's records (the critics, the adversary and their optimizers), and the evaluations.

use crate::common::run::{RunLoop, load_pair, load_records, open_run, save_pair};
use crate::control::schema::{ControlRecipe, PolicySpec};
use anyhow::Result;
use burn::module::Module;
use burn::tensor::Device;
use ember_control::{
    Adversary, Env, GaussianPolicy, GaussianPolicyConfig, Side, ValueNet, ValueNetConfig, rollout,
};
use ember_engine::SplitMix64;
use ember_engine::keys;
use ember_run::{Run, RunOptions, checkpoint};
use ember_train::{LrSchedule, Optimizer};
use std::collections::BTreeMap;
use std::path::Path;

/// A learner: its policy, its critic and their optimizers.
pub(super) struct Player {
    pub(super) policy: GaussianPolicy,
    pub(super) critic: ValueNet,
    pub(super) optim: Optimizer,
    pub(super) critic_optim: Optimizer,
}

/// The run between iterations.
pub(super) struct ControlJob<'a> {
    pub(super) r: &'a ControlRecipe,
    pub(super) run: Run,
    pub(super) base: Device,
    pub(super) ad: Device,
    pub(super) env: Env,
    pub(super) horizon: usize,
    pub(super) protagonist: Player,
    pub(super) adversary: Option<Player>,
    pub(super) rng: SplitMix64,
    pub(super) schedule: LrSchedule,
    /// Evaluation returns: of the initial policy, and the latest.
    pub(super) before: f64,
    pub(super) after: f64,
    pub(super) steps_done: usize,
}

impl Player {
    /// A fresh player of shape `spec` acting with `act` dimensions on `ad` (draws from its RNG).
    fn new(
        r: &ControlRecipe,
        obs: usize,
        act: usize,
        spec: PolicySpec,
        ad: &Device,
    ) -> Result<Self> {
        let policy = GaussianPolicyConfig::new(obs, act)
            .with_hidden(spec.hidden)
            .with_log_std_init(spec.log_std_init)
            .init(ad)?;
        let critic = ValueNetConfig::new(obs)
            .with_hidden(spec.critic_hidden)
            .init(ad)?;
        Ok(Self {
            policy,
            critic,
            optim: r.ppo.optim.init(),
            critic_optim: r.ppo.optim.init(),
        })
    }

    /// Writes the player's records into `d`. The protagonist's policy and optimizer are the
    /// run kit's `model.bpk` and `optim.bpk` (written by [`save_state`]), its critic
    /// `critic.bpk` and `critic_optim.bpk`; the adversary's are `adversary[_critic].bpk` and
    /// `adversary[_critic]_optim.bpk`.
    fn save(&self, d: &Path, side: Side) -> Result<()> {
        if side == Side::Adversary {
            save_pair(d, ADVERSARY, self.policy.clone().into_record(), &self.optim)?;
        }
        let stem = critic_stem(side);
        save_pair(
            d,
            &stem,
            self.critic.clone().into_record(),
            &self.critic_optim,
        )
    }

    /// The player with its records of `d` ([`Player::save`]'s names); the protagonist's policy
    /// through the run kit's reader, which checks the checkpoint's manifest.
    fn load(self, d: &Path, side: Side) -> Result<Self> {
        let (policy, optim) = match side {
            Side::Adversary => load_pair(d, ADVERSARY, self.policy, self.optim)?,
            Side::Protagonist => load_records(d, self.policy, self.optim)?,
        };
        let (critic, critic_optim) =
            load_pair(d, &critic_stem(side), self.critic, self.critic_optim)?;
        Ok(Self {
            policy,
            critic,
            optim,
            critic_optim,
        })
    }
}

/// The adversary's files' stem.
const ADVERSARY: &str = "adversary";

fn critic_stem(side: Side) -> String {
    match side {
        Side::Protagonist => "critic".into(),
        Side::Adversary => format!("{ADVERSARY}_critic"),
    }
}

impl ControlJob<'_> {
    /// Opens the run directory and builds fresh players (seeded).
    pub(super) fn open<'a>(
        r: &'a ControlRecipe,
        out: &'a Path,
        opts: &RunOptions,
    ) -> Result<ControlJob<'a>> {
        let p = &r.ppo.run;
        let run_loop = RunLoop {
            steps: p.steps,
            checkpoint_every: p.checkpoint_every,
            keep_checkpoints: p.keep_checkpoints,
        };
        let curves = (keys::ROLLOUT_RETURN_MEAN, "eval/return_mean");
        let run = open_run(out, opts, &r.header.name, r, run_loop, curves)?;
        let base = crate::common::device::device(&r.header.device)?;
        let ad = base.clone().autodiff();
        let env = r.env()?;
        ad.seed(r.header.seed ^ 0x434f_4e54);
        let pol = &r.policy;
        let (obs, act) = (env.obs_dim(), env.act_dim());
        // Under `[gradient]` the std is σ's, fixed.
        let log_std = r.gradient.map_or(pol.log_std_init, |g| g.sigma.ln());
        let spec = PolicySpec {
            log_std_init: log_std,
            ..pol.clone()
        };
        let protagonist = Player::new(r, obs, act, spec, &ad)?;
        let adversary = match r.adversary() {
            Some(a) => {
                let spec = PolicySpec {
                    hidden: a.hidden.clone(),
                    critic_hidden: a.hidden.clone(),
                    log_std_init: a.log_std_init,
                };
                Some(Player::new(r, obs, env.force_dim(), spec, &ad)?)
            }
            None => None,
        };
        Ok(ControlJob {
            horizon: r.horizon()?,
            rng: SplitMix64(r.header.seed),
            schedule: r.ppo.schedule.schedule(p.steps),
            before: f64::NAN,
            after: f64::NAN,
            steps_done: run.first_step(),
            r,
            run,
            base,
            ad,
            env,
            protagonist,
            adversary,
        })
    }
}

impl ControlJob<'_> {
    /// A resumed run's players, RNG and evaluations; a fresh run's first evaluation.
    pub(super) fn begin(mut self) -> Result<Self> {
        let resumed = self
            .run
            .resumed()
            .map(|(d, st)| (d.to_path_buf(), st.clone()));
        if let Some((dir, st)) = resumed {
            (self.rng, self.before, self.after) =
                (SplitMix64(st.rng), st.accuracy_before, st.accuracy_after);
            self.protagonist = self.protagonist.load(&dir, Side::Protagonist)?;
            if let Some(a) = self.adversary.take() {
                self.adversary = Some(a.load(&dir, Side::Adversary)?);
            }
        } else {
            let (r, h) = (self.r, self.horizon);
            let mu = self.protagonist.policy.valid();
            self.before = evaluate(&mu, None, &self.env, h, r, &self.base);
            self.after = self.before;
            self.run.log(eval_row(0, self.before))?;
        }
        self.run.say(&format!(
            "initial policy: evaluation return {:.1}",
            self.before
        ));
        Ok(self)
    }
}

/// Fills a checkpoint directory: the protagonist's policy and optimizer as the run kit's
/// records (`model.bpk`, `optim.bpk`) with the run state, then the players' other records.
pub(super) fn save_state(
    d: &Path,
    protagonist: &Player,
    adversary: Option<&Player>,
    ts: &checkpoint::TrainState,
) -> Result<()> {
    let p = protagonist;
    checkpoint::write_records(d, p.policy.clone().into_record(), &p.optim, ts)?;
    p.save(d, Side::Protagonist)?;
    if let Some(a) = adversary {
        a.save(d, Side::Adversary)?;
    }
    Ok(())
}

/// The mean return of the policy's mean action (against the adversary's mean force, when
/// given) over `eval.episodes` episodes from initial states drawn with `eval.seed` (the same
/// states at every evaluation).
pub(super) fn evaluate(
    policy: &GaussianPolicy,
    adversary: Option<Adversary>,
    env: &Env,
    horizon: usize,
    r: &ControlRecipe,
    device: &Device,
) -> f64 {
    let mut rng = SplitMix64(r.eval.seed);
    let state = env.reset(r.eval.episodes, &mut rng, device);
    let ro = rollout(policy, adversary, env, state, horizon, false);
    f64::from(ro.returns().mean().into_scalar::<f32>())
}

/// The protagonist alone under every (mass multiplier, friction) of the recipe's grid.
pub(super) fn robustness(
    policy: &GaussianPolicy,
    r: &ControlRecipe,
    horizon: usize,
    device: &Device,
) -> Result<Vec<(f32, f32, f64)>> {
    let mut out = Vec::new();
    for &m in &r.eval.masses {
        for &f in &r.eval.frictions {
            let env = Env::new(r.env.name, r.env.mass * m, r.env.length)?.with_friction(f)?;
            out.push((m, f, evaluate(policy, None, &env, horizon, r, device)));
        }
    }
    Ok(out)
}

/// The evaluation as a metrics row.
pub(super) fn eval_row(step: usize, ret: f64) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("step".to_string(), step as f64),
        ("eval/return_mean".to_string(), ret),
    ])
}
