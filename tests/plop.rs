//! PLoP (`ember_llm::plop`, Hayou et al. 2025): the normalised feature norm by hand, its closed
//! form against the paper's random-input ratio (Monte Carlo), its invariances, the choice of
//! the lowest types, and the projection inputs the scores read, checked by rebuilding the
//! residual stream of the transformers-validated tiny Llama from them.

mod common;

use burn::nn::Linear;
use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_llm::load;
use ember_llm::plop::{NfnScores, nfn_rows, nfn_scores};
use std::path::Path;

/// By hand: W = [[1, 0], [0, 2]] (burn layout, y = z·W), ‖W‖_F = √5, d_in = 2.
/// z = (1, 0): ‖zW‖ = 1, NFN = 1·√2/√5 = 0.632456; z = (0, 1): ‖zW‖ = 2, NFN = 2√2/√5 =
/// 1.264911; z = (3, 4): zW = (3, 8), ‖zW‖ = √73, NFN = √73·√2/(√5·5) = 1.080740; z = 0 → 0.
#[test]
fn nfn_by_hand() {
    let w = t2(&[&[1.0, 0.0], &[0.0, 2.0]]);
    let z = t2(&[&[1.0, 0.0], &[0.0, 1.0], &[3.0, 4.0], &[0.0, 0.0]]);
    let got = vals(nfn_rows(w, z));
    let want = [0.632_456_f32, 1.264_911, 1.080_74, 0.0];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
    }
}

/// The closed form is the paper's ratio ‖Wz‖/‖Wz̃‖ with ‖Wz̃‖² at its expectation: for z̃ with
/// Gaussian coordinates rescaled to ‖z‖, the mean of ‖Wz̃‖² over 20 000 draws (a fixed-seed
/// stream) is within 2% of ‖W‖²_F‖z‖²/d_in, for an anisotropic W.
#[test]
fn closed_form_matches_random_inputs() {
    let (d_in, d_out) = (6usize, 4usize);
    let w: Vec<f64> = (0..d_in * d_out)
        .map(|i| ((i * 7 % 11) as f64 - 5.0) * if i % d_out == 0 { 3.0 } else { 0.5 })
        .collect();
    let z = [0.3, -1.2, 0.7, 2.0, 0.1, -0.4];
    let zn2: f64 = z.iter().map(|x| x * x).sum();
    let wf2: f64 = w.iter().map(|x| x * x).sum();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut normal = || {
        // Box–Muller over a xorshift stream.
        let mut u = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (a, b) = (u(), u());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    };
    let draws = 20_000;
    let mut mean = 0.0;
    for _ in 0..draws {
        let g: Vec<f64> = (0..d_in).map(|_| normal()).collect();
        let gn = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        let zt: Vec<f64> = g.iter().map(|x| x / gn * zn2.sqrt()).collect();
        let y2: f64 = (0..d_out)
            .map(|o| {
                (0..d_in)
                    .map(|i| zt[i] * w[i * d_out + o])
                    .sum::<f64>()
                    .powi(2)
            })
            .sum();
        mean += y2 / draws as f64;
    }
    let closed = wf2 * zn2 / d_in as f64;
    assert!(
        (mean / closed - 1.0).abs() < 0.02,
        "Monte Carlo {mean} vs closed form {closed}"
    );
}

/// NFN does not depend on the scale of W or of z.
#[test]
fn nfn_is_scale_free() {
    let w = t2(&[&[0.5, -1.0, 2.0], &[1.5, 0.25, -0.75]]);
    let z = t2(&[&[0.3, -2.0], &[1.0, 1.0]]);
    let a = vals(nfn_rows(w.clone(), z.clone()));
    let b = vals(nfn_rows(w * 7.0, z * 0.01));
    close(&a, &b, 1e-5);
}

/// The choice: the `count` lowest types (ties by the q…down order), returned in that order;
/// counts outside 1..=7 refused; the per-type score is the mean over layers.
#[test]
fn choice_takes_the_lowest() {
    let s = NfnScores {
        per_layer: vec![
            [1.0, 2.0, 0.5, 3.0, 0.7, 0.7, 4.0],
            [1.0, 2.0, 0.7, 3.0, 0.7, 0.7, 0.0],
        ],
        tokens: 10,
    };
    assert_eq!(s.by_type(), [1.0, 2.0, 0.6, 3.0, 0.7, 0.7, 2.0]);
    assert_eq!(s.choose(1).unwrap(), ["v_proj"]);
    assert_eq!(s.choose(3).unwrap(), ["v_proj", "gate_proj", "up_proj"]);
    assert_eq!(
        s.choose(4).unwrap(),
        ["q_proj", "v_proj", "gate_proj", "up_proj"]
    );
    assert!(s.choose(0).is_err());
    assert!(s.choose(8).is_err());
}

