//! The preallocated key/value cache of batched decoding.
//!
//! Buffers of a fixed capacity `[batch, kv_heads, capacity, head_dim]` per layer are written in
//! place, and attention always runs over the whole buffer under a key mask, so every decode
//! step runs the same kernels with the same shapes (no shape-driven recompiles on GPU
//! backends). Capacities are rounded up to a bucket so that different prompt lengths share
//! shapes too. A cache may instead grow as positions are written ([`KvCache::growing_to`]):
//! where shapes need not stay few (the CPU), batched sampling starts with room for the first
//! tokens and doubles, so that the rows still running when it grows, not every row, pay for
//! the full length.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use std::ops::Range;

/// Rounds `needed` up to a multiple of `bucket`.
pub fn bucketed(needed: usize, bucket: usize) -> usize {
    needed.div_ceil(bucket.max(1)) * bucket.max(1)
}

/// The sizes a cache is built from (`Llama::cache_shape`): layers, key/value heads, head
/// dimension, and the dtype the keys and values are stored in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheShape {
    /// Decoder layers.
    pub layers: usize,
    /// Key/value heads per layer.
    pub kv_heads: usize,
    /// Dimension of a head.
    pub head_dim: usize,
    /// The stored dtype (the model's activation dtype).
    pub dtype: DType,
}

/// Per-layer keys and values, the key mask and each row's next position id.
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Tensor<4>>,
    v: Vec<Tensor<4>>,
    key_mask: Tensor<2>,
    next_pos: Tensor<2, Int>,
    len: usize,
    capacity: usize,
    /// The most positions it grows to (its capacity unless [`KvCache::growing_to`]).
    limit: usize,
    /// Capacities it grows to are multiples of this.
    bucket: usize,
}

impl KvCache {
    /// An empty cache for `batch` rows and `capacity` positions.
    pub fn new(shape: CacheShape, batch: usize, capacity: usize, device: &Device) -> Self {
        let (kv, hd, dt) = (shape.kv_heads, shape.head_dim, shape.dtype);
        let zeros = || Tensor::<4>::zeros([batch, kv, capacity, hd], (device, dt));
        Self {
            k: (0..shape.layers).map(|_| zeros()).collect(),
            v: (0..shape.layers).map(|_| zeros()).collect(),
            key_mask: Tensor::zeros([batch, capacity], device),
            next_pos: Tensor::zeros([batch, 1], device),
            len: 0,
            capacity,
            limit: capacity,
            bucket: 1,
        }
    }

    /// This cache growing, as positions are written, up to `limit` positions: each time it is
    /// full its capacity doubles (rounded up to a multiple of `bucket`, at most `limit`).
    pub fn growing_to(mut self, limit: usize, bucket: usize) -> Self {
        self.limit = limit.max(self.capacity);
        self.bucket = bucket.max(1);
        self
    }

    /// Grows, where allowed, to hold `t` more positions.
    fn make_room(&mut self, t: usize) {
        let needed = self.len + t;
        if needed > self.capacity && needed <= self.limit {
            let doubled = bucketed((2 * self.capacity).max(needed), self.bucket);
            self.grow(self.rows(), doubled.min(self.limit));
        }
    }

    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total positions.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Position ids of `t` new tokens with mask `mask` `[batch, t]`: continuing each row's count
    /// of real tokens (padding gets the position of the previous real token, as in HF).
    pub(crate) fn positions_for(&self, mask: &Tensor<2>) -> Tensor<2, Int> {
        let offset = mask.clone().cumsum(1) - 1.0;
        (self.next_pos.clone().float() + offset)
            .clamp_min(0.0)
            .int()
    }

    /// Records the mask of `t` new positions.
    pub(crate) fn append_mask(&mut self, mask: Tensor<2>) {
        let [b, t] = mask.dims();
        self.make_room(t);
        assert!(
            self.len + t <= self.capacity,
            "KV cache overflow: {} + {t} > {}",
            self.len,
            self.capacity
        );
        self.next_pos = self.next_pos.clone() + mask.clone().sum_dim(1).int();
        self.key_mask = self
            .key_mask
            .clone()
            .slice_assign([0..b, self.len..self.len + t], mask);
    }

