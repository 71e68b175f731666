//! The Mixture-of-LoRA comparison: the CPU recipe's tiny model, warmed up on addition, is
//! fine-tuned (supervised) on a mixture of arithmetic tasks through one plain LoRA, a
//! learned-router Mixture-of-LoRAs and ReMix, at the same number of activated adapter
//! parameters; held-out accuracy per task and routing balance are reported.

use crate::llm::{Policy, Tok, demonstrations, evaluate, warm_up};
use crate::molora::schema::{Arm, MoloraRecipe, arithmetic};
use anyhow::{Context, Result};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor};
use ember_llm::chartok;
use ember_llm::{Llama, LoraSettings, apply_lora, apply_mixture};
use ember_molora::{
    MixtureSettings, RouteCtx, RouterKind, balance, load_balance_loss, router_pg_loss,
};
use ember_run::write_atomic;
use ember_tasks::task::{Example, Rng, TaskSet};
use ember_train::OptimizerConfig;
use serde::Serialize;
use std::path::Path;
use std::time::Instant;

/// Per-row mean NLL of the answer tokens, `[rows]`.
fn row_losses(
    model: &Llama,
    toks: Tensor<2, Int>,
    mask: Tensor<2>,
    lm: Tensor<2>,
    ctx: &RouteCtx,
) -> Tensor<1> {
    let [b, t] = toks.dims();
    let logits = model.forward_routed(toks.clone(), mask, ctx);
    let v = logits.dims()[2];
    let lp = burn::tensor::activation::log_softmax(logits.slice([0..b, 0..t - 1, 0..v]), 2);
    let picked = lp
        .gather(2, toks.slice([0..b, 1..t]).reshape([b, t - 1, 1]))
        .reshape([b, t - 1]);
    ((picked * lm.clone()).sum_dim(1).neg() / lm.sum_dim(1).clamp_min(1.0)).reshape([b])
}

/// What one arm reached.
#[derive(Debug, Clone, Serialize)]
pub struct ArmResult {
    /// Label.
    pub name: String,
    /// Adapter parameters one token activates (k experts, or the LoRA).
    pub activated_params: usize,
    /// Router parameters.
    pub router_params: usize,
    /// Held-out accuracy per task, in recipe order.
    pub accuracy: Vec<f64>,
    /// Mean accuracy.
    pub mean_accuracy: f64,
    /// Effective number of experts per mixture layer (mean, min over layers) on the held-out
    /// prompts; None for LoRA.
    pub effective_experts: Option<(f64, f64)>,
    /// Effective number of experts of every mixture layer, in forward order.
    pub effective_experts_per_layer: Vec<f64>,
    /// Expert usage counts summed over layers.
    pub usage: Option<Vec<f64>>,
    /// Fine-tuning seconds.
    pub seconds: f64,
}

