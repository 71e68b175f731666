//! Attention for a few query positions (decoding steps) on the CPU backend (`attention.rs`):
//! one task per sequence and key/value head, whose `groups × t` query rows each take their
//! scores against every key (dot products of `hd` elements), the bias, a softmax and the
//! weighted sum of the values, all in the first-level cache. A decoding step's products are
//! `1 × hd · hd × keys` per head, where a matrix product spends most of its time packing.
//! Keys, values and the bias are read where they lie when each head's rows are contiguous (the
//! filled prefix of a key/value cache, sliced from its buffers, is such a view): no copy.

use crate::cpu::{T, dense, dot, elems, exp, lanes, simd, tensor};
use burn::tensor::Shape;
use rayon::prelude::*;

/// Query positions up to which [`attend`] serves the forward pass (a decoding step has one).
pub(crate) const FEW_QUERIES: usize = 4;

/// `softmax(q kᵀ · scale + bias) v` for `q` `[b, kv·g, t, hd]`, `k`, `v` `[b, kv, keys, hd]`,
/// `bias` `[b, 1, t, keys]` → `[b, kv·g, t, hd]` (query head `h·g + i` reads key/value head `h`);
/// `dims` is `[b, kv, g, t, keys, hd]`.
pub(crate) fn attend(q: T, k: T, v: T, bias: T, dims: [usize; 6], scale: f32) -> T {
    let [b, kv, g, t, keys, hd] = dims;
    let q = dense(q);
    let qs = elems(&q);
    // Each head's `[keys, hd]` block, and each sequence's `[t, keys]` bias, contiguous.
    let (k, v, bias) = (rows_view(k, hd), rows_view(v, hd), rows_view(bias, keys));
    let (ks, vs, bs) = (k.slice(), v.slice(), bias.slice());
    let mut out = vec![0f32; b * kv * g * t * hd];
    let rows = g * t * hd;
    out.par_chunks_mut(rows.max(1))
        .enumerate()
        .for_each(|(i, o)| {
            let (bi, h) = (i / kv.max(1), i % kv.max(1));
            let head = Head {
                q: &qs[i * rows..(i + 1) * rows],
                k: &ks[k.at(bi, h)..][..keys * hd],
                v: &vs[v.at(bi, h)..][..keys * hd],
                bias: &bs[bias.at(bi, 0)..][..t * keys],
                t,
                hd,
                scale,
            };
            simd(
                #[inline(always)]
                || head.run(o),
            )
        });
    tensor(out, Shape::new([b, kv * g, t, hd]))
}

/// A 4-D tensor `[n0, n1, r, w]` whose `[r, w]` blocks each lie contiguous (rows of `w`
/// elements one after the other), read where it lies; any other layout is made dense first.
struct RowsView {
    t: T,
    offset: usize,
    strides: [usize; 2],
}

/// `x` as a [`RowsView`] with `w` elements a row.
fn rows_view(x: T, w: usize) -> RowsView {
    let layout = x.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    let s = |d: usize| usize::try_from(strides[d]).ok();
    let blocks = match (s(0), s(1), s(2), s(3)) {
        (Some(s0), Some(s1), Some(s2), Some(1)) if s2 == w || shape[2] <= 1 => Some([s0, s1]),
        _ => None,
    };
    match (blocks, crate::cpu::is_f32(&x)) {
        (Some(strides), true) => RowsView {
            offset: layout.start_offset(),
            strides,
            t: x,
        },
        _ => {
            let [n1, r] = [shape[1], shape[2]];
            RowsView {
                t: dense(x),
                offset: 0,
                strides: [n1 * r * w, r * w],
            }
        }
    }
}

impl RowsView {
    /// The storage the view reads.
    fn slice(&self) -> &[f32] {
        self.t.storage::<f32>()
    }

    /// Where block `(i0, i1)` starts.
    fn at(&self, i0: usize, i1: usize) -> usize {
        self.offset + i0 * self.strides[0] + i1 * self.strides[1]
    }
}

/// One sequence's key/value head and the query rows that read it.
struct Head<'a> {
    /// `[g, t, hd]`.
    q: &'a [f32],
    /// `[keys, hd]` each.
    k: &'a [f32],
    v: &'a [f32],
    /// `[t, keys]`.
    bias: &'a [f32],
    t: usize,
    hd: usize,
    scale: f32,
}

impl Head<'_> {
    /// Fills `out` (`[g, t, hd]`, zeroed) with every query row's attention.
    #[inline(always)]
    fn run(&self, out: &mut [f32]) {
        let hd = self.hd.max(1);
        let keys = self.k.len() / hd;
        let mut p = vec![0f32; keys];
        for (r, (qr, o)) in self
            .q
            .chunks_exact(hd)
            .zip(out.chunks_exact_mut(hd))
            .enumerate()
        {
            let bias = &self.bias[r % self.t * keys..][..keys];
            for ((p, kr), &c) in p.iter_mut().zip(self.k.chunks_exact(hd)).zip(bias) {
                *p = dot(qr, kr) * self.scale + c;
            }
            let max = lanes(&p, f32::MIN, f32::max);
            p.iter_mut().for_each(|x| *x = exp(*x - max));
            let inv = 1.0 / lanes(&p, 0.0, |a, b| a + b);
            for (&w, vr) in p.iter().zip(self.v.chunks_exact(hd)) {
                let w = w * inv;
                for (o, &x) in o.iter_mut().zip(vr) {
                    *o += w * x;
                }
            }
        }
    }
}
