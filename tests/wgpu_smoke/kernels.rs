//! Ember's kernels on a CubeCL device (wgpu on lavapipe in CI) against their decomposed
//! references on the CPU backend: values and gradients to 1e-4 in f32, on odd shapes, a
//! temperature and vocabulary chunks of uneven width for the head, grouped-query heads, more
//! keys than queries (a shared prefix) and a mask with holes for attention, per-sequence tables
//! for the rotary embedding.

use burn::backend::Dispatch;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use ember_kernels::{FusedAttention, FusedHead, Kernel, op};

use super::{max_diff, values};

/// A random `[dims]` tensor's values, the same on every device.
fn random(dims: &[usize], seed: u64) -> Vec<f32> {
    let cpu = Device::flex();
    cpu.seed(seed);
    let n: usize = dims.iter().product();
    values(Tensor::<1>::random(
        [n],
        Distribution::Normal(0.0, 1.0),
        &cpu,
    ))
}

/// `data` on `device`'s autodiff device, tracked.
fn tracked<const D: usize>(data: &[f32], dims: [usize; D], device: &Device) -> Tensor<D> {
    let ad = device.clone().autodiff();
    Tensor::<D>::from_data(TensorData::new(data.to_vec(), dims), &ad).require_grad()
}

/// `data` on `device`'s autodiff device, untracked.
fn constant<const D: usize>(data: &[f32], dims: [usize; D], device: &Device) -> Tensor<D> {
    let ad = device.clone().autodiff();
    Tensor::<D>::from_data(TensorData::new(data.to_vec(), dims), &ad)
}

/// Asserts two runs' outputs and gradients (`(name, values)` each) agree to `tol`.
fn agree(what: &str, got: Vec<(&str, Vec<f32>)>, want: Vec<(&str, Vec<f32>)>, tol: f32) {
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        let d = max_diff(g, w);
        eprintln!("{what} {name}: max difference {d:.2e}");
        assert!(d < tol, "{what}: {name} differs by {d}");
    }
}

/// RMSNorm and SwiGLU through `op` (the fused kernels on `gpu`) against their references on
/// the CPU: the outputs and the gradients of a weighted sum.
fn norm_and_gate(gpu: &Device) {
    let (x, y) = (random(&[3, 7, 37], 1), random(&[3, 7, 37], 2));
    let gamma: Vec<f32> = random(&[37], 3).iter().map(|v| 1.0 + 0.1 * v).collect();
    let wts = random(&[3, 7, 37], 4);
    let run = |dev: &Device, fused: bool| {
        let (xt, yt) = (tracked(&x, [3, 7, 37], dev), tracked(&y, [3, 7, 37], dev));
        let g = tracked(&gamma, [37], dev);
        let (norm, gate) = match fused {
            true => (
                op::rms_norm(xt.clone(), g.clone(), 1e-5),
                op::swiglu(xt.clone(), yt.clone()),
            ),
            false => (
                ember_kernels::rms_norm_reference(xt.clone(), g.clone(), 1e-5),
                ember_kernels::swiglu_reference(xt.clone(), yt.clone()),
            ),
        };
        // Each forward kernel read on its own first, so that a failure names its kernel.
        let _ = (values(norm.clone().inner()), values(gate.clone().inner()));
        let w = constant(&wts, [3, 7, 37], dev);
        let loss = (norm.clone() * w.clone()).sum() + (gate.clone() * w * 0.5).sum();
        let gr = loss.backward();
        vec![
            ("rmsnorm", values(norm.inner())),
            ("swiglu", values(gate.inner())),
            ("∂x", values(xt.grad(&gr).unwrap())),
            ("∂up", values(yt.grad(&gr).unwrap())),
            ("∂γ", values(g.grad(&gr).unwrap())),
        ]
    };
    agree(
        "rmsnorm+swiglu",
        run(gpu, true),
        run(&Device::flex(), false),
        1e-4,
    );
}

/// The fused head, four uneven vocabulary chunks at temperature 0.7, against the whole logits'
/// `log_softmax` on the CPU: log-probs, entropies and the gradients of `h` and `W`.
fn head(gpu: &Device) {
    let (rows, vocab, d, chunk) = (13, 101, 40, 32);
    let (h, w) = (random(&[rows, d], 5), random(&[vocab, d], 6));
    let targets: Vec<i64> = (0..rows).map(|r| ((r * 31 + 7) % vocab) as i64).collect();
    let wts = random(&[rows], 7);
    let run = |dev: &Device, fused: bool| {
        let (ht, wt) = (tracked(&h, [rows, d], dev), tracked(&w, [vocab, d], dev));
        let ad = dev.clone().autodiff();
        let t = Tensor::<1, Int>::from_data(TensorData::from(targets.as_slice()), &ad);
        let (lp, ent) = match fused {
            true => {
                let out =
                    Tensor::<2>::from_dispatch(<Dispatch as FusedHead>::head_log_prob_entropy(
                        ht.clone().into_dispatch(),
                        wt.clone().into_dispatch(),
                        t.into_dispatch(),
                        1.0 / 0.7,
                        chunk,
                        false,
                    ));
                let lp = out.clone().slice([0..rows, 0..1]).reshape([rows]);
                (lp, out.slice([0..rows, 1..2]).reshape([rows]))
            }
            false => ember_kernels::head_log_probs_reference(ht.clone(), wt.clone(), t, 0.7),
        };
        let c = constant(&wts, [rows], dev);
        let loss = (lp.clone() * c.clone()).sum() + (ent.clone() * c * 0.3).sum();
        let gr = loss.backward();
        vec![
            ("log-prob", values(lp.inner())),
            ("entropy", values(ent.inner())),
            ("∂h", values(ht.grad(&gr).unwrap())),
            ("∂W", values(wt.grad(&gr).unwrap())),
        ]
    };
    agree("head", run(gpu, true), run(&Device::flex(), false), 1e-4);
}

