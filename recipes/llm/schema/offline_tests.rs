//! The `[offline]` table's objectives: parsing by kind, and each group objective's loss on
//! hand-worked inputs through the engine.

use super::offline::*;
use ember_engine::PreferenceLoss;
use serde::Deserialize;

/// SFT through the engine, by hand: two responses of 2 and 1 tokens, log π −0.5, −2.0 and
/// −1.0, dataset rewards replaced by 1: A = 1 on every token and the loss is the token-mean
/// NLL (0.5 + 2.0 + 1.0) / 3 = 7/6, whatever the rewards were.
#[test]
fn sft_is_the_token_mean_nll() {
    use burn::tensor::{Device, Tensor, TensorData};
    let dev = Device::default();
    let t = |v: [f32; 4]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [2, 2]), &dev);
    let sft = parse("[objective]\nkind = \"sft\"").unwrap();
    assert!(sft.is_sft());
    let (adv_cfg, loss) = sft.group().unwrap();
    let mask = t([1.0, 1.0, 1.0, 0.0]);
    let rewards = Tensor::<1>::from_floats([1.0, 1.0], &dev);
    let batch = ember_engine::RolloutBatch::new(mask.clone(), rewards, &[0, 0]).unwrap();
    let adv = ember_engine::compute_advantages(&adv_cfg, &batch, 0).unwrap();
    let lp = t([-0.5, -2.0, -1.0, 0.0]);
    let input = ember_engine::ActorInput {
        policy: ember_engine::PolicyLossInput {
            log_probs: lp.clone(),
            old_log_probs: lp,
            advantages: adv.advantages,
            mask: adv.mask.clone(),
            ref_log_probs: None,
        },
        entropy: None,
        rollout_log_probs: None,
        kl: None,
    };
    let norm = ember_engine::AggNorm::of_mask(&adv.mask);
    let (l, _) = ember_engine::actor_loss(&loss, &input, norm).unwrap();
    let l: Vec<f32> = l.into_data().try_to_vec().unwrap();
    assert!((l[0] - 7.0 / 6.0).abs() < 1e-6, "{l:?}");
}

/// The loss of `objective` on three one-token responses of three prompts (one response
/// each, so every baseline is the step's mean), rewards 1, 0, 0, log π −0.5, −1.0, −2.0 and
/// the behaviour policy's log μ −0.7, −1.5, −1.0; sequence sums averaged over responses.
fn one_response_loss(objective: &str) -> f32 {
    use burn::tensor::{Device, Tensor, TensorData};
    let dev = Device::default();
    let col = |v: [f32; 3]| Tensor::<2>::from_data(TensorData::new(v.to_vec(), [3, 1]), &dev);
    let o = parse(&format!("objective = {objective}")).unwrap();
    assert_eq!(o.pool(), Pool::Batch, "{objective}");
    let (adv_cfg, loss) = o.group().unwrap();
    let mask = col([1.0; 3]);
    let rewards = Tensor::<1>::from_floats([1.0, 0.0, 0.0], &dev);
    // One pool: every response in group 0, as the offline step puts them.
    let batch = ember_engine::RolloutBatch::new(mask, rewards, &[0, 0, 0]).unwrap();
    let adv = ember_engine::compute_advantages(&adv_cfg, &batch, 0).unwrap();
    let input = ember_engine::ActorInput {
        policy: ember_engine::PolicyLossInput {
            log_probs: col([-0.5, -1.0, -2.0]),
            old_log_probs: col([-0.7, -1.5, -1.0]),
            advantages: adv.advantages,
            mask: adv.mask.clone(),
            ref_log_probs: None,
        },
        entropy: None,
        rollout_log_probs: None,
        kl: None,
    };
    let norm = ember_engine::AggNorm::of_mask(&adv.mask);
    let (l, _) = ember_engine::actor_loss(&loss, &input, norm).unwrap();
    let l: Vec<f32> = l.into_data().try_to_vec().unwrap();
    l[0]
}

