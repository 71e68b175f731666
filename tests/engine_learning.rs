//! Model-agnostic learning: two tiny burn policies defined here, a categorical bandit and a 1-D
//! Gaussian, trained through the engine with every estimator and a representative set of
//! losses. Each run has a fixed seed and a bounded number of steps, and must reach the optimum.

mod common;

use burn::module::{Module, Param};
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use common::vals;
use ember_engine::*;

const ARMS: usize = 5;
/// Deterministic reward of each arm: arm 3 is best.
const ARM_REWARD: [f32; ARMS] = [0.0, 0.2, 0.5, 1.0, 0.2];
const GROUPS: usize = 4;
const PER_GROUP: usize = 8;
const N: usize = GROUPS * PER_GROUP;

#[derive(Module, Debug)]
struct Bandit {
    logits: Param<Tensor<1>>,
}

impl Bandit {
    fn new(device: &Device) -> Self {
        Self {
            logits: Param::from_tensor(Tensor::zeros([ARMS], device)),
        }
    }

    /// log π(a) for each action, `[n, 1]`.
    fn log_probs(&self, actions: &Tensor<2, Int>) -> Tensor<2> {
        let [n, _] = actions.dims();
        let lp = log_softmax(self.logits.val().reshape([1, ARMS]).expand([n, ARMS]), 1);
        lp.gather(1, actions.clone())
    }

    fn probs(&self) -> Vec<f32> {
        vals(burn::tensor::activation::softmax(self.logits.val(), 0))
    }
}

/// One algorithm under test: an estimator and an actor loss.
#[derive(Clone, Copy, Debug)]
struct Algo {
    advantage: AdvantageConfig,
    actor: ActorLossConfig,
}

fn algo(kind: AdvantageKind, policy: PolicyLossKind) -> Algo {
    Algo {
        advantage: AdvantageConfig::new(kind),
        actor: ActorLossConfig {
            policy,
            ..ActorLossConfig::default()
        },
    }
}

const GRPO: AdvantageKind = AdvantageKind::Grpo {
    std: StdKind::Unbiased,
    epsilon: 1e-6,
    scale_by_std: true,
};
const PPO: PolicyLossKind = PolicyLossKind::Ppo {
    clip_low: 0.2,
    clip_high: 0.28,
    dual_clip: Some(3.0),
};

fn estimators() -> Vec<AdvantageKind> {
    vec![
        AdvantageKind::Reinforce {
            baseline: BatchBaseline::Mean,
        },
        AdvantageKind::Rloo,
        GRPO,
        AdvantageKind::DrGrpo,
        AdvantageKind::ReinforcePlusPlus {
            gamma: 1.0,
            kl_coef: 0.01,
            whiten: true,
        },
        AdvantageKind::ReinforcePlusPlusBaseline,
        AdvantageKind::Remax,
        AdvantageKind::Opo,
        AdvantageKind::Bnpo { decompose: false },
        AdvantageKind::Gae {
            gamma: 1.0,
            lambda: 1.0,
            whiten: true,
        },
        AdvantageKind::ReinforceRej {
            reject: RejectGroups::Both,
            threshold: 0.5,
        },
        AdvantageKind::Opmd {
            baseline: OpmdBaseline::LogAvgExp,
            tau: 1.0,
        },
        AdvantageKind::AsymRe { shift: -0.1 },
    ]
}

fn losses() -> Vec<PolicyLossKind> {
    vec![
        PolicyLossKind::Vanilla,
        PPO,
        PolicyLossKind::Gspo {
            clip_low: 3e-4,
            clip_high: 4e-4,
        },
        PolicyLossKind::Cispo {
            clip_low: 1.0,
            clip_high: 0.28,
        },
        PolicyLossKind::Dispo {
            pos_down: 0.2,
            pos_up: 0.28,
            neg_down: 0.2,
            neg_up: 0.2,
        },
        PolicyLossKind::Topr {
            level: RatioLevel::Sequence,
        },
        PolicyLossKind::Rec {
            clip: RecClip::OneSide,
            importance_sampling: true,
            clip_low: 0.2,
            clip_high: 0.2,
            clip_low_prime: 0.6,
            clip_high_prime: 2.0,
        },
        PolicyLossKind::Opmd {
            tau: 1.0,
            k2_coef: 0.0,
        },
        PolicyLossKind::Alol { clip: 0.9 },
    ]
}

