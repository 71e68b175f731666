//! Golden values worked out by hand (the arithmetic is in the comments) for every estimator,
//! loss, aggregation mode, KL estimator, filter and correction of the engine, edge cases
//! included.

mod common;

use common::*;
use ember_engine::*;

fn batch(mask: Tensor2, rewards: &[f32], groups: &[usize]) -> RolloutBatch {
    RolloutBatch::new(mask, t1(rewards), groups).expect("valid batch")
}

type Tensor2 = burn::tensor::Tensor<2>;

fn adv(kind: AdvantageKind, b: &RolloutBatch) -> Vec<f32> {
    vals(
        compute_advantages(&AdvantageConfig::new(kind), b, 0)
            .expect("advantages")
            .advantages,
    )
}

fn one_group_1000() -> RolloutBatch {
    batch(full2(4, 1, 1.0), &[1.0, 0.0, 0.0, 0.0], &[7, 7, 7, 7])
}

const GRPO: AdvantageKind = AdvantageKind::Grpo {
    std: StdKind::Unbiased,
    epsilon: 1e-6,
    scale_by_std: true,
};

#[test]
fn rloo_leave_one_out() {
    // A_0 = 1 − (0+0+0)/3 = 1; A_j = 0 − (1+0+0)/3 = −1/3.
    let a = adv(AdvantageKind::Rloo, &one_group_1000());
    assert_close(&a, &[1.0, -1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0], 1e-6);
}

#[test]
fn grpo_unbiased_and_population_std() {
    // mean 0.25; unbiased var = (0.75² + 3·0.25²)/3 = 0.25 → std 0.5: 0.75/0.5 = 1.5, −0.5.
    let a = adv(GRPO, &one_group_1000());
    let s = 0.5 + 1e-6;
    assert_close(&a, &[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], 1e-5);
    assert!((a[0] - 1.5).abs() < 1e-4 && (a[1] + 0.5).abs() < 1e-4);
    // population var = 0.75/4 = 0.1875.
    let pop = AdvantageKind::Grpo {
        std: StdKind::Population,
        epsilon: 0.0,
        scale_by_std: true,
    };
    let a = adv(pop, &one_group_1000());
    let s = 0.1875f64.sqrt();
    assert_close(&a, &[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], 1e-5);
}

#[test]
fn dr_grpo_and_unscaled_grpo_drop_the_std() {
    let expected = [0.75, -0.25, -0.25, -0.25];
    assert_close(
        &adv(AdvantageKind::DrGrpo, &one_group_1000()),
        &expected,
        1e-6,
    );
    let unscaled = AdvantageKind::Grpo {
        std: StdKind::Unbiased,
        epsilon: 1e-6,
        scale_by_std: false,
    };
    assert_close(&adv(unscaled, &one_group_1000()), &expected, 1e-6);
}

#[test]
fn reinforce_raw_and_batch_mean() {
    let b = batch(full2(3, 1, 1.0), &[1.0, 0.5, 0.0], &[0, 1, 2]);
    let raw = AdvantageKind::Reinforce {
        baseline: BatchBaseline::None,
    };
    assert_close(&adv(raw, &b), &[1.0, 0.5, 0.0], 1e-6);
    let mean = AdvantageKind::Reinforce {
        baseline: BatchBaseline::Mean,
    };
    assert_close(&adv(mean, &b), &[0.5, 0.0, -0.5], 1e-6);
    // TOPR's constant baseline: with c = 0.75, the 0.5-reward sample becomes a negative.
    let constant = AdvantageKind::Reinforce {
        baseline: BatchBaseline::Constant(0.75),
    };
    assert_close(&adv(constant, &b), &[0.25, -0.25, -0.75], 1e-6);
    let parsed: AdvantageKind =
        toml::from_str("kind = \"reinforce\"\nbaseline = { constant = 0.75 }").unwrap();
    assert_eq!(parsed, constant);
}

#[test]
fn singleton_groups_get_zero_advantage() {
    let b = batch(full2(3, 1, 1.0), &[1.0, 0.0, 0.3], &[0, 1, 2]);
    for kind in [
        AdvantageKind::Rloo,
        GRPO,
        AdvantageKind::DrGrpo,
        AdvantageKind::ReinforcePlusPlusBaseline,
        AdvantageKind::Opo,
        AdvantageKind::ReinforceRej {
            reject: RejectGroups::Both,
            threshold: 0.5,
        },
        AdvantageKind::Opmd {
            baseline: OpmdBaseline::Mean,
            tau: 1.0,
        },
        AdvantageKind::AsymRe { shift: -0.1 },
        AdvantageKind::Bnpo { decompose: false },
    ] {
        assert_close(&adv(kind, &b), &[0.0, 0.0, 0.0], 0.0);
    }
}

#[test]
fn zero_variance_groups_are_exactly_zero() {
    // 0.1 is not representable: a mean computed in floats need not equal it, the rule must.
    let b = batch(
        full2(6, 2, 1.0),
        &[0.1, 0.1, 0.1, 1.0, 0.0, 0.0],
        &[0, 0, 0, 1, 1, 1],
    );
    for kind in [
        GRPO,
        AdvantageKind::Grpo {
            std: StdKind::Population,
            epsilon: 0.0,
            scale_by_std: true,
        },
        AdvantageKind::Bnpo { decompose: false },
        AdvantageKind::ReinforceRej {
            reject: RejectGroups::Both,
            threshold: 0.5,
        },
    ] {
        let a = adv(kind, &b);
        assert!(a[..6].iter().all(|x| *x == 0.0), "{kind:?}: {a:?}");
        assert!(a[6] > 0.0, "{kind:?}: {a:?}");
    }
}

#[test]
fn non_finite_rewards_are_excluded_counted_and_masked() {
    // Valid rewards of the group: {1, 0, 0}; the NaN sample gets 0 and leaves the mask.
    // RLOO: A_0 = 1 − 0 = 1; A_2 = A_3 = 0 − (1 + 0)/2 = −0.5.
    let b = batch(full2(4, 2, 1.0), &[1.0, f32::NAN, 0.0, 0.0], &[0, 0, 0, 0]);
    let out = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &b, 0).unwrap();
    assert_close(
        &vals(out.advantages),
        &[1.0, 1.0, 0.0, 0.0, -0.5, -0.5, -0.5, -0.5],
        1e-6,
    );
    assert_close(
        &vals(out.mask),
        &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
        0.0,
    );
    let m = out.metrics.to_host();
    assert_eq!(m["rollout/invalid_rewards"], 1.0);
    assert!((m["rollout/reward_mean"] - 1.0 / 3.0).abs() < 1e-6);
    // Infinity likewise, and GRPO's statistics ignore it: {1, 0} → ±0.7071 (unbiased std √0.5).
    let b = batch(full2(3, 1, 1.0), &[1.0, f32::INFINITY, 0.0], &[0, 0, 0]);
    let a = adv(GRPO, &b);
    let s = 0.5f64.sqrt() + 1e-6;
    assert_close(&a, &[0.5 / s, 0.0, -0.5 / s], 1e-5);
    // A reward beyond ±REWARD_LIMIT (1e9) is invalid too: f32 statistics of 1e20 overflow
    // (its squared deviation is infinite) and would make every advantage NaN. The same {1, 0}.
    let b = batch(full2(4, 1, 1.0), &[1.0, 2e20, 0.0, -1e10], &[0, 0, 0, 0]);
    let out = compute_advantages(&AdvantageConfig::new(GRPO), &b, 0).unwrap();
    assert_close(&vals(out.advantages), &[0.5 / s, 0.0, -0.5 / s, 0.0], 1e-5);
    assert_close(&vals(out.mask), &[1.0, 0.0, 1.0, 0.0], 0.0);
    assert_eq!(out.metrics.to_host()["rollout/invalid_rewards"], 2.0);
    // 1e9 itself is a reward.
    let b = batch(full2(2, 1, 1.0), &[1e9, 0.0], &[0, 0]);
    assert_eq!(vals(b.reward_valid()), vec![1.0, 1.0]);
}

#[test]
fn empty_batch_and_shape_mismatch_are_errors() {
    let empty = burn::tensor::Tensor::<2>::zeros([0, 3], &dev());
    let err = RolloutBatch::new(empty, t1(&[]), &[]).unwrap_err();
    assert_eq!(err, EngineError::EmptyBatch("mask"));
    assert!(err.to_string().contains("empty batch"));
    let err = RolloutBatch::new(full2(2, 3, 1.0), t1(&[1.0]), &[0, 0]).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::ShapeMismatch {
                name: "rewards",
                ..
            }
        ),
        "{err}"
    );
    let b = batch(full2(2, 3, 1.0), &[1.0, 0.0], &[0, 0]);
    let err = b.with_values(full2(2, 4, 0.0)).unwrap_err();
    assert!(err.to_string().contains("values"), "{err}");
}

