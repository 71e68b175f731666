//! Multi-turn rollouts (`ember::agent::rollout`): trajectories of the tiny policy against the
//! built-in environments, laid out with holes in the loss mask; the sampler's log-probs equal
//! the trainer's rescoring of the whole trajectory at every policy token; GRPO over whole
//! trajectories (the engine and trainer unchanged) raises the success rate of the guessing game.

mod common;

use burn::module::Module;
use ember::agent::rollout::{Plays, rollout};
use ember::lm::{Policy, Tok};
use ember_engine::SplitMix64;
use ember_engine::{AdvantageConfig, AdvantageKind, RolloutBatch, StdKind};
use ember_llm::SamplingConfig;
use ember_llm::actor::LlmExperience;
use ember_llm::chartok;
use ember_tasks::env::builtin::{Calculator, GuessNumber};
use ember_tasks::env::{Environment, EpisodeSource};

fn tiny_policy(seed: u64, device: &burn::tensor::Device) -> Policy {
    device.seed(seed);
    let config = ember_llm::LlamaConfig::new(
        ember_llm::Family::Llama,
        chartok::vocab_size(),
        32,
        64,
        2,
        4,
        2,
    )
    .with_max_position_embeddings(64);
    Policy {
        model: config.init(device),
        config,
        tok: Tok::Char(ember_llm::chartok::Vocab::Chars),
        stop: vec![chartok::EOS],
        lora: None,
    }
}