/// Trains the bandit for at most `max_steps` optimizer steps (2 epochs each); returns the step
/// at which π(best arm) first exceeded 0.9, or None.
fn train_bandit(a: Algo, seed: u64, max_steps: usize) -> Option<usize> {
    let device = Device::flex().autodiff();
    let mut policy = Bandit::new(&device);
    let mut opt = AdamConfig::new().init();
    let mut rng = SplitMix64(seed);
    let group_ids: Vec<usize> = (0..N).map(|i| i / PER_GROUP).collect();
    let uniform = (1.0 / ARMS as f32).ln();
    for step in 0..max_steps {
        let probs = policy.probs();
        if probs[3] > 0.9 {
            return Some(step);
        }
        // Sample on the host from the policy's probabilities (the test's sampler).
        let actions: Vec<i64> = (0..N)
            .map(|_| {
                let u = rng.uniform(0.0, 1.0) as f32;
                let mut acc = 0.0;
                probs
                    .iter()
                    .position(|p| {
                        acc += p;
                        u < acc
                    })
                    .unwrap_or(ARMS - 1) as i64
            })
            .collect();
        let rewards: Vec<f32> = actions.iter().map(|&k| ARM_REWARD[k as usize]).collect();
        let greedy = probs
            .iter()
            .enumerate()
            .fold(0, |b, (i, p)| if *p > probs[b] { i } else { b });
        let act = Tensor::<2, Int>::from_data(TensorData::new(actions, [N, 1]), &device);
        let old = policy.log_probs(&act).detach();
        let mask = Tensor::<2>::ones([N, 1], &device);
        let batch = RolloutBatch::new(
            mask.clone(),
            Tensor::from_floats(rewards.as_slice(), &device),
            &group_ids,
        )
        .unwrap()
        .with_old_log_probs(old.clone())
        .unwrap()
        .with_ref_log_probs(Tensor::full([N, 1], uniform, &device))
        .unwrap()
        .with_values(Tensor::zeros([N, 1], &device))
        .unwrap()
        .with_baseline_rewards(Tensor::full([N], ARM_REWARD[greedy], &device))
        .unwrap();
        let adv = compute_advantages(&a.advantage, &batch, step).expect("advantages");
        let norm = AggNorm {
            tokens: N as f32,
            seqs: N as f32,
        };
        for _epoch in 0..2 {
            let input = ActorInput {
                policy: PolicyLossInput {
                    log_probs: policy.log_probs(&act),
                    old_log_probs: old.clone(),
                    advantages: adv.advantages.clone(),
                    mask: adv.mask.clone(),
                    ref_log_probs: batch.ref_log_probs.clone(),
                },
                entropy: None,
                rollout_log_probs: None,
                kl: None,
            };
            let (loss, _) = actor_loss(&a.actor, &input, norm).expect("loss");
            let grads = GradientsParams::from_grads(loss.backward(), &policy);
            policy = opt.step(0.1, policy, grads);
        }
    }
    None
}

/// Every run reached π(best) > 0.9 within 11–16 steps at seed 42/7 (Adam, lr 0.1); the bound
/// leaves room without letting a wrong-signed estimator through.
const BANDIT_STEPS: usize = 40;

#[test]
fn bandit_every_estimator_with_ppo_and_vanilla() {
    for kind in estimators() {
        for loss in [PPO, PolicyLossKind::Vanilla] {
            let reached = train_bandit(algo(kind, loss), 42, BANDIT_STEPS);
            eprintln!("bandit {kind:?} + {loss:?}: π(best) > 0.9 at step {reached:?}");
            assert!(
                reached.is_some(),
                "{kind:?} + {loss:?} did not reach π(best) > 0.9 in {BANDIT_STEPS} steps"
            );
        }
    }
}

#[test]
fn bandit_every_loss_with_grpo() {
    for loss in losses() {
        let reached = train_bandit(algo(GRPO, loss), 7, BANDIT_STEPS);
        eprintln!("bandit GRPO + {loss:?}: π(best) > 0.9 at step {reached:?}");
        assert!(
            reached.is_some(),
            "GRPO + {loss:?} did not reach π(best) > 0.9 in {BANDIT_STEPS} steps"
        );
    }
}

#[test]
fn bandit_modifiers_raft_capo_lopti_and_kl() {
    let raft = algo(
        AdvantageKind::Raft { threshold: 0.9 },
        PolicyLossKind::Vanilla,
    );
    assert!(train_bandit(raft, 3, BANDIT_STEPS).is_some(), "RAFT");
    let mut capo = algo(AdvantageKind::Rloo, PPO);
    capo.advantage.capo_positive_steps = 10;
    assert!(train_bandit(capo, 3, BANDIT_STEPS).is_some(), "CAPO");
    let mut lopti = algo(GRPO, PPO);
    lopti.advantage.lopti_alpha = Some(0.3);
    assert!(train_bandit(lopti, 3, BANDIT_STEPS).is_some(), "Lopti");
    let mut kl = algo(GRPO, PPO);
    kl.actor.kl = Some(KlLoss {
        estimator: KlEstimator::K3,
        coef: 0.0,
    });
    assert!(train_bandit(kl, 3, BANDIT_STEPS).is_some(), "KL in loss");
}