#[test]
fn reinforce_plus_plus_reward_to_go_and_whitening() {
    // Rows: mask [1,1,0] reward 1; mask [1,1,1] reward 0; γ = 1, no KL.
    // Token rewards: [0,1,0], [0,0,0] → returns [1,1,0], [0,0,0].
    // Valid returns {1,1,0,0,0}: mean 0.4, unbiased var (2·0.36 + 3·0.16)/4 = 0.3.
    let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0]]);
    let b = batch(mask.clone(), &[1.0, 0.0], &[0, 0]);
    let kind = AdvantageKind::ReinforcePlusPlus {
        gamma: 1.0,
        kl_coef: 0.0,
        whiten: true,
    };
    let s = (0.3f64 + 1e-8).sqrt();
    let (hi, lo) = (0.6 / s, -0.4 / s);
    assert_close(&adv(kind, &b), &[hi, hi, 0.0, lo, lo, lo], 1e-5);

    // γ = 0.5 and k1 KL with β = 0.1: old − ref = 0.5 on every token → r_t −= 0.05.
    // Row 0: r = [−0.05, 0.95] → G = [−0.05 + 0.5·0.95, 0.95] = [0.425, 0.95].
    // Row 1: r = [−0.05]·3 → G_2 = −0.05, G_1 = −0.075, G_0 = −0.0875.
    let b = batch(mask, &[1.0, 0.0], &[0, 0])
        .with_old_log_probs(full2(2, 3, -1.0))
        .unwrap()
        .with_ref_log_probs(full2(2, 3, -1.5))
        .unwrap();
    let kind = AdvantageKind::ReinforcePlusPlus {
        gamma: 0.5,
        kl_coef: 0.1,
        whiten: true,
    };
    let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
    let g = [0.425, 0.95, -0.0875, -0.075, -0.05];
    let mean = g.iter().sum::<f64>() / 5.0;
    let var = g.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 4.0;
    let w: Vec<f64> = g.iter().map(|x| (x - mean) / (var + 1e-8).sqrt()).collect();
    assert_close(
        &vals(out.advantages),
        &[w[0], w[1], 0.0, w[2], w[3], w[4]],
        1e-5,
    );
    assert_close(
        &vals(out.returns),
        &[g[0], g[1], 0.0, g[2], g[3], g[4]],
        1e-6,
    );
    // Missing reference log-probs is an error naming them.
    let b = batch(full2(1, 2, 1.0), &[1.0], &[0]);
    let err = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap_err();
    assert!(err.to_string().contains("old_log_probs"), "{err}");
}

/// On-policy distillation's preset (γ = 0, no whitening): each token's advantage is its own
/// reward, the teacher's token reward plus the outcome on the last valid step; nothing of a
/// later token reaches an earlier one, and masked steps get 0.
#[test]
fn opd_takes_each_tokens_reward_as_its_advantage() {
    let parts = Preset::Opd.parts(8);
    assert!(Preset::Opd.needs_teacher() && !Preset::Grpo.needs_teacher());
    // Token rewards log π_T − log π_S: row 0 [−0.5, 0.25, (masked)], row 1 [0.1, −2, 0.3];
    // outcomes 1 and 0.
    let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0]]);
    let b = batch(mask, &[1.0, 0.0], &[0, 0])
        .with_token_rewards(t2(&[&[-0.5, 0.25, 9.0], &[0.1, -2.0, 0.3]]))
        .unwrap();
    let out = compute_advantages(&parts.advantage, &b, 0).unwrap();
    assert_close(
        &vals(out.advantages),
        &[-0.5, 1.25, 0.0, 0.1, -2.0, 0.3],
        1e-6,
    );
    assert_eq!(parts.loss.agg, LossAgg::TokenMean);
}

#[test]
fn reinforce_plus_plus_baseline() {
    // R − mean = [0.75, −0.25 ×3]; whitened over 4 tokens: mean 0, unbiased var 0.25.
    let a = adv(AdvantageKind::ReinforcePlusPlusBaseline, &one_group_1000());
    let s = (0.25f64 + 1e-8).sqrt();
    assert_close(&a, &[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], 1e-5);
}

#[test]
fn remax_subtracts_the_greedy_reward() {
    let b = batch(full2(2, 1, 1.0), &[1.0, 0.0], &[0, 1]);
    let err = compute_advantages(&AdvantageConfig::new(AdvantageKind::Remax), &b, 0).unwrap_err();
    assert_eq!(
        err,
        EngineError::MissingInput {
            what: "remax",
            input: "baseline_rewards"
        }
    );
    let b = b.with_baseline_rewards(t1(&[0.5, 0.5])).unwrap();
    assert_close(&adv(AdvantageKind::Remax, &b), &[0.5, -0.5], 1e-6);
}

#[test]
fn opo_length_weighted_baseline() {
    // Lengths 2 and 4: b = (2·1 + 4·0)/6 = 1/3 → A = [2/3, −1/3].
    let mask = t2(&[&[1.0, 1.0, 0.0, 0.0], &[1.0, 1.0, 1.0, 1.0]]);
    let a = adv(AdvantageKind::Opo, &batch(mask, &[1.0, 0.0], &[0, 0]));
    let (x, y) = (2.0 / 3.0, -1.0 / 3.0);
    assert_close(&a, &[x, x, 0.0, 0.0, y, y, y, y], 1e-6);
}

#[test]
fn bnpo_beta_normalisation() {
    // Groups p = 0.25 and 0.5: μ = 0.375, unbiased σ² = 0.03125, ν = μ(1−μ)/σ² − 1 = 6.5,
    // α = 1 + 6.5·0.375/3 = 1.8125, β = 1 + 6.5·0.625/3 = 2.3541667.
    // f(0.25) = 1.4463519, f(0.5) = 1.4669116 (Python math.lgamma); A = (R − p)/f.
    let b = batch(
        full2(8, 1, 1.0),
        &[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
        &[0, 0, 0, 0, 1, 1, 1, 1],
    );
    let a = adv(AdvantageKind::Bnpo { decompose: false }, &b);
    let (p, q) = (0.518_545_994, -0.172_848_665);
    let r = 0.340_852_172;
    assert_close(&a, &[p, q, q, q, r, r, -r, -r], 2e-4);
    // A single group degenerates to Beta(1, 1): A = R − p.
    assert_close(
        &adv(AdvantageKind::Bnpo { decompose: false }, &one_group_1000()),
        &[0.75, -0.25, -0.25, -0.25],
        1e-5,
    );
}

/// BNPO's advantage decomposition (reference `use_advantage_decomposition`): each reward term
/// gets its own BNPO advantage and A is their mean. Term 1 is the correctness of
/// `bnpo_beta_normalisation` (its A by hand there); term 2 is a format reward every row earns
/// (no spread in any group: A₂ = 0), with one failed value (NaN), which leaves term 2 alone.
/// So A = A₁ / 2, whatever the summed reward.
#[test]
fn bnpo_decomposes_the_reward_into_its_terms() {
    let correct = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0];
    let format = [1.0, 1.0, 1.0, f32::NAN, 1.0, 1.0, 1.0, 1.0];
    let rows: Vec<[f32; 2]> = correct.iter().zip(&format).map(|(c, f)| [*c, *f]).collect();
    let rows: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    let summed: Vec<f32> = correct
        .iter()
        .zip(&format)
        .map(|(c, f)| c + f.max(0.0))
        .collect();
    let b = batch(full2(8, 1, 1.0), &summed, &[0, 0, 0, 0, 1, 1, 1, 1]);
    let kind = AdvantageKind::Bnpo { decompose: true };
    let e = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap_err();
    assert!(e.to_string().contains("reward_parts"), "{e}");
    let b = b.with_reward_parts(t2(&rows)).unwrap();
    let (p, q, r) = (
        0.518_545_994 / 2.0,
        -0.172_848_665 / 2.0,
        0.340_852_172 / 2.0,
    );
    assert_close(&adv(kind, &b), &[p, q, q, q, r, r, -r, -r], 2e-4);
    // Without decomposition the summed reward is normalised as one.
    let whole = adv(AdvantageKind::Bnpo { decompose: false }, &b);
    assert!((f64::from(whole[0]) - p).abs() > 1e-2, "{whole:?}");
    // Per-step rewards are not among the parts: refused.
    let with_steps = b.with_token_rewards(full2(8, 1, 0.0)).unwrap();
    let e = compute_advantages(&AdvantageConfig::new(kind), &with_steps, 0).unwrap_err();
    assert!(e.to_string().contains("decompose"), "{e}");
}

