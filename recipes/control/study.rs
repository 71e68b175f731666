//! The gradient-estimator study (`cargo bench --bench gradient_estimators`): on Suh et al.'s
//! ball with a wall (a jump in the reward) and on the same launch without the wall (smooth),
//! the bias and variance of the first-order, zeroth-order, DDCG and inverse-variance (IVW;
//! IVW-H with one step) estimates of the smoothed reward's gradient against a 10⁵-sample
//! zeroth-order reference, then gradient-ascent learning curves of each on three seeds.
//! Prints the tables and writes the numbers as JSON (for `scripts/plot_gradient_study.py`).

use crate::control::pathwise::surrogate;
use crate::control::schema::{Estimator, GradientSpec};
use anyhow::Result;
use burn::module::Module;
use burn::tensor::{Device, Distribution, Tensor};
use ember_control::{
    BallWithWall, DdcgConfig, Env, EnvName, GaussianPolicy, GaussianPolicyConfig, GradientSamples,
    ddcg_weight, ivw_weight, mix, pathwise_samples, rollout,
};
use ember_engine::SplitMix64;
use ember_train::accumulated_step;
use serde::Serialize;
use std::path::Path;

/// The estimators compared, by name.
pub const ESTIMATORS: [&str; 4] = ["first", "zeroth", "ddcg", "ivw"];

/// The smoothing noise σ (radians) and the samples per estimate.
const SIGMA: f32 = 0.05;
const SAMPLES: usize = 100;

/// One estimator's combined gradient from one batch of samples, and the first-order weight α
/// it used.
fn estimate(s: &GradientSamples, which: &str) -> (f32, f32) {
    let alpha = match which {
        "first" => 1.0,
        "zeroth" => 0.0,
        "ddcg" => ddcg_weight(s, SIGMA, DdcgConfig::default()).into_scalar::<f32>(),
        _ => ivw_weight(s).into_scalar::<f32>(),
    };
    let d = s.values.device();
    (
        mix(s, Tensor::from_floats([alpha], &d)).into_scalar::<f32>(),
        alpha,
    )
}

/// Bias and variance of each estimator at one angle.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The launch angle.
    pub theta: f32,
    /// The reference gradient (10⁵ zeroth-order samples).
    pub reference: f64,
    /// Per estimator (in [`ESTIMATORS`] order): |mean − reference| over the repeats.
    pub bias: Vec<f64>,
    /// Per estimator: the variance over the repeats.
    pub variance: Vec<f64>,
    /// The fraction of DDCG's estimates that fell back to the zeroth-order estimator.
    pub ddcg_zeroth: f64,
}

fn noise(n: usize, device: &Device) -> Tensor<1> {
    Tensor::random([n], Distribution::Normal(0.0, f64::from(SIGMA)), device)
}