/// Attention with 4 query heads on 2 key/value heads, 9 queries over 11 keys (a 2-key shared
/// prefix), a causal mask with holes, in query blocks of 4, against the whole scores on the
/// CPU: the output and the gradients of `q`, `k` and `v`.
fn attention(gpu: &Device) {
    let (b, h, kv, t, keys, hd) = (2, 4, 2, 9, 11, 8);
    let (q, k, v) = (
        random(&[b, h, t, hd], 8),
        random(&[b, kv, keys, hd], 9),
        random(&[b, kv, keys, hd], 10),
    );
    let mut bias = vec![0f32; b * t * keys];
    for (i, m) in bias.iter_mut().enumerate() {
        let (row, key) = ((i / keys) % t, i % keys);
        // Causal after the prefix, and every fifth key of the second sequence masked.
        let hole = i >= t * keys && key % 5 == 3;
        if key > row + 2 || hole {
            *m = -1e9;
        }
    }
    let wts = random(&[b, h, t, hd], 11);
    let run = |dev: &Device, fused: bool| {
        let qt = tracked(&q, [b, h, t, hd], dev);
        let (kt, vt) = (
            tracked(&k, [b, kv, keys, hd], dev),
            tracked(&v, [b, kv, keys, hd], dev),
        );
        let mask = constant(&bias, [b, 1, t, keys], dev);
        let out = match fused {
            true => Tensor::<4>::from_dispatch(<Dispatch as FusedAttention>::attention_rows(
                qt.clone().into_dispatch(),
                kt.clone().into_dispatch(),
                vt.clone().into_dispatch(),
                mask.into_dispatch(),
                1.0 / (hd as f32).sqrt(),
                4,
            )),
            false => ember_kernels::attention_reference(qt.clone(), kt.clone(), vt.clone(), mask),
        };
        let loss = (out.clone() * constant(&wts, [b, h, t, hd], dev)).sum();
        let gr = loss.backward();
        vec![
            ("output", values(out.inner())),
            ("∂q", values(qt.grad(&gr).unwrap())),
            ("∂k", values(kt.grad(&gr).unwrap())),
            ("∂v", values(vt.grad(&gr).unwrap())),
        ]
    };
    agree(
        "attention",
        run(gpu, true),
        run(&Device::flex(), false),
        1e-4,
    );
}

/// The rotary embedding through `op` (the kernel on `gpu`) against its reference on the CPU,
/// 3 heads of dimension 10 over 7 positions with per-sequence tables, the heads a transposed
/// view of `[b, t, heads, d]` as the model's are: the output and the input's gradient.
fn rope(gpu: &Device) {
    let (x, cos, sin) = (
        random(&[2, 7, 3, 10], 12),
        random(&[2, 1, 7, 10], 13),
        random(&[2, 1, 7, 10], 14),
    );
    let wts = random(&[2, 3, 7, 10], 15);
    let run = |dev: &Device, fused: bool| {
        let xt = tracked(&x, [2, 7, 3, 10], dev);
        let heads = xt.clone().swap_dims(1, 2);
        let (c, s) = (
            constant(&cos, [2, 1, 7, 10], dev),
            constant(&sin, [2, 1, 7, 10], dev),
        );
        let y = match fused {
            true => op::rope(heads, &c, &s),
            false => ember_kernels::rope_reference(heads, c, s),
        };
        let gr = (y.clone() * constant(&wts, [2, 3, 7, 10], dev))
            .sum()
            .backward();
        vec![
            ("output", values(y.inner())),
            ("∂x", values(xt.grad(&gr).unwrap())),
        ]
    };
    agree("rope", run(gpu, true), run(&Device::flex(), false), 1e-4);
}

/// The elementwise and row kernels past one grid axis's 65 535 cubes (cubes spill to the
/// second axis): SwiGLU over 65 535 · 256 + 1 000 elements and RMSNorm over 70 000 rows, against
/// the references on the CPU.
fn big_grids(gpu: &Device) {
    let n = 65_535 * 256 + 1_000;
    let (g, u) = (random(&[n], 16), random(&[n], 17));
    let (x, gamma) = (random(&[70_000, 8], 18), random(&[8], 19));
    let run = |dev: &Device, fused: bool| {
        let at = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), dev);
        let rows = Tensor::<2>::from_data(TensorData::new(x.clone(), [70_000, 8]), dev);
        let (gate, norm) = match fused {
            true => (
                op::swiglu(at(&g), at(&u)),
                op::rms_norm(rows, at(&gamma), 1e-5),
            ),
            false => (
                ember_kernels::swiglu_reference(at(&g), at(&u)),
                ember_kernels::rms_norm_reference(rows, at(&gamma), 1e-5),
            ),
        };
        vec![("swiglu", values(gate)), ("rmsnorm", values(norm))]
    };
    agree("grids", run(gpu, true), run(&Device::flex(), false), 1e-4);
}

/// Every kernel Ember has for CubeCL devices, on `gpu`.
pub fn check_all(gpu: &Device) {
    let kernels = [
        Kernel::Head,
        Kernel::Attention,
        Kernel::RmsNorm,
        Kernel::Swiglu,
        Kernel::Rope,
    ];
    for k in kernels {
        assert!(op::runs(k, gpu), "{} does not run on {gpu:?}", k.name());
    }
    assert!(
        !op::runs(Kernel::Rope, &Device::flex()),
        "rope is a CubeCL kernel"
    );
    norm_and_gate(gpu);
    head(gpu);
    attention(gpu);
    rope(gpu);
    big_grids(gpu);
}
