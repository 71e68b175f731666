//! Mixture-of-LoRA: the k-subset log-probability against hand computations, the ReMix RLOO
//! router gradient against the exact gradient by enumeration, and the layers inside the LLM.

mod common;

use burn::module::{Module, Param};
use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_llm::{Family, LlamaConfig, SamplingConfig, apply_mixture, generate, mixtures};
use ember_molora::{
    Granularity, MixtureSettings, RouteCtx, RouterKind, balance, load_balance_loss, router_pg_loss,
    subset_log_prob,
};

fn idx(v: &[i64], b: usize, s: usize, k: usize) -> Tensor<3, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [b, s, k]), &dev())
}

fn probs(p: &[f32]) -> Tensor<3> {
    Tensor::from_data(TensorData::new(p.to_vec(), [1, 1, p.len()]), &dev())
}

#[test]
fn subset_log_prob_matches_hand_computation() {
    // p = [0.1, 0.2, 0.3, 0.4], S = {1, 3}:
    // P = 0.2·0.4/(1−0.2) + 0.4·0.2/(1−0.4) = 0.1 + 0.133333 = 0.233333.
    let p = probs(&[0.1, 0.2, 0.3, 0.4]);
    let lp = vals(subset_log_prob(p.clone(), idx(&[1, 3], 1, 1, 2)));
    assert_close(&lp, &[0.233_333_333_f64.ln()], 1e-6);
    // The order of the indices does not matter.
    let lp2 = vals(subset_log_prob(p.clone(), idx(&[3, 1], 1, 1, 2)));
    assert_close(&lp2, &[0.233_333_333_f64.ln()], 1e-6);
    // k = 3, S = {0, 1, 2}: Σ over the 6 orders of p_a p_b p_c / ((1−p_a)(1−p_a−p_b)).
    let q = [0.1f64, 0.2, 0.3];
    let mut want = 0.0;
    for o in ember_molora::permutations(3) {
        let (a, b, c) = (q[o[0]], q[o[1]], q[o[2]]);
        want += a * b * c / ((1.0 - a) * (1.0 - a - b));
    }
    // = 0.006·(1/(0.9·0.7) + 1/(0.9·0.6) + 1/(0.8·0.7) + 1/(0.8·0.5) + 1/(0.7·0.6) + 1/(0.7·0.5))
    // = 0.006 · 12.963 = 0.077778
    assert!((want - 0.077_778_f64).abs() < 1e-5, "{want}");
    let lp3 = vals(subset_log_prob(p, idx(&[0, 1, 2], 1, 1, 3)));
    assert_close(&lp3, &[want.ln()], 1e-5);
}

#[test]
fn subset_probabilities_sum_to_one() {
    let p = [0.05f32, 0.15, 0.3, 0.2, 0.3];
    for k in 1..=3 {
        let mut subsets = vec![];
        let n = p.len();
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize == k {
                subsets.push(
                    (0..n as i64)
                        .filter(|i| mask >> i & 1 == 1)
                        .collect::<Vec<_>>(),
                );
            }
        }
        let total: f64 = subsets
            .iter()
            .map(|s| f64::from(vals(subset_log_prob(probs(&p), idx(s, 1, 1, k)))[0]).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5, "k={k}: {total}");
    }
}

