//! Grouped-query attention `softmax(q kᵀ · scale + bias) v` whose backward pass keeps no score
//! matrix: the forward pass is the backend's own attention op (flex's fused kernel holds one
//! head's scores at a time; on the CPU, the probabilities of one block of queries at a time
//! through the fused softmax of the backward pass, which is faster there, and for a decoding
//! step's few queries one pass per head without matrix products, `cpu_attention.rs`)
//! and the backward pass keeps only the inputs and the output, and
//! recomputes the probabilities one block of queries at a time (FlashAttention's backward, Dao
//! et al. 2022, Algorithm 4, with the query blocks as the outer loop: each block sees all its
//! keys, so its softmax is recomputed whole instead of from a saved log-sum-exp).
//!
//! With `s = q kᵀ · scale + bias`, `p = softmax(s)`, `o = p v`, `D = rowsum(dO ∘ o)`:
//! `dV = pᵀ dO`, `dP = dO vᵀ`, `dS = p ∘ (dP − D)`, `dQ = dS k · scale`, `dK = dSᵀ q · scale`.
//! The bias (the masks) takes no gradient.
//!
//! Query head `kv·groups + g` reads key/value head `kv` (HF `repeat_kv`): the `groups` query
//! heads of one key/value head are the rows of one product, so keys and values are never
//! copied, and their gradients sum over the group in that product.

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, Slice, TensorMetadata, backend_extension, tensor::FloatTensor};
use burn::tensor::Shape;
use burn::tensor::ops::AttentionModuleOptions;

/// The fused attention as a burn backend extension: the CPU backend runs the blocked forward,
/// CubeCL devices (wgpu, CUDA) the blocked forward and backward in burn's CubeCL ops, the
/// autodiff backend adds the recomputing backward.
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait FusedAttention: Backend {
    /// `[b, heads, t, hd]`: `softmax(q kᵀ · scale + bias) v` for `q` `[b, heads, t, hd]`, `k`,
    /// `v` `[b, kv_heads, keys, hd]` (`heads` a multiple of `kv_heads`), `bias` `[b, 1, t,
    /// keys]`; the backward pass recomputes `block` query positions at a time.
    fn attention_rows(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        block: usize,
    ) -> FloatTensor<Self> {
        let _ = block;
        forward::<Self>(&Inputs { q, k, v, bias }, scale)
    }

    /// [`attention_rows`](FusedAttention::attention_rows) as training's forward pass computes
    /// it (its output is what the backward pass keeps): the backend's own attention op by
    /// default.
    fn attention_train(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        block: usize,
    ) -> FloatTensor<Self> {
        let _ = block;
        forward::<Self>(&Inputs { q, k, v, bias }, scale)
    }

    /// `softmax(qk · scale + bias)` over the last axis: the probabilities the backward pass
    /// recomputes, from `qk` `[b, kv, g, tq, keys]` and `bias` `[b, 1, 1, tq, keys]`.
    fn attention_probs(
        qk: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        probs::<Self>(qk, bias, scale)
    }
}

/// The decomposed [`FusedAttention::attention_probs`]: scale, add, burn's softmax.
fn probs<B: Backend>(qk: FloatTensor<B>, bias: FloatTensor<B>, scale: f32) -> FloatTensor<B> {
    let s = B::float_add(B::float_mul_scalar(qk, scale.into()), bias);
    B::softmax(s, 4)
}

#[cfg(feature = "flex")]
impl FusedAttention for burn::backend::Flex {
    fn attention_rows(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        block: usize,
    ) -> FloatTensor<Self> {
        let x: Inputs<Self> = Inputs { q, k, v, bias };
        let d = Dims::of(&x);
        let f32s = [&x.q, &x.k, &x.v, &x.bias]
            .into_iter()
            .all(crate::cpu::is_f32);
        let fits = x.bias.shape().num_elements() == d.b * d.t * d.keys;
        match f32s && fits {
            true if d.t <= crate::cpu_attention::FEW_QUERIES => {
                let dims = [d.b, d.kv, d.g, d.t, d.keys, x.q.shape()[3]];
                crate::cpu_attention::attend(x.q, x.k, x.v, x.bias, dims, scale)
            }
            true => blocked::<Self>(&x, d, scale, block),
            false => forward::<Self>(&x, scale),
        }
    }

    fn attention_probs(
        qk: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let [b, tq, keys] = {
            let s = qk.shape();
            [s[0], s[s.num_dims() - 2], s[s.num_dims() - 1]]
        };
        let fits = bias.shape().num_elements() == b * tq * keys;
        match crate::cpu::is_f32(&qk) && crate::cpu::is_f32(&bias) && fits {
            true => crate::cpu::softmax_biased(qk, bias, scale),
            false => probs::<Self>(qk, bias, scale),
        }
    }
}

/// On CubeCL devices both passes go block by block (burn's own attention op there repeats no
/// key/value heads for grouped queries, and its fallback holds every head's scores).
#[cfg(feature = "cube")]
impl FusedAttention for burn::backend::Cube {
    fn attention_rows(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        block: usize,
    ) -> FloatTensor<Self> {
        let x: Inputs<Self> = Inputs { q, k, v, bias };
        blocked::<Self>(&x, Dims::of(&x), scale, block)
    }