// ------------------------------------------------------------------ Gaussian policy

const TARGET: f32 = 2.0;
const SIGMA: f32 = 0.5;

#[derive(Module, Debug)]
struct Gaussian {
    mean: Param<Tensor<1>>,
}

impl Gaussian {
    /// log N(a; μ, σ²) for each action, `[n, 1]`.
    fn log_probs(&self, actions: &Tensor<2>) -> Tensor<2> {
        let [n, _] = actions.dims();
        let mu = self.mean.val().reshape([1, 1]).expand([n, 1]);
        let z = (actions.clone() - mu) / SIGMA;
        (z.clone() * z * -0.5).sub_scalar(SIGMA.ln() + 0.5 * (2.0 * std::f32::consts::PI).ln())
    }
}

/// Trains μ from 0 towards the target; reward exp(−(a − 2)²) in (0, 1]. Returns |μ − 2| at
/// the end.
fn train_gaussian(a: Algo, seed: u64, steps: usize) -> f32 {
    let device = Device::flex().autodiff();
    let mut policy = Gaussian {
        mean: Param::from_tensor(Tensor::zeros([1], &device)),
    };
    let mut opt = AdamConfig::new().init();
    let mut rng = SplitMix64(seed);
    let group_ids: Vec<usize> = (0..N).map(|i| i / PER_GROUP).collect();
    let reward = |x: f32| (-(x - TARGET) * (x - TARGET)).exp();
    for step in 0..steps {
        let mu = vals(policy.mean.val())[0];
        // Box–Muller normal draws.
        let actions: Vec<f32> = (0..N)
            .map(|_| {
                let (u1, u2) = (rng.uniform(1e-12, 1.0), rng.uniform(0.0, 1.0));
                mu + SIGMA
                    * ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
            })
            .collect();
        let rewards: Vec<f32> = actions.iter().map(|x| reward(*x)).collect();
        let act = Tensor::<2>::from_data(TensorData::new(actions, [N, 1]), &device);
        let old = policy.log_probs(&act).detach();
        let batch = RolloutBatch::new(
            Tensor::ones([N, 1], &device),
            Tensor::from_floats(rewards.as_slice(), &device),
            &group_ids,
        )
        .unwrap()
        .with_old_log_probs(old.clone())
        .unwrap()
        .with_ref_log_probs(old.clone())
        .unwrap()
        .with_values(Tensor::zeros([N, 1], &device))
        .unwrap()
        .with_baseline_rewards(Tensor::full([N], reward(mu), &device))
        .unwrap();
        let adv = compute_advantages(&a.advantage, &batch, step).expect("advantages");
        let norm = AggNorm {
            tokens: N as f32,
            seqs: N as f32,
        };
        for _epoch in 0..2 {
            let input = ActorInput {
                policy: PolicyLossInput {
                    log_probs: policy.log_probs(&act),
                    old_log_probs: old.clone(),
                    advantages: adv.advantages.clone(),
                    mask: adv.mask.clone(),
                    ref_log_probs: None,
                },
                entropy: None,
                rollout_log_probs: None,
                kl: None,
            };
            let (loss, _) = actor_loss(&a.actor, &input, norm).expect("loss");
            let grads = GradientsParams::from_grads(loss.backward(), &policy);
            policy = opt.step(0.05, policy, grads);
        }
    }
    (vals(policy.mean.val())[0] - TARGET).abs()
}

#[test]
fn gaussian_every_estimator_reaches_the_target() {
    for kind in estimators() {
        let loss = if matches!(kind, AdvantageKind::Bnpo { .. }) {
            PolicyLossKind::Vanilla
        } else {
            PPO
        };
        let err = train_gaussian(algo(kind, loss), 11, 120);
        eprintln!("gaussian {kind:?}: |μ − 2| = {err}");
        assert!(err < 0.2, "{kind:?}: |μ − 2| = {err} after 120 steps");
    }
}

#[test]
fn gaussian_representative_losses_reach_the_target() {
    for loss in [
        PolicyLossKind::Vanilla,
        PolicyLossKind::Cispo {
            clip_low: 1.0,
            clip_high: 0.28,
        },
        PolicyLossKind::Gspo {
            clip_low: 3e-4,
            clip_high: 4e-4,
        },
        PolicyLossKind::Topr {
            level: RatioLevel::Token,
        },
    ] {
        let err = train_gaussian(algo(AdvantageKind::Rloo, loss), 5, 120);
        eprintln!("gaussian RLOO + {loss:?}: |μ − 2| = {err}");
        assert!(
            err < 0.2,
            "RLOO + {loss:?}: |μ − 2| = {err} after 120 steps"
        );
    }
}

