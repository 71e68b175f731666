//! Gradient checks of every policy loss and KL estimator.
//!
//! Each loss is re-implemented here as a plain f64 loop, with its stop-gradient inputs passed
//! separately (`frozen`). On random inputs the engine's value must equal the loop's, and the
//! engine's autodiff gradient must equal the central finite difference of the loop objective
//! in its live argument with the frozen one held fixed: exactly what `detach()` means.

mod common;

use common::*;
use ember_engine::*;

const B: usize = 3;
const T: usize = 4;

struct Case {
    old: Vec<f64>,
    adv: Vec<f64>,
    mask: Vec<f64>,
    refl: Vec<f64>,
    lp: Vec<f64>,
}

fn case(seed: u64) -> Case {
    let mut rng = SplitMix64(seed);
    let old = rng.vec(B * T, -2.5, -0.2);
    // Live log-probs near the old ones so ratios fall on both sides of every clip bound.
    let lp: Vec<f64> = old.iter().map(|o| o + rng.uniform(-0.6, 0.6)).collect();
    let mut adv = rng.vec(B * T, -1.5, 1.5);
    // Sequence-level advantages on rows 1 and 2 (as outcome estimators produce them).
    for r in 1..B {
        let a = adv[r * T];
        adv[r * T..(r + 1) * T].fill(a);
    }
    let mask = vec![1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0];
    let refl = old.iter().map(|o| o + rng.uniform(-0.3, 0.3)).collect();
    Case {
        old,
        adv,
        mask,
        refl,
        lp,
    }
}

fn seq_sum(x: &[f64], mask: &[f64], row: usize) -> f64 {
    (0..T).map(|t| x[row * T + t] * mask[row * T + t]).sum()
}

/// The loop reference: per-step losses and the loss mask, `x` live, `f` frozen.
fn reference(kind: &PolicyLossKind, c: &Case, x: &[f64], f: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; B * T];
    let mut mask = c.mask.clone();
    let clampr = |v: f64| v.clamp(-20.0, 20.0);
    for i in 0..B * T {
        let (row, a, o) = (i / T, c.adv[i], c.old[i]);
        let frozen_ratio = clampr(f[i] - o).exp();
        out[i] = match *kind {
            PolicyLossKind::Vanilla => -a * x[i],
            PolicyLossKind::Ppo {
                clip_low,
                clip_high,
                dual_clip,
            } => {
                let r = clampr(x[i] - o).exp();
                let cl = (-a * r)
                    .max(-a * r.clamp(1.0 - f64::from(clip_low), 1.0 + f64::from(clip_high)));
                match dual_clip {
                    Some(d) if a < 0.0 => cl.min(-a * f64::from(d)),
                    _ => cl,
                }
            }
            PolicyLossKind::Gspo {
                clip_low,
                clip_high,
            } => {
                let len = (0..T).map(|t| c.mask[row * T + t]).sum::<f64>().max(1.0);
                let d: Vec<f64> = f.iter().zip(&c.old).map(|(f, o)| clampr(f - o)).collect();
                let s = (seq_sum(&d, &c.mask, row) / len + x[i] - f[i])
                    .min(10.0)
                    .exp();
                (-a * s).max(-a * s.clamp(1.0 - f64::from(clip_low), 1.0 + f64::from(clip_high)))
            }
            PolicyLossKind::Cispo {
                clip_low,
                clip_high,
            } => {
                let w = frozen_ratio.clamp(
                    (1.0 - f64::from(clip_low)).max(0.0),
                    1.0 + f64::from(clip_high),
                );
                -w * a * x[i]
            }
            PolicyLossKind::Dispo {
                pos_down,
                pos_up,
                neg_down,
                neg_up,
            } => {
                let (lo, hi) = if a > 0.0 {
                    (pos_down, pos_up)
                } else {
                    (neg_down, neg_up)
                };
                let keep =
                    frozen_ratio >= 1.0 - f64::from(lo) && frozen_ratio <= 1.0 + f64::from(hi);
                if keep { -frozen_ratio * a * x[i] } else { 0.0 }
            }
            PolicyLossKind::Topr { level } => {
                let lr = match level {
                    RatioLevel::Token => clampr(f[i] - o),
                    RatioLevel::Sequence => {
                        let d: Vec<f64> =
                            f.iter().zip(&c.old).map(|(f, o)| clampr(f - o)).collect();
                        seq_sum(&d, &c.mask, row)
                    }
                };
                let alpha = if a >= 0.0 {
                    1.0
                } else {
                    lr.clamp(-20.0, 0.0).exp()
                };
                -alpha * a * x[i]
            }
            PolicyLossKind::Rec {
                clip,
                importance_sampling,
                clip_low,
                clip_high,
                clip_low_prime,
                clip_high_prime,
            } => {
                let r = frozen_ratio;
                let (lo, hi) = (1.0 - f64::from(clip_low), 1.0 + f64::from(clip_high));
                let band = r >= lo && r <= hi;
                let keep = match clip {
                    RecClip::OneSide => (a >= 0.0 && r <= hi) || (a <= 0.0 && r >= lo),
                    RecClip::TwoSide => band,
                    RecClip::Ring => {
                        band || (a >= 0.0 && r <= 1.0 - f64::from(clip_low_prime))
                            || (a <= 0.0 && r >= 1.0 + f64::from(clip_high_prime))
                    }
                };
                let w = if importance_sampling { a * r } else { a };
                if keep { -w * x[i] } else { 0.0 }
            }
            PolicyLossKind::Opmd { tau, k2_coef } => {
                let d = clampr(x[i] - o);
                (-a * x[i] + f64::from(k2_coef) * d * d) / (1.0 + f64::from(tau))
            }
            PolicyLossKind::AlolSeq { clip } => {
                let w = clampr(f[i] - c.refl[i])
                    .exp()
                    .clamp(1.0 - f64::from(clip), 1.0 + f64::from(clip));
                if a > 0.0 {
                    -w * a * x[i]
                } else {
                    mask[i] = 0.0;
                    0.0
                }
            }
            PolicyLossKind::AlolKl { beta } => {
                if a > 0.0 {
                    -a * x[i] + f64::from(beta) * clampr(x[i] - c.refl[i])
                } else {
                    mask[i] = 0.0;
                    0.0
                }
            }
            PolicyLossKind::Alol { clip } => {
                let d: Vec<f64> = f.iter().zip(&c.refl).map(|(f, r)| f - r).collect();
                let w = clampr(seq_sum(&d, &c.mask, row))
                    .exp()
                    .clamp(1.0 - f64::from(clip), 1.0 + f64::from(clip));
                if a > 0.0 {
                    -w * a * x[i]
                } else {
                    mask[i] = 0.0;
                    0.0
                }
            }
        };
    }
    (out, mask)
}

