//! Continuous control (`ember-control`, `kind = "control"`): the environments against
//! gymnasium's transitions (`scripts/make_control_fixtures.py`), the differentiable step's
//! gradient against finite differences, batched rescoring against the sampler's log-probs, and
//! the job end to end: it learns, resumes exactly, and refuses bad recipes by name.

mod common;

use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Tensor, TensorData};
use ember_control::{
    ControlExperience, Env, EnvName, GaussianPolicy, GaussianPolicyConfig, ValueNetConfig,
    pathwise_samples, policy_surrogate, reward_to_go, rollout,
};
use ember_engine::SplitMix64;
use ember_engine::{PolicyLossInput, PolicyLossKind, policy_loss};
use ember_train::{Actor, Critic};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-control-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn vals(t: Tensor<2>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Every recorded gymnasium transition (600 of Pendulum-v1 with torques beyond the bound, 390
/// of CartPole-v1 to termination): the same state and action give the same next state,
/// reward, termination and observation, to 1e-5 (absolute, or relative beyond 1).
#[test]
fn environments_match_gymnasium_step_for_step() {
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/control/gymnasium_transitions.json"))
            .unwrap();
    let data: serde_json::Value = serde_json::from_str(&text).unwrap();
    let d = Device::flex();
    for (key, name) in [
        ("pendulum", EnvName::Pendulum),
        ("cart_pole", EnvName::CartPole),
    ] {
        let env = Env::new(name, 1.0, 1.0).unwrap();
        let rows = data[key].as_array().unwrap();
        let n = rows.len();
        let col = |f: &str| -> Vec<f32> { rows.iter().flat_map(|r| floats(&r[f])).collect() };
        let (state, next, obs) = (col("state"), col("next"), col("obs"));
        let k = state.len() / n;
        let s = Tensor::<2>::from_data(TensorData::new(state, [n, k]), &d);
        let a = Tensor::<2>::from_data(TensorData::new(col("action"), [n, 1]), &d);
        let t = env.step(s, a);
        let close = |g: f32, w: f32| (g - w).abs() <= 1e-5 * w.abs().max(1.0);
        for (i, (g, w)) in vals(t.state.clone()).iter().zip(&next).enumerate() {
            assert!(close(*g, *w), "{key} row {}: next state {g} vs {w}", i / k);
        }
        let rewards = t.reward.into_data().try_to_vec::<f32>().unwrap();
        let ended = t.terminated.into_data().try_to_vec::<f32>().unwrap();
        for (i, r) in rows.iter().enumerate() {
            let want = r["reward"].as_f64().unwrap() as f32;
            assert!(
                close(rewards[i], want),
                "{key} row {i}: reward {} vs {want}",
                rewards[i]
            );
            let term = r["terminated"].as_bool().unwrap();
            assert_eq!(ended[i] == 1.0, term, "{key} row {i}: terminated");
        }
        let o = vals(env.observe(t.state));
        for (g, w) in o.iter().zip(&obs) {
            assert!(close(*g, *w), "{key}: observation {g} vs {w}");
        }
    }
}

/// The return of 5 pendulum steps under fixed torques, differentiated through the simulator
/// by autodiff, equals central finite differences (in f64 of the f32 returns, step 1e-2) for
/// the initial state and every action, where no clip is active.
#[test]
fn differentiable_step_gradient_matches_finite_differences() {
    let d = Device::flex().autodiff();
    let env = Env::new(EnvName::Pendulum, 1.0, 1.0).unwrap();
    let (s0, u) = ([0.7f32, -0.4], [0.3f32, -0.5, 0.9, 0.1, -0.2]);
    let ret = |s: [f32; 2], u: &[f32], dev: &Device| -> (Tensor<2>, Tensor<2>, Tensor<1>) {
        let grad = |t: Tensor<2>| {
            if dev.is_autodiff() {
                t.require_grad()
            } else {
                t
            }
        };
        let state = grad(Tensor::<2>::from_floats([s], dev));
        let acts = grad(Tensor::<2>::from_data(
            TensorData::new(u.to_vec(), [1, u.len()]),
            dev,
        ));
        let mut st = state.clone();
        let mut total = Tensor::<1>::zeros([1], dev);
        for t in 0..u.len() {
            let tr = env.step(st, acts.clone().narrow(1, t, 1));
            total = total + tr.reward;
            st = tr.state;
        }
        (state, acts, total)
    };
    let (state, acts, total) = ret(s0, &u, &d);
    let g = total.backward();
    let gs = vals(state.grad(&g).unwrap());
    let ga = vals(acts.grad(&g).unwrap());
    let f = |s: [f32; 2], u: &[f32]| -> f64 {
        f64::from(ret(s, u, &Device::flex()).2.into_scalar::<f32>())
    };
    let h = 1e-2f32;
    for i in 0..2 {
        let (mut p, mut m) = (s0, s0);
        p[i] += h;
        m[i] -= h;
        let fd = (f(p, &u) - f(m, &u)) / (2.0 * f64::from(h));
        assert!(
            (f64::from(gs[i]) - fd).abs() < 2e-3 * fd.abs().max(1.0),
            "dR/ds{i}: {} vs {fd}",
            gs[i]
        );
    }
    for t in 0..u.len() {
        let (mut p, mut m) = (u, u);
        p[t] += h;
        m[t] -= h;
        let fd = (f(s0, &p) - f(s0, &m)) / (2.0 * f64::from(h));
        assert!(
            (f64::from(ga[t]) - fd).abs() < 2e-3 * fd.abs().max(1.0),
            "dR/du{t}: {} vs {fd}",
            ga[t]
        );
    }
}

/// The actor's batched rescoring of a rollout (rows in another order, cut into segments)
/// equals the log-probs recorded while sampling; its entropy is the hand value
/// ½ + ½·ln 2π + log σ; the critic scores each step as its one-state forward does.
#[test]
fn rescoring_equals_the_sampled_log_probs() {
    let d = Device::flex();
    d.seed(3);
    let env = Env::new(EnvName::CartPole, 1.0, 1.0).unwrap();
    let policy = GaussianPolicyConfig::new(4, 1)
        .with_hidden(vec![8])
        .with_log_std_init(-0.5)
        .init(&d)
        .unwrap();
    let critic = ValueNetConfig::new(4)
        .with_hidden(vec![8])
        .init(&d)
        .unwrap();
    let state = env.reset(3, &mut SplitMix64(5), &d);
    let ro = rollout(&policy, None, &env, state, 8, true);
    let exp = ControlExperience {
        obs: ro.obs.clone(),
        actions: ro.actions.clone(),
    };
    let s = policy.score(&exp, &[2, 0, 1], true);
    let want = Tensor::cat(
        vec![
            ro.log_probs.clone().narrow(0, 2, 1),
            ro.log_probs.clone().narrow(0, 0, 2),
        ],
        0,
    );
    for (g, w) in vals(s.log_probs).iter().zip(vals(want)) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    let h = vals(s.entropy.unwrap());
    assert!(
        h.iter()
            .all(|&x| (x - (0.5 + 0.918_938_5 - 0.5)).abs() < 1e-6),
        "{h:?}"
    );
    let seg = exp.segments(4);
    let s = policy.score(&seg, &[0, 1, 2, 3, 4, 5], false);
    for (g, w) in vals(s.log_probs).iter().zip(vals(ro.log_probs.clone())) {
        assert!((g - w).abs() < 1e-5, "segments: {g} vs {w}");
    }
    let v = vals(critic.values(&exp, &[1]));
    let one = critic.value(ro.obs.clone().narrow(0, 1, 1).reshape([8, 4]));
    for (g, w) in v.iter().zip(one.into_data().try_to_vec::<f32>().unwrap()) {
        assert!((g - w).abs() < 1e-6);
    }
    // The mask stops at termination and rewards stop with it.
    let (m, r) = (vals(ro.mask.clone()), vals(ro.rewards.clone()));
    assert!(m.iter().zip(&r).all(|(m, r)| m == r), "{m:?} {r:?}");
}

fn train(recipe: &str, out: &Path, sets: &[&str], flags: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ember"));
    c.arg("train")
        .arg(root().join("recipes").join(recipe))
        .args(["--quiet", "--out"])
        .arg(out);
    for s in sets {
        c.args(["--set", s]);
    }
    c.args(flags).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into()
}

/// The cart-pole recipe at a small budget: the deterministic policy's return (200 at most here)
/// rises by at least 100 within 12 iterations on two seeds; a run stopped after 5 and resumed
/// logs the uninterrupted run's metrics.
#[test]
fn control_job_learns_and_resumes_exactly() {
    let small = ["ppo.steps=12", "eval.every=4", "env.horizon=200"];
    for seed in ["seed=0", "seed=1"] {
        let out = tmp(&format!("learn-{seed}"));
        let sets: Vec<&str> = small.iter().copied().chain([seed]).collect();
        let o = train("cart-pole-ppo.toml", &out, &sets, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap())
                .unwrap();
        let (before, after) = (s["before"].as_f64().unwrap(), s["after"].as_f64().unwrap());
        eprintln!("cart-pole {seed}: evaluation return {before:.1} -> {after:.1}");
        assert!(after - before >= 100.0, "{seed}: {before} -> {after}");
        if seed == "seed=0" {
            let part = tmp("part");
            let o = train("cart-pole-ppo.toml", &part, &sets, &["--stop-after", "5"]);
            assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
            let o = train("cart-pole-ppo.toml", &part, &sets, &["--resume"]);
            assert!(o.status.success(), "{}", stderr(&o));
            assert_eq!(common::metric_rows(&part), common::metric_rows(&out));
            std::fs::remove_dir_all(&part).ok();
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

/// Bad recipes are refused before anything runs, naming the key. The last seven were accepted
/// before (found by `scripts/fuzz_set.py`): NaN or huge optimizer settings ran and wrote
/// checkpoints, huge masses or forces ran, and a huge `ppo.epochs` made a step that never ended.
#[test]
fn control_recipe_errors_name_the_key() {
    let cases: [(&[&str], &str); 19] = [
        (&["ppo.segment=7"], "ppo.segment"),
        (&["ppo.mini_batches=100000"], "ppo.mini_batches"),
        (&["env.mass=0"], "env.mass"),
        (&["env.name=\"hopper\""], "hopper"),
        (&["ppo.learning_rate=0.1"], "learning_rate"),
        (&["env.episodes=0"], "env.episodes"),
        (&["ppo.weight_decay=nan"], "ppo.weight_decay = NaN"),
        (&["ppo.adam_eps=-1"], "ppo.adam_eps = -1"),
        (&["ppo.min_lr_ratio=inf"], "ppo.min_lr_ratio = inf"),
        (&["ppo.epochs=9223372036854775807"], "ppo.epochs"),
        (&["env.mass=1e18"], "env.mass"),
        (&["ppo.reward_scale=1e18"], "ppo.reward_scale"),
        (&["eval.masses=[1e18]"], "eval.masses"),
        (&["ppo.clip_low=1"], "ppo.clip_low = 1 must be in [0, 1)"),
        (
            &["ppo.clip=0.2"],
            "`ppo.clip` is now spelled `ppo.clip_low` and `ppo.clip_high`",
        ),
        (
            &["gradient.estimator=\"ddcg\"", "gradient.sigma=0"],
            "gradient.sigma = 0 must be in [1e-4, 10]",
        ),
        (
            &["gradient.estimator=\"ddcg\"", "gradient.ddcg_c=1"],
            "gradient.ddcg_c = 1 must be in [0, 1)",
        ),
        (&["gradient.estimator=\"second\""], "second"),
        (
            &["gradient.estimator=\"ivw_h\"", "env.episodes=1"],
            "env.episodes must be at least 2",
        ),
    ];
    for (sets, want) in cases {
        let out = tmp("bad");
        let o = train("pendulum-ppo.toml", &out, sets, &[]);
        assert!(!o.status.success(), "{sets:?} was accepted");
        assert!(stderr(&o).contains(want), "{sets:?}: {}", stderr(&o));
        assert!(!out.exists(), "{sets:?} created the run directory");
    }
}

/// RARL at a tiny budget: both players' records make the checkpoint (a run stopped after 2
/// iterations and resumed logs the uninterrupted run's metrics, the adversary's included); the
/// adversary's metrics and the evaluation against it are logged; the robustness grid is
/// evaluated for every pair.
#[test]
fn rarl_job_resumes_exactly_and_evaluates_the_grid() {
    let sets = [
        "env.horizon=50",
        "env.episodes=4",
        "ppo.steps=4",
        "ppo.segment=25",
        "ppo.mini_batches=4",
        "ppo.epochs=2",
        "eval.every=2",
        "eval.episodes=4",
        "eval.masses=[1.0, 2.0]",
        "eval.frictions=[0.0, 0.1, 0.2]",
    ];
    let full = tmp("rarl-full");
    let o = train("pendulum-rarl.toml", &full, &sets, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let part = tmp("rarl-part");
    let o = train("pendulum-rarl.toml", &part, &sets, &["--stop-after", "2"]);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let o = train("pendulum-rarl.toml", &part, &sets, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (a, b) = (common::metric_rows(&part), common::metric_rows(&full));
    assert_eq!(a, b);
    let last = &b[b.len() - 1];
    for key in [
        "adversary/actor/pg_loss",
        "adversary/critic/vf_loss",
        "eval/return_with_adversary",
    ] {
        assert!(last.contains_key(key), "{key} missing: {:?}", last.keys());
    }
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(full.join("summary.json")).unwrap()).unwrap();
    let grid = s["robustness"].as_array().unwrap();
    assert_eq!(grid.len(), 6);
    assert_eq!(grid[5][0].as_f64(), Some(2.0));
    assert!((grid[5][1].as_f64().unwrap() - 0.2).abs() < 1e-6);
    std::fs::remove_dir_all(&full).ok();
    std::fs::remove_dir_all(&part).ok();
}

/// One SGD step of `policy` on `loss`'s gradient.
fn sgd_step(policy: &GaussianPolicy, loss: Tensor<1>) -> GaussianPolicy {
    let mut opt: ModuleOptimizer = SgdConfig::new().init();
    let g = GradientsParams::from_grads(loss.backward(), policy);
    opt.step(0.1, policy.clone(), g)
}

/// The zeroth-order samples (G_t − b_t)·w_t/σ², carried to θ through the policy
/// (`policy_surrogate`, IVW-H's vector-Jacobian product), give the engine's REINFORCE gradient
/// (`PolicyLossKind::Vanilla` on the same steps with advantages G_t − b_t): one SGD step with
/// each leaves the same policy. The reward-to-go is checked by hand, and a cart-pole batch
/// (whose reward does not depend on the actions) has first-order samples of exactly 0.
#[test]
fn zeroth_order_samples_carry_the_engines_reinforce_gradient() {
    let ad = Device::flex().autodiff();
    ad.seed(11);
    let env = Env::new(EnvName::Pendulum, 1.0, 1.0).unwrap();
    let policy = GaussianPolicyConfig::new(3, 1)
        .with_hidden(vec![8])
        .with_log_std_init(0.3f32.ln())
        .init(&ad)
        .unwrap()
        .with_fixed_std();
    let state = env.reset(4, &mut SplitMix64(2), &ad);
    let s = pathwise_samples(&policy, &env, state, 6, 0.3);
    let a = sgd_step(
        &policy,
        policy_surrogate(&policy, s.obs.clone(), s.zeroth.clone()),
    );
    let lp = policy.log_prob(
        s.obs.clone().reshape([24, 3]),
        s.actions.clone().reshape([24, 1]),
    );
    let lp = lp.reshape([4, 6]);
    let input = PolicyLossInput {
        old_log_probs: lp.clone().detach(),
        log_probs: lp,
        advantages: s.advantages.clone(),
        mask: Tensor::ones([4, 6], &ad),
        ref_log_probs: None,
    };
    let engine = policy_loss(&PolicyLossKind::Vanilla, &input).unwrap();
    let b = sgd_step(&policy, engine.per_step.sum() / 4.0);
    let probe = Tensor::<2>::from_floats([[1.0, 0.0, 0.5], [-0.3, 0.9, -2.0]], &ad);
    let (ma, mb, m0) = (
        vals(a.mean(probe.clone())),
        vals(b.mean(probe.clone())),
        vals(policy.mean(probe)),
    );
    for ((x, y), z) in ma.iter().zip(&mb).zip(&m0) {
        assert!(
            (x - y).abs() < 1e-5 * (x - z).abs().max(1e-3),
            "{ma:?} vs {mb:?} (from {m0:?})"
        );
        assert!((x - z).abs() > 1e-6, "the step moved nothing: {ma:?}");
    }
    let rtg = vals(reward_to_go(Tensor::from_floats([[1.0, 2.0, 3.0]], &ad)));
    assert_eq!(rtg, vec![6.0, 5.0, 3.0]);
    let cart = Env::new(EnvName::CartPole, 1.0, 1.0).unwrap();
    let p4 = GaussianPolicyConfig::new(4, 1)
        .with_hidden(vec![8])
        .init(&ad)
        .unwrap();
    let s = pathwise_samples(&p4, &cart, cart.reset(3, &mut SplitMix64(4), &ad), 20, 0.5);
    let first = s.first.into_data().try_to_vec::<f32>().unwrap();
    assert!(first.iter().all(|&g| g == 0.0));
}

/// Trains `recipe` with `sets` (expected to succeed) and returns its metric rows.
fn gradient_run(recipe: &str, out: &Path, sets: &[&str], flags: &[&str]) -> Vec<Row> {
    let o = train(recipe, out, sets, flags);
    assert!(o.status.success(), "{sets:?}: {}", stderr(&o));
    common::metric_rows(out)
}

type Row = serde_json::Map<String, serde_json::Value>;

/// Every row's `key`.
fn column(rows: &[Row], key: &str) -> Vec<f64> {
    rows.iter().filter_map(|r| r.get(key)?.as_f64()).collect()
}

/// `[gradient]` trains through `ember train`: the first-order samples' weight is 1 for the
/// pathwise estimator, 0 for REINFORCE's, IVW-H's strictly between (both variances are positive
/// on the pendulum), DDCG's in [0, 1]; the std stays σ; the policy moves. A DDCG run stopped
/// after 2 iterations and resumed logs the uninterrupted run's metrics. RARL's adversary is
/// refused beside `[gradient]`.
#[test]
fn gradient_estimators_train_and_resume_exactly() {
    let small = [
        "env.horizon=50",
        "env.episodes=8",
        "ppo.steps=4",
        "eval.every=2",
        "eval.episodes=4",
        "ppo.lr=1e-2",
        "gradient.sigma=0.3",
    ];
    for est in ["first", "zeroth", "ddcg", "ivw_h"] {
        let out = tmp(&format!("gradient-{est}"));
        let e = format!("gradient.estimator=\"{est}\"");
        let sets: Vec<&str> = small.iter().copied().chain([e.as_str()]).collect();
        let rows = gradient_run("pendulum-ppo.toml", &out, &sets, &[]);
        let w = column(&rows, "gradient/first_weight");
        assert_eq!(w.len(), 4, "{est}: {rows:?}");
        let ok = match est {
            "first" => w.iter().all(|&w| w == 1.0),
            "zeroth" => w.iter().all(|&w| w == 0.0),
            "ivw_h" => w.iter().all(|&w| w > 0.0 && w < 1.0),
            _ => w.iter().all(|&w| (0.0..=1.0).contains(&w)),
        };
        assert!(ok, "{est}: first-order weights {w:?}");
        let std = column(&rows, "policy/std");
        assert!(std.iter().all(|s| (s - 0.3).abs() < 1e-6), "{est}: {std:?}");
        let eval = column(&rows, "eval/return_mean");
        assert!(eval.len() == 3 && eval[0] != eval[2], "{est}: {eval:?}");
        if est == "ddcg" {
            let part = tmp("gradient-part");
            let o = train("pendulum-ppo.toml", &part, &sets, &["--stop-after", "2"]);
            assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
            assert_eq!(
                gradient_run("pendulum-ppo.toml", &part, &sets, &["--resume"]),
                rows
            );
            std::fs::remove_dir_all(&part).ok();
        }
        std::fs::remove_dir_all(&out).ok();
    }
    let out = tmp("gradient-rarl");
    let o = train(
        "pendulum-rarl.toml",
        &out,
        &["gradient.estimator=\"ddcg\""],
        &[],
    );
    assert!(
        stderr(&o).contains("[gradient] trains the protagonist alone"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}

/// The cart-pole's return counts the steps until the fall, so its pathwise gradient is 0:
/// under `[gradient]` the first-order estimator's samples, their variance and its gradient are
/// exactly 0 (it cannot learn); DDCG's test sees returns that vary with gradients that do not
/// and takes REINFORCE's gradient (first-order weight 0, a gradient that is not 0).
#[test]
fn ddcg_falls_back_where_the_pathwise_gradient_is_zero() {
    let small = [
        "env.horizon=50",
        "env.episodes=8",
        "ppo.steps=2",
        "eval.every=2",
        "eval.episodes=4",
    ];
    for est in ["first", "ddcg"] {
        let out = tmp(&format!("cart-pole-{est}"));
        let e = format!("gradient.estimator=\"{est}\"");
        let sets: Vec<&str> = small.iter().copied().chain([e.as_str()]).collect();
        let rows = gradient_run("cart-pole-ddcg.toml", &out, &sets, &[]);
        let (var, norm) = (
            column(&rows, "gradient/first_variance"),
            column(&rows, "actor/grad_norm"),
        );
        assert!(var.len() == 2 && var.iter().all(|&v| v == 0.0), "{var:?}");
        match est {
            "first" => assert!(norm.iter().all(|&n| n == 0.0), "{norm:?}"),
            _ => {
                let w = column(&rows, "gradient/first_weight");
                assert!(w.iter().all(|&w| w == 0.0), "{w:?}");
                assert!(norm.iter().all(|&n| n > 0.0), "{norm:?}");
            }
        }
        std::fs::remove_dir_all(&out).ok();
    }
}
