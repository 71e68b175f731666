//! PPO's critic: the clipped value loss (verl `compute_value_loss`), PACT's importance weights
//! and the explained variance, against hand-worked values; the value loss's gradient against
//! finite differences of an f64 loop.

mod common;

use common::*;
use ember_engine::*;

type Tensor2 = burn::tensor::Tensor<2>;

fn input(weights: Option<Tensor2>) -> ValueLossInput {
    ValueLossInput {
        vpreds: t2(&[&[1.0, 0.2, -0.5, 9.0], &[0.3, 0.8, 0.0, 0.0]]),
        values: t2(&[&[0.2, 0.1, 0.0, 0.0], &[0.3, 0.0, 0.0, 0.0]]),
        returns: t2(&[&[1.0, 1.0, 1.0, 0.0], &[0.0, 0.0, 0.0, 0.0]]),
        mask: t2(&[&[1.0, 1.0, 1.0, 0.0], &[1.0, 1.0, 0.0, 0.0]]),
        weights,
    }
}

fn metric(m: &Metrics, key: &str) -> f64 {
    f64::from(vals(m.get(key).unwrap_or_else(|| panic!("{key}")).clone())[0])
}

#[test]
fn clipped_value_loss_by_hand() {
    // ε_v = 0.5. Step (0,0): V 1.0 from V_old 0.2 clips to 0.7, (0.7 − 1)² = 0.09 > 0² = 0:
    // the clipped square wins (1 of 5 valid steps). (0,1) 0.64, (0,2) 2.25 (its clip at −0.5
    // is V itself), (1,0) 0.09, (1,1): 0.64 beats the clipped 0.25. Token-mean: ½ · 3.71 / 5.
    let inp = input(None);
    let norm = AggNorm::of_mask(&inp.mask);
    let cfg = CriticConfig::default();
    let (loss, m) = value_loss(&cfg, &inp, norm).unwrap();
    assert_close(&vals(loss), &[0.371], 1e-6);
    assert!((metric(&m, "critic/vf_clipfrac") - 0.2).abs() < 1e-6);
    assert!((metric(&m, "critic/vpred_mean") - 0.36).abs() < 1e-6);
    // No clip: ½ · (0 + 0.64 + 2.25 + 0.09 + 0.64) / 5.
    let off = CriticConfig {
        value_clip: 0.0,
        ..cfg
    };
    let (loss, m) = value_loss(&off, &inp, norm).unwrap();
    assert_close(&vals(loss), &[0.362], 1e-6);
    assert!(m.get("critic/vf_clipfrac").is_none());
    // Weights multiply the per-step losses (the masked step's weight 7 does nothing):
    // ½ · (0.09·2 + 0.64·1 + 2.25·0.5 + 0.09·1 + 0.64·0) / 5.
    let w = t2(&[&[2.0, 1.0, 0.5, 7.0], &[1.0, 0.0, 3.0, 3.0]]);
    let (loss, _) = value_loss(&cfg, &input(Some(w)), norm).unwrap();
    assert_close(&vals(loss), &[0.2035], 1e-6);
    // Sequence-mean aggregation: row means (0.09 + 0.64 + 2.25)/3 and (0.09 + 0.64)/2.
    let seq = CriticConfig {
        agg: LossAgg::SeqMeanTokenMean,
        ..cfg
    };
    let (loss, _) = value_loss(&seq, &inp, norm).unwrap();
    assert_close(&vals(loss), &[0.5 * (2.98 / 3.0 + 0.73 / 2.0) / 2.0], 1e-6);
}

#[test]
fn bad_critic_inputs_are_errors() {
    let mut inp = input(None);
    let norm = AggNorm::of_mask(&inp.mask);
    let bad = CriticConfig {
        value_clip: -1.0,
        ..CriticConfig::default()
    };
    assert!(matches!(
        value_loss(&bad, &inp, norm),
        Err(EngineError::InvalidConfig {
            field: "critic.value_clip",
            ..
        })
    ));
    let bad = CriticConfig {
        pact: Some(Pact { weight_clip: 0.0 }),
        ..CriticConfig::default()
    };
    assert!(bad.validate().is_err());
    inp.returns = full2(2, 3, 0.0);
    assert!(matches!(
        value_loss(&CriticConfig::default(), &inp, norm),
        Err(EngineError::ShapeMismatch {
            name: "returns",
            ..
        })
    ));
    assert!(
        pact_weights(
            &Pact::default(),
            full2(2, 4, 0.0),
            full2(2, 3, 0.0),
            full2(2, 4, 1.0)
        )
        .is_err()
    );
}

