//! The fused head's element-wise passes on the CPU backend (`head.rs`, [`HeadPasses`]): one
//! pass over each chunk of products `zp = h W[chunk]ᵀ`, split over the cores by rows, where the
//! burn-op reference makes six to eight passes and as many `[rows, chunk]` tensors, its `exp`
//! on one core. The formulas are the reference's: the online log-sum-exp of Milakov &
//! Gimelshein (2018), eq. in their Algorithm 3, and the gradient in `head.rs`'s module comment.
//!
//! [`HeadPasses`]: crate::head::HeadPasses

use crate::cpu::{T, dense, elems, exp, per_task, simd, tensor};
use burn::backend::TensorMetadata;
use burn::tensor::Shape;
use rayon::prelude::*;

/// One row's running `(m, s, a)` after the logits `zp · inv_t` (Milakov & Gimelshein 2018,
/// Algorithm 3, with `a = Σ e^{z − m} z` carried beside the sum): `prev` rescaled by
/// `e^{m − m'}` to the new maximum `m'`, plus this row's terms.
#[inline(always)]
fn row_update(zp: &[f32], inv_t: f32, prev: Option<[f32; 3]>) -> [f32; 3] {
    // The largest logit: the largest product, or the smallest where `inv_t` is negative.
    let top = match inv_t >= 0.0 {
        true => crate::cpu::lanes(zp, f32::MIN, f32::max) * inv_t,
        false => crate::cpu::lanes(zp, f32::MAX, f32::min) * inv_t,
    };
    let [m0, s0, a0] = prev.unwrap_or([top, 0.0, 0.0]);
    let m = m0.max(top);
    let rescale = exp(m0 - m);
    let (mut se, mut sz) = ([0f32; 16], [0f32; 16]);
    let chunks = zp.chunks_exact(16);
    let (mut te, mut tz) = (0f32, 0f32);
    for &x in chunks.remainder() {
        let z = x * inv_t;
        let e = exp(z - m);
        te += e;
        tz += e * z;
    }
    for c in chunks {
        for k in 0..16 {
            let z = c[k] * inv_t;
            let e = exp(z - m);
            se[k] += e;
            sz[k] += e * z;
        }
    }
    let s = s0 * rescale + se.iter().sum::<f32>() + te;
    let a = a0 * rescale + sz.iter().sum::<f32>() + tz;
    [m, s, a]
}

/// `[rows, 1]` tensors `m`, `s`, `a` after the chunk `zp` `[rows, n]` ([`row_update`] on each
/// row); `prev` the values after the chunks before it.
pub(crate) fn chunk_update(zp: T, inv_t: f32, prev: Option<(T, T, T)>) -> (T, T, T) {
    let shape = zp.shape();
    let (rows, n) = (shape[0], shape[1]);
    let zp = dense(zp);
    let prev = prev.map(|(m, s, a)| [dense(m), dense(s), dense(a)]);
    let prev_rows = prev.as_ref().map(|p| p.each_ref().map(elems));
    let zs = elems(&zp);
    let mut out = vec![0f32; rows * 3];
    let per = per_task(rows, n);
    out.par_chunks_mut(3 * per)
        .zip(zs.par_chunks((per * n).max(1)))
        .enumerate()
        .for_each(|(task, (out, zs))| {
            simd(
                #[inline(always)]
                || {
                    for (j, (o, z)) in out.chunks_mut(3).zip(zs.chunks(n.max(1))).enumerate() {
                        let r = task * per + j;
                        let before = prev_rows.map(|[m, s, a]| [m[r], s[r], a[r]]);
                        o.copy_from_slice(&row_update(z, inv_t, before));
                    }
                },
            )
        });
    let column = |k: usize| {
        let v: Vec<f32> = out.iter().skip(k).step_by(3).copied().collect();
        tensor(v, Shape::new([rows, 1]))
    };
    (column(0), column(1), column(2))
}

