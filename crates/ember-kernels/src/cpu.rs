//! The element-wise kernels on the CPU backend: one pass over contiguous f32 slices where burn's
//! decomposed ops make one pass (and one tensor) per op, split over the cores with rayon and
//! compiled for the CPU's widest vectors (`pulp`'s runtime dispatch: AVX-512 or AVX2, else
//! SSE2). Every loop body is branch-free, so the compiler vectorises it, `exp` included
//! ([`exp`]).

use burn::backend::{Flex, TensorMetadata, tensor::FloatTensor};
use burn::tensor::{DType, Shape, TensorData};
use rayon::prelude::*;

/// A CPU tensor (burn-flex's `FlexTensor`).
pub(crate) type T = FloatTensor<Flex>;

/// Elements one task takes at least: below twice this a kernel runs on the calling thread.
const TASK: usize = 1 << 14;

/// `x` as a contiguous f32 tensor (itself when it already is one).
pub(crate) fn dense(x: T) -> T {
    match x.as_slice::<f32>() {
        Some(_) => x,
        None => x.to_contiguous(),
    }
}

/// Whether `x` is f32 (what these kernels take; the callers take the reference otherwise).
pub(crate) fn is_f32(x: &T) -> bool {
    x.dtype() == DType::F32
}

/// The f32 elements of a tensor made by [`dense`].
pub(crate) fn elems(x: &T) -> &[f32] {
    x.as_slice::<f32>().unwrap_or(&[])
}

/// A tensor of `shape` holding `v`.
pub(crate) fn tensor(v: Vec<f32>, shape: Shape) -> T {
    T::from_data(TensorData::new(v, shape))
}

/// Units (rows or elements) per task for `n` units of `width` elements: about [`TASK`]
/// elements a task, all of them in one task when there are fewer than `2·TASK`.
pub(crate) fn per_task(n: usize, width: usize) -> usize {
    let total = n.saturating_mul(width.max(1));
    if total < 2 * TASK {
        n.max(1)
    } else {
        (TASK / width.max(1)).max(1)
    }
}

/// Runs `f` compiled for the widest vectors the CPU has. `f` must be a closure marked
/// `#[inline(always)]`: a closure the compiler leaves out of line is compiled for the baseline
/// CPU (SSE2), whatever `pulp` chose.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// `exp(x)` in f32 without a branch or a call, so that loops over it vectorise: Cephes `expf`'s
/// range reduction `x = n ln 2 + r`, |r| ≤ ln 2 / 2, and its degree-6 polynomial for `e^r`
/// (relative error about 2·10⁻⁷), scaled by `2ⁿ` through the exponent bits. The input is
/// clamped to [−87, 88], where `2ⁿ` stays a normal f32: `exp(−87) ≈ 1.6·10⁻³⁸` stands for
/// anything smaller, `exp(88) ≈ 1.7·10³⁸` for anything larger.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // 1.5·2²³: adding it rounds to the nearest integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: i32 = 0x4B40_0000;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_345e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    let k = t.to_bits() as i32 - ROUND_BITS;
    e * f32::from_bits(((k + 127) << 23) as u32)
}

/// `Σ aᵢ bᵢ` in sixteen running sums (one vector register's lanes), so that it vectorises.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..16 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `x` folded with `f` in sixteen running values (one vector register's lanes), then across
/// them: a maximum or a sum that vectorises (a single running value makes each step wait for
/// the one before).
#[inline(always)]
pub(crate) fn lanes(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder().iter().fold(init, |a, &v| f(a, v));
    for c in chunks {
        for k in 0..16 {
            acc[k] = f(acc[k], c[k]);
        }
    }
    acc.iter().fold(tail, |a, &v| f(a, v))
}