fn reference_agg(per: &[f64], mask: &[f64], agg: LossAgg, norm: AggNorm) -> f64 {
    let total: f64 = per.iter().zip(mask).map(|(l, m)| l * m).sum();
    let (tokens, seqs) = (f64::from(norm.tokens), f64::from(norm.seqs));
    match agg {
        LossAgg::TokenMean => total / tokens,
        LossAgg::SeqMeanTokenSum => total / seqs,
        LossAgg::SeqMeanTokenSumNorm { constant } => total / (seqs * f64::from(constant)),
        LossAgg::SeqMeanTokenMean => {
            (0..B)
                .map(|r| {
                    let s: f64 = (0..T).map(|t| per[r * T + t] * mask[r * T + t]).sum();
                    let n: f64 = (0..T).map(|t| mask[r * T + t]).sum();
                    s / n.max(1.0)
                })
                .sum::<f64>()
                / seqs
        }
    }
}

fn kinds() -> Vec<PolicyLossKind> {
    vec![
        PolicyLossKind::Vanilla,
        PolicyLossKind::Ppo {
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: Some(3.0),
        },
        PolicyLossKind::Ppo {
            clip_low: 0.1,
            clip_high: 0.1,
            dual_clip: None,
        },
        PolicyLossKind::Gspo {
            clip_low: 0.1,
            clip_high: 0.15,
        },
        PolicyLossKind::Cispo {
            clip_low: 0.1,
            clip_high: 0.2,
        },
        PolicyLossKind::Dispo {
            pos_down: 0.2,
            pos_up: 0.3,
            neg_down: 0.3,
            neg_up: 0.2,
        },
        PolicyLossKind::Topr {
            level: RatioLevel::Sequence,
        },
        PolicyLossKind::Topr {
            level: RatioLevel::Token,
        },
        PolicyLossKind::Rec {
            clip: RecClip::OneSide,
            importance_sampling: false,
            clip_low: 0.2,
            clip_high: 0.2,
            clip_low_prime: 0.6,
            clip_high_prime: 2.0,
        },
        PolicyLossKind::Rec {
            clip: RecClip::TwoSide,
            importance_sampling: true,
            clip_low: 0.2,
            clip_high: 0.2,
            clip_low_prime: 0.6,
            clip_high_prime: 2.0,
        },
        PolicyLossKind::Rec {
            clip: RecClip::Ring,
            importance_sampling: false,
            clip_low: 0.1,
            clip_high: 0.1,
            clip_low_prime: 0.3,
            clip_high_prime: 0.4,
        },
        PolicyLossKind::Opmd {
            tau: 1.0,
            k2_coef: 0.3,
        },
        PolicyLossKind::Alol { clip: 0.2 },
        PolicyLossKind::AlolSeq { clip: 0.2 },
        PolicyLossKind::AlolKl { beta: 0.3 },
    ]
}

