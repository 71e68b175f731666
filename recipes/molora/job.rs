//! The Mixture-of-LoRA comparison: the CPU recipe's tiny model, warmed up on addition, is
//! fine-tuned (supervised) on a mixture of arithmetic tasks through one plain LoRA, a
//! learned-router Mixture-of-LoRAs and ReMix, at the same number of activated adapter
//! parameters; held-out accuracy per task and routing balance are reported.

use crate::lm::{Policy, Tok, demonstrations, evaluate, warm_up};
use crate::molora::schema::{Arm, MoloraRecipe, arithmetic};
use anyhow::{Context, Result};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor};
use ember_engine::SplitMix64;
use ember_llm::chartok;
use ember_llm::{Llama, LoraSettings, apply_lora, apply_mixture};
use ember_molora::{
    MixtureSettings, RouteCtx, RouterKind, balance, load_balance_loss, router_pg_loss,
};
use ember_run::write_atomic;
use ember_tasks::task::{Example, TaskSet};
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
    let base = crate::common::device::device(&r.header.device)?;
    let ad = base.clone().autodiff();
    let say = |s: String| ember_run::say(quiet, &s);
    // The CPU recipe's warm-started model (supervised steps on the warm-up task).
    ad.seed(r.header.seed);
    let cfg = r.model.llama_config();
    let mut rng = SplitMix64(r.header.seed);
    let t0 = Instant::now();
    let task = TaskSet::Arithmetic(arithmetic(&r.warmup_task));
    let chars = chartok::Vocab::Chars;
    let (warm, _) = warm_up(cfg.init(&ad), chars, &r.warmup, &task, &mut rng, &ad)?;
    let secs = t0.elapsed().as_secs_f64();
    say(format!(
        "[{}] warm-up on {}: {secs:.1} s",
        r.header.name, r.warmup_task.name
    ));
    let evals: Vec<Vec<Example>> = r
        .tasks
        .iter()
        .map(|t| arithmetic(t).held_out_set(r.header.seed, r.eval_size))
        .collect();
    let policy = |model: Llama| Policy {
        model,
        config: cfg.clone(),
        tok: Tok::Char(chartok::Vocab::Chars),
        stop: vec![chartok::EOS],
        lora: None,
    };
    let accuracy = |model: &Llama| -> Result<Vec<f64>> {
        let max_new = 6;
        evals
            .iter()
            .map(|e| evaluate(&policy(model.clone()), e, max_new, &base))
            .collect()
    };
    let before = accuracy(&warm)?;
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
        ad.seed(r.header.seed ^ 0xA5);
        let built = build_arm(arm, &warm, r, &ad)?;
        let (activated, router_params) = (built.activated, built.router_params);
        let model = finetune(built, arm, r, &ad, quiet)?;
        let seconds = start.elapsed().as_secs_f64();
        let accuracy = accuracy(&model)?;
        let balance = routing_balance(&model.valid(), &evals, &base)?;
        let effective_experts = balance.effective;
        say(format!(
            "[{}] {}: accuracy {:?} in {seconds:.0} s{}",
            r.header.name,
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
            effective_experts_per_layer: balance.per_layer,
            usage: balance.usage,
            seconds,
        });
    }
    write_atomic(
        &out.join("results.json"),
        serde_json::to_string_pretty(&results)?.as_bytes(),
    )?;
    let md = results_table(r, &results);
    write_atomic(&out.join("results.md"), md.as_bytes())?;
    say(md);
    Ok(results)
}

/// An arm's adapted model before fine-tuning, its parameter counts, and its router's
/// training: ReMix's (selections, policy-gradient coefficient), or the learned router's
/// load-balancing coefficient.
struct BuiltArm {
    model: Llama,
    activated: usize,
    router_params: usize,
    remix: Option<(usize, f32)>,
    aux: f32,
}

/// The warm model with the arm's adapters: one LoRA, or a mixture on the same targets.
fn build_arm(arm: &Arm, warm: &Llama, r: &MoloraRecipe, ad: &Device) -> Result<BuiltArm> {
    Ok(match arm {
        Arm::Lora { rank, .. } => {
            let s = LoraSettings {
                rank: *rank,
                alpha: r.finetune.alpha,
                targets: r.finetune.targets.clone(),
            };
            let model = apply_lora(warm.clone(), &s)?;
            let activated = ember_llm::adapter_param_count(&model);
            BuiltArm {
                model,
                activated,
                router_params: 0,
                remix: None,
                aux: 0.0,
            }
        }
        Arm::Mixture { settings, .. } => {
            let s = MixtureSettings {
                alpha: r.finetune.alpha,
                ..settings.clone()
            };
            let model = apply_mixture(warm.clone(), &s, &r.finetune.targets, ad)?;
            let layers = ember_llm::mixtures(&model);
            let activated = layers.iter().map(|x| x.activated_params()).sum();
            let router_params = layers.iter().map(|x| x.router_params()).sum();
            let (remix, aux) = match s.router {
                RouterKind::Remix {
                    selections,
                    pg_coef,
                } => (Some((selections, pg_coef)), 0.0),
                RouterKind::Learned { aux_coef } => (None, aux_coef),
            };
            BuiltArm {
                model,
                activated,
                router_params,
                remix,
                aux,
            }
        }
    })
}