/// The logistic function `1 / (1 + e^{−x})` through [`exp`].
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `silu(g)·u` element-wise (`gate`, `up` and the output of one shape).
pub(crate) fn swiglu(gate: T, up: T) -> T {
    let shape = gate.shape();
    let (gate, up) = (dense(gate), dense(up));
    let (g, u) = (elems(&gate), elems(&up));
    let mut out = vec![0f32; g.len()];
    let chunk = per_task(g.len(), 1);
    out.par_chunks_mut(chunk)
        .zip(g.par_chunks(chunk).zip(u.par_chunks(chunk)))
        .for_each(|(o, (g, u))| {
            simd(
                #[inline(always)]
                || {
                    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                        *o = g * sigmoid(g) * u;
                    }
                },
            )
        });
    tensor(out, shape)
}

/// `(∂L/∂gate, ∂L/∂up)` of `silu(g)·u` from the output's gradient `dy`: with `s = σ(g)`,
/// `∂/∂u = dy·g·s` and `∂/∂g = dy·u·s·(1 + g(1 − s))`.
pub(crate) fn swiglu_grad(gate: T, up: T, dy: T) -> (T, T) {
    let shape = gate.shape();
    let (gate, up, dy) = (dense(gate), dense(up), dense(dy));
    let (g, u, dy) = (elems(&gate), elems(&up), elems(&dy));
    let (mut dg, mut du) = (vec![0f32; g.len()], vec![0f32; g.len()]);
    let chunk = per_task(g.len(), 1);
    dg.par_chunks_mut(chunk)
        .zip(du.par_chunks_mut(chunk))
        .zip(g.par_chunks(chunk).zip(u.par_chunks(chunk)))
        .zip(dy.par_chunks(chunk))
        .for_each(|(((dg, du), (g, u)), dy)| {
            simd(
                #[inline(always)]
                || {
                    for i in 0..dg
                        .len()
                        .min(du.len())
                        .min(g.len())
                        .min(u.len())
                        .min(dy.len())
                    {
                        let (g, s) = (g[i], sigmoid(g[i]));
                        du[i] = dy[i] * g * s;
                        dg[i] = dy[i] * u[i] * s * (1.0 + g * (1.0 - s));
                    }
                },
            )
        });
    (tensor(dg, shape.clone()), tensor(du, shape))
}

/// RMSNorm of the rows of `x` `[rows, d]`: `y = x · r · γ` with `r = 1/√(mean(x²) + ε)`;
/// returns `(y, r)`, `r` `[rows, 1]`.
pub(crate) fn rms_norm(x: T, gamma: T, eps: f32) -> (T, T) {
    let shape = x.shape();
    let (rows, d) = (shape[0], shape[1]);
    let (x, gamma) = (dense(x), dense(gamma));
    let (xs, gs) = (elems(&x), elems(&gamma));
    let (mut y, mut r) = (vec![0f32; xs.len()], vec![0f32; rows]);
    let n = per_task(rows, d);
    y.par_chunks_mut((n * d).max(1))
        .zip(r.par_chunks_mut(n))
        .zip(xs.par_chunks((n * d).max(1)))
        .for_each(|((y, r), xs)| {
            simd(
                #[inline(always)]
                || {
                    for ((y, r), x) in y.chunks_mut(d).zip(r.iter_mut()).zip(xs.chunks(d)) {
                        let ss = dot(x, x);
                        *r = 1.0 / (ss / d as f32 + eps).sqrt();
                        for ((y, &x), &g) in y.iter_mut().zip(x).zip(gs) {
                            *y = x * *r * g;
                        }
                    }
                },
            )
        });
    (tensor(y, shape), tensor(r, Shape::new([rows, 1])))
}

