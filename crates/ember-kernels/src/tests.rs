use super::*;
use burn::tensor::{Distribution, TensorData, Tolerance};

fn device() -> Device {
    // The CPU backend: the tests of this crate run where the fused kernels do.
    let d = Device::default();
    assert!(
        fused_on(&d),
        "the tests need the CPU backend (the `flex` feature)"
    );
    d
}

fn close(a: Tensor<1>, b: Tensor<1>, tol: f64) {
    a.into_data()
        .assert_approx_eq::<f32>(&b.into_data(), Tolerance::absolute(tol));
}

/// Values and gradients (of `h` and `w`) against the reference, on odd shapes: vocabulary
/// chunks of uneven width, targets at chunk edges, a temperature, a loss weighting both
/// outputs.
fn check(rows: usize, vocab: usize, d: usize, chunk: usize, temperature: f32, seed: u64) {
    let dev = device();
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let h0 = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.5), &dev);
    let w0 = Tensor::<2>::random([vocab, d], Distribution::Normal(0.0, 1.0), &dev);
    let t: Vec<i64> = (0..rows)
        .map(|r| ((r * 7 + chunk - 1) % vocab) as i64)
        .collect();
    let weights = Tensor::<1>::random([rows], Distribution::Uniform(-1.0, 1.0), &dev);
    let run = |fused: bool| {
        let h = Tensor::<2>::from_data(h0.to_data(), &base).require_grad();
        let w = Tensor::<2>::from_data(w0.to_data(), &base).require_grad();
        let targets = Tensor::<1, Int>::from_data(TensorData::from(t.as_slice()), &base);
        let (lp, ent) = match fused {
            true => {
                let out =
                    Tensor::<2>::from_dispatch(<Dispatch as FusedHead>::head_log_prob_entropy(
                        h.clone().into_dispatch(),
                        w.clone().into_dispatch(),
                        targets.into_dispatch(),
                        1.0 / temperature,
                        chunk,
                        false,
                    ));
                let lp = out.clone().slice([0..rows, 0..1]).reshape([rows]);
                (lp, out.slice([0..rows, 1..2]).reshape([rows]))
            }
            false => head_log_probs_reference(h.clone(), w.clone(), targets, temperature),
        };
        let wts = Tensor::<1>::from_data(weights.to_data(), &base);
        let loss = (lp.clone() * wts.clone()).sum() + (ent.clone() * wts * 0.3).sum();
        let g = loss.backward();
        let gh = h.grad(&g).unwrap().reshape([rows * d]);
        let gw = w.grad(&g).unwrap().reshape([vocab * d]);
        (lp.inner(), ent.inner(), gh, gw)
    };
    let (a, b) = (run(true), run(false));
    close(a.0, b.0, 2e-4);
    close(a.1, b.1, 2e-4);
    close(a.2, b.2, 2e-4);
    close(a.3, b.3, 2e-4);
}

#[test]
fn fused_head_matches_the_reference_in_values_and_gradients() {
    check(7, 37, 5, 8, 0.7, 1);
    check(16, 64, 8, 64, 1.0, 2);
    check(3, 50, 4, 1000, 1.3, 3);
    check(9, 33, 6, 1, 1.0, 4);
    // Many rows and wide chunks (42 000 logits each), so the chunk products run on every core.
    check(70, 1100, 16, 600, 0.8, 5);
}

#[test]
fn fused_head_without_autodiff_equals_the_autodiff_forward() {
    let dev = device();
    dev.seed(5);
    let h = Tensor::<2>::random([11, 6], Distribution::Normal(0.0, 2.0), &dev);
    let w = Tensor::<2>::random([29, 6], Distribution::Normal(0.0, 2.0), &dev);
    let t = Tensor::<1, Int>::from_data(
        TensorData::from([0i64, 28, 5, 6, 7, 13, 14, 27, 1, 2, 3]),
        &dev,
    );
    let (lp, ent) = head_log_probs(h.clone(), w.clone(), t.clone(), 0.9);
    let (lr, er) = head_log_probs_reference(h, w, t, 0.9);
    close(lp.clone(), lr, 1e-4);
    close(ent.clone(), er, 1e-4);
    // A distribution's entropy is between 0 and log(vocab); log-probabilities are below 0.
    let e: Vec<f32> = ent.into_data().try_to_vec::<f32>().unwrap();
    assert!(
        e.iter().all(|x| *x >= 0.0 && *x <= (29f32).ln() + 1e-4),
        "{e:?}"
    );
    let l: Vec<f32> = lp.into_data().try_to_vec::<f32>().unwrap();
    assert!(l.iter().all(|x| *x <= 1e-6), "{l:?}");
}