/// The largest difference, over the policy's tokens, between the sampler's log-probs and the
/// trainer's rescoring of the whole trajectories.
fn rescoring_gap(policy: &Policy, x: &ember::agent::rollout::TrajectoryTensors) -> f32 {
    let exp = LlmExperience {
        tokens: x.tokens.clone(),
        mask: x.attention.clone(),
        response_len: x.region,
        temperature: 1.0,
        adapters: true,
    };
    let rescored = common::vals(exp.score_all(&policy.model) * x.loss_mask.clone());
    let sampled = common::vals(x.log_probs.clone());
    rescored
        .iter()
        .zip(&sampled)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

fn sampling(seed: u64, max_new: usize) -> SamplingConfig {
    SamplingConfig {
        temperature: 1.0,
        max_new_tokens: max_new,
        n: 1,
        seed,
        stop_tokens: vec![chartok::EOS],
        ..SamplingConfig::default()
    }
}

/// A rollout's layout: the first observation is the prompt; turns and observations alternate
/// in the region; the loss mask is 1 exactly on the turns' tokens; the rescored log-probs of
/// the whole trajectory equal the sampler's at every policy token (< 1e-4).
#[test]
fn trajectories_have_holes_and_rescore_like_the_sampler() {
    let device = common::dev();
    let policy = tiny_policy(3, &device);
    let mut env = Calculator::new(2, 3);
    let seeds = EpisodeSource::train(&mut SplitMix64(1), 6);
    let sc = sampling(9, 6);
    let t = rollout(
        &policy,
        &policy.model,
        &mut env,
        plays(&seeds, 2, 3, &sc),
        &device,
    )
    .unwrap();
    assert_eq!(t.prompts.len(), 12);
    assert_eq!(t.group_ids, (0..12).map(|i| i / 2).collect::<Vec<_>>());
    for i in 0..12 {
        // turns and observations alternate, starting with a turn
        for (k, s) in t.segments[i].iter().enumerate() {
            assert_eq!(s.log_probs.is_some(), k % 2 == 0);
        }
        assert_eq!(t.turn_rewards[i].len(), t.segments[i].len().div_ceil(2));
    }
    let x = t.tensors(&device).unwrap();
    let mask = common::vals(x.loss_mask.clone());
    let r = x.region;
    for i in 0..12 {
        let mut col = 0;
        for s in &t.segments[i] {
            for _ in &s.ids {
                assert_eq!(
                    mask[i * r + col],
                    if s.log_probs.is_some() { 1.0 } else { 0.0 }
                );
                col += 1;
            }
        }
        assert!(mask[i * r + col..(i + 1) * r].iter().all(|m| *m == 0.0));
    }
    let d = rescoring_gap(&policy, &x);
    assert!(d < 1e-4, "rescoring vs sampler {d}");
}

/// A turn the environment rejects (`keep: false`, the kernel gym's profiling-based rejection)
/// stays in the loss mask the estimators read and leaves the update mask; the turns' numbers
/// average over the turns that report them, and the best-of-turns figures take each row's best.
#[test]
fn rejected_turns_leave_the_update_mask() {
    use ember::agent::rollout::{Segment, Trajectories};
    use std::collections::BTreeMap;
    let device = common::dev();
    let turn = |n: usize| Segment {
        ids: vec![5; n],
        log_probs: Some(vec![0.0; n]),
    };
    let obs = Segment {
        ids: vec![6; 2],
        log_probs: None,
    };
    let info = |c: f64| BTreeMap::from([("correct".to_string(), c)]);
    let t = Trajectories {
        prompts: vec![vec![1], vec![1]],
        segments: vec![
            vec![turn(2), obs.clone(), turn(1)],
            vec![turn(1), obs, turn(2)],
        ],
        turn_rewards: vec![vec![0.0, 3.0], vec![2.0, 0.0]],
        turn_kept: vec![vec![true, false], vec![true, true]],
        turn_info: vec![vec![info(0.0), info(1.0)], vec![info(1.0), BTreeMap::new()]],
        group_ids: vec![0, 0],
        texts: vec![vec![], vec![]],
        unfinished: vec![false, false],
        env_seconds: 0.0,
    };
    let x = t.tensors(&device).unwrap();
    assert_eq!(x.region, 5);
    assert_eq!(
        common::vals(x.loss_mask),
        [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    );
    assert_eq!(
        common::vals(x.update_mask.unwrap()),
        [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    );
    let m = t.turn_metrics("rollout/");
    assert!((m["rollout/env/correct"] - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(m["rollout/env/correct_best"], 1.0);
    assert_eq!(m["rollout/best_turn_reward"], 2.5);
    assert_eq!(m["rollout/last_turn_reward"], 1.5);
    assert_eq!(m["rollout/rejected_turns"], 1.0);
    let all_kept = Trajectories {
        turn_kept: vec![vec![true; 2]; 2],
        ..t
    };
    assert!(all_kept.tensors(&device).unwrap().update_mask.is_none());
}

/// The calculator's demonstrations are trajectories like the rollouts: the turns (with their
/// stop token) in the loss, the calculator's answer a hole; a quarter of them call the tool.
#[test]
fn demonstrations_have_the_rollout_layout() {
    let device = common::dev();
    let policy = tiny_policy(3, &device);
    let env = Calculator::new(2, 3);
    let seeds = EpisodeSource::train(&mut SplitMix64(2), 400);
    let t =
        ember::agent::rollout::demonstrations(&policy, &env, &seeds, &mut SplitMix64(4)).unwrap();
    let tool = t.turns().iter().filter(|n| **n == 2).count();
    assert!(
        (70..130).contains(&tool),
        "{tool} of 400 call the calculator"
    );
    for (i, segs) in t.segments.iter().enumerate() {
        let (a, b) = env.problem(seeds[i]);
        let last = segs.last().unwrap();
        assert_eq!(last.ids.last(), Some(&chartok::EOS));
        assert_eq!(policy.decode(&last.ids), (a * b).to_string());
        if segs.len() == 3 {
            assert_eq!(policy.decode(&segs[0].ids), format!("{a}*{b}"));
            assert!(segs[1].log_probs.is_none());
            assert_eq!(policy.decode(&segs[1].ids), format!("={},", a * b));
        }
    }
    let x = t.tensors(&device).unwrap();
    let ids = common::vals(x.turn_ids);
    let mask = common::vals(x.loss_mask);
    assert!(
        ids.iter()
            .zip(&mask)
            .all(|(t, m)| (*t >= 0.0) == (*m == 1.0))
    );
}

/// Trajectory-level GRPO on the guessing game (secrets 0..=3, three guesses): the held-out
/// success rate of a random tiny policy rises by at least 20 points within 40 steps (seeded).
#[test]
fn grpo_over_trajectories_learns_the_guessing_game() {
    let device = common::dev();
    let ad = device.clone().autodiff();
    let mut policy = tiny_policy(5, &ad);
    let mut optim = ember_train::OptimizerConfig::default()
        .with_grad_clip(1.0)
        .init();
    let mut env = GuessNumber::new(3, 3);
    let eval_seeds = EpisodeSource::held_out_set(64);
    let success = |policy: &Policy, env: &mut GuessNumber, seed: u64| -> f64 {
        let sampler = policy.model.valid();
        let t = rollout(
            policy,
            &sampler,
            env,
            plays(&eval_seeds, 1, 3, &sampling(seed, 3)),
            &device,
        )
        .unwrap();
        let r = t.rewards();
        r.iter().map(|x| f64::from(*x)).sum::<f64>() / r.len() as f64
    };
    let before = success(&policy, &mut env, 77);
    let mut rng = SplitMix64(11);
    let adv = AdvantageConfig::new(AdvantageKind::Grpo {
        std: StdKind::Unbiased,
        epsilon: 1e-6,
        scale_by_std: true,
    });
    let upd = ember_train::UpdateConfig::default();
    for step in 0..40 {
        let seeds = EpisodeSource::train(&mut rng, 16);
        let sampler = policy.model.valid();
        let sc = sampling(rng.next_u64(), 3);
        let t = rollout(
            &policy,
            &sampler,
            &mut env,
            plays(&seeds, 8, 3, &sc),
            &device,
        )
        .unwrap();
        let x = t.tensors(&device).unwrap();
        let rewards = t.rewards();
        let batch = RolloutBatch::new(
            x.loss_mask.to_device(&ad),
            burn::tensor::Tensor::from_floats(rewards.as_slice(), &ad),
            &t.group_ids,
        )
        .unwrap()
        .with_rollout_log_probs(x.log_probs.to_device(&ad))
        .unwrap();
        let a = ember_engine::compute_advantages(&adv, &batch, step).unwrap();
        let exp = LlmExperience {
            tokens: x.tokens.to_device(&ad),
            mask: x.attention.to_device(&ad),
            response_len: x.region,
            temperature: 1.0,
            adapters: true,
        };
        let (m, _) = ember_train::update(
            policy.model,
            &mut optim,
            ember_train::UpdateData {
                experience: &exp,
                batch: &batch,
                adv: &a,
            },
            &upd,
            3e-3,
            &mut |n| (0..n).collect(),
        )
        .unwrap();
        policy.model = m;
    }
    let after = success(&policy, &mut env, 77);
    eprintln!("guessing game: held-out success {before:.3} -> {after:.3}");
    assert!(after - before >= 0.2, "{before} -> {after}");
}

/// A pretrained policy's episode is a conversation in its chat template (SmolLM2's ChatML, its
/// default system message included): the first prompt, a turn that ends with the stop token and
/// the observation appended after it are exactly the ids of the template's rendering of the
/// whole conversation; a turn cut off before its stop token gets the end-of-message token from
/// the observation. Then a rollout of the guessing game: the sampler's log-probs equal the
/// rescoring of the whole conversations.
#[test]
fn chat_template_episodes_are_conversations() {
    let Some(path) = common::assets::smollm2() else {
        return;
    };
    let device = common::dev();
    let spec: ember::lm::PretrainedSpec =
        toml::from_str(&format!("path = {:?}", path.display().to_string())).unwrap();
    let policy = ember::lm::policy_from_specs(None, Some(&spec), 0, &device, None).unwrap();
    let Tok::Real { tok, .. } = &policy.tok else {
        panic!("a real tokenizer")
    };
    let end = tok.encode("<|im_end|>").unwrap();
    assert_eq!(end.len(), 1);
    assert!(policy.stop.contains(&end[0]));
    let q = Calculator::new(2, 3)
        .with_instructions(true)
        .reset(&[ember_tasks::env::Episode { id: 0, seed: 5 }])
        .unwrap()
        .remove(0);
    assert!(q.starts_with("What is ") && q.contains("<calc>"), "{q}");
    let (call, result) = ("<calc>12*34</calc>", "<result>408</result>");
    let mut turn = tok.encode(call).unwrap();
    turn.push(end[0]);
    let whole = [
        policy.first_prompt(&q).unwrap(),
        turn.clone(),
        policy.observation_after(&turn, result).unwrap(),
    ]
    .concat();
    let msgs = [
        ember_llm::Message::new("user", &q),
        ember_llm::Message::new("assistant", call),
        ember_llm::Message::new("user", result),
    ];
    let want = tok
        .encode(&tok.apply_chat_template(&msgs, true).unwrap())
        .unwrap();
    assert_eq!(whole, want);
    let cut = tok.encode("<calc>12*").unwrap();
    assert_eq!(policy.observation_after(&cut, result).unwrap()[0], end[0]);

    // The guessing game answers every wrong turn, so most episodes take both turns.
    let mut env = GuessNumber::new(7, 2);
    let seeds = EpisodeSource::train(&mut SplitMix64(4), 2);
    let sc = SamplingConfig {
        stop_tokens: policy.stop.clone(),
        ..sampling(2, 8)
    };
    let t = rollout(
        &policy,
        &policy.model,
        &mut env,
        plays(&seeds, 2, 2, &sc),
        &device,
    )
    .unwrap();
    let d = rescoring_gap(&policy, &t.tensors(&device).unwrap());
    assert!(d < 2e-3, "rescoring vs sampler {d}");
    assert!(
        t.segments.iter().any(|s| s.len() > 1),
        "some episode took a second turn"
    );
}

/// The episodes of a rollout: `samples` per seed, at most `max_turns` turns, sampled by `sc`.
fn plays<'a>(
    seeds: &'a [u64],
    samples: usize,
    max_turns: usize,
    sc: &'a SamplingConfig,
) -> Plays<'a> {
    Plays {
        seeds,
        samples,
        max_turns,
        sc,
    }
}