/// `repeats` estimates of each estimator at `theta`, against the reference.
fn point(task: &BallWithWall, theta: f32, repeats: usize, device: &Device) -> Point {
    let reference = task.samples(theta, noise(100_000, device), SIGMA);
    let reference = f64::from(reference.zeroth.mean().into_scalar::<f32>());
    let mut est = vec![Vec::with_capacity(repeats); ESTIMATORS.len()];
    let mut fell_back = 0usize;
    for _ in 0..repeats {
        let s = task.samples(theta, noise(SAMPLES, device), SIGMA);
        for (i, e) in ESTIMATORS.iter().enumerate() {
            let (g, alpha) = estimate(&s, e);
            est[i].push(f64::from(g));
            fell_back += usize::from(*e == "ddcg" && alpha == 0.0);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let var = |v: &[f64]| {
        let m = mean(v);
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64
    };
    Point {
        theta,
        reference,
        bias: est.iter().map(|v| (mean(v) - reference).abs()).collect(),
        variance: est.iter().map(|v| var(v)).collect(),
        ddcg_zeroth: fell_back as f64 / repeats as f64,
    }
}

/// Gradient ascent on the angle from `theta0` with each estimator: the distance after every
/// step (`steps` + 1 values), for one seed.
fn curve(
    task: &BallWithWall,
    which: &str,
    theta0: f32,
    lr: f32,
    steps: usize,
    device: &Device,
) -> Vec<f32> {
    let mut theta = theta0;
    let dist = |t: f32| {
        task.distance(Tensor::from_floats([t], device))
            .into_scalar::<f32>()
    };
    let mut out = vec![dist(theta)];
    for _ in 0..steps {
        let s = task.samples(theta, noise(SAMPLES, device), SIGMA);
        theta = (theta + lr * estimate(&s, which).0).clamp(0.0, std::f32::consts::FRAC_PI_2);
        out.push(dist(theta));
    }
    out
}

/// One task's results.
#[derive(Debug, Clone, Serialize)]
pub struct TaskStudy {
    /// `"wall"` or `"smooth"`.
    pub task: &'static str,
    /// The angles where the landing distance jumps (none without a wall).
    pub jumps: Vec<f32>,
    /// The angle sweep.
    pub points: Vec<Point>,
    /// Per estimator, per seed: the landing distance along gradient ascent.
    pub curves: Vec<Vec<Vec<f32>>>,
}

/// Runs the study and writes `out` (JSON); `repeats` estimates per angle.
pub fn run(out: &Path, repeats: usize) -> Result<Vec<TaskStudy>> {
    let device = crate::common::device::device("auto")?.autodiff();
    // The wall's curves start 0.14 rad (2.9σ) below the angle that clears it, on the flat
    // where the ball hits the wall; the smooth task's from a short throw.
    let smooth = BallWithWall {
        wall: None,
        ..BallWithWall::default()
    };
    let tasks = [
        ("wall", BallWithWall::default(), 0.55),
        ("smooth", smooth, 0.2),
    ];
    let mut all = Vec::new();
    for (name, task, theta0) in tasks {
        device.seed(7);
        let points: Vec<Point> = (1..40)
            .map(|i| {
                point(
                    &task,
                    i as f32 * std::f32::consts::FRAC_PI_2 / 40.0,
                    repeats,
                    &device,
                )
            })
            .collect();
        let curves = ESTIMATORS
            .iter()
            .map(|e| {
                (0..3u64)
                    .map(|seed| {
                        device.seed(100 + seed);
                        curve(&task, e, theta0, 5.0, 100, &device)
                    })
                    .collect()
            })
            .collect();
        let jumps = jumps(&task, &device);
        all.push(TaskStudy {
            task: name,
            jumps,
            points,
            curves,
        });
    }
    report(&all, repeats);
    ember_run::write_atomic(out, serde_json::to_string(&all)?.as_bytes())?;
    Ok(all)
}

/// The angles (on a 10⁻⁴ rad grid) where the landing distance jumps by more than 10⁻³: where
/// the rising ball clears the wall, and where the falling ball of a steep launch meets it.
fn jumps(task: &BallWithWall, device: &Device) -> Vec<f32> {
    let grid: Vec<f32> = (0..15_708).map(|i| i as f32 * 1e-4).collect();
    let x = task.distance(Tensor::from_floats(grid.as_slice(), device));
    let x = x.into_data().try_to_vec::<f32>().unwrap_or_default();
    x.windows(2)
        .enumerate()
        .filter(|(_, w)| (w[1] - w[0]).abs() > 1e-3)
        .map(|(i, _)| grid[i + 1])
        .collect()
}

/// Mean bias, its standard error and mean variance of estimator `i` over `points`.
fn summary(points: &[&Point], i: usize, repeats: usize) -> (f64, f64, f64) {
    let n = points.len().max(1) as f64;
    let bias = points.iter().map(|p| p.bias[i]).sum::<f64>() / n;
    let var = points.iter().map(|p| p.variance[i]).sum::<f64>() / n;
    (bias, (var / repeats as f64).sqrt(), var)
}

/// The tables: mean bias and variance over the sweep (and over the angles within 0.1 rad of
/// a jump), the final distances of the learning curves.
fn report(all: &[TaskStudy], repeats: usize) {
    for t in all {
        let all_points: Vec<&Point> = t.points.iter().collect();
        let near_jump = |p: &&Point| t.jumps.iter().any(|j| (p.theta - j).abs() < 0.1);
        let near: Vec<&Point> = t.points.iter().filter(near_jump).collect();
        println!(
            "\n{} task (jumps at {:?} rad): σ = {SIGMA}, {SAMPLES} samples per estimate, {repeats} \
             estimates per angle, {} angles ({} within 0.1 rad of a jump)",
            t.task,
            t.jumps,
            all_points.len(),
            near.len()
        );
        println!(
            "| estimator | bias (± s.e.) | variance | near a jump: bias | variance | final distance (3 seeds) |"
        );
        println!("|---|---|---|---|---|---|");
        for (i, e) in ESTIMATORS.iter().enumerate() {
            let (b, se, v) = summary(&all_points, i, repeats);
            let (nb, _, nv) = summary(&near, i, repeats);
            let finals: Vec<String> = t.curves[i]
                .iter()
                .map(|c| format!("{:.4}", c[c.len() - 1]))
                .collect();
            println!(
                "| {e} | {b:.2e} (± {se:.1e}) | {v:.2e} | {nb:.2e} | {nv:.2e} | {} |",
                finals.join(", ")
            );
        }
        let fell = t.points.iter().map(|p| p.ddcg_zeroth).sum::<f64>() / t.points.len() as f64;
        let fell_near = near.iter().map(|p| p.ddcg_zeroth).sum::<f64>() / near.len().max(1) as f64;
        println!(
            "DDCG fell back to the zeroth-order estimator in {:.1} % of the estimates ({:.1} % \
             near a jump)",
            100.0 * fell,
            100.0 * fell_near
        );
    }
}

/// One multi-step learning run's settings: the task, its horizon, the action noise, the
/// episodes per update, the updates, the learning rate.
#[derive(Debug, Clone, Copy)]
pub struct Learning {
    /// The environment.
    pub env: Env,
    /// Steps per episode (training and evaluation).
    pub horizon: usize,
    /// σ of the action noise.
    pub sigma: f32,
    /// Episodes per update.
    pub episodes: usize,
    /// Updates.
    pub updates: usize,
    /// Adam's learning rate.
    pub lr: f64,
}

/// A learning curve: the mean-action return on 32 fixed initial states before each of
/// `updates / 10` blocks of updates and after the last, for `seed`.
pub fn learning_curve(l: &Learning, which: Estimator, seed: u64) -> Result<Vec<f64>> {
    let spec = GradientSpec {
        estimator: which,
        sigma: l.sigma,
        ddcg_c: DdcgConfig::default().c,
    };
    let ad = crate::common::device::device("auto")?.autodiff();
    ad.seed(seed ^ 0x4444_4347);
    let mut policy = GaussianPolicyConfig::new(l.env.obs_dim(), l.env.act_dim())
        .with_log_std_init(l.sigma.ln())
        .init(&ad)?
        .with_fixed_std();
    let mut optim = ember_train::OptimizerConfig::default()
        .with_epsilon(1e-8)
        .init();
    let mut rng = SplitMix64(seed);
    let eval = |p: &GaussianPolicy| {
        let s0 = l.env.reset(32, &mut SplitMix64(12_345), &ad);
        let ro = rollout(&p.clone().no_grad(), None, &l.env, s0, l.horizon, false);
        f64::from(ro.returns().mean().into_scalar::<f32>())
    };
    let mut curve = vec![eval(&policy)];
    for u in 0..l.updates {
        let s0 = l.env.reset(l.episodes, &mut rng, &ad);
        let s = pathwise_samples(&policy, &l.env, s0, l.horizon, l.sigma);
        let (loss, _) = surrogate(&policy, &s, &spec)?;
        let (p, _, _) = accumulated_step(policy, &mut optim, l.lr, 1, |_, _| loss.clone());
        policy = p;
        if (u + 1) % 10 == 0 {
            curve.push(eval(&policy));
        }
    }
    Ok(curve)
}

/// One task's learning curves: per estimator (in [`Estimator::ALL`] order), per seed.
#[derive(Debug, Clone, Serialize)]
pub struct LearningStudy {
    /// `"pendulum"` or `"cart_pole"`.
    pub task: &'static str,
    /// Steps per episode.
    pub horizon: usize,
    /// Updates between two points of a curve.
    pub every: usize,
    /// The curves.
    pub curves: Vec<Vec<Vec<f64>>>,
}

/// The learning study's tasks: the smooth swing-up (100-step episodes) and the cart-pole,
/// whose reward stops when it falls (a jump the pathwise gradient cannot see), 200 steps.
pub fn learning_tasks() -> Result<Vec<(&'static str, Learning)>> {
    let base = |env: Env, horizon: usize| Learning {
        env,
        horizon,
        sigma: 0.5,
        episodes: 16,
        updates: 100,
        lr: 1e-2,
    };
    Ok(vec![
        (
            "pendulum",
            base(Env::new(EnvName::Pendulum, 1.0, 1.0)?, 100),
        ),
        (
            "cart_pole",
            base(Env::new(EnvName::CartPole, 1.0, 1.0)?, 200),
        ),
    ])
}

/// Every estimator's learning curves on every task, three seeds; prints the final returns.
pub fn learning_study(seeds: u64) -> Result<Vec<LearningStudy>> {
    let mut out = Vec::new();
    for (task, l) in learning_tasks()? {
        let mut curves = Vec::new();
        println!(
            "\n{task}: {}-step episodes, σ = {}, {} episodes × {} updates",
            l.horizon, l.sigma, l.episodes, l.updates
        );
        println!("| estimator | return before | after, per seed | mean |");
        println!("|---|---|---|---|");
        for e in Estimator::ALL {
            let runs: Vec<Vec<f64>> = (0..seeds)
                .map(|s| learning_curve(&l, e, s))
                .collect::<Result<_>>()?;
            let finals: Vec<f64> = runs.iter().map(|c| c[c.len() - 1]).collect();
            let mean = finals.iter().sum::<f64>() / finals.len() as f64;
            let shown: Vec<String> = finals.iter().map(|f| format!("{f:.1}")).collect();
            println!(
                "| {} | {:.1} | {} | {mean:.1} |",
                e.name(),
                runs[0][0],
                shown.join(", ")
            );
            curves.push(runs);
        }
        out.push(LearningStudy {
            task,
            horizon: l.horizon,
            every: 10,
            curves,
        });
    }
    Ok(out)
}