#[test]
fn head_chunks_keep_the_logits_small() {
    assert_eq!(head_chunk(16384), 256);
    assert_eq!(head_chunk(64), 65536);
    assert_eq!(head_chunk(0), 1 << 22);
}

/// The additive bias `[b, 1, t, keys]` of causal attention whose `t` queries are the last `t`
/// of `keys` positions (the shared-prefix layout when `keys > t`), with holes: key `j` of row
/// `r` is masked where `(r + 3j) % 5 == 0`, and row 0 has every key masked (a padding row).
fn holed_bias(b: usize, t: usize, keys: usize, dev: &Device) -> Tensor<4> {
    let mut v = Vec::with_capacity(b * t * keys);
    for r in 0..b {
        for i in 0..t {
            for j in 0..keys {
                let allowed = j <= i + (keys - t) && (r + 3 * j) % 5 != 0 && r != 0;
                v.push(if allowed { 0.0f32 } else { -1e9 });
            }
        }
    }
    Tensor::<4>::from_data(TensorData::new(v, [b, 1, t, keys]), dev)
}

/// Values and gradients (of `q`, `k`, `v`) of the fused attention against the reference:
/// grouped-query heads, query blocks of uneven width, masks with holes, a fully masked row,
/// more keys than queries (a shared prefix).
fn check_attention(dims: [usize; 6], block: usize, seed: u64) {
    let [b, heads, kv, t, keys, hd] = dims;
    let dev = device();
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let normal = |s: [usize; 4]| Tensor::<4>::random(s, Distribution::Normal(0.0, 1.0), &dev);
    let (q0, k0, v0) = (
        normal([b, heads, t, hd]),
        normal([b, kv, keys, hd]),
        normal([b, kv, keys, hd]),
    );
    let weights = normal([b, heads, t, hd]);
    let bias = holed_bias(b, t, keys, &base);
    let run = |fused: bool| {
        let leaf = |x: &Tensor<4>| Tensor::<4>::from_data(x.to_data(), &base).require_grad();
        let (q, k, v) = (leaf(&q0), leaf(&k0), leaf(&v0));
        let out = match fused {
            true => Tensor::<4>::from_dispatch(<Dispatch as FusedAttention>::attention_rows(
                q.clone().into_dispatch(),
                k.clone().into_dispatch(),
                v.clone().into_dispatch(),
                bias.clone().into_dispatch(),
                1.0 / (hd as f32).sqrt(),
                block,
            )),
            false => attention_reference(q.clone(), k.clone(), v.clone(), bias.clone()),
        };
        let loss = (out.clone() * Tensor::<4>::from_data(weights.to_data(), &base)).sum();
        let g = loss.backward();
        let flat = |x: Tensor<4>| {
            let n = x.shape().num_elements();
            x.reshape([n])
        };
        [
            flat(out.inner()),
            flat(q.grad(&g).unwrap()),
            flat(k.grad(&g).unwrap()),
            flat(v.grad(&g).unwrap()),
        ]
    };
    let (a, r) = (run(true), run(false));
    for (i, (x, y)) in a.into_iter().zip(r).enumerate() {
        eprintln!("{dims:?} block {block}: {}", ["out", "dq", "dk", "dv"][i]);
        close(x, y, 2e-4);
    }
}

#[test]
fn fused_attention_matches_the_reference_in_values_and_gradients() {
    // [b, heads, kv_heads, t, keys, hd], query block, seed.
    check_attention([3, 6, 2, 7, 7, 4], 3, 1);
    check_attention([2, 4, 4, 5, 9, 8], 1, 2);
    check_attention([4, 3, 1, 6, 6, 5], 64, 3);
    check_attention([2, 9, 3, 13, 20, 6], 4, 4);
    // Decoding steps (one to `FEW_QUERIES` queries after a cache of keys), SmolLM2's heads.
    check_attention([5, 9, 3, 1, 37, 64], 16, 6);
    check_attention([3, 6, 2, 3, 20, 24], 16, 7);
    // Past 2¹⁸ scores per head the backend's forward takes its tiled (flash) path.
    check_attention([2, 2, 1, 520, 520, 4], 100, 5);
}