fn engine_value_and_grad(
    kind: &PolicyLossKind,
    c: &Case,
    agg: LossAgg,
) -> (f64, Vec<f64>, AggNorm) {
    let d = dev().autodiff();
    let lp = from_f64_on(&c.lp, B, T, &d).require_grad();
    let input = PolicyLossInput {
        log_probs: lp.clone(),
        old_log_probs: from_f64_on(&c.old, B, T, &d),
        advantages: from_f64_on(&c.adv, B, T, &d),
        mask: from_f64_on(&c.mask, B, T, &d),
        ref_log_probs: Some(from_f64_on(&c.refl, B, T, &d)),
    };
    let norm = AggNorm::of_mask(&input.mask);
    let out = policy_loss(kind, &input).expect("loss");
    let loss = aggregate(out.per_step, out.mask, agg, norm);
    let grads = loss.backward();
    let g = vals(lp.grad(&grads).expect("gradient"))
        .into_iter()
        .map(f64::from)
        .collect();
    (f64::from(vals(loss)[0]), g, norm)
}

fn check(kind: &PolicyLossKind, agg: LossAgg, seed: u64) {
    let c = case(seed);
    let (value, grad, norm) = engine_value_and_grad(kind, &c, agg);
    let objective = |x: &[f64]| {
        let (per, mask) = reference(kind, &c, x, &c.lp);
        reference_agg(&per, &mask, agg, norm)
    };
    let want = objective(&c.lp);
    assert!(
        (value - want).abs() <= 1e-4 * (1.0 + want.abs()),
        "{kind:?} {agg:?}: value {value} vs {want}"
    );
    let h = 1e-5;
    for i in 0..B * T {
        let mut up = c.lp.clone();
        up[i] += h;
        let mut down = c.lp.clone();
        down[i] -= h;
        let fd = (objective(&up) - objective(&down)) / (2.0 * h);
        assert!(
            (grad[i] - fd).abs() <= 2e-4 * (1.0 + fd.abs()),
            "{kind:?} {agg:?} seed {seed}: d/dlogp[{i}] autodiff {} vs finite difference {fd}",
            grad[i]
        );
    }
}

#[test]
fn every_policy_loss_matches_finite_differences() {
    for kind in kinds() {
        for seed in [1, 2, 3] {
            check(&kind, LossAgg::TokenMean, seed);
        }
    }
}

#[test]
fn aggregation_modes_match_finite_differences() {
    let kind = PolicyLossKind::Ppo {
        clip_low: 0.2,
        clip_high: 0.28,
        dual_clip: Some(3.0),
    };
    for agg in [
        LossAgg::SeqMeanTokenMean,
        LossAgg::SeqMeanTokenSum,
        LossAgg::SeqMeanTokenSumNorm { constant: 4.0 },
    ] {
        check(&kind, agg, 11);
        check(
            &PolicyLossKind::Gspo {
                clip_low: 0.1,
                clip_high: 0.1,
            },
            agg,
            12,
        );
    }
}

#[test]
fn kl_estimators_match_finite_differences() {
    let c = case(5);
    let d = dev().autodiff();
    for est in [
        KlEstimator::K1,
        KlEstimator::K2,
        KlEstimator::K3,
        KlEstimator::Abs,
        KlEstimator::K1StraightThrough,
        KlEstimator::K3StraightThrough,
    ] {
        let lp = from_f64_on(&c.lp, B, T, &d).require_grad();
        let k = kl_penalty(lp.clone(), from_f64_on(&c.refl, B, T, &d), est);
        let grads = k.clone().sum().backward();
        let g = vals(lp.grad(&grads).unwrap());
        let v = vals(k);
        for i in 0..B * T {
            let x = c.lp[i] - c.refl[i];
            let k3 = |x: f64| ((-x).exp() + x - 1.0).clamp(-10.0, 10.0);
            let (value, fd) = match est {
                KlEstimator::K1 => (x, 1.0),
                KlEstimator::K2 => (0.5 * x * x, x),
                KlEstimator::K3 => (k3(x), (k3(x + 1e-6) - k3(x - 1e-6)) / 2e-6),
                KlEstimator::Abs => (x.abs(), x.signum()),
                // Straight-through: value of k1/k3, gradient of k2.
                KlEstimator::K1StraightThrough => (x, x),
                KlEstimator::K3StraightThrough => (k3(x), x),
            };
            assert!((f64::from(v[i]) - value).abs() < 1e-5, "{est:?} value");
            assert!(
                (f64::from(g[i]) - fd).abs() < 1e-4,
                "{est:?} grad {} vs {fd}",
                g[i]
            );
        }
    }
}
