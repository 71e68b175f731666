//! SeeUPO's turn-by-turn update (`ember_train::sequential_update`) against the loop written out
//! step by step with the trainer's one-update function and the engine's ratio, on a toy actor
//! whose log-probs are log σ(θ_t + offset): which turn is updated first, which steps each update
//! sees, which old log-probs it uses and how the later turn's advantages are weighted. Lopti's
//! token isolation (`UpdateSchedule::lopti_threshold`) against its two updates written out.

use burn::module::{Module, Param};
use burn::tensor::activation::log_sigmoid;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_engine::{
    AdvantageConfig, AdvantageKind, Advantages, Metrics, RolloutBatch, TurnOrder, TurnUpdates,
    compute_advantages, turn_mask,
};
use ember_train::{
    Actor, OptimizerConfig, Scored, Turns, UpdateConfig, UpdateData, sequential_update, update,
};

#[derive(Module, Debug)]
struct Toy {
    theta: Param<Tensor<1>>,
}

impl Actor for Toy {
    type Experience = Tensor<2>;

    fn score(&self, offsets: &Tensor<2>, rows: &[usize], _: bool) -> Scored {
        let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let idx =
            Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &offsets.device());
        let off = offsets.clone().select(0, idx);
        let [r, t] = off.dims();
        let logits = self.theta.val().reshape([1, t]).expand([r, t]) + off;
        Scored {
            recompute: None,
            log_probs: log_sigmoid(logits),
            entropy: None,
            kl: None,
        }
    }
}

fn t2(v: &[f32], rows: usize, cols: usize, d: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v.to_vec(), [rows, cols]), d)
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

struct Case {
    toy: Toy,
    offsets: Tensor<2>,
    batch: RolloutBatch,
    adv: Advantages,
}

/// Four rows of four steps: turns [0 0 1 1], [0 1 1 −], [0 0 0 0], [0 1 − −] (− an
/// observation: out of the mask), rewards 1, 0, 1, 0 in two groups (RLOO: ±1).
fn case(d: &Device, turns: &[f32]) -> Case {
    let toy = Toy {
        theta: Param::from_tensor(Tensor::from_floats([0.3, -0.2, 0.5, 0.1], d)),
    };
    let offsets = t2(
        &[
            0.0, 0.5, -0.5, 1.0, 0.2, 0.0, 0.3, 0.0, -0.4, 0.1, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0,
        ],
        4,
        4,
        d,
    );
    let turn_ids = t2(turns, 4, 4, d);
    let mask = turn_ids.clone().greater_equal_elem(0.0).float();
    let lp0 = toy.score(&offsets, &[0, 1, 2, 3], false).log_probs.detach();
    let batch = RolloutBatch::new(
        mask,
        Tensor::from_floats([1.0, 0.0, 1.0, 0.0], d),
        &[0, 0, 1, 1],
    )
    .unwrap()
    .with_turns(turn_ids)
    .unwrap()
    .with_rollout_log_probs(lp0)
    .unwrap();
    let adv = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &batch, 0).unwrap();
    Case {
        toy,
        offsets,
        batch,
        adv,
    }
}

const TURNS: [f32; 16] = [
    0., 0., 1., 1., 0., 1., 1., -1., 0., 0., 0., 0., 0., 1., -1., -1.,
];

/// AdamW with ε = 1, so that a step depends on the size of the gradient (and so on the
/// weights of the advantages).
fn optimizer() -> ember_train::Optimizer {
    OptimizerConfig::default().with_epsilon(1.0).init()
}

/// `sequential_update` of the case's toy actor (fresh optimizer, lr 0.1, identity row order) on
/// `batch` with the given schedule and rescoring.
fn seq(
    c: &Case,
    batch: &RolloutBatch,
    turns: &TurnUpdates,
    rescore: &mut dyn FnMut(&Toy) -> Tensor<2>,
) -> Result<(Toy, ember_train::UpdateStats), ember_engine::EngineError> {
    sequential_update(
        c.toy.clone(),
        &mut optimizer(),
        UpdateData {
            experience: &c.offsets,
            batch,
            adv: &c.adv,
        },
        Turns {
            cfg: &UpdateConfig::default(),
            turns,
            rescore,
        },
        0.1,
        &mut |n| (0..n).collect(),
    )
}