#[test]
fn fused_attention_without_autodiff_equals_the_reference() {
    let dev = device();
    dev.seed(7);
    let normal = |s: [usize; 4]| Tensor::<4>::random(s, Distribution::Normal(0.0, 2.0), &dev);
    let (q, k, v) = (
        normal([3, 6, 11, 8]),
        normal([3, 2, 15, 8]),
        normal([3, 2, 15, 8]),
    );
    let bias = holed_bias(3, 11, 15, &dev);
    let a = attention(q.clone(), k.clone(), v.clone(), bias.clone()).reshape([3 * 6 * 11 * 8]);
    let r = attention_reference(q, k, v, bias).reshape([3 * 6 * 11 * 8]);
    close(a, r, 1e-4);
}

/// Keys, values and bias given as the filled prefix of larger buffers (a key/value cache's
/// views): read where they lie, the same attention as on dense copies.
#[test]
fn decoding_attention_reads_views_of_a_cache() {
    let dev = device();
    dev.seed(9);
    let normal = |s: [usize; 4]| Tensor::<4>::random(s, Distribution::Normal(0.0, 1.0), &dev);
    let (b, heads, kv, hd, cap, filled) = (4, 9, 3, 64, 50, 23);
    for t in [1, 2] {
        let q = normal([b, heads, t, hd]);
        let (kb, vb) = (normal([b, kv, cap, hd]), normal([b, kv, cap, hd]));
        let bias = holed_bias(b, t, cap, &dev);
        let prefix = |x: &Tensor<4>| x.clone().slice([0..b, 0..kv, 0..filled, 0..hd]);
        let bias_view = bias.clone().slice([0..b, 0..1, 0..t, 0..filled]);
        let got = attention(q.clone(), prefix(&kb), prefix(&vb), bias_view.clone());
        let dense = |x: Tensor<4>| Tensor::<4>::from_data(x.to_data(), &dev);
        let want = attention_reference(q, dense(prefix(&kb)), dense(prefix(&vb)), dense(bias_view));
        let n = b * heads * t * hd;
        close(got.reshape([n]), want.reshape([n]), 1e-5);
    }
}

#[test]
fn attention_blocks_keep_the_scores_small() {
    assert_eq!(attention_block(64 * 9, 512), 16);
    assert_eq!(attention_block(8 * 9, 256), 227);
    assert_eq!(attention_block(0, 0), 1 << 22);
}

/// `x` flattened to one axis.
fn flat<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    let n = x.shape().num_elements();
    x.reshape([n])
}

/// Values and gradients (of `x`, and of `γ` when it trains) of the fused RMSNorm against the
/// reference on `[b, t, d]`.
fn check_rms_norm(dims: [usize; 3], gamma_trains: bool, seed: u64) {
    let dev = device();
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let x0 = Tensor::<3>::random(dims, Distribution::Normal(0.5, 3.0), &dev);
    let g0 = Tensor::<1>::random([dims[2]], Distribution::Normal(1.0, 0.5), &dev);
    let weights = Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &dev);
    let run = |fused: bool| {
        let x = Tensor::<3>::from_data(x0.to_data(), &base).require_grad();
        let g = Tensor::<1>::from_data(g0.to_data(), &base);
        let g = if gamma_trains { g.require_grad() } else { g };
        let y = match fused {
            true => rms_norm(x.clone(), g.clone(), 1e-5),
            false => rms_norm_reference(x.clone(), g.clone(), 1e-5),
        };
        let loss = (y.clone() * Tensor::<3>::from_data(weights.to_data(), &base)).sum();
        let grads = loss.backward();
        let dg = g.grad(&grads).map(flat);
        assert_eq!(dg.is_some(), gamma_trains);
        (flat(y.inner()), flat(x.grad(&grads).unwrap()), dg)
    };
    let (a, r) = (run(true), run(false));
    close(a.0, r.0, 2e-5);
    close(a.1, r.1, 2e-5);
    if let (Some(a), Some(r)) = (a.2, r.2) {
        close(a, r, 1e-3);
    }
}