#[test]
fn gae_recursion() {
    // V = [0.5, 0.6, 0.7], R = 1 on the last step, γ = 0.9, λ = 0.8:
    // δ = [0.9·0.6 − 0.5, 0.9·0.7 − 0.6, 1 − 0.7] = [0.04, 0.03, 0.3];
    // A_2 = 0.3, A_1 = 0.03 + 0.72·0.3 = 0.246, A_0 = 0.04 + 0.72·0.246 = 0.21712.
    // The padded second row is ignored; its value must not leak in.
    let mask = t2(&[&[1.0, 1.0, 1.0, 0.0], &[1.0, 1.0, 0.0, 0.0]]);
    let values = t2(&[&[0.5, 0.6, 0.7, 9.0], &[0.2, 0.4, 9.0, 9.0]]);
    let b = batch(mask, &[1.0, 0.0], &[0, 1])
        .with_values(values)
        .unwrap();
    let kind = AdvantageKind::Gae {
        gamma: 0.9,
        lambda: 0.8,
        whiten: false,
    };
    let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
    // Row 1: δ = [0.9·0.4 − 0.2, 0 − 0.4] = [0.16, −0.4]; A_1 = −0.4, A_0 = 0.16 − 0.288 = −0.128.
    assert_close(
        &vals(out.advantages),
        &[0.21712, 0.246, 0.3, 0.0, -0.128, -0.4, 0.0, 0.0],
        1e-6,
    );
    assert_close(
        &vals(out.returns),
        &[0.71712, 0.846, 1.0, 0.0, 0.072, 0.0, 0.0, 0.0],
        1e-6,
    );
    let b = batch(full2(1, 1, 1.0), &[1.0], &[0]);
    let err = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap_err();
    assert_eq!(
        err,
        EngineError::MissingInput {
            what: "gae",
            input: "values"
        }
    );
}

/// RAFT trains on the positives alone: the negatives get advantage 0 and leave the mask, so a
/// token mean averages over the positives' tokens (the rejection-sampling SFT of Dong et al.
/// 2023), not over every sample's.
#[test]
fn raft_keeps_positives_only() {
    let b = batch(full2(3, 1, 1.0), &[1.0, 0.0, 0.5], &[0, 0, 0]);
    assert_close(
        &adv(AdvantageKind::Raft { threshold: 0.0 }, &b),
        &[1.0, 0.0, 1.0],
        0.0,
    );
    let out = compute_advantages(
        &AdvantageConfig::new(AdvantageKind::Raft { threshold: 0.6 }),
        &b,
        0,
    )
    .unwrap();
    assert_close(&vals(out.advantages), &[1.0, 0.0, 0.0], 0.0);
    assert_close(&vals(out.mask), &[1.0, 0.0, 0.0], 0.0);
}

const REJ_BOTH: AdvantageKind = AdvantageKind::ReinforceRej {
    reject: RejectGroups::Both,
    threshold: 0.5,
};

#[test]
fn reinforce_rej_rejects_and_reports_zero_variance_groups() {
    let b = batch(
        full2(6, 1, 1.0),
        &[1.0, 0.0, 1.0, 1.0, 0.0, 0.0],
        &[0, 0, 1, 1, 2, 2],
    );
    let out = compute_advantages(&AdvantageConfig::new(REJ_BOTH), &b, 0).unwrap();
    assert_close(
        &vals(out.advantages),
        &[0.5, -0.5, 0.0, 0.0, 0.0, 0.0],
        1e-6,
    );
    assert_close(&vals(out.mask), &[1.0, 1.0, 0.0, 0.0, 0.0, 0.0], 0.0);
    assert_eq!(out.metrics.to_host()["advantage/rejected_samples"], 4.0);
    // The ablation of §4: only the all-wrong group (rewards 0, 0) leaves; the all-right group
    // stays with advantage 0 and counts in the token mean's denominator.
    let one_sided = AdvantageKind::ReinforceRej {
        reject: RejectGroups::AllWrong,
        threshold: 0.5,
    };
    let out = compute_advantages(&AdvantageConfig::new(one_sided), &b, 0).unwrap();
    assert_close(&vals(out.mask), &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0], 0.0);
    assert_eq!(out.metrics.to_host()["advantage/rejected_samples"], 2.0);
    let other = AdvantageKind::ReinforceRej {
        reject: RejectGroups::AllRight,
        threshold: 0.5,
    };
    let out = compute_advantages(&AdvantageConfig::new(other), &b, 0).unwrap();
    assert_close(&vals(out.mask), &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0], 0.0);
}

#[test]
fn opmd_and_asymre_baselines() {
    let b = batch(full2(2, 1, 1.0), &[1.0, 0.0], &[0, 0]);
    let mean = AdvantageKind::Opmd {
        baseline: OpmdBaseline::Mean,
        tau: 1.0,
    };
    assert_close(&adv(mean, &b), &[0.5, -0.5], 1e-6);
    // b = log((e + 1)/2) = 0.6201145.
    let lae = AdvantageKind::Opmd {
        baseline: OpmdBaseline::LogAvgExp,
        tau: 1.0,
    };
    assert_close(&adv(lae, &b), &[1.0 - 0.620_114_5, -0.620_114_5], 1e-5);
    // AsymRE: b = mean + δ = 0.5 − 0.1 = 0.4.
    assert_close(
        &adv(AdvantageKind::AsymRe { shift: -0.1 }, &b),
        &[0.6, -0.4],
        1e-6,
    );
}

#[test]
fn capo_curriculum_and_lopti_reweighting() {
    let b = one_group_1000();
    let cfg = AdvantageConfig {
        capo_positive_steps: 5,
        ..AdvantageConfig::new(AdvantageKind::Rloo)
    };
    assert_close(
        &vals(compute_advantages(&cfg, &b, 4).unwrap().advantages),
        &[1.0, 0.0, 0.0, 0.0],
        1e-6,
    );
    let third = -1.0 / 3.0;
    assert_close(
        &vals(compute_advantages(&cfg, &b, 5).unwrap().advantages),
        &[1.0, third, third, third],
        1e-6,
    );
    // π_old = 0.5: factor 0.3·0.5 + 0.7 = 0.85.
    let b = one_group_1000()
        .with_old_log_probs(full2(4, 1, 0.5f32.ln()))
        .unwrap();
    let cfg = AdvantageConfig {
        lopti_alpha: Some(0.3),
        ..AdvantageConfig::new(AdvantageKind::Rloo)
    };
    let f = 0.85;
    assert_close(
        &vals(compute_advantages(&cfg, &b, 0).unwrap().advantages),
        &[f, third * f, third * f, third * f],
        1e-6,
    );
    // Clipping at 0.5 (DDPO adv_clip_max): RLOO [1, −1/3, −1/3, −1/3] → [0.5, −1/3, …].
    let cfg = AdvantageConfig {
        clip: Some(0.5),
        ..AdvantageConfig::new(AdvantageKind::Rloo)
    };
    assert_close(
        &vals(
            compute_advantages(&cfg, &one_group_1000(), 0)
                .unwrap()
                .advantages,
        ),
        &[0.5, third, third, third],
        1e-6,
    );
    let bad = AdvantageConfig {
        clip: Some(0.0),
        ..AdvantageConfig::new(AdvantageKind::Rloo)
    };
    let err = compute_advantages(&bad, &one_group_1000(), 0).unwrap_err();
    assert!(err.to_string().contains("advantage.clip"), "{err}");
}

#[test]
fn config_values_are_checked() {
    let b = one_group_1000();
    let cfg = AdvantageConfig::new(AdvantageKind::Gae {
        gamma: 1.5,
        lambda: 1.0,
        whiten: true,
    });
    let err = compute_advantages(&cfg, &b, 0).unwrap_err();
    assert!(err.to_string().contains("advantage.gamma"), "{err}");
}

// ---------------------------------------------------------------- losses

fn loss_input(lp: &[f32], old: &[f32], adv: &[f32]) -> PolicyLossInput {
    let n = lp.len();
    PolicyLossInput {
        log_probs: from_f64(&lp.iter().map(|x| f64::from(*x)).collect::<Vec<_>>(), 1, n),
        old_log_probs: from_f64(&old.iter().map(|x| f64::from(*x)).collect::<Vec<_>>(), 1, n),
        advantages: from_f64(&adv.iter().map(|x| f64::from(*x)).collect::<Vec<_>>(), 1, n),
        mask: full2(1, n, 1.0),
        ref_log_probs: None,
    }
}

fn per_step(kind: PolicyLossKind, input: &PolicyLossInput) -> Vec<f32> {
    vals(policy_loss(&kind, input).expect("loss").per_step)
}

#[test]
fn ppo_clip_higher_and_dual_clip() {
    // ε_l 0.2, ε_h 0.28, c 3. (A=1, r=1.5): max(−1.5, −1.28) = −1.28.
    // (A=−1, r=5): max(5, 1.28) = 5, min(5, 3) = 3. (A=−1, r=0.5): max(0.5, 0.8) = 0.8.
    // (A=1, r=0.5): max(−0.5, −0.8) = −0.5.
    let kind = PolicyLossKind::Ppo {
        clip_low: 0.2,
        clip_high: 0.28,
        dual_clip: Some(3.0),
    };
    let lr = |r: f32| r.ln();
    let input = loss_input(
        &[lr(1.5), lr(5.0), lr(0.5), lr(0.5)],
        &[0.0; 4],
        &[1.0, -1.0, -1.0, 1.0],
    );
    let out = policy_loss(&kind, &input).unwrap();
    assert_close(&vals(out.per_step), &[-1.28, 3.0, 0.8, -0.5], 1e-5);
    let m = out.metrics.to_host();
    assert_eq!(m["actor/clipfrac"], 0.5); // tokens 0 and 2
    assert_eq!(m["actor/clipfrac_lower"], 0.25); // token 1
}