/// Supervised fine-tuning on the task mixture: the answer NLL, plus ReMix's router policy
/// gradient (each example repeated `selections` times) or the learned router's Switch
/// load-balancing loss.
fn finetune(b: BuiltArm, arm: &Arm, r: &MoloraRecipe, ad: &Device, quiet: bool) -> Result<Llama> {
    let mut model = b.model;
    let mut optim = OptimizerConfig::default().init();
    let mut trng = SplitMix64(r.header.seed ^ 0x5EED);
    for step in 0..r.finetune.steps {
        let batch: Vec<Example> = (0..r.finetune.batch)
            .map(|_| {
                let t = &r.tasks[trng.below(r.tasks.len() as u64) as usize];
                arithmetic(t).train(&mut trng, 1).remove(0)
            })
            .collect();
        let m = b.remix.map_or(1, |(s, _)| s);
        let rep: Vec<Example> = batch
            .iter()
            .flat_map(|e| std::iter::repeat_n(e.clone(), m))
            .collect();
        let (toks, mask, lm) = demonstrations(chartok::Vocab::Chars, &rep, ad)?;
        let ctx = match b.remix {
            Some(_) => RouteCtx::training(),
            None => RouteCtx::plain(true).recording(),
        };
        let losses = row_losses(&model, toks, mask.clone(), lm, &ctx);
        let sup = losses.clone().mean();
        let mut loss = sup.clone();
        let recs = ctx.take_records();
        if let Some((_, pg_coef)) = b.remix {
            let groups: Vec<usize> = (0..rep.len()).map(|i| i / m).collect();
            let (pg, _) = router_pg_loss(&recs, &mask, losses, &groups)?;
            loss = loss + pg * pg_coef;
        } else if b.aux > 0.0 {
            for rec in &recs {
                loss = loss + load_balance_loss(rec, &mask) * b.aux;
            }
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(r.finetune.lr, model, grads).0;
        if !quiet && (step + 1).is_multiple_of(50) {
            let l: f32 = sup.into_scalar();
            let (name, done, all) = (arm.name(), step + 1, r.finetune.steps);
            eprintln!(
                "[{}] {name} step {done}/{all} answer NLL {l:.3}",
                r.header.name
            );
        }
    }
    Ok(model)
}

/// Routing balance on the held-out prompts (none for a model without mixtures).
#[derive(Default)]
struct Balance {
    /// The effective number of experts per mixture layer: mean and min over layers.
    effective: Option<(f64, f64)>,
    /// Expert usage summed over layers.
    usage: Option<Vec<f64>>,
    /// Each layer's effective number of experts, in forward order.
    per_layer: Vec<f64>,
}

/// The routing balance of `valid`'s mixture layers on the held-out prompts.
fn routing_balance(valid: &Llama, evals: &[Vec<Example>], base: &Device) -> Result<Balance> {
    if ember_llm::mixtures(valid).is_empty() {
        return Ok(Balance::default());
    }
    let prompts: Vec<Example> = evals
        .iter()
        .flatten()
        .map(|e| Example {
            answer: String::new(),
            ..e.clone()
        })
        .collect();
    let (toks, mask, _) = demonstrations(chartok::Vocab::Chars, &prompts, base)?;
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
            Tensor::ones([mask.dims()[0], 1], base)
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
    let mean = effs.iter().sum::<f64>() / effs.len() as f64;
    let min = effs.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(Balance {
        effective: Some((mean, min)),
        usage: Some(usage),
        per_layer: effs,
    })
}

/// `results.md`: one row per arm.
fn results_table(r: &MoloraRecipe, results: &[ArmResult]) -> String {
    let mut md = String::from("| arm | activated adapter params (+ router) |");
    for t in &r.tasks {
        md += &format!(" {} |", t.name);
    }
    md += " mean | effective experts (mean / min layer) | fine-tune s |\n|---|---|";
    md += &"---|".repeat(r.tasks.len() + 3);
    md += "\n";
    for a in results {
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
    md
}