/// `ember_train::accumulated_step` (RAM's update): one optimizer step on parts whose gradients
/// are accumulated equals one step on the summed loss, and it returns the summed loss value.
#[test]
fn accumulated_step_equals_one_step_on_the_summed_loss() {
    let device = Device::default().autodiff();
    let actions = |a: i64| Tensor::<2, Int>::from_data(TensorData::new(vec![a], [1, 1]), &device);
    let part = |m: &Bandit, i: usize| -> Tensor<1> {
        let w = [0.7f32, -0.3][i];
        (m.log_probs(&actions([1i64, 3][i])).reshape([1]) * (-w)).sum()
    };
    let init = Bandit {
        logits: Param::from_tensor(Tensor::from_floats([0.1, -0.2, 0.3, 0.0, 0.5], &device)),
    };
    let opt = ember_train::OptimizerConfig::default();
    let mut o1 = opt.init();
    let (a, total, _) = ember_train::accumulated_step(init.clone(), &mut o1, 0.05, 2, part);
    let mut o2 = opt.init();
    let loss = part(&init, 0) + part(&init, 1);
    let want = f64::from(loss.clone().into_scalar::<f32>());
    let grads = GradientsParams::from_grads(loss.backward(), &init);
    let (b, _) = o2.step(0.05, init, grads);
    assert!((total - want).abs() < 1e-6, "{total} vs {want}");
    let (pa, pb) = (vals(a.logits.val()), vals(b.logits.val()));
    for (x, y) in pa.iter().zip(&pb) {
        assert!((x - y).abs() < 1e-6, "{pa:?} vs {pb:?}");
    }
    assert!(
        pa.iter()
            .zip([0.1f32, -0.2, 0.3, 0.0, 0.5])
            .any(|(x, y)| (x - y).abs() > 1e-3)
    );
    // A non-finite part skips the step: the weights come back unchanged.
    let (c, total, report) = ember_train::accumulated_step(b.clone(), &mut o2, 0.05, 2, |m, i| {
        part(m, i) * if i == 1 { f32::NAN } else { 1.0 }
    });
    assert!(total.is_nan());
    assert!(!report.applied);
    assert_eq!(vals(c.logits.val()), vals(b.logits.val()));
}

/// The bandit as a trainer `Actor`: its experience is the sampled arms `[n, 1]`.
impl ember_train::Actor for Bandit {
    type Experience = Tensor<2, Int>;

    fn score(&self, actions: &Tensor<2, Int>, rows: &[usize], _: bool) -> ember_train::Scored {
        let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let idx =
            Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &actions.device());
        ember_train::Scored {
            recompute: None,
            log_probs: self.log_probs(&actions.clone().select(0, idx)),
            entropy: None,
            kl: None,
        }
    }
}

/// A non-finite loss (here NaN old log-probs, as a broken rollout would give) skips the
/// optimizer step and counts it, so the weights stay finite; a finite one steps.
#[test]
fn a_non_finite_loss_skips_the_step() {
    let device = Device::default().autodiff();
    let actions =
        Tensor::<2, Int>::from_data(TensorData::new(vec![0i64, 1, 2, 3], [4, 1]), &device);
    let batch = |old: f32| {
        RolloutBatch::new(
            Tensor::<2>::ones([4, 1], &device),
            Tensor::<1>::from_floats([1.0, 0.0, 1.0, 0.0], &device),
            &[0, 0, 0, 0],
        )
        .unwrap()
        .with_old_log_probs(Tensor::<2>::full([4, 1], old, &device))
        .unwrap()
    };
    let cfg = ember_train::UpdateConfig::default();
    let run = |old: f32| {
        let b = batch(old);
        let adv = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &b, 0).unwrap();
        let mut optim = ember_train::OptimizerConfig::default().init();
        let model = Bandit::new(&device);
        let (m, stats) = ember_train::update(
            model,
            &mut optim,
            ember_train::UpdateData {
                experience: &actions,
                batch: &b,
                adv: &adv,
            },
            &cfg,
            0.1,
            &mut |n| (0..n).collect(),
        )
        .unwrap();
        (vals(m.logits.val()), stats)
    };
    let (w, stats) = run(f32::NAN);
    assert_eq!((stats.optimizer_steps, stats.skipped_steps), (0, 1));
    assert_eq!(stats.metrics["actor/skipped_steps"], 1.0);
    assert_eq!(w, vec![0.0; ARMS]);
    let (w, stats) = run((1.0f32 / ARMS as f32).ln());
    assert_eq!((stats.optimizer_steps, stats.skipped_steps), (1, 0));
    assert!(
        w.iter().all(|x| x.is_finite()) && w.iter().any(|x| *x != 0.0),
        "{w:?}"
    );
}