/// `∂L/∂zp = −p (g_lp + g_H (z − E[z])) · inv_t`, `z = zp · inv_t`, `p = e^{z − lse}`, for the
/// chunk `zp` `[rows, n]`; `stats` = `[lse, E[z], g_lp, g_H]`, `[rows, 1]` each.
pub(crate) fn chunk_grad(zp: T, inv_t: f32, stats: [T; 4]) -> T {
    let shape = zp.shape();
    let (rows, n) = (shape[0], shape[1]);
    let zp = dense(zp);
    let stats = stats.map(dense);
    let [lse, ez, g_lp, g_ent] = stats.each_ref().map(elems);
    let zs = elems(&zp);
    let mut out = vec![0f32; zs.len()];
    let per = per_task(rows, n);
    out.par_chunks_mut((per * n).max(1))
        .zip(zs.par_chunks((per * n).max(1)))
        .enumerate()
        .for_each(|(task, (out, zs))| {
            simd(
                #[inline(always)]
                || {
                    for (j, (o, z)) in out
                        .chunks_mut(n.max(1))
                        .zip(zs.chunks(n.max(1)))
                        .enumerate()
                    {
                        let r = task * per + j;
                        let (l, e, gl, gh) = (lse[r], ez[r], g_lp[r], g_ent[r]);
                        for (o, &x) in o.iter_mut().zip(z) {
                            let z = x * inv_t;
                            *o = -exp(z - l) * (gl + gh * (z - e)) * inv_t;
                        }
                    }
                },
            )
        });
    tensor(out, shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::head::{HeadPasses, RowStats, Running};
    use burn::backend::Flex;

    /// `rows × n` values spread over about ±`scale`, from a fixed integer hash.
    fn values(rows: usize, n: usize, scale: f32, seed: usize) -> T {
        let v = (0..rows * n)
            .map(|i| {
                let h = (i * 2_654_435_761 + seed * 40_503) % 10_007;
                (h as f32 / 10_007.0 - 0.5) * 2.0 * scale
            })
            .collect();
        tensor(v, Shape::new([rows, n]))
    }

    fn vec_of(x: &T) -> Vec<f32> {
        elems(&dense(x.clone())).to_vec()
    }

    /// Equal within `rel` of the larger magnitude (or `1e-6` absolute near zero).
    fn assert_close(a: &T, b: &T, rel: f32, what: &str) {
        let (a, b) = (vec_of(a), vec_of(b));
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let tol = rel * x.abs().max(y.abs()).max(1e-6 / rel);
            assert!((x - y).abs() <= tol, "{what}[{i}]: {x} against {y}");
        }
    }

    /// The one-pass update and gradient equal the burn-op reference (`head.rs`) on rows split
    /// over several tasks with a ragged last task, widths that are not a multiple of 16, two
    /// chunks in a row (the second rescaling the first's sums), and a negative `inv_t`.
    #[test]
    fn chunk_passes_match_the_reference() {
        for (rows, n, inv_t) in [(70, 600, 1.3), (5, 17, -0.7), (1, 3, 1.0), (40, 1000, 0.5)] {
            let (z1, z2) = (values(rows, n, 6.0, 1), values(rows, n, 9.0, 2));
            let first = <Flex as HeadPasses>::head_chunk_update(z1.clone(), inv_t, None);
            let first_ref = crate::head::chunk_update::<Flex>(z1, inv_t, None);
            let both = <Flex as HeadPasses>::head_chunk_update(z2.clone(), inv_t, Some(first));
            let both_ref = crate::head::chunk_update::<Flex>(z2.clone(), inv_t, Some(first_ref));
            let Running { m, s, a } = both;
            let want = both_ref;
            assert_close(&m, &want.m, 1e-6, "m");
            assert_close(&s, &want.s, 2e-5, "s");
            assert_close(&a, &want.a, 2e-5, "a");
            let stats = RowStats::<Flex> {
                lse: values(rows, 1, 3.0, 3),
                ez: values(rows, 1, 2.0, 4),
                g_lp: values(rows, 1, 1.0, 5),
                g_ent: values(rows, 1, 0.5, 6),
            };
            let dz = <Flex as HeadPasses>::head_chunk_grad(z2.clone(), inv_t, stats.clone());
            let dz_ref = crate::head::chunk_grad::<Flex>(z2, inv_t, stats);
            assert_close(&dz, &dz_ref, 2e-5, "dz");
        }
    }
}