#[test]
fn vanilla_and_opmd_losses() {
    let input = loss_input(&[-0.5, -2.0], &[-1.0, -1.0], &[2.0, -1.0]);
    assert_close(
        &per_step(PolicyLossKind::Vanilla, &input),
        &[1.0, -2.0],
        1e-6,
    );
    // (−A·log π + c·(log π − log π_old)²)/(1 + τ), τ = 1, c = 0.5:
    // token 0: (1 + 0.5·0.25)/2 = 0.5625; token 1: (−2 + 0.5·1)/2 = −0.75.
    let kind = PolicyLossKind::Opmd {
        tau: 1.0,
        k2_coef: 0.5,
    };
    assert_close(&per_step(kind, &input), &[0.5625, -0.75], 1e-6);
}

#[test]
fn gspo_sequence_ratio() {
    // log-ratios [0.1, 0.3] → s = e^0.2 = 1.2214; ε 0.2/0.2, A = 1: max(−1.2214, −1.2) = −1.2.
    let input = loss_input(&[-0.9, -0.7], &[-1.0, -1.0], &[1.0, 1.0]);
    let kind = PolicyLossKind::Gspo {
        clip_low: 0.2,
        clip_high: 0.2,
    };
    assert_close(&per_step(kind, &input), &[-1.2, -1.2], 1e-5);
    // ε_h 0.3: unclipped, −e^0.2.
    let kind = PolicyLossKind::Gspo {
        clip_low: 0.2,
        clip_high: 0.3,
    };
    let s = 0.2f64.exp();
    assert_close(&per_step(kind, &input), &[-s, -s], 1e-5);
}

#[test]
fn cispo_dispo_topr_rec_alol() {
    let ln = |x: f32| x.ln();
    // CISPO, ε_h 0.28: r = 1.5 → w = 1.28; L = −1.28·A·log π with log π = ln 1.5 + old.
    let input = loss_input(&[ln(1.5) - 1.0, ln(0.5) - 1.0], &[-1.0, -1.0], &[1.0, -1.0]);
    let l0 = f64::from(ln(1.5) - 1.0);
    let l1 = f64::from(ln(0.5) - 1.0);
    let kind = PolicyLossKind::Cispo {
        clip_low: 1.0,
        clip_high: 0.28,
    };
    assert_close(&per_step(kind, &input), &[-1.28 * l0, 0.5 * l1], 1e-5);
    // DISPO: A>0 band [0.8, 1.28] → r = 1.5 is masked; A<0 band [0.4, 1.2] (neg_down 0.6)
    // keeps r = 0.5: L = −0.5·(−1)·log π.
    let kind = PolicyLossKind::Dispo {
        pos_down: 0.2,
        pos_up: 0.28,
        neg_down: 0.6,
        neg_up: 0.2,
    };
    assert_close(&per_step(kind, &input), &[0.0, 0.5 * l1], 1e-5);
    // TOPR, sequence level: one row, log-ratio sum ln 1.5 + ln 0.5 = ln 0.75.
    // A ≥ 0 → α = 1; A < 0 → α = min(0.75, 1).
    let kind = PolicyLossKind::Topr {
        level: RatioLevel::Sequence,
    };
    assert_close(&per_step(kind, &input), &[-l0, 0.75 * l1], 1e-5);
    let kind = PolicyLossKind::Topr {
        level: RatioLevel::Token,
    };
    assert_close(&per_step(kind, &input), &[-l0, 0.5 * l1], 1e-5);
    // REC one-side (ε 0.2): A>0 ∧ r=1.5 > 1.2 → masked; A<0 ∧ r=0.5 < 0.8 → masked.
    let rec = |clip, is| PolicyLossKind::Rec {
        clip,
        importance_sampling: is,
        clip_low: 0.2,
        clip_high: 0.2,
        clip_low_prime: 0.6,
        clip_high_prime: 2.0,
    };
    assert_close(
        &per_step(rec(RecClip::OneSide, false), &input),
        &[0.0, 0.0],
        0.0,
    );
    let input2 = loss_input(
        &[ln(1.1) - 1.0, ln(1.5) - 1.0, ln(0.3) - 1.0, ln(3.5) - 1.0],
        &[-1.0; 4],
        &[1.0, -1.0, 1.0, -1.0],
    );
    let l = [ln(1.1) - 1.0, ln(1.5) - 1.0, ln(0.3) - 1.0, ln(3.5) - 1.0].map(f64::from);
    // One-side: token 1 (A<0, r=1.5 ≥ 0.8) kept, token 2 (A>0, r=0.3 ≤ 1.2) kept, token 3 kept.
    assert_close(
        &per_step(rec(RecClip::OneSide, false), &input2),
        &[-l[0], l[1], -l[2], l[3]],
        1e-5,
    );
    // Two-side: only r = 1.1 inside [0.8, 1.2]; with IS the weight is 1.1.
    assert_close(
        &per_step(rec(RecClip::TwoSide, true), &input2),
        &[-1.1 * l[0], 0.0, 0.0, 0.0],
        1e-5,
    );
    // Ring (ε′ 0.6 / 2.0): band keeps token 0; A>0 ∧ r=0.3 ≤ 0.4 kept; A<0 ∧ r=3.5 ≥ 3 kept.
    assert_close(
        &per_step(rec(RecClip::Ring, false), &input2),
        &[-l[0], 0.0, -l[2], l[3]],
        1e-5,
    );
    // A-LoL, ε 0.9: sequence log π − log π_ref = 2·0.5 → r = e ≈ 2.718 → clipped to 1.9.
    let mut input3 = loss_input(
        &[-1.0, -1.0, -2.0, -2.0],
        &[-1.0; 4],
        &[2.0, 2.0, -1.0, -1.0],
    );
    input3.log_probs = t2(&[&[-1.0, -1.0], &[-2.0, -2.0]]);
    input3.old_log_probs = full2(2, 2, -1.0);
    input3.advantages = t2(&[&[2.0, 2.0], &[-1.0, -1.0]]);
    input3.mask = full2(2, 2, 1.0);
    let kind = PolicyLossKind::Alol { clip: 0.9 };
    let err = policy_loss(&kind, &input3).unwrap_err();
    assert_eq!(
        err,
        EngineError::MissingInput {
            what: "alol",
            input: "ref_log_probs"
        }
    );
    input3.ref_log_probs = Some(full2(2, 2, -1.5));
    let out = policy_loss(&kind, &input3).unwrap();
    assert_close(
        &vals(out.per_step),
        &[3.8, 3.8, 0.0, 0.0], // −1.9·2·log π with log π = −1
        1e-5,
    );
    assert_close(&vals(out.mask), &[1.0, 1.0, 0.0, 0.0], 0.0);
    // A-LoL seq: per-token ratio e^0.5 ≈ 1.6487 (inside 1 ± 0.9): −1.6487·2·(−1) = 3.2974.
    let out = policy_loss(&PolicyLossKind::AlolSeq { clip: 0.9 }, &input3).unwrap();
    assert_close(
        &vals(out.per_step),
        &[3.297_442_5, 3.297_442_5, 0.0, 0.0],
        1e-5,
    );
    assert_close(&vals(out.mask), &[1.0, 1.0, 0.0, 0.0], 0.0);
    // A-LoL KL, β 0.2: −2·(−1) + 0.2·(−1 + 1.5) = 2.1 on the positive row.
    let out = policy_loss(&PolicyLossKind::AlolKl { beta: 0.2 }, &input3).unwrap();
    assert_close(&vals(out.per_step), &[2.1, 2.1, 0.0, 0.0], 1e-5);
}

#[test]
fn aggregation_modes() {
    // loss [[1,2,3],[4,5,6]], mask [[1,1,0],[1,0,0]]:
    // token-mean (1+2+4)/3; seq-mean-token-mean (1.5 + 4)/2; seq-mean-token-sum (3 + 4)/2;
    // seq-mean-token-sum-norm (C = 3): 7/(2·3).
    let loss = t2(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]]);
    let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 0.0, 0.0]]);
    let norm = AggNorm::of_mask(&mask);
    assert_eq!(
        norm,
        AggNorm {
            tokens: 3.0,
            seqs: 2.0
        }
    );
    let run = |m| vals(aggregate(loss.clone(), mask.clone(), m, norm))[0];
    assert!((run(LossAgg::TokenMean) - 7.0 / 3.0).abs() < 1e-6);
    assert!((run(LossAgg::SeqMeanTokenMean) - 2.75).abs() < 1e-6);
    assert!((run(LossAgg::SeqMeanTokenSum) - 3.5).abs() < 1e-6);
    assert!((run(LossAgg::SeqMeanTokenSumNorm { constant: 3.0 }) - 7.0 / 6.0).abs() < 1e-6);
    // Global normalisers: this micro-batch is half of an optimizer step of 6 tokens.
    let global = norm.merge(norm);
    let x = vals(aggregate(loss, mask, LossAgg::TokenMean, global))[0];
    assert!((x - 7.0 / 6.0).abs() < 1e-6);
}