#[track_caller]
fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= tol, "max difference {worst} > {tol}");
}

#[derive(serde::Deserialize)]
struct Fixture {
    tokens: Vec<Vec<i64>>,
    mask: Vec<Vec<f32>>,
}

/// The inputs the visitor shows are the projections' real inputs: from them alone (W_o's and
/// W_down's inputs, the norms' weights), the residual stream is rebuilt layer by layer, each
/// layer's q/k/v input equals RMSNorm of the rebuilt stream, its gate/up input RMSNorm after
/// attention, and the final logits equal the model's forward (which matches transformers, see
/// `llm_model.rs`). Then the scores of `nfn_scores` equal an f64 host computation on the same
/// inputs over the unpadded tokens.
#[test]
fn visited_inputs_rebuild_the_forward() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm/tiny_llama");
    let model = load(&dir, &dev()).unwrap().model;
    let fx: Fixture =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    let (b, t) = (fx.tokens.len(), fx.tokens[0].len());
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(fx.tokens.concat(), [b, t]), &dev());
    let mask = Tensor::<2>::from_data(TensorData::new(fx.mask.concat(), [b, t]), &dev());
    let mut seen: Vec<(usize, usize, Linear, Tensor<3>)> = Vec::new();
    model.visit_projection_inputs(tokens.clone(), mask.clone(), &mut |l, j, lin, z| {
        seen.push((l, j, lin.clone(), z.clone()));
    });
    let layers = model.n_layers();
    assert_eq!(seen.len(), 7 * layers);
    let order: Vec<(usize, usize)> = seen.iter().map(|(l, j, _, _)| (*l, *j)).collect();
    let want: Vec<(usize, usize)> = (0..layers)
        .flat_map(|l| (0..7).map(move |j| (l, j)))
        .collect();
    assert_eq!(order, want);
    let mut h = model.embed_tokens.forward(tokens.clone());
    for l in 0..layers {
        let block = &model.layers[l];
        let at = |j: usize| &seen[l * 7 + j];
        let x = block.input_layernorm.forward(h.clone());
        for j in 0..3 {
            close(&vals(at(j).3.clone()), &vals(x.clone()), 1e-5);
        }
        h = h + at(3).2.forward(at(3).3.clone());
        let x = block.post_attention_layernorm.forward(h.clone());
        for j in 4..6 {
            close(&vals(at(j).3.clone()), &vals(x.clone()), 1e-5);
        }
        h = h + at(6).2.forward(at(6).3.clone());
    }
    let head = model.lm_head.as_ref().expect("untied head");
    let rebuilt = vals(head.forward(model.norm.forward(h)));
    let forward = vals(model.forward(tokens.clone(), mask.clone()));
    let (m, v) = (fx.mask.concat(), forward.len() / (b * t));
    for (p, keep) in m.iter().enumerate() {
        if *keep == 1.0 {
            close(
                &rebuilt[p * v..(p + 1) * v],
                &forward[p * v..(p + 1) * v],
                1e-4,
            );
        }
    }
    // The scores against an f64 host computation.
    let scores = nfn_scores(&model, &[(tokens, mask)]).unwrap();
    let valid = m.iter().filter(|x| **x == 1.0).count();
    assert_eq!(scores.tokens, valid);
    for (l, j, lin, z) in &seen {
        let w = vals(lin.weight.val());
        let [_, d_out] = lin.weight.val().dims();
        let zs = vals(z.clone());
        let d_in = zs.len() / (b * t);
        let wf = w.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let mut sum = 0.0;
        for (p, keep) in m.iter().enumerate() {
            if *keep != 1.0 {
                continue;
            }
            let row = &zs[p * d_in..(p + 1) * d_in];
            let zn = row
                .iter()
                .map(|x| f64::from(*x).powi(2))
                .sum::<f64>()
                .sqrt();
            let yn = (0..d_out)
                .map(|o| {
                    (0..d_in)
                        .map(|i| f64::from(row[i]) * f64::from(w[i * d_out + o]))
                        .sum::<f64>()
                        .powi(2)
                })
                .sum::<f64>()
                .sqrt();
            sum += yn * (d_in as f64).sqrt() / (wf * zn);
        }
        let host = sum / valid as f64;
        let got = scores.per_layer[*l][*j];
        assert!(
            (got - host).abs() < 1e-4 * host.max(1.0),
            "layer {l} projection {j}: {got} vs {host}"
        );
    }
}
