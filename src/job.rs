//! The main job: a tiny Llama-architecture policy warmed up by supervised steps on generated
//! demonstrations, then trained by RL on verifiable arithmetic, evaluated on a held-out split.

use crate::chartok;
use crate::engine::*;
use crate::recipe::Recipe;
use crate::reward::exact_match;
use crate::tasks::{Example, Rng};
use anyhow::{Context, Result};
use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::actor::LlmExperience;
use ember_llm::{Family, Llama, LlamaConfig, SamplingConfig, generate};
use ember_train::{LrSchedule, UpdateConfig, update};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a run reports at the end.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Held-out accuracy after the warm-up.
    pub accuracy_before: f64,
    /// Held-out accuracy after RL.
    pub accuracy_after: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The run directory.
    pub out: PathBuf,
}

fn model_config(r: &Recipe) -> LlamaConfig {
    let m = &r.model;
    LlamaConfig::new(
        Family::Llama,
        chartok::vocab_size(),
        m.d_model,
        m.d_ff,
        m.layers,
        m.heads,
        m.kv_heads,
    )
    .with_max_position_embeddings(64)
    .with_rms_norm_eps(1e-5)
}

fn prompt_ids(e: &Example) -> Result<Vec<u32>> {
    let mut ids = vec![chartok::BOS];
    ids.extend(chartok::encode(&e.prompt).map_err(anyhow::Error::msg)?);
    Ok(ids)
}

/// Greedy held-out accuracy.
pub fn evaluate(model: &Llama, eval: &[Example], max_new: usize, device: &Device) -> Result<f64> {
    let prompts = eval.iter().map(prompt_ids).collect::<Result<Vec<_>>>()?;
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: max_new,
        stop_tokens: vec![chartok::EOS],
        ..SamplingConfig::default()
    };
    let g = generate(model, &prompts, &cfg, device)?;
    let correct: f32 = g
        .response_ids()
        .iter()
        .zip(eval)
        .map(|(r, e)| exact_match(&chartok::decode(r), &e.answer))
        .sum();
    Ok(f64::from(correct) / eval.len() as f64)
}

/// Supervised steps on demonstrations `prompt answer <eos>`: −mean log π of the answer tokens.
fn warm_up(mut model: Llama, r: &Recipe, rng: &mut Rng, device: &Device) -> Result<Llama> {
    let mut optim: ModuleOptimizer = AdamWConfig::new().with_weight_decay(0.0).init();
    for _ in 0..r.warmup.steps {
        let batch = r.task.arithmetic.train(rng, r.warmup.batch);
        let seqs: Vec<(Vec<u32>, usize)> = batch
            .iter()
            .map(|e| {
                let mut ids = prompt_ids(e)?;
                let p = ids.len();
                ids.extend(chartok::encode(&e.answer).map_err(anyhow::Error::msg)?);
                ids.push(chartok::EOS);
                Ok((ids, p))
            })
            .collect::<Result<_>>()?;
        let t = seqs.iter().map(|(s, _)| s.len()).max().unwrap_or(1);
        let b = seqs.len();
        let (mut toks, mut mask, mut lm) = (
            vec![0i64; b * t],
            vec![0f32; b * t],
            vec![0f32; b * (t - 1)],
        );
        for (i, (s, p)) in seqs.iter().enumerate() {
            for (j, id) in s.iter().enumerate() {
                toks[i * t + j] = i64::from(*id);
                mask[i * t + j] = 1.0;
                if j >= *p {
                    lm[i * (t - 1) + j - 1] = 1.0;
                }
            }
        }
        let toks = Tensor::<2, Int>::from_data(TensorData::new(toks, [b, t]), device);
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [b, t]), device);
        let lm = Tensor::<2>::from_data(TensorData::new(lm, [b, t - 1]), device);
        let (lp, _) = model.token_log_probs(toks, mask, 1.0, false, true);
        let loss = (lp * lm.clone()).sum().neg() / lm.sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(r.warmup.lr, model, grads);
    }
    Ok(model)
}

/// Appends metric rows to `metrics.jsonl` and rewrites `metrics.csv`.
struct MetricsLog {
    jsonl: std::fs::File,
    rows: Vec<BTreeMap<String, f64>>,
    dir: PathBuf,
}