#[test]
fn pact_weights_are_truncated_suffix_products() {
    // log π_new − log π_old: row 0 [0.1, −0.2, 0.5, (pad) 3.0]; row 1 [0.2, (observation) 5.0,
    // −0.1, (pad) 0]. Suffix sums over valid steps: row 0 [0.4, 0.3, 0.5], row 1 [0.1, ·,
    // −0.1] (the observation's 5.0 is carried over, not counted). c̄ = 1.4 truncates e^0.4 and
    // e^0.5 (2 of 5 valid steps); masked steps get 0.
    let old = t2(&[&[-1.0, -1.0, -1.0, -1.0], &[-2.0, -2.0, -2.0, -2.0]]);
    let new = old.clone() + t2(&[&[0.1, -0.2, 0.5, 3.0], &[0.2, 5.0, -0.1, 0.0]]);
    let mask = t2(&[&[1.0, 1.0, 1.0, 0.0], &[1.0, 0.0, 1.0, 0.0]]);
    let pact = Pact { weight_clip: 1.4 };
    let (w, m) = pact_weights(&pact, new, old.clone(), mask.clone()).unwrap();
    let (e3, e1, em1) = (0.3f64.exp(), 0.1f64.exp(), (-0.1f64).exp());
    assert_close(&vals(w), &[1.4, e3, 1.4, 0.0, e1, 0.0, em1, 0.0], 1e-6);
    assert!((metric(&m, "critic/pact_weight_mean") - (2.8 + e3 + e1 + em1) / 5.0).abs() < 1e-6);
    assert!((metric(&m, "critic/pact_clipped_fraction") - 0.4).abs() < 1e-6);
    // An unchanged policy weighs every valid step 1 (PACT = the plain critic update).
    let (w, _) = pact_weights(&pact, old.clone(), old, mask).unwrap();
    assert_close(&vals(w), &[1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0], 0.0);
}

#[test]
fn explained_variance_as_verl() {
    // R − V = [0.5, −0.2, 0.1]: unbiased variance 0.12333; Var(R) = 1/3:
    // 1 − 0.12333 / (1/3 + 1e-5) = 0.630011. The masked fourth step is ignored.
    let ev = explained_variance(
        t2(&[&[0.5, 0.2, 0.9, 7.0]]),
        t2(&[&[1.0, 0.0, 1.0, -3.0]]),
        t2(&[&[1.0, 1.0, 1.0, 0.0]]),
    )
    .unwrap();
    assert_close(&vals(ev), &[0.630_011_1], 1e-5);
}

/// ½ · token-mean of max((v − R)², (clip(v, V_old ± ε) − R)²) · w, in f64.
fn reference(v: &[f64], old: &[f64], ret: &[f64], mask: &[f64], w: &[f64], eps: f64) -> f64 {
    let n: f64 = mask.iter().sum();
    let mut s = 0.0;
    for i in 0..v.len() {
        let a = (v[i] - ret[i]).powi(2);
        let c = (old[i] + (v[i] - old[i]).clamp(-eps, eps) - ret[i]).powi(2);
        s += a.max(c) * w[i] * mask[i];
    }
    0.5 * s / n
}