/// Reverse order: turn 1 is updated first on its own steps; then turn 0 with old log-probs
/// rescored after that update and advantages × the clipped ratio of turn 1.
#[test]
fn reverse_order_matches_the_loop_written_out() {
    let d = Device::default().autodiff();
    let c = case(&d, &TURNS);
    let cfg = UpdateConfig::default();
    let turns = TurnUpdates::default();
    let all = [0, 1, 2, 3];
    let mut rescored = 0;
    let (got, stats) = seq(&c, &c.batch, &turns, &mut |a: &Toy| {
        rescored += 1;
        a.score(&c.offsets, &all, false).log_probs.detach()
    })
    .unwrap();
    assert_eq!(rescored, 1);
    assert_eq!(stats.optimizer_steps, 2);

    // The same, written out.
    let turn_ids = c.batch.turn_ids.clone().unwrap();
    let mut opt = optimizer();
    let lp0 = c.batch.rollout_log_probs.clone().unwrap();
    let m1 = turn_mask(&c.adv.mask, &turn_ids, 1);
    let adv_of = |a: Tensor<2>, m: Tensor<2>| Advantages {
        advantages: a.clone() * m.clone(),
        returns: a,
        mask: m,
        metrics: Metrics::new(),
    };
    let b1 = c.batch.clone().with_old_log_probs(lp0.clone()).unwrap();
    let ident = &mut |n| (0..n).collect();
    let (after1, _) = update(
        c.toy.clone(),
        &mut opt,
        UpdateData {
            experience: &c.offsets,
            batch: &b1,
            adv: &adv_of(c.adv.advantages.clone(), m1.clone()),
        },
        &cfg,
        0.1,
        ident,
    )
    .unwrap();
    let lp1 = after1.score(&c.offsets, &all, false).log_probs.detach();
    let ratio = turns.accumulate(None, &lp0, &lp1, &m1);
    let r = values(ratio.clone());
    // Rows 0, 1, 3 had turn-1 steps and moved; row 2 did not: ratio exactly 1.
    assert!(
        r[0] != 1.0 && r[1] != 1.0 && r[3] != 1.0 && r[2] == 1.0,
        "{r:?}"
    );
    assert!(r.iter().all(|x| (0.8..=1.2).contains(x)), "{r:?}");
    let m0 = turn_mask(&c.adv.mask, &turn_ids, 0);
    let b0 = c.batch.clone().with_old_log_probs(lp1).unwrap();
    let weighted = c.adv.advantages.clone() * ratio.clone().reshape([4, 1]);
    let (want, _) = update(
        after1,
        &mut opt,
        UpdateData {
            experience: &c.offsets,
            batch: &b0,
            adv: &adv_of(weighted, m0),
        },
        &cfg,
        0.1,
        ident,
    )
    .unwrap();
    let (g, w) = (values(got.theta.val()), values(want.theta.val()));
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() < 1e-6, "{g:?} vs {w:?}");
    }
    // The ratio metric is the mean over the rows turn 0 weighted (all four).
    let mean = r.iter().sum::<f32>() / 4.0;
    assert!((stats.metrics["seeupo/ratio_mean"] - f64::from(mean)).abs() < 1e-6);
    assert_eq!(stats.metrics["seeupo/turn_updates"], 2.0);
    // Forward order is a different schedule with a different result.
    let forward = TurnUpdates {
        order: TurnOrder::Forward,
        ..turns
    };
    let (fwd, _) = seq(&c, &c.batch, &forward, &mut |a: &Toy| {
        a.score(&c.offsets, &all, false).log_probs.detach()
    })
    .unwrap();
    let f = values(fwd.theta.val());
    assert!(f.iter().zip(&g).any(|(a, b)| (a - b).abs() > 1e-5), "{f:?}");
}

/// With a single turn SeeUPO is the ordinary update: same weights, no rescoring.
#[test]
fn one_turn_is_the_plain_update() {
    let d = Device::default().autodiff();
    let single = TURNS.map(|t| if t < 0.0 { -1.0 } else { 0.0 });
    let c = case(&d, &single);
    let cfg = UpdateConfig::default();
    let (got, _) = seq(&c, &c.batch, &TurnUpdates::default(), &mut |_: &Toy| {
        panic!("no rescoring with one turn")
    })
    .unwrap();
    let (want, _) = update(
        c.toy.clone(),
        &mut optimizer(),
        UpdateData {
            experience: &c.offsets,
            batch: &c.batch,
            adv: &c.adv,
        },
        &cfg,
        0.1,
        &mut |n| (0..n).collect(),
    )
    .unwrap();
    assert_eq!(values(got.theta.val()), values(want.theta.val()));
    // Without turn ids the update names what is missing.
    let plain = RolloutBatch::new(
        c.batch.mask.clone(),
        Tensor::from_floats([1.0, 0.0, 1.0, 0.0], &d),
        &[0, 0, 1, 1],
    )
    .unwrap();
    let e = seq(&c, &plain, &TurnUpdates::default(), &mut |_: &Toy| panic!())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("turn_ids"), "{e}");
}