/// Runs every arm; writes `results.json` and `results.md` into `out`.
pub fn run(r: &MoloraRecipe, out: &Path, quiet: bool) -> Result<Vec<ArmResult>> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    write_atomic(
        &out.join("recipe.resolved.toml"),
        toml::to_string_pretty(r)?.as_bytes(),
    )?;
    let base = crate::common::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let say = |s: String| ember_run::say(quiet, &s);
    // The CPU recipe's warm-started model (supervised steps on the warm-up task).
    ad.seed(r.seed);
    let cfg = r.model.llama_config();
    let mut rng = Rng(r.seed);
    let t0 = Instant::now();
    let warm = warm_up(
        cfg.init(&ad),
        &r.warmup,
        &TaskSet::Arithmetic(arithmetic(&r.warmup_task)),
        &mut rng,
        &ad,
    )?;
    say(format!(
        "[{}] warm-up on {}: {:.1} s",
        r.name,
        r.warmup_task.name,
        t0.elapsed().as_secs_f64()
    ));
    let evals: Vec<Vec<Example>> = r
        .tasks
        .iter()
        .map(|t| arithmetic(t).held_out_set(r.seed, r.eval_size))
        .collect();
    let max_new = 6;
    let policy = |model: Llama| Policy {
        model,
        config: cfg.clone(),
        tok: Tok::Char,
        stop: vec![chartok::EOS],
        lora: None,
    };
    let before: Vec<f64> = evals
        .iter()
        .map(|e| evaluate(&policy(warm.clone()), e, max_new, &base))
        .collect::<Result<_>>()?;
    let mut results = vec![ArmResult {
        name: "warm start (no adapter)".into(),
        activated_params: 0,
        router_params: 0,
        mean_accuracy: before.iter().sum::<f64>() / before.len() as f64,
        accuracy: before,
        effective_experts: None,
        effective_experts_per_layer: Vec::new(),
        usage: None,
        seconds: 0.0,
    }];
    for arm in &r.arms {
        let start = Instant::now();
        ad.seed(r.seed ^ 0xA5);
        let mut router_params = 0;
        let (mut model, activated, remix, aux) = match arm {
            Arm::Lora { rank, .. } => {
                let s = LoraSettings {
                    rank: *rank,
                    alpha: r.finetune.alpha,
                    targets: r.finetune.targets.clone(),
                };
                let m = apply_lora(warm.clone(), &s)?;
                let n = ember_llm::lora::adapter_param_count(&m);
                (m, n, None, 0.0)
            }
            Arm::Mixture { settings, .. } => {
                let s = MixtureSettings {
                    alpha: r.finetune.alpha,
                    ..settings.clone()
                };
                let m = apply_mixture(warm.clone(), &s, &r.finetune.targets, &ad)?;
                let n: usize = ember_llm::mixtures(&m)
                    .iter()
                    .map(|x| x.activated_params())
                    .sum();
                router_params = ember_llm::mixtures(&m)
                    .iter()
                    .map(|x| x.router_params())
                    .sum();
                let (remix, aux) = match s.router {
                    RouterKind::Remix {
                        selections,
                        pg_coef,
                    } => (Some((selections, pg_coef)), 0.0),
                    RouterKind::Learned { aux_coef } => (None, aux_coef),
                };
                (m, n, remix, aux)
            }
        };
        let mut optim = OptimizerConfig::default().init();
        let mut trng = Rng(r.seed ^ 0x5EED);
        for step in 0..r.finetune.steps {
            let batch: Vec<Example> = (0..r.finetune.batch)
                .map(|_| {
                    let t = &r.tasks[trng.below(r.tasks.len() as u64) as usize];
                    arithmetic(t).train(&mut trng, 1).remove(0)
                })
                .collect();
            let m = remix.map_or(1, |(s, _)| s);
            let rep: Vec<Example> = batch
                .iter()
                .flat_map(|e| std::iter::repeat_n(e.clone(), m))
                .collect();
            let (toks, mask, lm) = demonstrations(&rep, &ad)?;
            let ctx = match remix {
                Some(_) => RouteCtx::training(),
                None => RouteCtx::plain(true).recording(),
            };
            let losses = row_losses(&model, toks, mask.clone(), lm, &ctx);
            let sup = losses.clone().mean();
            let mut loss = sup.clone();
            let recs = ctx.take_records();
            if let Some((_, pg_coef)) = remix {
                let groups: Vec<usize> = (0..rep.len()).map(|i| i / m).collect();
                let (pg, _) = router_pg_loss(&recs, &mask, losses, &groups)?;
                loss = loss + pg * pg_coef;
            } else if aux > 0.0 {
                for rec in &recs {
                    loss = loss + load_balance_loss(rec, &mask) * aux;
                }
            }
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(r.finetune.lr, model, grads).0;
            if !quiet && (step + 1) % 50 == 0 {
                let l: f32 = sup.into_scalar();
                eprintln!(
                    "[{}] {} step {}/{} answer NLL {l:.3}",
                    r.name,
                    arm.name(),
                    step + 1,
                    r.finetune.steps
                );
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let valid = model.valid();
        let accuracy: Vec<f64> = evals
            .iter()
            .map(|e| evaluate(&policy(model.clone()), e, max_new, &base))
            .collect::<Result<_>>()?;
        let mut per_layer = Vec::new();
        let (effective_experts, usage) = if ember_llm::mixtures(&valid).is_empty() {
            (None, None)
        } else {
            let all: Vec<Example> = evals.iter().flatten().cloned().collect();
            let prompts: Vec<Example> = all
                .iter()
                .map(|e| Example {
                    answer: String::new(),
                    ..e.clone()
                })
                .collect();
            let (toks, mask, _) = demonstrations(&prompts, &base)?;
            let ctx = RouteCtx::plain(true)
                .recording()
                .with_pool_mask(mask.clone());
            let _ = valid.forward_routed(toks, mask.clone(), &ctx);
            let mut effs = Vec::new();
            let mut usage: Vec<f64> = Vec::new();
            for rec in ctx.take_records() {
                let s = rec.weights.dims()[1];
                let m = if s == mask.dims()[1] {
                    mask.clone()
                } else {
                    Tensor::ones([mask.dims()[0], 1], &base)
                };
                let (eff, u) = balance(&rec.weights, &rec.selected, &m);
                effs.push(eff);
                if usage.is_empty() {
                    usage = u;
                } else {
                    for (a, b) in usage.iter_mut().zip(u) {
                        *a += b;
                    }
                }
            }
            per_layer = effs.clone();
            let mean = effs.iter().sum::<f64>() / effs.len() as f64;
            let min = effs.iter().copied().fold(f64::INFINITY, f64::min);
            (Some((mean, min)), Some(usage))
        };
        say(format!(
            "[{}] {}: accuracy {:?} in {seconds:.0} s{}",
            r.name,
            arm.name(),
            accuracy
                .iter()
                .map(|a| format!("{a:.3}"))
                .collect::<Vec<_>>(),
            effective_experts.map_or(String::new(), |(m, lo)| format!(
                ", effective experts {m:.2} (min {lo:.2})"
            ))
        ));
        results.push(ArmResult {
            name: arm.name().to_string(),
            activated_params: activated,
            router_params,
            mean_accuracy: accuracy.iter().sum::<f64>() / accuracy.len() as f64,
            accuracy,
            effective_experts,
            effective_experts_per_layer: per_layer,
            usage,
            seconds,
        });
    }
    write_atomic(
        &out.join("results.json"),
        serde_json::to_string_pretty(&results)?.as_bytes(),
    )?;
    let mut md = String::from("| arm | activated adapter params (+ router) |");
    for t in &r.tasks {
        md += &format!(" {} |", t.name);
    }
    md += " mean | effective experts (mean / min layer) | fine-tune s |\n|---|---|";
    md += &"---|".repeat(r.tasks.len() + 3);
    md += "\n";
    for a in &results {
        md += &format!(
            "| {} | {} (+{}) |",
            a.name, a.activated_params, a.router_params
        );
        for x in &a.accuracy {
            md += &format!(" {x:.3} |");
        }
        md += &format!(
            " {:.3} | {} | {:.0} |\n",
            a.mean_accuracy,
            a.effective_experts
                .map_or("–".into(), |(m, lo)| format!("{m:.2} / {lo:.2}")),
            a.seconds
        );
    }
    write_atomic(&out.join("results.md"), md.as_bytes())?;
    say(md);
    Ok(results)
}
