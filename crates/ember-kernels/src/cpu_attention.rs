//! Attention for a few query positions (decoding steps) on the CPU backend (`attention.rs`):
//! one task per sequence and key/value head, whose `groups × t` query rows each take their
//! scores against every key (dot products of `hd` elements), the bias, a softmax and the
//! weighted sum of the values, all in the first-level cache. A decoding step's products are
//! `1 × hd · hd × keys` per head, where a matrix product spends most of its time packing.

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
    let (q, k, v, bias) = (dense(q), dense(k), dense(v), dense(bias));
    let (qs, ks, vs, bs) = (elems(&q), elems(&k), elems(&v), elems(&bias));
    let mut out = vec![0f32; b * kv * g * t * hd];
    let rows = g * t * hd;
    out.par_chunks_mut(rows.max(1))
        .enumerate()
        .for_each(|(i, o)| {
            let at = i * keys * hd..(i + 1) * keys * hd;
            let head = Head {
                q: &qs[i * rows..(i + 1) * rows],
                k: &ks[at.clone()],
                v: &vs[at],
                bias: &bs[i / kv * t * keys..(i / kv + 1) * t * keys],
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
