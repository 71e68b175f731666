//! `ember value-mse`: how well each baseline estimates a prompt's value, the measurement of the
//! BASIS paper (Gong et al. 2026, arXiv 2605.27293). For P prompts of the recipe's task, the
//! policy (the recipe's warmed-up tiny model, or a run's checkpoint) samples 8 + M responses
//! each at the rollout temperature. The last M give the Monte-Carlo value V_MC (the mean
//! reward); from the first ones come the estimates, each compared with V_MC by the mean squared
//! error over prompts:
//! - REINFORCE++ (one rollout per prompt): the batch mean of the first responses' rewards;
//! - BASIS (one rollout per prompt): [`basis_values`] on the first responses, at several
//!   bandwidths;
//! - GRPO's group mean of 8 rollouts per prompt.
//!
//! The MSE includes V_MC's own sampling noise, estimated as the mean over prompts of the sample
//! variance of its M rewards divided by M, and reported.

use crate::llm::plop::policy_at_start;
use crate::llm::schema::Recipe;
use crate::llm::setup::rollout_sampling;
use crate::lm::score::{Scorer, completions};
use crate::lm::step::prompt_features;
use anyhow::{Result, bail};
use burn::module::Module;
use burn::tensor::Tensor;
use ember_engine::*;
use ember_llm::{SamplingConfig, generate};
use std::collections::BTreeMap;
use std::path::Path;

/// Responses per prompt of the group-mean estimator.
const GROUP: usize = 8;

/// The options of `ember value-mse`.
pub struct ValueMse<'a> {
    /// Prompts P.
    pub prompts: usize,
    /// Monte-Carlo responses per prompt M.
    pub mc: usize,
    /// A checkpoint to load instead of the warm-up.
    pub checkpoint: Option<&'a Path>,
    /// BASIS bandwidths to report.
    pub bandwidths: Vec<f32>,
}

/// Runs the measurement and returns its report (JSON object).
pub fn value_mse(r: &Recipe, o: &ValueMse) -> Result<serde_json::Value> {
    if o.prompts < 2 || o.prompts > 4096 || o.mc < 2 || o.mc > 1024 {
        bail!("--prompts must be in 2..=4096 and --mc in 2..=1024");
    }
    if o.prompts * (GROUP + o.mc) > 200_000 {
        bail!(
            "--prompts × (8 + --mc) = {} responses in one batch; at most 200000",
            o.prompts * (GROUP + o.mc)
        );
    }
    if let Some(b) = o.bandwidths.iter().find(|b| !(b.is_finite() && **b > 0.0)) {
        bail!("--bandwidths: {b} is not a finite number > 0");
    }
    let base = crate::common::device::device(&r.header.device)?;
    let ad = base.clone().autodiff();
    let task = r.task.build()?;
    let mut rng = SplitMix64(r.header.seed);
    let policy = policy_at_start(r, &task, o.checkpoint, &mut rng, &ad)?;
    let examples = task.train(&mut rng, o.prompts);
    let max_new = r.rollout.max_new_tokens;
    let prompts = examples
        .iter()
        .map(|e| policy.prompt_ids(e, max_new))
        .collect::<Result<Vec<_>>>()?;
    let sampler = policy.model.valid();
    let n = GROUP + o.mc;
    let sc = SamplingConfig {
        n,
        ..rollout_sampling(r, &policy.stop, rng.next_u64())
    };
    let g = generate(&sampler, &prompts, &sc, &base)?;
    let ids = g.response_ids();
    let texts: Vec<String> = ids.iter().map(|x| policy.decode(x)).collect();
    let mut scorer = Scorer::new(&r.reward, &base)?;
    let rewards = scorer.score(
        1,
        &completions(&g, &examples, &ids, &texts),
        &mut BTreeMap::new(),
    )?;
    // Rows are prompt-major: row p·n + k is response k of prompt p.
    let p = o.prompts;
    let at = |i: usize, k: usize| f64::from(rewards[i * n + k]);
    if rewards.iter().any(|x| !x.is_finite()) {
        bail!("the reward gave invalid values; value-mse needs a reward for every response");
    }
    let mc: Vec<f64> = (0..p)
        .map(|i| (GROUP..n).map(|k| at(i, k)).sum::<f64>() / o.mc as f64)
        .collect();
    let first: Vec<f64> = (0..p).map(|i| at(i, 0)).collect();
    let mse = |est: &[f64]| {
        est.iter()
            .zip(&mc)
            .map(|(e, v)| (e - v).powi(2))
            .sum::<f64>()
            / p as f64
    };
    let batch_mean = first.iter().sum::<f64>() / p as f64;
    let group: Vec<f64> = (0..p)
        .map(|i| (0..GROUP).map(|k| at(i, k)).sum::<f64>() / GROUP as f64)
        .collect();
    // V_MC's own variance: each prompt's sample variance over its M responses, divided by M.
    let noise = (0..p)
        .map(|i| {
            let ss: f64 = (GROUP..n).map(|k| (at(i, k) - mc[i]).powi(2)).sum();
            ss / (o.mc as f64 - 1.0) / o.mc as f64
        })
        .sum::<f64>()
        / p as f64;

    // BASIS on the first response of each prompt.
    let rows: Vec<usize> = (0..p).map(|i| i * n).collect();
    let first_g = ember_llm::Generation::stack(vec![(g, rows)], (0..p).collect());
    let features = prompt_features(&sampler, &first_g);
    let r1 = Tensor::<1>::from_floats(
        first
            .iter()
            .map(|x| *x as f32)
            .collect::<Vec<_>>()
            .as_slice(),
        &base,
    );
    let ones = r1.ones_like();
    let mut basis = serde_json::Map::new();
    for &b in &o.bandwidths {
        let v = basis_values(features.clone(), r1.clone(), ones.clone(), b, 1.0);
        let v: Vec<f64> = v
            .try_into_vec_as::<f32>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .into_iter()
            .map(f64::from)
            .collect();
        basis.insert(format!("{b}"), mse(&v).into());
    }
    Ok(serde_json::json!({
        "prompts": p, "mc_samples": o.mc,
        "mean_value": mc.iter().sum::<f64>() / p as f64,
        "mse_reinforce_pp_batch_mean": mse(&vec![batch_mean; p]),
        "mse_basis_by_bandwidth": basis,
        "mse_group_mean_8": mse(&group),
        "mc_noise": noise,
    }))
}