#[test]
fn fused_rms_norm_matches_the_reference_in_values_and_gradients() {
    // One row; odd widths; enough rows for several tasks (the parallel split).
    check_rms_norm([1, 1, 7], true, 1);
    check_rms_norm([3, 5, 33], true, 2);
    check_rms_norm([2, 3, 17], false, 3);
    check_rms_norm([4, 37, 576], true, 4);
}

/// Values and gradients (of `gate` and `up`) of the fused SwiGLU gate against the reference,
/// gates far into both tails included.
fn check_swiglu(dims: [usize; 3], spread: f64, seed: u64) {
    let dev = device();
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let g0 = Tensor::<3>::random(dims, Distribution::Normal(0.0, spread), &dev);
    let u0 = Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &dev);
    let weights = Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &dev);
    let run = |fused: bool| {
        let leaf = |x: &Tensor<3>| Tensor::<3>::from_data(x.to_data(), &base).require_grad();
        let (g, u) = (leaf(&g0), leaf(&u0));
        let y = match fused {
            true => swiglu(g.clone(), u.clone()),
            false => swiglu_reference(g.clone(), u.clone()),
        };
        let loss = (y.clone() * Tensor::<3>::from_data(weights.to_data(), &base)).sum();
        let grads = loss.backward();
        [
            flat(y.inner()),
            flat(g.grad(&grads).unwrap()),
            flat(u.grad(&grads).unwrap()),
        ]
    };
    for (x, y) in run(true).into_iter().zip(run(false)) {
        close(x, y, 2e-5 * spread.max(1.0));
    }
}

#[test]
fn fused_swiglu_matches_the_reference_in_values_and_gradients() {
    check_swiglu([1, 1, 5], 1.0, 1);
    check_swiglu([3, 7, 41], 3.0, 2);
    check_swiglu([2, 9, 1536], 30.0, 3);
}

#[test]
fn fused_norm_and_gate_without_autodiff_equal_the_references() {
    let dev = device();
    dev.seed(9);
    let x = Tensor::<3>::random([5, 13, 64], Distribution::Normal(0.0, 2.0), &dev);
    let u = Tensor::<3>::random([5, 13, 64], Distribution::Normal(0.0, 2.0), &dev);
    let g = Tensor::<1>::random([64], Distribution::Normal(1.0, 0.3), &dev);
    close(
        flat(rms_norm(x.clone(), g.clone(), 1e-6)),
        flat(rms_norm_reference(x.clone(), g, 1e-6)),
        1e-5,
    );
    close(
        flat(swiglu(x.clone(), u.clone())),
        flat(swiglu_reference(x, u)),
        1e-5,
    );
}

/// The rotary extension's passes (decomposed on the CPU backend, with its hand-written
/// backward keeping only the tables) against [`rope_reference`] under burn's autodiff: values
/// and the input's gradient, 3 heads, 5 positions, head dimension 6, per-sequence tables.
#[test]
fn rope_extension_matches_the_reference_in_values_and_gradients() {
    let dev = device();
    dev.seed(11);
    let ad = dev.clone().autodiff();
    let x0 = Tensor::<4>::random([2, 3, 5, 6], Distribution::Normal(0.0, 1.0), &dev);
    let cos = Tensor::<4>::random([2, 1, 5, 6], Distribution::Uniform(-1.0, 1.0), &ad);
    let sin = Tensor::<4>::random([2, 1, 5, 6], Distribution::Uniform(-1.0, 1.0), &ad);
    let wts = Tensor::<4>::random([2, 3, 5, 6], Distribution::Normal(0.0, 1.0), &ad);
    let run = |fused: bool| {
        let x = Tensor::<4>::from_data(x0.to_data(), &ad).require_grad();
        let y = match fused {
            true => rope(x.clone(), cos.clone(), sin.clone()),
            false => rope_reference(x.clone(), cos.clone(), sin.clone()),
        };
        let g = (y.clone() * wts.clone()).sum().backward();
        (flat(y.inner()), flat(x.grad(&g).unwrap()))
    };
    let (a, b) = (run(true), run(false));
    close(a.0, b.0, 1e-6);
    close(a.1, b.1, 1e-6);
}