impl MetricsLog {
    fn new(dir: &Path) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        let jsonl =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            jsonl,
            rows: Vec::new(),
            dir: dir.to_path_buf(),
        })
    }

    fn push(&mut self, row: BTreeMap<String, f64>) -> Result<()> {
        let json: serde_json::Map<String, serde_json::Value> = row
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    serde_json::Number::from_f64(*v)
                        .map_or(serde_json::Value::Null, serde_json::Value::Number),
                )
            })
            .collect();
        writeln!(self.jsonl, "{}", serde_json::Value::Object(json))?;
        self.jsonl.flush()?;
        self.rows.push(row);
        Ok(())
    }

    fn write_csv(&self) -> Result<()> {
        let mut keys: Vec<String> = self.rows.iter().flat_map(|r| r.keys().cloned()).collect();
        keys.sort();
        keys.dedup();
        let mut out = keys.join(",") + "\n";
        for r in &self.rows {
            let line: Vec<String> = keys
                .iter()
                .map(|k| r.get(k).map(|v| v.to_string()).unwrap_or_default())
                .collect();
            out += &(line.join(",") + "\n");
        }
        let tmp = self.dir.join("metrics.csv.tmp");
        std::fs::write(&tmp, out)?;
        std::fs::rename(&tmp, self.dir.join("metrics.csv"))?;
        Ok(())
    }
}