    fn attention_train(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        block: usize,
    ) -> FloatTensor<Self> {
        Self::attention_rows(q, k, v, bias, scale, block)
    }
}

/// The attention's inputs.
#[derive(Debug, Clone)]
struct Inputs<B: Backend> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    bias: FloatTensor<B>,
}

/// The sizes: batch, key/value heads, groups (query heads per key/value head), query
/// positions, keys.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    kv: usize,
    g: usize,
    t: usize,
    keys: usize,
}

impl Dims {
    fn of<B: Backend>(x: &Inputs<B>) -> Self {
        let (qs, ks) = (x.q.shape(), x.k.shape());
        Dims {
            b: qs[0],
            kv: ks[1],
            g: qs[1] / ks[1].max(1),
            t: qs[2],
            keys: ks[2],
        }
    }

    /// The query blocks `[start, end)`, `block` positions wide.
    fn blocks(self, block: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
        let block = block.max(1);
        (0..self.t)
            .step_by(block)
            .map(move |s| s..(s + block).min(self.t))
    }
}

/// `parts` joined along `dim` (one part as it is).
fn cat<B: Backend>(mut parts: Vec<FloatTensor<B>>, dim: usize) -> FloatTensor<B> {
    match parts.len() {
        1 => parts.remove(0),
        _ => B::float_cat(parts, dim),
    }
}

fn shape<const N: usize>(dims: [usize; N]) -> Shape {
    Shape::new(dims)
}

/// Positions `r` of a `[b, heads, t, n]` tensor as `[b, kv, g·|r|, n]`: the rows of one
/// key/value head's product.
fn rows_of<B: Backend>(x: &FloatTensor<B>, d: Dims, r: std::ops::Range<usize>) -> FloatTensor<B> {
    let n = x.shape()[3];
    let tq = r.len();
    if tq == d.t {
        return B::float_reshape(x.clone(), shape([d.b, d.kv, d.g * tq, n]));
    }
    let x = B::float_reshape(x.clone(), shape([d.b, d.kv, d.g, d.t, n]));
    let all = |m: usize| Slice::from(0..m);
    let x = B::float_slice(x, &[all(d.b), all(d.kv), all(d.g), Slice::from(r), all(n)]);
    B::float_reshape(x, shape([d.b, d.kv, d.g * tq, n]))
}

/// `[b, kv, g·tq, n]` back to `[b, heads, tq, n]`.
fn heads_of<B: Backend>(x: FloatTensor<B>, d: Dims, tq: usize) -> FloatTensor<B> {
    let n = x.shape()[3];
    B::float_reshape(x, shape([d.b, d.kv * d.g, tq, n]))
}

/// The probabilities of the query positions `r`, `[b, kv, g, tq, keys]`:
/// `softmax(q kᵀ · scale + bias)`.
fn probs_of<B: Backend + FusedAttention>(
    x: &Inputs<B>,
    d: Dims,
    r: std::ops::Range<usize>,
    scale: f32,
) -> FloatTensor<B> {
    let tq = r.len();
    let q = rows_of::<B>(&x.q, d, r.clone());
    let s = B::float_matmul(q, B::float_transpose(x.k.clone()));
    let s = B::float_reshape(s, shape([d.b, d.kv, d.g, tq, d.keys]));
    let all = |m: usize| Slice::from(0..m);
    let bias = match tq == d.t {
        true => x.bias.clone(),
        false => B::float_slice(
            x.bias.clone(),
            &[all(d.b), all(1), Slice::from(r), all(d.keys)],
        ),
    };
    B::attention_probs(
        s,
        B::float_reshape(bias, shape([d.b, 1, 1, tq, d.keys])),
        scale,
    )
}

/// The forward pass: the backend's own attention op (on the CPU backend a fused kernel that
/// never holds more than one head's scores, tiled with an online softmax on long rows).
fn forward<B: Backend>(x: &Inputs<B>, scale: f32) -> FloatTensor<B> {
    let options = AttentionModuleOptions {
        scale: Some(f64::from(scale)),
        softcap: None,
        is_causal: false,
    };
    B::attention(
        x.q.clone(),
        x.k.clone(),
        x.v.clone(),
        None,
        Some(x.bias.clone()),
        options,
    )
}

/// The forward pass one block of `block` query positions at a time, through the probabilities
/// the backward pass recomputes ([`FusedAttention::attention_probs`]): `o = p v` per block.
#[cfg(any(feature = "flex", feature = "cube"))]
fn blocked<B: Backend + FusedAttention>(
    x: &Inputs<B>,
    d: Dims,
    scale: f32,
    block: usize,
) -> FloatTensor<B> {
    let parts = d
        .blocks(block)
        .map(|r| {
            let tq = r.len();
            let p = probs_of::<B>(x, d, r, scale);
            let p = B::float_reshape(p, shape([d.b, d.kv, d.g * tq, d.keys]));
            heads_of::<B>(B::float_matmul(p, x.v.clone()), d, tq)
        })
        .collect();
    cat::<B>(parts, 2)
}

