//! The few-row product `x · W` on the CPU backend (`gemv.rs`): one task per core, each taking a
//! contiguous block of `W`'s rows (so that each core streams one contiguous range of memory,
//! which the hardware prefetcher follows best) and writing the partial products of its block;
//! the partials are then summed. Within a task the running sums of every input row stay in the
//! cache while the task walks down its rows of `W`, each weight read once.

use crate::cpu::simd;
use rayon::prelude::*;

/// Weights up to which a product is left to burn's (on one core): waking the pool costs more
/// than streaming a matrix this small (256 KiB of f32) takes.
const SERIAL_WEIGHTS: usize = 1 << 16;

/// Running sums a tile keeps (256 KiB of f32, within the second-level cache): wider outputs are
/// computed a tile of columns at a time.
const TILE_SUMS: usize = 1 << 16;

/// Whether a `[k, m]` weight is large enough for [`products`] to split it over the cores.
pub(crate) fn splits(k: usize, m: usize) -> bool {
    k.saturating_mul(m) > SERIAL_WEIGHTS && rayon::current_num_threads() > 1
}

/// `xs · w` for `xs` `[n, k]` and `w` `[k, m]`, both row-major: `[n, m]` row-major.
pub(crate) fn products(xs: &[f32], w: &[f32], [n, k, m]: [usize; 3]) -> Vec<f32> {
    if n == 0 || k == 0 || m == 0 || xs.len() < n * k || w.len() < k * m {
        return vec![0f32; n.saturating_mul(m)];
    }
    let tasks = rayon::current_num_threads().clamp(1, k);
    let per = k.div_ceil(tasks);
    let mut parts: Vec<Vec<f32>> = (0..k.div_ceil(per))
        .into_par_iter()
        .map(|t| {
            let rows = t * per..((t + 1) * per).min(k);
            simd(
                #[inline(always)]
                || block(xs, w, [n, k, m], rows.clone()),
            )
        })
        .collect();
    let mut y = parts.swap_remove(0);
    for p in parts {
        simd(
            #[inline(always)]
            || {
                for (a, b) in y.iter_mut().zip(&p) {
                    *a += b;
                }
            },
        );
    }
    y
}

/// `xs[:, rows] · w[rows, :]`: `[n, m]` row-major, a tile of columns at a time.
#[inline(always)]
fn block(xs: &[f32], w: &[f32], [n, k, m]: [usize; 3], rows: std::ops::Range<usize>) -> Vec<f32> {
    let mut out = vec![0f32; n * m];
    let tile = (TILE_SUMS / n).max(64).next_multiple_of(16).min(m);
    let mut acc = vec![0f32; n * tile];
    for t0 in (0..m).step_by(tile) {
        let tw = tile.min(m - t0);
        let acc = &mut acc[..n * tw];
        acc.fill(0.0);
        let ws = w[rows.start * m..rows.end * m].chunks_exact(m);
        for (kk, wrow) in rows.clone().zip(ws) {
            let wr = &wrow[t0..t0 + tw];
            for (r, a) in acc.chunks_exact_mut(tw).enumerate() {
                let xv = xs[r * k + kk];
                for (a, &b) in a.iter_mut().zip(wr) {
                    *a += xv * b;
                }
            }
        }
        for (o, a) in out.chunks_exact_mut(m).zip(acc.chunks_exact(tw)) {
            o[t0..t0 + tw].copy_from_slice(a);
        }
    }
    out
}