/// N = 4, k = 2: the Monte-Carlo RLOO router gradient of the layer (Gumbel-top-k samples,
/// subset log-probs, the engine's RLOO and vanilla loss) converges to −∇ E[R] computed
/// exactly by enumerating the six subsets.
#[test]
fn remix_rloo_gradient_matches_exact_gradient() {
    let device = dev().autodiff();
    device.seed(7);
    let settings = MixtureSettings {
        experts: 4,
        top_k: 2,
        rank: 1,
        alpha: 1.0,
        router: RouterKind::Remix {
            selections: 4,
            pg_coef: 1.0,
        },
        granularity: Granularity::Token,
    };
    let layer = settings.init(3, 2, &device);
    let reward = |a: usize, b: usize| -> f32 {
        // An arbitrary table over the six pairs.
        let t = [
            [0.0, 1.0, 0.2, 0.5],
            [1.0, 0.0, 0.9, 0.1],
            [0.2, 0.9, 0.0, 0.4],
            [0.5, 0.1, 0.4, 0.0],
        ];
        t[a][b]
    };
    let x_row = [0.7f32, -0.4, 1.1];
    // Exact: E[R] = Σ_S R(S) P(S), differentiated by autodiff through the enumeration.
    let x1 = Tensor::<3>::from_data(TensorData::new(x_row.to_vec(), [1, 1, 3]), &device);
    let p = burn::tensor::activation::softmax(layer.router.forward(x1), 2);
    let mut expected: Option<Tensor<1>> = None;
    for a in 0..4 {
        for b in a + 1..4 {
            let lp = subset_log_prob(p.clone(), idx_on(&[a as i64, b as i64], &device));
            let term = lp.exp().reshape([1]) * reward(a, b);
            expected = Some(match expected {
                None => term,
                Some(e) => e + term,
            });
        }
    }
    let g_exact = router_grad(&layer, expected.unwrap().neg());
    // Monte Carlo: 3000 inputs × M = 4 selections.
    let (groups, m) = (3000usize, 4usize);
    let rows = groups * m;
    let x: Vec<f32> = (0..rows).flat_map(|_| x_row).collect();
    let x = Tensor::<3>::from_data(TensorData::new(x, [rows, 1, 3]), &device);
    let ctx = RouteCtx::training();
    let _ = layer.forward(x, &ctx);
    let recs = ctx.take_records();
    let sel: Vec<f32> = recs[0].selected.clone().try_into_vec_as::<f32>().unwrap();
    let losses: Vec<f32> = (0..rows)
        .map(|r| {
            let s: Vec<usize> = (0..4).filter(|e| sel[r * 4 + e] > 0.5).collect();
            assert_eq!(s.len(), 2);
            -reward(s[0], s[1])
        })
        .collect();
    let group_ids: Vec<usize> = (0..rows).map(|r| r / m).collect();
    let (loss, _) = router_pg_loss(
        &recs,
        &Tensor::ones([rows, 1], &device),
        Tensor::from_floats(losses.as_slice(), &device),
        &group_ids,
    )
    .unwrap();
    let g_mc = router_grad(&layer, loss);
    let err: f32 = g_mc
        .iter()
        .zip(&g_exact)
        .map(|(a, b)| (a - b).powi(2))
        .sum::<f32>()
        .sqrt();
    let norm: f32 = g_exact.iter().map(|a| a * a).sum::<f32>().sqrt();
    eprintln!(
        "exact {g_exact:?}\nmc    {g_mc:?}\nrelative error {}",
        err / norm
    );
    assert!(norm > 1e-3, "degenerate test: exact gradient {norm}");
    assert!(err / norm < 0.03, "relative error {}", err / norm);
}

fn idx_on(v: &[i64], device: &burn::tensor::Device) -> Tensor<3, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [1, 1, v.len()]), device)
}

fn router_grad(layer: &ember_molora::MoLora, loss: Tensor<1>) -> Vec<f32> {
    let grads = loss.backward();
    layer
        .router
        .weight
        .grad(&grads)
        .unwrap()
        .try_into_vec_as::<f32>()
        .unwrap()
}

fn tiny() -> LlamaConfig {
    LlamaConfig::new(Family::Llama, 20, 16, 32, 2, 4, 2).with_max_position_embeddings(32)
}

fn settings(router: RouterKind, granularity: Granularity) -> MixtureSettings {
    MixtureSettings {
        experts: 4,
        top_k: 2,
        rank: 2,
        alpha: 4.0,
        router,
        granularity,
    }
}

fn targets() -> Vec<String> {
    ["q_proj", "v_proj", "up_proj", "down_proj"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// Randomises the experts' B factors so the mixtures change the model.
fn perturb(model: ember_llm::Llama) -> ember_llm::Llama {
    let mut m = model;
    for l in &mut m.layers {
        for mix in [
            &mut l.self_attn.q_mix,
            &mut l.self_attn.v_mix,
            &mut l.mlp.up_mix,
            &mut l.mlp.down_mix,
        ]
        .into_iter()
        .flatten()
        {
            let shape = mix.b.dims();
            let b =
                Tensor::<3>::random(shape, burn::tensor::Distribution::Normal(0.0, 0.3), &dev());
            mix.b = Param::from_tensor(b);
        }
    }
    m
}

#[test]
fn mixture_starts_as_identity_and_generation_matches_rescoring() {
    dev().seed(3);
    let base = tiny().init(&dev());
    let tokens =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 5, 7, 9, 2, 3], [2, 3]), &dev());
    let mask = Tensor::<2>::ones([2, 3], &dev());
    let before = vals(
        base.forward(tokens.clone(), mask.clone())
            .reshape([2 * 3 * 20]),
    );
    for granularity in [Granularity::Token, Granularity::Sequence] {
        for router in [
            RouterKind::Learned { aux_coef: 0.01 },
            RouterKind::Remix {
                selections: 2,
                pg_coef: 1.0,
            },
        ] {
            let s = settings(router, granularity);
            let m = apply_mixture(base.clone(), &s, &targets(), &dev()).unwrap();
            assert_eq!(mixtures(&m).len(), 2 * 4);
            // B = 0: the model is unchanged.
            let after = vals(
                m.forward(tokens.clone(), mask.clone())
                    .reshape([2 * 3 * 20]),
            );
            let diff = before
                .iter()
                .zip(&after)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-6, "{diff}");
            // Sampled log-probs (KV cache, routing replayed for sequence routing) equal the
            // full forward's under the same (deterministic, top-k) routing.
            let m = perturb(m);
            let prompts = vec![vec![1u32, 4, 6], vec![1, 9]];
            let cfg = SamplingConfig {
                temperature: 1.0,
                max_new_tokens: 6,
                seed: 11,
                ..SamplingConfig::default()
            };
            let g = generate(&m, &prompts, &cfg, &dev()).unwrap();
            let (seq, seq_mask) = g.sequences();
            let [rows, total] = seq.dims();
            let new = g.tokens.dims()[1];
            let pl = total - new;
            // Sequence routing pools over the prompt, as at the prefill.
            let pool = Tensor::cat(
                vec![g.prompt_mask.clone(), Tensor::zeros([rows, new], &dev())],
                1,
            );
            let ctx = RouteCtx::plain(true).with_pool_mask(pool);
            let logits = m.forward_routed(seq.clone(), seq_mask, &ctx);
            let lp = burn::tensor::activation::log_softmax(
                logits.slice([0..rows, pl - 1..total - 1, 0..20]),
                2,
            );
            let picked = lp
                .gather(2, g.tokens.clone().reshape([rows, new, 1]))
                .reshape([rows, new]);
            let want = vals(picked * g.mask.clone());
            let got = vals(g.log_probs.clone());
            let diff = want
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-4, "{router:?} {granularity:?}: {diff}");
        }
    }
}

