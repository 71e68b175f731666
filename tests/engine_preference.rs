//! The RPO family of pairwise objectives (DPO, IPO, RPO's squared and Bernoulli-KL distances,
//! SimPO) against hand-worked values (the script is the f64 `reference` below, run by hand for
//! the pairs of `golden`), and their gradients against finite differences of that f64 loop.

mod common;

use common::*;
use ember_engine::*;

const KINDS: [PreferenceLoss; 6] = [
    PreferenceLoss::Dpo { beta: 0.1 },
    PreferenceLoss::Ipo { beta: 0.1 },
    PreferenceLoss::RpoSq {
        beta: 0.1,
        eta: 1.0,
    },
    PreferenceLoss::RpoBwdKl {
        beta: 0.1,
        eta: 1.0,
    },
    PreferenceLoss::RpoFwdKl {
        beta: 0.1,
        eta: 1.0,
    },
    PreferenceLoss::Simpo {
        beta: 2.0,
        gamma: 1.0,
    },
];

/// Host pairs: chosen/rejected log-probs, reference log-probs, lengths, rewards.
struct Pairs {
    cw: Vec<f64>,
    cl: Vec<f64>,
    rw: Vec<f64>,
    rl: Vec<f64>,
    lw: Vec<f64>,
    ll: Vec<f64>,
    gw: Vec<f64>,
    gl: Vec<f64>,
}

fn golden() -> Pairs {
    Pairs {
        cw: vec![-2.0, -5.0],
        cl: vec![-3.0, -4.0],
        rw: vec![-2.5, -4.5],
        rl: vec![-2.8, -4.2],
        lw: vec![2.0, 5.0],
        ll: vec![3.0, 4.0],
        gw: vec![1.0, 1.0],
        gl: vec![0.0, 0.5],
    }
}

fn t(v: &[f64], d: &burn::tensor::Device) -> burn::tensor::Tensor<1> {
    let f: Vec<f32> = v.iter().map(|x| *x as f32).collect();
    burn::tensor::Tensor::from_floats(f.as_slice(), d)
}

fn ls(x: f64) -> f64 {
    if x > 0.0 {
        -(-x).exp().ln_1p()
    } else {
        x - x.exp().ln_1p()
    }
}

/// The f64 reference of each objective (mean over pairs), `cw`/`cl` live.
fn reference(kind: &PreferenceLoss, p: &Pairs, cw: &[f64], cl: &[f64], avg: bool) -> f64 {
    let n = cw.len();
    let mut s = 0.0;
    for i in 0..n {
        let (mut hw, mut hl) = (cw[i] - p.rw[i], cl[i] - p.rl[i]);
        if avg {
            hw /= p.lw[i];
            hl /= p.ll[i];
        }
        let (dh, dr) = (hw - hl, p.gw[i] - p.gl[i]);
        let bern = |a: f64, b: f64| a.exp() * (a - b);
        let f = f64::from;
        s += match *kind {
            PreferenceLoss::Dpo { beta } => -ls(f(beta) * dh),
            PreferenceLoss::Ipo { beta } => (dh - 1.0 / (2.0 * f(beta))).powi(2),
            PreferenceLoss::RpoSq { beta, eta } => (f(beta) * dh - f(eta) * dr).powi(2),
            PreferenceLoss::RpoBwdKl { beta, eta } => {
                let (z, g) = (f(beta) * dh, f(eta) * dr);
                bern(ls(g), ls(z)) + bern(ls(-g), ls(-z))
            }
            PreferenceLoss::RpoFwdKl { beta, eta } => {
                let (z, g) = (f(beta) * dh, f(eta) * dr);
                bern(ls(z), ls(g)) + bern(ls(-z), ls(-g))
            }
            PreferenceLoss::Simpo { beta, gamma } => {
                -ls(f(beta) * (cw[i] / p.lw[i] - cl[i] / p.ll[i]) - f(gamma))
            }
        };
    }
    s / n as f64
}