#[test]
fn kl_estimators() {
    // log π − log π_ref = 0.5: k1 0.5, k2 0.125, k3 = e^−0.5 + 0.5 − 1, abs 0.5.
    let lp = full2(1, 1, -1.0);
    let rf = full2(1, 1, -1.5);
    let k = |e| vals(kl_penalty(lp.clone(), rf.clone(), e))[0] as f64;
    assert!((k(KlEstimator::K1) - 0.5).abs() < 1e-6);
    assert!((k(KlEstimator::K2) - 0.125).abs() < 1e-6);
    let k3 = (-0.5f64).exp() - 0.5;
    assert!((k(KlEstimator::K3) - k3).abs() < 1e-6);
    assert!((k(KlEstimator::Abs) - 0.5).abs() < 1e-6);
    assert!((k(KlEstimator::K3StraightThrough) - k3).abs() < 1e-6);
    assert!((k(KlEstimator::K1StraightThrough) - 0.5).abs() < 1e-6);
    // Straight-through gradients are those of k2: d/dlogπ ½x² = x = 0.5 (k3's would be 1 − e^−x).
    let d = dev().autodiff();
    for (est, g) in [
        (KlEstimator::K3StraightThrough, 0.5),
        (KlEstimator::K1StraightThrough, 0.5),
        (KlEstimator::K3, 1.0 - (-0.5f64).exp()),
        (KlEstimator::K1, 1.0),
    ] {
        let x = burn::tensor::Tensor::<2>::full([1, 1], -1.0, &d).require_grad();
        let r = burn::tensor::Tensor::<2>::full([1, 1], -1.5, &d);
        let grads = kl_penalty(x.clone(), r, est).sum().backward();
        let got = vals(x.grad(&grads).expect("grad"))[0] as f64;
        assert!((got - g).abs() < 1e-5, "{est:?}: {got} vs {g}");
    }
    // k3 is clamped to 10 for a huge log-ratio.
    let big = vals(kl_penalty(
        full2(1, 1, -30.0),
        full2(1, 1, 0.0),
        KlEstimator::K3,
    ))[0];
    assert_eq!(big, 10.0);
}

#[test]
fn adaptive_kl_controller() {
    // e = clip(12/6 − 1, −0.2, 0.2) = 0.2; β = 0.1·(1 + 0.2·100/10000) = 0.1002.
    let mut c = KlController::new(KlControl::Adaptive {
        init_coef: 0.1,
        target: 6.0,
        horizon: 10000.0,
    })
    .unwrap();
    c.update(12.0, 100);
    assert!((c.coef() - 0.1002).abs() < 1e-7);
    let mut f = KlController::new(KlControl::Fixed { coef: 0.05 }).unwrap();
    f.update(100.0, 100);
    assert_eq!(f.coef(), 0.05);
    assert!(KlController::new(KlControl::Fixed { coef: -1.0 }).is_err());
}

#[test]
fn mismatch_correction_truncate_and_mask() {
    // π_old/μ = 0.6/0.2 = 3 on token 0, 1 on token 1.
    let old = t2(&[&[0.6f32.ln(), -1.0]]);
    let rollout = t2(&[&[0.2f32.ln(), -1.0]]);
    let mask = full2(1, 2, 1.0);
    let tis = MismatchCorrection {
        level: IsLevel::Token,
        mode: IsMode::Truncate,
        cap: 2.0,
    };
    let w = tis
        .weights(old.clone(), rollout.clone(), mask.clone())
        .unwrap();
    assert_close(&vals(w.weights), &[2.0, 1.0], 1e-5);
    let m = w.metrics.to_host();
    assert!((m["mismatch/is_ratio_max"] - 3.0).abs() < 1e-4);
    // ESS = (2 + 1)² / (2·(4 + 1)) = 0.9.
    assert!((m["mismatch/ess"] - 0.9).abs() < 1e-5);
    // Sequence level: ρ = 3·1 = 3 for both tokens → 2.
    let seq = MismatchCorrection {
        level: IsLevel::Sequence,
        ..tis
    };
    assert_close(
        &vals(
            seq.weights(old.clone(), rollout.clone(), mask.clone())
                .unwrap()
                .weights,
        ),
        &[2.0, 2.0],
        1e-5,
    );
    // Geometric: exp(ln 3 / 2) = √3 ≈ 1.732 < 2.
    let geo = MismatchCorrection {
        level: IsLevel::Geometric,
        ..tis
    };
    let r3 = 3f64.sqrt();
    assert_close(
        &vals(
            geo.weights(old.clone(), rollout.clone(), mask.clone())
                .unwrap()
                .weights,
        ),
        &[r3, r3],
        1e-5,
    );
    // Mask mode drops the token outside [1/2, 2].
    let mis = MismatchCorrection {
        mode: IsMode::Mask,
        ..tis
    };
    let w = mis.weights(old, rollout, mask).unwrap();
    assert_close(&vals(w.mask), &[0.0, 1.0], 0.0);
    assert!((w.metrics.to_host()["mismatch/masked_frac"] - 0.5).abs() < 1e-6);
    assert!(MismatchCorrection { cap: 0.5, ..tis }.validate().is_err());
}

/// TOPR weighs negatives by π/μ against the sampler's log-probs (Le Roux et al. 2025, eq. 9),
/// not against π_old, and leaves positives at 1 however far π is from μ; a mismatch weight on
/// top is refused. Two tokens, log π = [ln 1.5 − 1, ln 0.5 − 1], π_old = e⁻¹ (ratio 1.5, 0.5),
/// μ = [log π − ln 3, log π + ln 4] (π/μ = 3, 0.25), A = [1, −1], token sum:
/// L = −1·1·log π₀ + min(0.25, 1)·log π₁.
#[test]
fn topr_tapers_negatives_against_the_sampler() {
    let ln = |x: f32| x.ln();
    let (l0, l1) = (ln(1.5) - 1.0, ln(0.5) - 1.0);
    let policy = loss_input(&[l0, l1], &[-1.0, -1.0], &[1.0, -1.0]);
    let norm = AggNorm::of_mask(&policy.mask);
    let cfg = ActorLossConfig {
        policy: PolicyLossKind::Topr {
            level: RatioLevel::Token,
        },
        agg: LossAgg::SeqMeanTokenSum,
        ..ActorLossConfig::default()
    };
    let input = ActorInput {
        policy,
        entropy: None,
        rollout_log_probs: Some(t2(&[&[l0 - ln(3.0), l1 + ln(4.0)]])),
        kl: None,
    };
    let (loss, m) = actor_loss(&cfg, &input, norm).unwrap();
    let want = -f64::from(l0) + 0.25 * f64::from(l1);
    assert!((f64::from(vals(loss)[0]) - want).abs() < 1e-5, "{want}");
    let m = m.to_host();
    // The ratio's spread is against μ: [3, 0.25]; one step of two was tapered.
    assert!((m["actor/ratio_max"] - 3.0).abs() < 1e-4, "{m:?}");
    assert!((m["actor/ratio_min"] - 0.25).abs() < 1e-5, "{m:?}");
    assert!((m["actor/ratio_mean"] - 1.625).abs() < 1e-4, "{m:?}");
    assert!((m["actor/ratio_std"] - 1.375).abs() < 1e-4, "{m:?}");
    assert!((m["actor/topr_tapered_frac"] - 0.5).abs() < 1e-6, "{m:?}");
    // Without the sampler's log-probs TOPR reads π_old: π/π_old = 0.5 for the negative.
    let plain = ActorInput {
        rollout_log_probs: None,
        ..input.clone()
    };
    let (loss, _) = actor_loss(&cfg, &plain, norm).unwrap();
    let want = -f64::from(l0) + 0.5 * f64::from(l1);
    assert!((f64::from(vals(loss)[0]) - want).abs() < 1e-5, "{want}");
    let with_tis = ActorLossConfig {
        mismatch: Some(MismatchCorrection::default()),
        ..cfg
    };
    let e = actor_loss(&with_tis, &input, norm).unwrap_err().to_string();
    assert!(e.contains("loss.mismatch"), "{e}");
}

#[test]
fn actor_loss_composes_terms() {
    // Vanilla PG, token-mean over 2 tokens, KL k1 β = 0.5, entropy bonus 0.1:
    // pg = mean(−A·log π) = (1 + −2)/2 = −0.5; kl = mean(log π − ref) = (0.5 + −1)/2 = −0.25;
    // H = mean([1, 3]) = 2 → loss = −0.5 + 0.5·(−0.25) − 0.1·2 = −0.825.
    let mut policy = loss_input(&[-0.5, -2.0], &[-1.0, -1.0], &[2.0, -1.0]);
    policy.ref_log_probs = Some(t2(&[&[-1.0, -1.0]]));
    let norm = AggNorm::of_mask(&policy.mask);
    let cfg = ActorLossConfig {
        policy: PolicyLossKind::Vanilla,
        kl: Some(KlLoss {
            estimator: KlEstimator::K1,
            coef: 0.5,
        }),
        entropy_coef: 0.1,
        ..ActorLossConfig::default()
    };
    let input = ActorInput {
        policy,
        entropy: Some(t2(&[&[1.0, 3.0]])),
        rollout_log_probs: None,
        kl: None,
    };
    let (loss, metrics) = actor_loss(&cfg, &input, norm).unwrap();
    assert!((vals(loss)[0] + 0.825).abs() < 1e-6);
    let m = metrics.to_host();
    assert!((m["actor/pg_loss"] + 0.5).abs() < 1e-6 && (m["actor/entropy"] - 2.0).abs() < 1e-6);
    // Entropy bonus without entropy is an error.
    let input = ActorInput {
        entropy: None,
        ..input
    };
    assert!(
        actor_loss(&cfg, &input, norm)
            .unwrap_err()
            .to_string()
            .contains("entropy")
    );
}