#[test]
fn routing_records_balance_and_aux_loss() {
    dev().seed(5);
    let s = settings(RouterKind::Learned { aux_coef: 0.01 }, Granularity::Token);
    let layer = s.init(6, 3, &dev());
    let x = Tensor::<3>::random(
        [3, 5, 6],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &dev(),
    );
    let ctx = RouteCtx::plain(true).recording();
    let _ = layer.forward(x, &ctx);
    let recs = ctx.take_records();
    assert_eq!(recs.len(), 1);
    let w = vals(recs[0].weights.clone().sum_dim(2).reshape([15]));
    assert_close(&w, &[1.0; 15], 1e-5);
    let sel = vals(recs[0].selected.clone().sum_dim(2).reshape([15]));
    assert_close(&sel, &[2.0; 15], 0.0);
    let mask = Tensor::<2>::ones([3, 5], &dev());
    let (eff, usage) = balance(&recs[0].weights, &recs[0].selected, &mask);
    assert!((1.0..=4.0).contains(&eff), "{eff}");
    assert_eq!(usage.iter().sum::<f64>(), 30.0);
    // Uniform routing: f_e = P_e = 1/N, so the Switch loss is N · N · (1/N)² = 1.
    let uniform = ember_molora::RouteRecord {
        log_prob: None,
        probs: Tensor::ones([1, 4, 4], &dev()) * 0.25,
        weights: Tensor::ones([1, 4, 4], &dev()) * 0.25,
        selected: Tensor::<3>::from_data(
            TensorData::new(
                vec![
                    1f32, 1., 0., 0., 0., 0., 1., 1., 1., 1., 0., 0., 0., 0., 1., 1.,
                ],
                [1, 4, 4],
            ),
            &dev(),
        ),
    };
    let l = vals(load_balance_loss(&uniform, &Tensor::ones([1, 4], &dev())));
    assert_close(&l, &[1.0], 1e-6);
    let (eff, _) = balance(
        &uniform.weights,
        &uniform.selected,
        &Tensor::ones([1, 4], &dev()),
    );
    assert!((eff - 4.0).abs() < 1e-9);
    let _ = Module::num_params(&layer);
}

/// The comparison recipe end to end at a tiny budget: every arm trains and is reported.
#[test]
fn molora_recipe_runs_every_arm() {
    let out = std::env::temp_dir().join(format!("ember-molora-{}", std::process::id()));
    let recipe = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/molora-cpu.toml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["molora", recipe.to_str().unwrap(), "--quiet", "--out"])
        .arg(&out)
        .args([
            "--set",
            "warmup.steps=20",
            "--set",
            "finetune.steps=3",
            "--set",
            "eval_size=8",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let arms = v.as_array().unwrap();
    assert_eq!(arms.len(), 4);
    // Same activated adapter parameters per token in every arm.
    let lora = arms[1]["activated_params"].as_u64().unwrap();
    assert!(lora > 0);
    for a in &arms[2..] {
        assert_eq!(a["activated_params"].as_u64().unwrap(), lora, "{a}");
        let eff = a["effective_experts"][0].as_f64().unwrap();
        assert!((1.0..=8.0).contains(&eff), "{a}");
        let usage: f64 = a["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .sum();
        assert!(usage > 0.0);
    }
    assert!(out.join("results.md").exists());
    std::fs::remove_dir_all(&out).ok();
}