/// `(∂L/∂x, ∂L/∂γ)` of [`rms_norm`] from `dy` `[rows, d]`: with `gy = dy ∘ γ`,
/// `∂L/∂x = r·gy − x · r³ · Σ(x ∘ gy) / d` per row, `∂L/∂γ = Σ_rows dy ∘ x · r`.
pub(crate) fn rms_norm_grad(x: T, gamma: T, r: T, dy: T) -> (T, T) {
    let shape = x.shape();
    let d = shape[1];
    let (x, gamma, r, dy) = (dense(x), dense(gamma), dense(r), dense(dy));
    let (xs, gs, rs, dys) = (elems(&x), elems(&gamma), elems(&r), elems(&dy));
    let mut dx = vec![0f32; xs.len()];
    let n = per_task(rs.len(), d);
    let w = (n * d).max(1);
    // Each task's partial ∂γ, summed afterwards in task order: a rayon `reduce` would combine
    // them in an order set by work stealing, so the last bits of ∂γ (and, through the gradient
    // norm, of a whole run) would depend on the machine's load.
    let parts: Vec<Vec<f32>> = dx
        .par_chunks_mut(w)
        .zip(xs.par_chunks(w).zip(dys.par_chunks(w)))
        .zip(rs.par_chunks(n))
        .map(|((dx, (xs, dys)), rs)| {
            let (mut dg, mut gy) = (vec![0f32; d], vec![0f32; d]);
            simd(
                #[inline(always)]
                || {
                    let rows = dx.chunks_mut(d).zip(xs.chunks(d)).zip(dys.chunks(d));
                    for (((dx, x), dy), &r) in rows.zip(rs) {
                        for ((g, &dy), &w) in gy.iter_mut().zip(dy).zip(gs) {
                            *g = dy * w;
                        }
                        let c = r * r * r * dot(x, &gy) / d as f32;
                        for i in 0..d.min(dx.len()).min(x.len()).min(dy.len()) {
                            dx[i] = r * gy[i] - x[i] * c;
                            dg[i] += dy[i] * x[i] * r;
                        }
                    }
                },
            );
            dg
        })
        .collect();
    let mut dgamma = vec![0f32; d];
    for p in parts {
        dgamma.iter_mut().zip(p).for_each(|(a, b)| *a += b);
    }
    (tensor(dx, shape), tensor(dgamma, Shape::new([d])))
}