#[test]
fn value_loss_gradient_matches_finite_differences() {
    const B: usize = 3;
    const T: usize = 5;
    for seed in 0..4u64 {
        let mut rng = SplitMix64(seed);
        let old = rng.vec(B * T, -1.0, 1.0);
        // Predictions on both sides of the clip band, away from its edges.
        let v: Vec<f64> = old
            .iter()
            .map(|o| {
                let d = rng.uniform(0.05, 0.9);
                let d = if d > 0.45 && d < 0.55 { d + 0.2 } else { d };
                if rng.uniform(0.0, 1.0) < 0.5 {
                    o + d
                } else {
                    o - d
                }
            })
            .collect();
        let ret = rng.vec(B * T, -1.0, 1.5);
        let w = rng.vec(B * T, 0.2, 2.0);
        let mask: Vec<f64> = (0..B * T)
            .map(|i| if i % 7 == 6 { 0.0 } else { 1.0 })
            .collect();
        let d = dev().autodiff();
        let vp = from_f64_on(&v, B, T, &d).require_grad();
        let inp = ValueLossInput {
            vpreds: vp.clone(),
            values: from_f64_on(&old, B, T, &d),
            returns: from_f64_on(&ret, B, T, &d),
            mask: from_f64_on(&mask, B, T, &d),
            weights: Some(from_f64_on(&w, B, T, &d)),
        };
        let norm = AggNorm::of_mask(&inp.mask);
        let (loss, _) = value_loss(&CriticConfig::default(), &inp, norm).unwrap();
        let grads = loss.clone().backward();
        let g = vals(vp.grad(&grads).expect("gradient"));
        let f = |x: &[f64]| reference(x, &old, &ret, &mask, &w, 0.5);
        let want = f(&v);
        let got = f64::from(vals(loss)[0]);
        assert!(
            (got - want).abs() < 1e-5 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
        let h = 1e-6;
        for i in 0..B * T {
            let (mut up, mut down) = (v.clone(), v.clone());
            up[i] += h;
            down[i] -= h;
            let fd = (f(&up) - f(&down)) / (2.0 * h);
            assert!(
                (f64::from(g[i]) - fd).abs() < 2e-4 * (1.0 + fd.abs()),
                "seed {seed} step {i}: autodiff {} vs finite difference {fd}",
                g[i]
            );
        }
    }
}

#[test]
fn basis_kernel_baseline_by_hand() {
    // Unit features [1,0], [0.8,0.6], [0,1]: squared distances 0.4, 2, 0.8, mean h² = 16/15.
    // Bandwidth 1: K = exp(−d²/(2h²)); one pseudo-row at the leave-one-out mean (0.5, 1, 0.5):
    // V0 = (K02·1 + 0.5)/(K01 + K02 + 1) = 0.401509, V1 = 1 (every other reward is 1),
    // V2 = (K02·1 + 0.5)/(K02 + K12 + 1) = 0.428884. Bandwidth 0.5: 0.349972, 1, 0.419940.
    // A fourth row with an invalid reward (valid 0) has no weight in the others' estimates.
    let f = t2(&[&[2.0, 0.0], &[0.8, 0.6], &[0.0, 3.0], &[0.5, 0.5]]);
    let r = t1(&[1.0, 0.0, 1.0, 0.0]);
    let valid = t1(&[1.0, 1.0, 1.0, 0.0]);
    let v = vals(basis_values(f.clone(), r.clone(), valid.clone(), 1.0, 1.0));
    assert_close(&v[..3], &[0.401_509_4, 1.0, 0.428_884_4], 1e-5);
    let v = vals(basis_values(f.clone(), r.clone(), valid.clone(), 0.5, 1.0));
    assert_close(&v[..3], &[0.349_972_1, 1.0, 0.419_940_3], 1e-5);
    // Through the estimator: A = R − V̂ on valid rows, whitening off.
    let b = RolloutBatch::new(
        full2(4, 2, 1.0),
        t1(&[1.0, 0.0, 1.0, f32::NAN]),
        &[0, 1, 2, 3],
    )
    .unwrap()
    .with_features(f)
    .unwrap();
    let kind = AdvantageKind::Basis {
        bandwidth: 1.0,
        prior: 1.0,
        whiten: false,
    };
    let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
    let a = vals(out.advantages);
    assert_close(
        &a,
        &[
            0.598_490_6,
            0.598_490_6,
            -1.0,
            -1.0,
            0.571_115_6,
            0.571_115_6,
            0.0,
            0.0,
        ],
        1e-5,
    );
    // Without features the estimator names what is missing.
    let b = RolloutBatch::new(full2(2, 1, 1.0), t1(&[1.0, 0.0]), &[0, 1]).unwrap();
    assert_eq!(
        compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap_err(),
        EngineError::MissingInput {
            what: "basis",
            input: "features"
        }
    );
    assert!(kind.group_free() && kind.needs_features());
}