/// By hand, mean reward 1/3:
/// - TOPR (c = the mean): A = 2/3, −1/3, −1/3; the positive keeps α = 1, the negatives
///   α = min(π/μ, 1) = min(e^0.5, 1) = 1 and e^−1: L = [⅓ − ⅓ − e^−1·⅔]/3 = −0.081760;
///   with c = 0 only the positive counts: L = 0.5/3.
/// - AsymRE (δ = −0.1): A = R − 0.2333: L = [0.38333 − 0.23333 − 0.46667]/3 = −0.105556.
/// - OPMD (τ = 1): L = [⅓ − ⅓ − ⅔]/3/2 = −0.111111.
/// - REC one-side: ρ = e^0.2 = 1.2214 > 1.2 masks the positive, ρ = e^−1 < 0.8 the
///   second negative: L = −⅓/3 = −0.111111; two-side keeps only ρ ∈ [0.8, 1.2], none
///   of the three: L = 0.
#[test]
fn off_policy_objectives_on_one_response_per_prompt_by_hand() {
    let e1 = (-1.0f32).exp();
    for (objective, want) in [
        (
            r#"{ kind = "topr" }"#,
            (1.0 / 3.0 - 1.0 / 3.0 - e1 * 2.0 / 3.0) / 3.0,
        ),
        (r#"{ kind = "topr", baseline = "none" }"#, 0.5 / 3.0),
        (r#"{ kind = "asym_re", pool = "batch" }"#, -0.105_555_6),
        (r#"{ kind = "opmd", pool = "batch" }"#, -1.0 / 9.0),
        (r#"{ kind = "rec", pool = "batch" }"#, -1.0 / 9.0),
        (
            r#"{ kind = "rec", pool = "batch", clip = "two_side" }"#,
            0.0,
        ),
    ] {
        let got = one_response_loss(objective);
        assert!((got - want).abs() < 1e-5, "{objective}: {got} vs {want}");
    }
    // Group pools need two responses a prompt; A-LoL and REINFORCE-LOO always do.
    let rec = parse(r#"objective = { kind = "rec" }"#).unwrap();
    assert_eq!(rec.pool(), Pool::Group);
    assert_eq!(rec.name(), "rec");
    let e = parse(r#"objective = { kind = "topr", pool = "batch" }"#).unwrap_err();
    assert!(e.to_string().contains("pool"), "{e}");
}

fn parse(text: &str) -> std::result::Result<Objective, toml::de::Error> {
    #[derive(Deserialize)]
    struct Table {
        objective: Objective,
    }
    toml::from_str::<Table>(text).map(|t| t.objective)
}

/// A pairwise objective is the engine's `PreferenceLoss` with its defaults; the group
/// objectives keep theirs; each side names its own unknown keys, and an unknown kind lists
/// both sides' kinds.
#[test]
fn objectives_parse_by_kind_with_the_engine_defaults() {
    let dpo = parse(r#"objective = { kind = "dpo" }"#).unwrap();
    assert_eq!(dpo, Objective::Pairwise(PreferenceLoss::Dpo { beta: 0.1 }));
    let simpo = parse(r#"objective = { kind = "simpo" }"#).unwrap();
    let want = PreferenceLoss::Simpo {
        beta: 2.0,
        gamma: 1.0,
    };
    assert_eq!(simpo, Objective::Pairwise(want));
    let alol = parse(r#"objective = { kind = "a_lol" }"#).unwrap();
    assert_eq!(
        alol,
        Objective::Group(GroupObjective::ALol {
            clip: 0.9,
            value: AlolValue::GroupMean
        })
    );
    assert!(alol.is_alol() && alol.pairwise().is_none() && alol.group().is_some());
    let loo = parse(r#"objective = { kind = "reinforce_loo" }"#).unwrap();
    assert_eq!(loo, Objective::Group(GroupObjective::ReinforceLoo));
    let e = parse(r#"objective = { kind = "dpo", clip = 1.0 }"#).unwrap_err();
    assert!(e.to_string().contains("clip"), "{e}");
    let e = parse(r#"objective = { kind = "ppo" }"#).unwrap_err();
    assert!(
        e.to_string().contains("a_lol") && e.to_string().contains("dpo"),
        "{e}"
    );
    // Written back as the recipe wrote it (the resolved recipe is compared on resume).
    let o = Objective::Pairwise(PreferenceLoss::RpoSq {
        beta: 0.5,
        eta: 2.0,
    });
    let text = toml::to_string(&o).unwrap();
    assert_eq!(text, "kind = \"rpo_sq\"\nbeta = 0.5\neta = 2.0\n");
    assert_eq!(
        parse(&format!(
            "objective = {{ {} }}",
            text.trim().replace('\n', ", ")
        ))
        .unwrap(),
        o
    );
}