/// `softmax(s · scale + bias)` over the last axis of `s` `[b, m, tq, keys]` (any leading split
/// of `b·m·tq` rows), `bias` `[b, 1, 1, tq, keys]` shared by the `m` rows of each batch entry
/// and position: three passes over each row (max, `exp` and sum, scale) in place of burn's
/// five whole-tensor ones.
pub(crate) fn softmax_biased(s: T, bias: T, scale: f32) -> T {
    let shape = s.shape();
    let n = shape.num_dims();
    let (keys, tq, b) = (shape[n - 1], shape[n - 2], shape[0]);
    let (s, bias) = (dense(s), dense(bias));
    let (ss, bs) = (elems(&s), elems(&bias));
    let rows = ss.len() / keys.max(1);
    let per_b = rows / b.max(1);
    let mut out = vec![0f32; ss.len()];
    let m = per_task(rows, keys);
    out.par_chunks_mut((m * keys).max(1))
        .zip(ss.par_chunks((m * keys).max(1)))
        .enumerate()
        .for_each(|(task, (out, ss))| {
            simd(
                #[inline(always)]
                || {
                    for (j, (o, s)) in out.chunks_mut(keys).zip(ss.chunks(keys)).enumerate() {
                        let row = task * m + j;
                        let at = (row / per_b.max(1) * tq + row % tq) * keys;
                        let bias = &bs[at.min(bs.len())..(at + keys).min(bs.len())];
                        for ((o, &s), &c) in o.iter_mut().zip(s).zip(bias) {
                            *o = s * scale + c;
                        }
                        let max = lanes(o, f32::MIN, f32::max);
                        o.iter_mut().for_each(|o| *o = exp(*o - max));
                        let inv = 1.0 / lanes(o, 0.0, |a, b| a + b);
                        o.iter_mut().for_each(|o| *o *= inv);
                    }
                },
            )
        });
    tensor(out, shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ∂γ of the norm is the sum of every task's partial in task order, bit for bit, however
    /// the pool's workers steal: here the pool is kept busy by other parallel work while the
    /// same gradient is taken 24 times, and each equals the partials summed one by one.
    #[test]
    fn norm_gamma_gradient_sums_in_task_order() {
        let (rows, d) = (512, 256);
        let vals = |seed: u32| -> Vec<f32> {
            (0..rows * d)
                .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32)
                .map(|v| v / (1u32 << 24) as f32 - 0.5)
                .collect()
        };
        let t = |v: Vec<f32>, s: [usize; 2]| tensor(v, Shape::new(s));
        let (x, dy) = (vals(1), vals(2));
        let r: Vec<f32> = (0..rows).map(|i| 1.0 + i as f32 / rows as f32).collect();
        let gamma = vec![0.5f32; d];
        let grad = || {
            let (_, dg) = rms_norm_grad(
                t(x.clone(), [rows, d]),
                t(gamma.clone(), [1, d]).reshape(Shape::new([d])),
                t(r.clone(), [rows, 1]),
                t(dy.clone(), [rows, d]),
            );
            elems(&dg).to_vec()
        };
        // The partials one task at a time, in order (`per_task`'s split), summed in order.
        let n = per_task(rows, d);
        let mut want = vec![0f32; d];
        for rows_of_task in (0..rows).collect::<Vec<_>>().chunks(n) {
            let mut dg = vec![0f32; d];
            for &i in rows_of_task {
                for k in 0..d {
                    dg[k] += dy[i * d + k] * x[i * d + k] * r[i];
                }
            }
            want.iter_mut().zip(dg).for_each(|(a, b)| *a += b);
        }
        let busy = std::sync::atomic::AtomicBool::new(true);
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            s.spawn(|| {
                while busy.load(std::sync::atomic::Ordering::Relaxed) {
                    let v: f32 = (0..1 << 16).into_par_iter().map(|i| i as f32).sum();
                    std::hint::black_box(v);
                }
            });
            let got = (0..24).map(|_| grad()).collect();
            busy.store(false, std::sync::atomic::Ordering::Relaxed);
            got
        });
        for g in got {
            assert_eq!(g, want);
        }
    }

    #[test]
    fn exp_matches_the_library_within_a_few_ulp() {
        let mut worst = 0f32;
        for i in -8700..8800 {
            let x = i as f32 * 0.01 + 0.003;
            let (a, b) = (exp(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        // Beyond the clamp: the smallest and largest values it stands for, never 0, ∞ or NaN.
        assert_eq!(exp(-1000.0), (-87f32).exp());
        assert!((exp(1000.0) / 88f32.exp() - 1.0).abs() < 4e-7);
        assert_eq!(sigmoid(-1000.0), sigmoid(-88.0));
        assert!(sigmoid(-1000.0) > 0.0 && sigmoid(-1000.0) < 1e-38);
        assert_eq!(sigmoid(1000.0), 1.0);
    }

    #[test]
    fn zero_width_rows_do_not_panic() {
        let (y, r) = rms_norm(
            tensor(vec![], Shape::new([3, 0])),
            tensor(vec![], Shape::new([0])),
            1e-6,
        );
        assert_eq!((elems(&y).len(), elems(&r).len()), (0, 3));
        let (dx, dg) = rms_norm_grad(
            tensor(vec![], Shape::new([3, 0])),
            tensor(vec![], Shape::new([0])),
            r,
            tensor(vec![], Shape::new([3, 0])),
        );
        assert_eq!((elems(&dx).len(), elems(&dg).len()), (0, 0));
    }

    #[test]
    fn tasks_split_large_work_and_keep_small_work_whole() {
        assert_eq!(per_task(10, 576), 10);
        assert_eq!(per_task(64, 576), 28);
        assert_eq!(per_task(100_000, 1), TASK);
        assert_eq!(per_task(0, 576), 1);
    }
}