/// The backward pass's saved tensors.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    x: Inputs<B>,
    out: FloatTensor<B>,
    scale: f32,
    block: usize,
}

/// The recomputing backward of [`FusedAttention::attention_rows`].
#[derive(Debug)]
struct AttentionBackward;

impl<B: Backend + FusedAttention> Backward<B, 3> for AttentionBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (dq, dk, dv) = attention_grads::<B>(&ops.state, grad);
        for (node, g) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

/// `(∂L/∂q, ∂L/∂k, ∂L/∂v)` from the output's gradient `dO` `[b, heads, t, hd]`, block by block
/// (the formulas in the module's comment).
fn attention_grads<B: Backend + FusedAttention>(
    st: &Saved<B>,
    d_out: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let x = &st.x;
    let d = Dims::of(x);
    // D = rowsum(dO ∘ o) `[b, kv, g, t, 1]`.
    let dd = B::float_sum_dim(B::float_mul(d_out.clone(), st.out.clone()), 3);
    let dd = B::float_reshape(dd, shape([d.b, d.kv, d.g, d.t, 1]));
    let all = |m: usize| Slice::from(0..m);
    let (mut dq, mut dk, mut dv) = (Vec::new(), None, None);
    let add = |acc: Option<FloatTensor<B>>, part: FloatTensor<B>| match acc {
        Some(a) => B::float_add(a, part),
        None => part,
    };
    for r in d.blocks(st.block) {
        let tq = r.len();
        let rows = [
            all(d.b),
            all(d.kv),
            all(d.g),
            Slice::from(r.clone()),
            all(1),
        ];
        let p = probs_of::<B>(x, d, r.clone(), st.scale);
        let p = B::float_reshape(p, shape([d.b, d.kv, d.g * tq, d.keys]));
        let go = rows_of::<B>(&d_out, d, r.clone());
        dv = Some(add(
            dv,
            B::float_matmul(B::float_transpose(p.clone()), go.clone()),
        ));
        let dp = B::float_matmul(go, B::float_transpose(x.v.clone()));
        let dp = B::float_reshape(dp, shape([d.b, d.kv, d.g, tq, d.keys]));
        let ds = B::float_mul(
            B::float_reshape(p, shape([d.b, d.kv, d.g, tq, d.keys])),
            B::float_sub(dp, B::float_slice(dd.clone(), &rows)),
        );
        let ds = B::float_reshape(
            B::float_mul_scalar(ds, st.scale.into()),
            shape([d.b, d.kv, d.g * tq, d.keys]),
        );
        dq.push(heads_of::<B>(
            B::float_matmul(ds.clone(), x.k.clone()),
            d,
            tq,
        ));
        let q = rows_of::<B>(&x.q, d, r);
        dk = Some(add(dk, B::float_matmul(B::float_transpose(ds), q)));
    }
    let zeros = || B::float_mul_scalar(x.k.clone(), 0f32.into());
    (
        cat::<B>(dq, 2),
        dk.unwrap_or_else(zeros),
        dv.unwrap_or_else(zeros),
    )
}

/// The output `[b, heads, t, hd]` as a view of one contiguous `[b, t, heads, hd]` copy: the
/// caller's `swap_dims(1, 2)` and fold into `[b, t, heads·hd]` (W_o's input, which its product
/// keeps for backward) then reuse the copy the backward pass keeps instead of making another.
fn packed<B: Backend>(out: FloatTensor<B>) -> FloatTensor<B> {
    let [b, h, t, hd] = [0, 1, 2, 3].map(|i| out.shape()[i]);
    let rows = B::float_reshape(B::float_swap_dims(out, 1, 2), shape([b, t, h * hd]));
    B::float_swap_dims(B::float_reshape(rows, shape([b, t, h, hd])), 1, 2)
}

impl<B: Backend + FusedAttention, C: CheckpointStrategy> FusedAttention for Autodiff<B, C> {
    fn attention_rows(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        scale: f32,
        block: usize,
    ) -> FloatTensor<Self> {
        match AttentionBackward
            .prepare::<C>([q.node(), k.node(), v.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let x: Inputs<B> = Inputs {
                    q: q.primitive().clone(),
                    k: k.primitive().clone(),
                    v: v.primitive().clone(),
                    bias: bias.into_primitive(),
                };
                // On the CPU the backend's own op, not the blocked forward: training's forward,
                // measured both ways there, ran no faster blocked (`benches/README.md`).
                let (q, k, v, bias) = (x.q.clone(), x.k.clone(), x.v.clone(), x.bias.clone());
                let out = packed::<B>(B::attention_train(q, k, v, bias, scale, block));
                let saved = Saved {
                    x,
                    out: out.clone(),
                    scale,
                    block,
                };
                prep.finish(saved, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::attention_rows(
                q.into_primitive(),
                k.into_primitive(),
                v.into_primitive(),
                bias.into_primitive(),
                scale,
                block,
            )),
        }
    }
}