// ---------------------------------------------------------------- filters and scans

#[test]
fn overlong_penalty_and_truncation_mask() {
    // L_max 10, L_cache 4: |y| = 5 → 0; 8 → (6 − 8)/4 = −0.5; 12 → −1.
    let p = OverlongPenalty {
        max_len: 10.0,
        cache_len: 4.0,
        factor: 1.0,
    };
    assert_close(
        &vals(p.penalty(t1(&[5.0, 8.0, 12.0]))),
        &[0.0, -0.5, -1.0],
        1e-6,
    );
    let mut b = batch(full2(2, 2, 1.0), &[1.0, 1.0], &[0, 0]);
    let flags = burn::tensor::Tensor::<1>::from_floats([0.0, 1.0], &dev()).greater_elem(0.5);
    b = b.with_truncated(flags).unwrap();
    let n = mask_truncated(&mut b);
    assert_eq!(vals(n), vec![1.0]);
    assert_close(&vals(b.mask), &[1.0, 1.0, 0.0, 0.0], 0.0);
}

#[test]
fn dynamic_sampling_drops_zero_variance_groups() {
    let b = batch(
        full2(6, 1, 1.0),
        &[1.0, 0.0, 1.0, 1.0, 0.5, f32::NAN],
        &[0, 0, 1, 1, 2, 2],
    );
    let (kept, dropped) = dynamic_sampling_keep(&b);
    // Group 1 all equal; group 2 has one valid sample: both dropped.
    assert_eq!(kept, vec![0, 1]);
    assert_eq!(dropped, 2);
    let sub = b.select(&kept).unwrap();
    assert_eq!(sub.dims(), [2, 1]);
    assert_close(&adv(AdvantageKind::Rloo, &sub), &[1.0, -1.0], 1e-6);
    assert!(b.select(&[]).is_err());
    assert!(b.select(&[9]).is_err());
}

#[test]
fn discounted_suffix_sum_matches_a_loop() {
    let mut rng = SplitMix64(7);
    for (steps, gamma) in [(1usize, 0.9f64), (2, 1.0), (37, 0.9), (64, 0.99), (5, 0.0)] {
        let x = rng.vec(3 * steps, -1.0, 1.0);
        let got = vals(ember_engine::discounted_suffix_sum(
            from_f64(&x, 3, steps),
            gamma as f32,
        ));
        let mut want = vec![0.0; 3 * steps];
        for r in 0..3 {
            let mut acc = 0.0;
            for t in (0..steps).rev() {
                acc = x[r * steps + t] + gamma * acc;
                want[r * steps + t] = acc;
            }
        }
        assert_close(&got, &want, 1e-4);
    }
}

#[test]
fn lgamma_matches_reference_values() {
    // ln Γ at 1, 1.5, 2.354166…, 4.1666…, 10 (Python math.lgamma).
    let x = t1(&[1.0, 1.5, 2.354_166_7, 4.166_666_5, 10.0]);
    let want = [
        0.0,
        -0.120_782_237_635_245_4,
        0.187_480_020_115_808_7,
        2.004_993_826_792_101,
        12.801_827_480_081_467,
    ];
    assert_close(&vals(ember_engine::lgamma(x)), &want, 2e-5);
}

#[test]
fn configs_parse_from_toml() {
    #[derive(serde::Deserialize)]
    struct R {
        advantage: AdvantageConfig,
        actor: ActorLossConfig,
    }
    let r: R = toml::from_str(
        r#"
        [advantage]
        kind = "grpo"
        epsilon = 1e-4
        capo_positive_steps = 3
        [actor]
        policy = { kind = "ppo", clip_high = 0.28, dual_clip = 3.0 }
        agg = { mode = "seq-mean-token-sum-norm", constant = 512.0 }
        kl = { estimator = "k3" }
        "#,
    )
    .unwrap();
    assert_eq!(
        r.advantage.kind,
        AdvantageKind::Grpo {
            std: StdKind::Unbiased,
            epsilon: 1e-4,
            scale_by_std: true
        }
    );
    assert_eq!(r.advantage.capo_positive_steps, 3);
    assert_eq!(
        r.actor.policy,
        PolicyLossKind::Ppo {
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: Some(3.0)
        }
    );
    let bad = toml::from_str::<AdvantageConfig>("kind = \"grpo\"\nepsilom = 1.0");
    assert!(bad.is_err());
}

/// verl's `compute_gae_advantage_return` loop, transcribed in f64 for one row: masked steps carry
/// the next value and the running advantage (observation tokens inside a multi-turn episode).
fn verl_gae_row(r: &[f64], v: &[f64], m: &[f64], gamma: f64, lambda: f64) -> Vec<f64> {
    let (mut next_v, mut last) = (0.0, 0.0);
    let mut out = vec![0.0; r.len()];
    for t in (0..r.len()).rev() {
        let delta = r[t] + gamma * next_v - v[t];
        let l = delta + gamma * lambda * last;
        next_v = v[t] * m[t] + (1.0 - m[t]) * next_v;
        last = l * m[t] + (1.0 - m[t]) * last;
        out[t] = last;
    }
    out
}