/// Runs the recipe, writing into `out`.
pub fn train(r: &Recipe, out: &Path, quiet: bool) -> Result<Summary> {
    let start = Instant::now();
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("recipe.resolved.toml"), toml::to_string_pretty(r)?)?;
    let base = crate::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let mut rng = Rng(r.seed);
    let eval = r.task.arithmetic.held_out_set(r.seed, r.task.eval_size);
    let max_new = r.rollout.max_new_tokens;

    base.seed(r.seed);
    let model = model_config(r).init(&ad);
    let t0 = Instant::now();
    let mut model = warm_up(model, r, &mut rng, &ad)?;
    let accuracy_before = evaluate(&model.valid(), &eval, max_new, &base)?;
    let say = |s: String| {
        if !quiet {
            eprintln!("{s}");
        }
    };
    say(format!(
        "[{}] warm-up: {} steps in {:.1} s, held-out accuracy {:.3}",
        r.name,
        r.warmup.steps,
        t0.elapsed().as_secs_f64(),
        accuracy_before
    ));

    let (adv_cfg, loss, dynamic) = r.algorithm_parts();
    let upd = UpdateConfig {
        epochs: r.train.epochs,
        mini_batches: r.train.mini_batches,
        micro_batch_rows: r.train.micro_batch_rows,
        loss,
    };
    let needs_greedy = matches!(adv_cfg.kind, AdvantageKind::Remax);
    let reference = (r.train.kl_coef > 0.0).then(|| model.valid());
    let mut adamw = AdamWConfig::new().with_weight_decay(0.0);
    if r.train.grad_clip > 0.0 {
        adamw = adamw.with_grad_clipping(Some(burn::grad_clipping::GradientClippingConfig::Norm(
            r.train.grad_clip,
        )));
    }
    let mut optim: ModuleOptimizer = adamw.init();
    let schedule = LrSchedule {
        lr: r.train.lr,
        warmup_steps: r.train.warmup_steps,
        total_steps: r.train.steps,
        min_ratio: r.train.min_lr_ratio,
    };
    let mut log = MetricsLog::new(out)?;
    let mut row0 = BTreeMap::new();
    row0.insert("step".to_string(), 0.0);
    row0.insert("eval/accuracy".to_string(), accuracy_before);
    log.push(row0)?;
    let mut accuracy_after = accuracy_before;
    let n = r.rollout.samples_per_prompt;
    for step in 0..r.train.steps {
        let t_step = Instant::now();
        let examples = r
            .task
            .arithmetic
            .train(&mut rng, r.rollout.prompts_per_step);
        let prompts = examples
            .iter()
            .map(prompt_ids)
            .collect::<Result<Vec<_>>>()?;
        let sampler = model.valid();
        let sc = SamplingConfig {
            temperature: r.rollout.temperature,
            max_new_tokens: max_new,
            n,
            seed: rng.next_u64(),
            stop_tokens: vec![chartok::EOS],
            ..SamplingConfig::default()
        };
        let g = generate(&sampler, &prompts, &sc, &base)?;
        let responses = g.response_ids();
        let rewards: Vec<f32> = responses
            .iter()
            .zip(&g.group_ids)
            .map(|(resp, gi)| exact_match(&chartok::decode(resp), &examples[*gi].answer))
            .collect();
        let (seq, seq_mask) = g.sequences();
        let response_len = g.tokens.dims()[1];
        let exp = LlmExperience {
            tokens: seq.clone().to_device(&ad),
            mask: seq_mask.clone().to_device(&ad),
            response_len,
            temperature: sc.temperature.max(1e-6),
            adapters: true,
        };
        let mut batch = RolloutBatch::new(
            g.mask.clone().to_device(&ad),
            Tensor::from_floats(rewards.as_slice(), &ad),
            &g.group_ids,
        )?
        .with_rollout_log_probs(g.log_probs.clone().to_device(&ad))?;
        if r.train.recompute_old_log_probs {
            let host_exp = LlmExperience {
                tokens: seq.clone(),
                mask: seq_mask.clone(),
                ..exp.clone()
            };
            batch = batch.with_old_log_probs(host_exp.score_all(&sampler).to_device(&ad))?;
        }
        if let Some(reference) = &reference {
            let host_exp = LlmExperience {
                tokens: seq.clone(),
                mask: seq_mask.clone(),
                ..exp.clone()
            };
            batch = batch.with_ref_log_probs(host_exp.score_all(reference).to_device(&ad))?;
        }
        if needs_greedy {
            let greedy = SamplingConfig {
                temperature: 0.0,
                n: 1,
                ..sc.clone()
            };
            let gg = generate(&sampler, &prompts, &greedy, &base)?;
            let base_r: Vec<f32> = gg
                .response_ids()
                .iter()
                .zip(&examples)
                .map(|(resp, e)| exact_match(&chartok::decode(resp), &e.answer))
                .collect();
            let per_row: Vec<f32> = g.group_ids.iter().map(|gi| base_r[*gi]).collect();
            batch = batch.with_baseline_rewards(Tensor::from_floats(per_row.as_slice(), &ad))?;
        }
        let mut kept_rows: Vec<usize> = (0..batch.dims()[0]).collect();
        let mut dropped_groups = 0;
        if dynamic {
            let (kept, dropped) = dynamic_sampling_keep(&batch);
            dropped_groups = dropped;
            kept_rows = kept;
        }
        let mut row = BTreeMap::new();
        row.insert("step".to_string(), (step + 1) as f64);
        row.insert(
            "rollout/reward_mean".to_string(),
            rewards.iter().map(|x| f64::from(*x)).sum::<f64>() / rewards.len() as f64,
        );
        let lengths: Vec<usize> = responses.iter().map(Vec::len).collect();
        row.insert(
            "rollout/response_length".to_string(),
            lengths.iter().sum::<usize>() as f64 / lengths.len() as f64,
        );
        row.insert("rollout/dropped_groups".to_string(), dropped_groups as f64);
        let lr = schedule.at(step);
        row.insert("actor/lr".to_string(), lr);
        if !kept_rows.is_empty() {
            let (batch, exp) = if kept_rows.len() < batch.dims()[0] {
                let idx: Vec<i64> = kept_rows.iter().map(|x| *x as i64).collect();
                let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [kept_rows.len()]), &ad);
                let e = LlmExperience {
                    tokens: exp.tokens.clone().select(0, idx.clone()),
                    mask: exp.mask.clone().select(0, idx),
                    ..exp.clone()
                };
                (batch.select(&kept_rows)?, e)
            } else {
                (batch, exp)
            };
            let adv = compute_advantages(&adv_cfg, &batch, step)?;
            for (k, v) in adv.metrics.to_host() {
                row.insert(k, v);
            }
            let mut order_rng = Rng(rng.next_u64());
            let (m, stats) = update(
                model,
                &mut optim,
                &exp,
                &batch,
                &adv,
                &upd,
                lr,
                r.train.kl_coef,
                &mut |n| order_rng.permutation(n),
            )?;
            model = m;
            row.extend(stats.metrics);
        }
        let secs = t_step.elapsed().as_secs_f64();
        let tokens: usize = lengths.iter().sum();
        row.insert("perf/step_s".to_string(), secs);
        row.insert("perf/tokens_per_s".to_string(), tokens as f64 / secs);
        if (step + 1) % r.train.eval_every == 0 || step + 1 == r.train.steps {
            accuracy_after = evaluate(&model.valid(), &eval, max_new, &base)?;
            row.insert("eval/accuracy".to_string(), accuracy_after);
        }
        say(format!(
            "[{}] step {:>4}/{} reward {:.3} acc {:.3} kl {:.4} clip {:.3} {:.0} tok/s",
            r.name,
            step + 1,
            r.train.steps,
            row["rollout/reward_mean"],
            accuracy_after,
            row.get("actor/approx_kl").copied().unwrap_or(0.0),
            row.get("actor/clipfrac").copied().unwrap_or(0.0),
            row["perf/tokens_per_s"]
        ));
        log.push(row)?;
    }
    log.write_csv()?;
    let final_dir = out.join("final");
    ember_llm::save_hf(
        &model.valid(),
        &model_config(r),
        &[chartok::EOS],
        &final_dir,
    )?;
    let summary = Summary {
        accuracy_before,
        accuracy_after,
        seconds: start.elapsed().as_secs_f64(),
        out: out.to_path_buf(),
    };
    let json = serde_json::json!({
        "name": r.name, "algorithm": r.algorithm.name(), "seed": r.seed,
        "accuracy_before": accuracy_before, "accuracy_after": accuracy_after, "seconds": summary.seconds,
    });
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    say(format!(
        "[{}] held-out accuracy {:.3} -> {:.3} in {:.0} s; run directory {}",
        r.name,
        accuracy_before,
        accuracy_after,
        summary.seconds,
        out.display()
    ));
    Ok(summary)
}