/// Lopti (η = 0.5): the steps whose π_old < η take a whole update first (their advantages
/// alone, the whole batch's normaliser), then the others from the weights it left, with the
/// same optimizer: the same weights as those two updates written out. A threshold no step is
/// under is the plain update.
#[test]
fn lopti_updates_low_probability_tokens_first() {
    let d = Device::default().autodiff();
    let single = TURNS.map(|t| if t < 0.0 { -1.0 } else { 0.0 });
    let c = case(&d, &single);
    let lopti = |eta: f32| UpdateConfig {
        schedule: ember_train::UpdateSchedule {
            lopti_threshold: Some(eta),
            ..Default::default()
        },
        ..UpdateConfig::default()
    };
    // One update of the case's toy on `adv` from `toy` with `opt`, identity row order.
    let step =
        |toy: Toy, opt: &mut ember_train::Optimizer, adv: &Advantages, cfg: &UpdateConfig| {
            update(
                toy,
                opt,
                UpdateData {
                    experience: &c.offsets,
                    batch: &c.batch,
                    adv,
                },
                cfg,
                0.1,
                &mut |n| (0..n).collect(),
            )
            .unwrap()
        };
    let (got, stats) = step(c.toy.clone(), &mut optimizer(), &c.adv, &lopti(0.5));
    assert_eq!(stats.optimizer_steps, 2);
    // Written out: the low set, then the high set.
    let lp0 = c.batch.rollout_log_probs.clone().unwrap();
    let low = lp0.exp().lower_elem(0.5).float() * c.adv.mask.clone();
    let high = c.adv.mask.clone() - low.clone();
    let n_low = values(low.clone().sum())[0];
    let n_all = values(c.adv.mask.clone().sum())[0];
    assert!(n_low > 0.0 && n_low < n_all, "{n_low} of {n_all}");
    let only = |m: Tensor<2>| Advantages {
        advantages: c.adv.advantages.clone() * m,
        returns: c.adv.returns.clone(),
        mask: c.adv.mask.clone(),
        metrics: Metrics::new(),
    };
    let mut opt = optimizer();
    let cfg = UpdateConfig::default();
    let (after_low, _) = step(c.toy.clone(), &mut opt, &only(low), &cfg);
    let (want, _) = step(after_low, &mut opt, &only(high), &cfg);
    let (g, w) = (values(got.theta.val()), values(want.theta.val()));
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() < 1e-6, "{g:?} vs {w:?}");
    }
    let frac = stats.metrics["actor/lopti_low_frac"];
    assert!((frac - f64::from(n_low / n_all)).abs() < 1e-6, "{frac}");
    // The plain update differs; a threshold under every probability is the plain update.
    let (plain, _) = step(c.toy.clone(), &mut optimizer(), &c.adv, &cfg);
    let p = values(plain.theta.val());
    assert!(p.iter().zip(&g).any(|(a, b)| (a - b).abs() > 1e-5), "{p:?}");
    let (none_low, stats) = step(c.toy.clone(), &mut optimizer(), &c.adv, &lopti(1e-3));
    assert_eq!(stats.optimizer_steps, 1);
    assert_eq!(values(none_low.theta.val()), p);
    // Two mini-batches, rows {1, 3} then {0, 2}: under η = 0.46 only rows 1 and 3 have a step
    // (π_old = σ(−0.2) = 0.450 each), so the first pass's second mini-batch takes no step.
    let two = UpdateConfig {
        schedule: ember_train::UpdateSchedule {
            mini_batches: 2,
            lopti_threshold: Some(0.46),
            ..Default::default()
        },
        ..UpdateConfig::default()
    };
    let (_, stats) = update(
        c.toy.clone(),
        &mut optimizer(),
        UpdateData {
            experience: &c.offsets,
            batch: &c.batch,
            adv: &c.adv,
        },
        &two,
        0.1,
        &mut |_| vec![1, 3, 0, 2],
    )
    .unwrap();
    assert_eq!(stats.optimizer_steps, 3);
    let frac = stats.metrics["actor/lopti_low_frac"];
    assert!((frac - 2.0 / 13.0).abs() < 1e-6, "{frac}");
}