/// Masks with holes (multi-turn: observation tokens inside a trajectory). GAE skips them as verl
/// does. By hand, mask [1, 0, 1, 0], V = [0.5, 0.7, 0.2, 9], R = 1 on step 2:
/// γ = λ = 1: δ_2 = 1 − 0.2 = 0.8, A_2 = 0.8; step 1 is skipped (V_next of step 0 is V_2);
/// δ_0 = 0.2 − 0.5 = −0.3, A_0 = −0.3 + 0.8 = 0.5 (discounting straight through the hole with
/// V = 0 there gave −0.2). γ = 0.9, λ = 0.8: δ_0 = 0.9·0.2 − 0.5 = −0.32, A_0 = −0.32 + 0.72·0.8
/// = 0.256. The f64 transcription of verl's loop agrees on a longer random row with two holes.
#[test]
fn gae_skips_holes_in_the_mask_as_verl_does() {
    let mask = t2(&[&[1.0, 0.0, 1.0, 0.0]]);
    let values = t2(&[&[0.5, 0.7, 0.2, 9.0]]);
    for (gamma, lambda, a0) in [(1.0, 1.0, 0.5), (0.9, 0.8, 0.256)] {
        let b = batch(mask.clone(), &[1.0], &[0])
            .with_values(values.clone())
            .unwrap();
        let kind = AdvantageKind::Gae {
            gamma,
            lambda,
            whiten: false,
        };
        let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
        assert_close(&vals(out.advantages.clone()), &[a0, 0.0, 0.8, 0.0], 1e-6);
        assert_close(&vals(out.returns), &[a0 + 0.5, 0.0, 1.0, 0.0], 1e-6);
        assert_close(
            &vals(out.advantages),
            &verl_gae_row(
                &[0.0, 0.0, 1.0, 0.0],
                &[0.5, 0.7, 0.2, 9.0],
                &[1.0, 0.0, 1.0, 0.0],
                gamma.into(),
                lambda.into(),
            )
            .iter()
            .zip([1.0, 0.0, 1.0, 0.0])
            .map(|(a, m)| a * m)
            .collect::<Vec<_>>(),
            1e-6,
        );
    }
    // A longer row: holes of two and three steps, trailing padding, per-step rewards.
    let m = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
    let v = [
        0.3, -0.2, 0.9, 0.4, 0.1, 0.6, -0.7, 0.2, 0.5, 0.25, 3.0, 3.0,
    ];
    let tr = [0.0, 0.1, 0.0, 0.0, -0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let (gamma, lambda) = (0.95f32, 0.9f32);
    let b = batch(t2(&[&m.map(|x| x as f32)]), &[0.75], &[0])
        .with_values(t2(&[&v.map(|x| x as f32)]))
        .unwrap()
        .with_token_rewards(t2(&[&tr.map(|x| x as f32)]))
        .unwrap();
    let kind = AdvantageKind::Gae {
        gamma,
        lambda,
        whiten: false,
    };
    let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
    let mut r = tr;
    r[9] += 0.75; // the outcome on the last valid step
    let want: Vec<f64> = verl_gae_row(&r, &v, &m, gamma.into(), lambda.into())
        .iter()
        .zip(m)
        .map(|(a, m)| a * m)
        .collect();
    assert_close(&vals(out.advantages), &want, 1e-5);
}

/// REINFORCE++ over a mask with a hole, γ = 0.5, R = 1 on the last valid step (3): the return
/// is carried across the hole and γ counts valid steps: G = [0.25, ·, 0.5, 1, ·] (verl's loop
/// resets at the hole and would give G_0 = 0; discounting through it would give 0.125).
#[test]
fn reinforce_plus_plus_carries_returns_across_holes() {
    let b = batch(t2(&[&[1.0, 0.0, 1.0, 1.0, 0.0]]), &[1.0], &[0]);
    let kind = AdvantageKind::ReinforcePlusPlus {
        gamma: 0.5,
        kl_coef: 0.0,
        whiten: true,
    };
    let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
    assert_close(&vals(out.returns), &[0.25, 0.0, 0.5, 1.0, 0.0], 1e-6);
}

/// Per-step rewards reach every estimator, as `RolloutBatch::with_token_rewards` promises: the
/// outcome-level ones use R + Σ_t r_t (verl's `token_level_rewards.sum(-1)`). One group,
/// R = [1, 1, 0, 0], a per-step reward 0.5 on sample 0: sequence rewards [1.5, 1, 0, 0].
/// RLOO: A_i = R_i − mean of the others = [1.5 − 1/3, 1 − 1.5/3, −2.5/3, −2.5/3]. GRPO: mean
/// 0.625, unbiased std 0.75, A = (R − 0.625)/0.75 (ε = 1e-6). Dr.GRPO: R − 0.625.
#[test]
fn token_rewards_reach_the_outcome_estimators() {
    let mask = full2(4, 3, 1.0);
    let tr = t2(&[
        &[0.5, 0.0, 0.0],
        &[0.0, 0.0, 0.0],
        &[0.0, 0.0, 0.0],
        &[0.0, 0.0, 0.0],
    ]);
    let b = batch(mask, &[1.0, 1.0, 0.0, 0.0], &[0, 0, 0, 0])
        .with_token_rewards(tr)
        .unwrap();
    let first = |kind| -> Vec<f32> {
        let out = compute_advantages(&AdvantageConfig::new(kind), &b, 0).unwrap();
        vals(out.advantages).chunks(3).map(|r| r[0]).collect()
    };
    let third = 1.0 / 3.0;
    assert_close(
        &first(AdvantageKind::Rloo),
        &[1.5 - third, 1.0 - 0.5, -2.5 * third, -2.5 * third],
        1e-6,
    );
    let g = |r: f64| (r - 0.625) / (0.75 + 1e-6);
    assert_close(
        &first(AdvantageKind::Grpo {
            std: StdKind::Unbiased,
            epsilon: 1e-6,
            scale_by_std: true,
        }),
        &[g(1.5), g(1.0), g(0.0), g(0.0)],
        1e-5,
    );
    assert_close(
        &first(AdvantageKind::DrGrpo),
        &[0.875, 0.375, -0.625, -0.625],
        1e-6,
    );
}

/// ReMax with per-step rewards, as verl's `compute_remax_outcome_advantage`: each step's
/// reward-to-go (outcome on the last valid step) minus the greedy baseline, and the
/// reward-to-go as the returns. Row 0: r = [0.5, 0, 0.25 + 1], to-go [1.75, 1.25, 1.25], minus
/// 0.5. Row 1 (last step masked): r = [0, 1 + 0], to-go [1, 1, ·], minus 0.25.
#[test]
fn remax_gives_each_step_its_reward_to_go() {
    let mask = t2(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
    let tr = t2(&[&[0.5, 0.0, 0.25], &[0.0, 1.0, 0.0]]);
    let b = batch(mask, &[1.0, 0.0], &[0, 1])
        .with_token_rewards(tr)
        .unwrap()
        .with_baseline_rewards(t1(&[0.5, 0.25]))
        .unwrap();
    let out = compute_advantages(&AdvantageConfig::new(AdvantageKind::Remax), &b, 0).unwrap();
    assert_close(
        &vals(out.advantages),
        &[1.25, 0.75, 0.75, 0.75, 0.75, 0.0],
        1e-6,
    );
    assert_close(&vals(out.returns), &[1.75, 1.25, 1.25, 1.0, 1.0, 0.0], 1e-6);
}

/// verl-style transcription of KernelGYM's `compute_multi_turn_rloo_outcome_advantage` in f64
/// over per-turn scores: returns over turns, then leave-one-out among the episodes of the same
/// prompt that reached the same turn.
fn trloo_reference(scores: &[Vec<f64>], groups: &[usize], gamma: f64) -> Vec<Vec<f64>> {
    let g: Vec<Vec<f64>> = scores
        .iter()
        .map(|s| {
            let mut out = vec![0.0; s.len()];
            let mut run = 0.0;
            for k in (0..s.len()).rev() {
                run = s[k] + gamma * run;
                out[k] = run;
            }
            out
        })
        .collect();
    g.iter()
        .enumerate()
        .map(|(i, gi)| {
            gi.iter()
                .enumerate()
                .map(|(k, x)| {
                    let peers: Vec<f64> = (0..g.len())
                        .filter(|&j| groups[j] == groups[i] && g[j].len() > k)
                        .map(|j| g[j][k])
                        .collect();
                    let n = peers.len() as f64;
                    if n > 1.0 {
                        x * n / (n - 1.0) - peers.iter().sum::<f64>() / n * n / (n - 1.0)
                    } else {
                        *x
                    }
                })
                .collect()
        })
        .collect()
}

/// The three episodes of one prompt of the TRLOO tests below: the mask (turns of 2 policy steps,
/// observations as holes), the turn of each step and the turn rewards on each turn's last step.
type Rows = [[f32; 8]; 3];
fn trloo_episodes() -> (Rows, Rows, Rows) {
    let m: Rows = [
        [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0],
        [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ];
    let turns: Rows = [
        [0.0, 0.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0],
        [0.0, 0.0, -1.0, 1.0, 1.0, -1.0, 2.0, 2.0],
        [0.0, 0.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0],
    ];
    let tr: Rows = [
        [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        [0.0; 8],
    ];
    (m, turns, tr)
}

/// The mask of [`trloo_episodes`] as a tensor, and their batch (one group, turn rewards, turn
/// ids) with TRLOO's advantages (γ = 1) on it after `extra` (the batch as it is, or narrowed).
fn trloo_advantages(extra: impl FnOnce(RolloutBatch) -> RolloutBatch) -> (Rows, Advantages) {
    let (m, turns, tr) = trloo_episodes();
    let rows = |x: &Rows| t2(&[&x[0], &x[1], &x[2]]);
    let b = batch(rows(&m), &[0.0, 0.0, 0.0], &[0, 0, 0])
        .with_token_rewards(rows(&tr))
        .unwrap()
        .with_turns(rows(&turns))
        .unwrap();
    let kind = AdvantageKind::Trloo { gamma: 1.0 };
    let out = compute_advantages(&AdvantageConfig::new(kind), &extra(b), 0).unwrap();
    (m, out)
}

/// TRLOO's advantages of [`trloo_episodes`] by hand (the reasoning above
/// `trloo_by_hand_and_against_the_reference`).
const TRLOO_BY_HAND: [f64; 24] = [
    0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, //
    0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, //
    -1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
];

/// An update mask (KernelGYM's profiling-based rejection) narrows the loss, not the baselines:
/// the first case of the TRLOO test above with ep1's turn 1 rejected gives the same advantages
/// elsewhere (ep0's turn 1 is still left out against ep1's G = 1: A = 0) and drops the rejected
/// steps from the advantages and the mask.
#[test]
fn an_update_mask_keeps_the_baselines() {
    let mut keep = [[1.0f32; 8]; 3];
    keep[1][3] = 0.0;
    keep[1][4] = 0.0;
    let narrow = |b: RolloutBatch| {
        b.with_update_mask(t2(&[&keep[0], &keep[1], &keep[2]]))
            .unwrap()
    };
    let (m, out) = trloo_advantages(narrow);
    assert_close(&vals(out.advantages), &TRLOO_BY_HAND, 1e-6);
    let mask = vals(out.mask);
    assert_eq!(&mask[8..16], &[1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
    assert_eq!(&mask[0..8], &m[0]);
    let err =
        batch(t2(&[&m[0], &m[1], &m[2]]), &[0.0; 3], &[0, 0, 0]).with_update_mask(full2(3, 2, 1.0));
    assert!(err.is_err());
}

/// TRLOO by hand and against the reference transcription. One prompt, three episodes laid out
/// as Ember does (turns of 2 policy steps, observations as holes), per-turn rewards on each
/// turn's last step, γ = 1:
/// ep0: turns rewarded [0, 1] → G = [1, 1]; ep1: [0, 0, 1] → G = [1, 1, 1]; ep2: [0] → G = [0].
/// Turn 0 (n = 3): A = G − mean of the other two: ep0 1 − 0.5 = 0.5, ep1 0.5, ep2 0 − 1 = −1.
/// Turn 1 (n = 2, ep0 and ep1): 1 − 1 = 0 each. Turn 2 (n = 1, ep1 alone): A = G = 1.
#[test]
fn trloo_by_hand_and_against_the_reference() {
    let (_, out) = trloo_advantages(|b| b);
    assert_close(&vals(out.advantages), &TRLOO_BY_HAND, 1e-6);
    // Two prompts, uneven turn counts, γ = 0.9, rewards on every turn: the reference agrees.
    let scores = vec![
        vec![0.2, -0.1, 1.0],
        vec![0.0, 0.5],
        vec![0.3],
        vec![1.0, 0.0, 0.0, 0.25],
        vec![-0.5, 0.75],
    ];
    let groups = [0usize, 0, 0, 1, 1];
    let want = trloo_reference(&scores, &groups, 0.9);
    // Layout: each turn one policy step followed by one observation step.
    let width = 8;
    let (mut mask, mut turn, mut rew) = (vec![], vec![], vec![]);
    for s in &scores {
        let (mut mr, mut tr_, mut rr) = (
            vec![0.0f32; width],
            vec![-1.0f32; width],
            vec![0.0f32; width],
        );
        for (k, x) in s.iter().enumerate() {
            mr[2 * k] = 1.0;
            tr_[2 * k] = k as f32;
            rr[2 * k] = *x as f32;
        }
        mask.push(mr);
        turn.push(tr_);
        rew.push(rr);
    }
    let to2 = |v: &[Vec<f32>]| t2(&v.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let b = batch(to2(&mask), &[0.0; 5], &groups)
        .with_token_rewards(to2(&rew))
        .unwrap()
        .with_turns(to2(&turn))
        .unwrap();
    let out = compute_advantages(
        &AdvantageConfig::new(AdvantageKind::Trloo { gamma: 0.9 }),
        &b,
        0,
    )
    .unwrap();
    let got = vals(out.advantages);
    for (i, w) in want.iter().enumerate() {
        for (k, x) in w.iter().enumerate() {
            let g = got[i * width + 2 * k];
            assert!(
                (f64::from(g) - x).abs() < 1e-5,
                "episode {i} turn {k}: {g} vs {x}"
            );
        }
    }
    // Without turns it is a named error.
    let b = batch(full2(2, 2, 1.0), &[1.0, 0.0], &[0, 0]);
    let err = compute_advantages(
        &AdvantageConfig::new(AdvantageKind::Trloo { gamma: 1.0 }),
        &b,
        0,
    )
    .unwrap_err();
    assert_eq!(
        err,
        EngineError::MissingInput {
            what: "trloo",
            input: "turn_ids"
        }
    );
}

/// SeeUPO's advantage (preset `seeupo`: Dr.GRPO, then sequence-level batch whitening, then
/// clamp ±3; AgentEvolver `compute_grpo_outcome_advantage_local` with `special_norm`).
#[test]
fn seeupo_row_whitening_and_clamp() {
    let parts = Preset::Seeupo.parts(8);
    assert!(parts.advantage.whiten_rows && parts.turn_updates.is_some());
    let seeupo = |b: &RolloutBatch| {
        vals(
            compute_advantages(&parts.advantage, b, 0)
                .unwrap()
                .advantages,
        )
    };
    // Groups {1, 0} and {1, 1}: Dr.GRPO [0.5, −0.5, 0, 0]; over the 4 rows mean 0, unbiased
    // std = sqrt(0.5/3) = 0.408248 → [1.224745, −1.224745, 0, 0]. Two steps per row: each
    // step carries its row's value (the whitening is per row, not per token).
    let b = batch(full2(4, 2, 1.0), &[1.0, 0.0, 1.0, 1.0], &[0, 0, 1, 1]);
    let w = 0.5 / (0.5f64 / 3.0).sqrt();
    assert_close(&seeupo(&b), &[w, w, -w, -w, 0., 0., 0., 0.], 1e-5);
    // An invalid (NaN) row is out of the statistics and gets 0: the same values for the rest.
    let b = batch(
        full2(5, 1, 1.0),
        &[1.0, 0.0, 1.0, 1.0, f32::NAN],
        &[0, 0, 1, 1, 1],
    );
    assert_close(&seeupo(&b), &[w, -w, 0., 0., 0.], 1e-5);
    // 20 rows: {1, 0} and nine zero-range pairs: std = sqrt(0.5/19) = 0.162221, 0.5/std =
    // 3.0822 → clamped to ±3.
    let mut r = vec![0.0f32; 20];
    r[0] = 1.0;
    let groups: Vec<usize> = (0..20).map(|i| i / 2).collect();
    let a = seeupo(&batch(full2(20, 1, 1.0), &r, &groups));
    assert!(
        (a[0] - 3.0).abs() < 1e-6 && (a[1] + 3.0).abs() < 1e-6,
        "{a:?}"
    );
    assert!(a[2..].iter().all(|x| *x == 0.0));
    // All rows equal: std 0 is not divided by; every advantage 0.
    let b = batch(full2(4, 1, 1.0), &[1.0; 4], &[0, 0, 1, 1]);
    assert_close(&seeupo(&b), &[0.0; 4], 0.0);
    // Per-step estimators are refused.
    let bad = AdvantageConfig {
        whiten_rows: true,
        ..AdvantageConfig::new(AdvantageKind::Trloo { gamma: 1.0 })
    };
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("advantage.whiten_rows"), "{e}");
}

fn t2f(v: &[f32], b: usize, t: usize) -> Tensor2 {
    burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(v.to_vec(), [b, t]), &dev())
}

/// SeeUPO's accumulated ratio (`TurnUpdates::accumulate`, AgentEvolver `update_ratios`).
/// Hand-worked ratios: turn 1 of three rows (row 2 never reached it).
/// Row 0: log-ratio steps 0.1, 0.3 → mean 0.2 → e^0.2 = 1.2214 → clip 1.2.
/// Row 1: −0.05 (one step) → e^−0.05 = 0.95123 (inside the band).
/// Row 2: no step in turn 1 → 1.
/// Then with prev = [1.1, 0.7, 1.0]: [1.32 → 1.2, 0.66586 → 0.8, 1.0].
#[test]
fn seeupo_accumulated_ratio_by_hand() {
    let u = TurnUpdates::default();
    let turns = t2f(&[0., 1., 1., -1., 0., 1., 0., 0., 0.], 3, 3);
    let mask = t2f(&[1., 1., 1., 0., 1., 1., 1., 1., 1.], 3, 3);
    let old = t2f(&[-1., -2., -1., 0., -1., -0.5, -1., -1., -1.], 3, 3);
    let new = t2f(&[-9., -1.9, -0.7, 5., 3., -0.55, -2., -2., -2.], 3, 3);
    let m1 = turn_mask(&mask, &turns, 1);
    assert_eq!(vals(m1.clone()), vec![0., 1., 1., 0., 0., 1., 0., 0., 0.]);
    let s = vals(u.accumulate(None, &old, &new, &m1));
    let want = [1.2, (-0.05f32).exp(), 1.0];
    for (a, b) in s.iter().zip(want) {
        assert!((a - b).abs() < 1e-5, "{s:?}");
    }
    let prev = t1(&[1.1, 0.7, 1.0]);
    let m = vals(u.accumulate(Some(prev), &old, &new, &m1));
    for (a, b) in m.iter().zip([1.2, 0.8, 1.0]) {
        assert!((a - b).abs() < 1e-5, "{m:?}");
    }
    assert_eq!(turn_count(&turns), 2);
    assert_eq!(turn_count(&t2f(&[-1., -1.], 1, 2)), 0);
}

/// Reinforce-Ada's `global_stat_est`: GRPO centres (and scales) by the pool's statistics given
/// per row, not the batch group's. Rows [1, 0, 0, 0] of one prompt whose pool of 12 drew 3
/// positives: mean 0.25, unbiased std sqrt(12·0.1875/11) = 0.452267. Without std (the preset):
/// [0.75, −0.25, −0.25, −0.25]; with std: (R − 0.25)/(0.452267 + 1e-6). The batch's own group
/// (mean 0.25, std 0.5) would give 1.5 for the first row.
#[test]
fn grpo_with_pool_statistics() {
    let std = (12.0f64 * 0.1875 / 11.0).sqrt();
    let b = one_group_1000()
        .with_group_stats(t1(&[0.25; 4]), t1(&[std as f32; 4]))
        .unwrap();
    let ada = Preset::ReinforceAda.parts(8);
    assert!(ada.adaptive.is_some());
    let a = vals(
        compute_advantages(&ada.advantage, &b, 0)
            .unwrap()
            .advantages,
    );
    assert_close(&a, &[0.75, -0.25, -0.25, -0.25], 1e-6);
    let s = std + 1e-6;
    assert_close(
        &adv(GRPO, &b),
        &[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s],
        1e-5,
    );
    // A group whose kept rows are all equal still gets the pool's advantage (here all wrong
    // against a pool mean of 0.25), where the batch's own statistics would give 0.
    let b = batch(full2(2, 1, 1.0), &[0.0, 0.0], &[0, 0])
        .with_group_stats(t1(&[0.25; 2]), t1(&[0.5; 2]))
        .unwrap();
    assert_close(
        &vals(
            compute_advantages(&ada.advantage, &b, 0)
                .unwrap()
                .advantages,
        ),
        &[-0.25, -0.25],
        1e-6,
    );
    let e = one_group_1000()
        .with_group_stats(t1(&[0.0; 3]), t1(&[1.0; 4]))
        .unwrap_err();
    assert!(e.to_string().contains("group_stats.mean"), "{e}");
}