    /// Additive attention bias `[batch, 1, t, capacity]` for `t` queries starting at `start`:
    /// keys must be real and not in the future.
    pub(crate) fn attention_bias(&self, start: usize, t: usize) -> Tensor<4> {
        let [b, cap] = self.key_mask.dims();
        let device = self.key_mask.device();
        let keys = self.key_mask.clone().reshape([b, 1, 1, cap]);
        let allowed = if t == 1 {
            // Future positions are not written yet: the key mask alone is causal.
            keys
        } else {
            let causal: Vec<f32> = (0..t)
                .flat_map(|i| (0..cap).map(move |j| if j <= start + i { 1.0 } else { 0.0 }))
                .collect();
            let causal = Tensor::<2>::from_data(TensorData::new(causal, [t, cap]), &device);
            keys * causal.reshape([1, 1, t, cap])
        };
        (allowed.neg() + 1.0) * -1e9
    }

    /// Writes layer `layer`'s keys/values `[batch, kv, t, hd]` at `start`; returns the whole
    /// buffers.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        start: usize,
        k: Tensor<4>,
        v: Tensor<4>,
    ) -> (Tensor<4>, Tensor<4>) {
        let [b, kv, t, hd] = k.dims();
        let range = [0..b, 0..kv, start..start + t, 0..hd];
        (
            assign_in_place(&mut self.k, layer, range.clone(), k),
            assign_in_place(&mut self.v, layer, range, v),
        )
    }

    /// The rows picked by `idx` (from [`repeat_index`]): a prompt prefilled once serves its
    /// `n` samples.
    pub(crate) fn repeat_rows(self, idx: &Tensor<1, Int>) -> Self {
        let rep = |t: Tensor<4>| t.select(0, idx.clone());
        Self {
            k: self.k.into_iter().map(rep).collect(),
            v: self.v.into_iter().map(rep).collect(),
            key_mask: self.key_mask.select(0, idx.clone()),
            next_pos: self.next_pos.select(0, idx.clone()),
            len: self.len,
            capacity: self.capacity,
            limit: self.limit,
            bucket: self.bucket,
        }
    }

    /// Moves the write position on by `t`.
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }

    /// Rows (slots).
    pub(crate) fn rows(&self) -> usize {
        self.key_mask.dims()[0]
    }

    /// Writes row `from` of `src` (all of its `src.len()` written positions) into row `slot`
    /// at positions `at..at + src.len()`, with its key mask and next position id; the slot's
    /// other positions become masked keys.
    pub(crate) fn place_row(&mut self, slot: usize, src: &KvCache, from: usize, at: usize) {
        let n = src.len;
        for layer in 0..self.k.len() {
            let [_, kv, _, hd] = src.k[layer].dims();
            let pick = |t: &Tensor<4>| t.clone().slice([from..from + 1, 0..kv, 0..n, 0..hd]);
            let to = [slot..slot + 1, 0..kv, at..at + n, 0..hd];
            assign_in_place(&mut self.k, layer, to.clone(), pick(&src.k[layer]));
            assign_in_place(&mut self.v, layer, to, pick(&src.v[layer]));
        }
        let device = self.key_mask.device();
        let row = Tensor::<2>::zeros([1, self.capacity], &device).slice_assign(
            [0..1, at..at + n],
            src.key_mask.clone().slice([from..from + 1, 0..n]),
        );
        self.key_mask = self
            .key_mask
            .clone()
            .slice_assign([slot..slot + 1, 0..self.capacity], row);
        self.next_pos = self.next_pos.clone().slice_assign(
            [slot..slot + 1, 0..1],
            src.next_pos.clone().slice([from..from + 1, 0..1]),
        );
    }

    /// Grows to `rows` rows and `capacity` positions (no-ops where already that large); the new
    /// entries are zeros and masked.
    pub(crate) fn grow(&mut self, rows: usize, capacity: usize) {
        let (b, cap) = (self.rows(), self.capacity);
        let (rows, capacity) = (rows.max(b), capacity.max(cap));
        if (rows, capacity) == (b, cap) {
            return;
        }
        let device = self.key_mask.device();
        let widen = |t: Tensor<4>| -> Tensor<4> {
            let [_, kv, _, hd] = t.dims();
            let dt = t.dtype();
            let t = if capacity > cap {
                let pad = Tensor::<4>::zeros([b, kv, capacity - cap, hd], (&device, dt));
                Tensor::cat(vec![t, pad], 2)
            } else {
                t
            };
            if rows > b {
                let pad = Tensor::<4>::zeros([rows - b, kv, capacity, hd], (&device, dt));
                Tensor::cat(vec![t, pad], 0)
            } else {
                t
            }
        };
        self.k = std::mem::take(&mut self.k).into_iter().map(widen).collect();
        self.v = std::mem::take(&mut self.v).into_iter().map(widen).collect();
        let mask = Tensor::<2>::zeros([rows, capacity], &device);
        self.key_mask = mask.slice_assign([0..b, 0..cap], self.key_mask.clone());
        let pos = Tensor::<2, Int>::zeros([rows, 1], &device);
        self.next_pos = pos.slice_assign([0..b, 0..1], self.next_pos.clone());
        self.capacity = capacity;
    }

    /// Keeps the rows `keep` (in that order) and drops the first `shift` positions, so that
    /// what was at position `shift` is at 0; the capacity stays, the freed end masked.
    ///
    /// # Panics
    /// When `keep` is empty or `shift` is past the written positions.
    pub(crate) fn compact(&mut self, keep: &[usize], shift: usize) {
        assert!(
            !keep.is_empty() && shift <= self.len,
            "compact: nothing kept"
        );
        let device = self.key_mask.device();
        let idx: Vec<i64> = keep.iter().map(|&r| r as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [keep.len()]), &device);
        let (rows, cap, len) = (keep.len(), self.capacity, self.len);
        let squeeze = |t: Tensor<4>| -> Tensor<4> {
            let [_, kv, _, hd] = t.dims();
            let dt = t.dtype();
            let t = t.select(0, idx.clone());
            if shift == 0 {
                return t;
            }
            let kept = t.slice([0..rows, 0..kv, shift..cap, 0..hd]);
            let pad = Tensor::<4>::zeros([rows, kv, shift, hd], (&device, dt));
            Tensor::cat(vec![kept, pad], 2)
        };
        self.k = std::mem::take(&mut self.k)
            .into_iter()
            .map(squeeze)
            .collect();
        self.v = std::mem::take(&mut self.v)
            .into_iter()
            .map(squeeze)
            .collect();
        let mask = self.key_mask.clone().select(0, idx.clone());
        self.key_mask = if shift == 0 {
            mask
        } else {
            Tensor::cat(
                vec![
                    mask.slice([0..rows, shift..cap]),
                    Tensor::zeros([rows, shift], &device),
                ],
                1,
            )
        };
        self.next_pos = self.next_pos.clone().select(0, idx);
        self.len = len - shift;
    }
}

/// Writes `value` into `bufs[i]` at `range` and returns the updated buffer. The buffer is taken
/// out of the list first, so the backend holds its only reference and writes in place
/// (burn-flex copies a shared buffer whole: for the KV cache that was every layer's
/// `[batch, kv_heads, capacity, head_dim]` per decoded token).
fn assign_in_place(
    bufs: &mut Vec<Tensor<4>>,
    i: usize,
    range: [Range<usize>; 4],
    value: Tensor<4>,
) -> Tensor<4> {
    let written = bufs.remove(i).slice_assign(range, value);
    bufs.insert(i, written.clone());
    written
}

/// Row indices `0, 0, …, 1, 1, …` with each of `rows` rows repeated `n` times (rows
/// `i·n .. (i+1)·n` select row `i`), for `select(0, ·)`.
pub(crate) fn repeat_index(rows: usize, n: usize, device: &Device) -> Tensor<1, Int> {
    let idx: Vec<i64> = (0..rows as i64)
        .flat_map(|r| std::iter::repeat_n(r, n))
        .collect();
    Tensor::<1, Int>::from_data(TensorData::new(idx, [rows * n]), device)
}