fn engine(kind: &PreferenceLoss, p: &Pairs, avg: bool) -> (f64, Vec<f32>, Vec<f32>, Metrics) {
    let d = dev().autodiff();
    let cw = t(&p.cw, &d).require_grad();
    let cl = t(&p.cl, &d).require_grad();
    let input = PairInput {
        chosen: cw.clone(),
        rejected: cl.clone(),
        chosen_ref: t(&p.rw, &d),
        rejected_ref: t(&p.rl, &d),
        chosen_len: t(&p.lw, &d),
        rejected_len: t(&p.ll, &d),
        chosen_reward: t(&p.gw, &d),
        rejected_reward: t(&p.gl, &d),
    };
    let (loss, m) = preference_loss(kind, &input, avg).unwrap();
    let grads = loss.clone().backward();
    let gw = vals(cw.grad(&grads).unwrap());
    let gl = vals(cl.grad(&grads).unwrap());
    (f64::from(vals(loss)[0]), gw, gl, m)
}

#[test]
fn pairwise_objectives_by_hand() {
    // Δh = [0.7, −0.7] (h_w = [0.5, −0.5], h_l = [−0.2, 0.2]); Δr = [1, 0.5]; β = 0.1.
    // IPO: ((0.7 − 5)² + (−0.7 − 5)²)/2 = 25.49; RPO-sq: ((0.07 − 1)² + (−0.07 − 0.5)²)/2 =
    // 0.5949; SimPO: both pairs have ℓ_w = ℓ_l = −1, so −log σ(−1) = 1.3132617.
    let p = golden();
    let want = [
        0.693_759_555_548_697_2,
        25.49,
        0.5949,
        0.067_433_368_155_013_22,
        0.071_761_065_920_517_44,
        1.313_261_687_518_222_8,
    ];
    for (kind, w) in KINDS.iter().zip(want) {
        let (v, _, _, m) = engine(kind, &p, false);
        assert!((v - w).abs() < 1e-5 * (1.0 + w), "{kind:?}: {v} vs {w}");
        assert!((reference(kind, &p, &p.cw, &p.cl, false) - w).abs() < 1e-6 * (1.0 + w));
        let acc = f64::from(vals(m.get("preference/accuracy").unwrap().clone())[0]);
        let expected = if matches!(kind, PreferenceLoss::Simpo { .. }) {
            0.0
        } else {
            0.5
        };
        assert_eq!(acc, expected, "{kind:?}");
    }
    // DPO on length-averaged log-probs: Δh = [0.25 + 0.0667, −0.1 − 0.05].
    let (v, _, _, _) = engine(&PreferenceLoss::Dpo { beta: 0.1 }, &p, true);
    assert!((v - 0.689_057_247_254_076_5).abs() < 1e-6, "{v}");
    assert!(!KINDS[5].uses_reference() && KINDS[0].uses_reference());
    assert!(KINDS[2].uses_rewards() && !KINDS[0].uses_rewards());
    assert!(PreferenceLoss::Dpo { beta: 0.0 }.validate().is_err());
}

#[test]
fn pairwise_gradients_match_finite_differences() {
    for seed in 0..3u64 {
        let mut rng = SplitMix64(seed);
        let n = 5;
        let p = Pairs {
            cw: rng.vec(n, -8.0, -1.0),
            cl: rng.vec(n, -8.0, -1.0),
            rw: rng.vec(n, -8.0, -1.0),
            rl: rng.vec(n, -8.0, -1.0),
            lw: (0..n).map(|i| (i + 2) as f64).collect(),
            ll: (0..n).map(|i| (6 - i) as f64).collect(),
            gw: rng.vec(n, 0.0, 1.0),
            gl: rng.vec(n, 0.0, 1.0),
        };
        for kind in &KINDS {
            for avg in [false, true] {
                let (v, gw, gl, _) = engine(kind, &p, avg);
                let want = reference(kind, &p, &p.cw, &p.cl, avg);
                assert!(
                    (v - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{kind:?}: {v} vs {want}"
                );
                let h = 1e-6;
                for i in 0..n {
                    for (live, g) in [(0, &gw), (1, &gl)] {
                        let (mut up, mut down) =
                            ((p.cw.clone(), p.cl.clone()), (p.cw.clone(), p.cl.clone()));
                        if live == 0 {
                            up.0[i] += h;
                            down.0[i] -= h;
                        } else {
                            up.1[i] += h;
                            down.1[i] -= h;
                        }
                        let fd = (reference(kind, &p, &up.0, &up.1, avg)
                            - reference(kind, &p, &down.0, &down.1, avg))
                            / (2.0 * h);
                        assert!(
                            (f64::from(g[i]) - fd).abs() < 2e-3 * (1.0 + fd.abs()),
                            "{kind:?} avg {avg} seed {seed} pair {i} side {live}: {} vs {fd}",
                            g[i]
                        );
                    }
                }
            }
        }
    }
}
