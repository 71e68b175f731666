//! The LM head's chosen-token log-probability and entropy, fused: `z = h Wᵀ / T` is visited in
//! vocabulary chunks with an online log-sum-exp (Milakov & Gimelshein 2018, "Online normalizer
//! calculation for softmax"), so no `[rows, vocab]` tensor outlives one chunk; the backward pass
//! recomputes each chunk's logits (as Liger-Kernel's fused linear cross-entropy and TRL's fused
//! LM head do) and writes only the hidden-state gradient, and the head's when it trains.
//!
//! With `p = softmax(z)`, `lse = log Σ exp z`, `E[z] = Σ p z`:
//! `log p_t = z_t − lse`, `H = lse − E[z]`;
//! `∂ log p_t / ∂z = onehot(t) − p`, `∂H/∂z = −p (z − E[z])`.

use crate::amx::{FusedAmx, product, rounded};
use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{
    Backend, Slice, TensorMetadata, backend_extension,
    tensor::{FloatTensor, IntTensor},
};
use burn::tensor::IndexingUpdateOp;

/// The fused head as a burn backend extension: the CPU backend runs the chunked forward, the
/// autodiff backend adds the recomputing backward.
#[backend_extension(Flex: cfg(feature = "flex"), Cube: cfg(feature = "cube"), Autodiff)]
pub trait FusedHead: Backend + FusedAmx {
    /// `[rows, 2]`: column 0 the log-probability of `targets[r]` under `softmax(h Wᵀ · inv_t)`,
    /// column 1 that distribution's entropy. `h` `[rows, d]`, `w` `[vocab, d]`, `targets`
    /// `[rows]`; `chunk` vocabulary columns at a time; the products in bf16 (`amx.rs`) when
    /// `bf16`.
    fn head_log_prob_entropy(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        targets: IntTensor<Self>,
        inv_t: f32,
        chunk: usize,
        bf16: bool,
    ) -> FloatTensor<Self> {
        forward::<Self>(h, w, targets, Scale { inv_t, chunk, bf16 }).out
    }
}

/// CubeCL devices (wgpu, CUDA) run the decomposed passes in burn's CubeCL ops, which burn's
/// fusion joins into few kernels; the autodiff backend's hand-written backward keeps what it
/// keeps on the CPU.
#[cfg(feature = "cube")]
impl FusedHead for burn::backend::Cube {}

#[cfg(feature = "flex")]
impl FusedHead for burn::backend::Flex {}

/// How the head's logits are computed: `z = h Wᵀ · inv_t`, `chunk` vocabulary columns at a time,
/// the products in bf16 when `bf16`.
#[derive(Debug, Clone, Copy)]
struct Scale {
    inv_t: f32,
    chunk: usize,
    bf16: bool,
}

/// What the forward pass keeps for the backward pass.
struct Forward<B: Backend> {
    /// `[rows, 2]`: log-probability, entropy.
    out: FloatTensor<B>,
    /// `[rows, 1]`: the log-sum-exp of each row's logits.
    lse: FloatTensor<B>,
    /// `[rows, 1]`: each row's expected logit `E[z]`.
    ez: FloatTensor<B>,
}

/// The vocabulary chunks `[start, end)` of `vocab` columns, `chunk` wide.
fn chunks(vocab: usize, chunk: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..vocab)
        .step_by(chunk.max(1))
        .map(move |s| s..(s + chunk.max(1)).min(vocab))
}

/// One chunk's logits `h W[s..e]ᵀ · inv_t`, `[rows, e − s]`.
fn logits<B: Backend + FusedAmx>(
    h: &FloatTensor<B>,
    w: &FloatTensor<B>,
    cols: std::ops::Range<usize>,
    sc: Scale,
) -> FloatTensor<B> {
    let d = w.shape()[1];
    let wc = B::float_slice(w.clone(), &[Slice::from(cols), Slice::from(0..d)]);
    let z = product::<B>(h.clone(), B::float_transpose(wc), sc.bf16);
    B::float_mul_scalar(z, sc.inv_t.into())
}

/// The element-wise maximum `(a + b + |a − b|) / 2` (no comparison mask needed).
fn maximum<B: Backend>(a: FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
    let gap = B::float_abs(B::float_sub(a.clone(), b.clone()));
    B::float_mul_scalar(B::float_add(B::float_add(a, b), gap), 0.5f32.into())
}

/// The chosen tokens' logits `(h · W[t]) · inv_t`, `[rows, 1]` (from bf16-rounded inputs where
/// the chunks' products round theirs, so that `log p_t ≤ 0` holds).
fn chosen<B: Backend>(
    h: &FloatTensor<B>,
    w: &FloatTensor<B>,
    targets: &IntTensor<B>,
    sc: Scale,
) -> FloatTensor<B> {
    let rows_w = rounded::<B>(B::float_select(w.clone(), 0, targets.clone()), sc.bf16);
    let dot = B::float_sum_dim(B::float_mul(rounded::<B>(h.clone(), sc.bf16), rows_w), 1);
    B::float_mul_scalar(dot, sc.inv_t.into())
}

/// The forward pass: a running maximum `m`, `s = Σ exp(z − m)` and `a = Σ exp(z − m) z` over the
/// chunks, then `lse = m + log s`, `E[z] = a / s`.
fn forward<B: Backend + FusedAmx>(
    h: FloatTensor<B>,
    w: FloatTensor<B>,
    targets: IntTensor<B>,
    sc: Scale,
) -> Forward<B> {
    let vocab = w.shape()[0];
    let mut acc: Option<(FloatTensor<B>, FloatTensor<B>, FloatTensor<B>)> = None;
    for c in chunks(vocab, sc.chunk) {
        let z = logits::<B>(&h, &w, c, sc);
        let zmax = B::float_max_dim(z.clone(), 1);
        let (m, s, a) = match acc.take() {
            None => {
                let zero = B::float_mul_scalar(zmax.clone(), 0f32.into());
                (zmax, zero.clone(), zero)
            }
            Some((m, s, a)) => {
                let mn = maximum::<B>(m.clone(), zmax);
                let scale = B::float_exp(B::float_sub(m, mn.clone()));
                (mn, B::float_mul(s, scale.clone()), B::float_mul(a, scale))
            }
        };
        let e = B::float_exp(B::float_sub(z.clone(), m.clone()));
        let s = B::float_add(s, B::float_sum_dim(e.clone(), 1));
        let a = B::float_add(a, B::float_sum_dim(B::float_mul(e, z), 1));
        acc = Some((m, s, a));
    }
    let Some((m, s, a)) = acc else {
        panic!("head_log_prob_entropy: an empty vocabulary");
    };
    let lse = B::float_add(m, B::float_log(s.clone()));
    let ez = B::float_div(a, s);
    let lp = B::float_sub(chosen::<B>(&h, &w, &targets, sc), lse.clone());
    let ent = B::float_sub(lse.clone(), ez.clone());
    Forward {
        out: B::float_cat(vec![lp, ent], 1),
        lse,
        ez,
    }
}

/// The backward pass's saved tensors.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    h: FloatTensor<B>,
    w: FloatTensor<B>,
    targets: IntTensor<B>,
    lse: FloatTensor<B>,
    ez: FloatTensor<B>,
    sc: Scale,
}

/// The recomputing backward of [`FusedHead::head_log_prob_entropy`].
#[derive(Debug)]
struct HeadBackward;

impl<B: Backend + FusedAmx> Backward<B, 2> for HeadBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_h, node_w] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (dh, dw) = head_grads::<B>(&ops.state, grad, node_w.is_some());
        if let Some(node) = node_h {
            grads.register::<B>(node.id, dh);
        }
        if let (Some(node), Some(dw)) = (node_w, dw) {
            grads.register::<B>(node.id, dw);
        }
    }
}

/// `(∂L/∂h, ∂L/∂W)` from the output's gradient `[rows, 2]`: per chunk,
/// `∂L/∂z = −p (g_lp + g_H (z − E[z]))` plus `g_lp` at the chosen token, then `∂L/∂h += ∂L/∂z
/// W[chunk] · inv_t` and `∂L/∂W[chunk] = (∂L/∂z)ᵀ h · inv_t`.
fn head_grads<B: Backend + FusedAmx>(
    st: &Saved<B>,
    grad: FloatTensor<B>,
    with_w: bool,
) -> (FloatTensor<B>, Option<FloatTensor<B>>) {
    let rows = st.h.shape()[0];
    let [vocab, d] = [st.w.shape()[0], st.w.shape()[1]];
    let g_lp = B::float_slice(grad.clone(), &[Slice::from(0..rows), Slice::from(0..1)]);
    let g_ent = B::float_slice(grad, &[Slice::from(0..rows), Slice::from(1..2)]);
    let mut dh: Option<FloatTensor<B>> = None;
    let mut dw_parts = Vec::new();
    for c in chunks(vocab, st.sc.chunk) {
        let z = logits::<B>(&st.h, &st.w, c.clone(), st.sc);
        let p = B::float_exp(B::float_sub(z.clone(), st.lse.clone()));
        let centred = B::float_mul(B::float_sub(z, st.ez.clone()), g_ent.clone());
        let dz = B::float_neg(B::float_mul(p, B::float_add(centred, g_lp.clone())));
        let dz = B::float_mul_scalar(dz, st.sc.inv_t.into());
        let wc = B::float_slice(st.w.clone(), &[Slice::from(c), Slice::from(0..d)]);
        let part = product::<B>(dz.clone(), wc, st.sc.bf16);
        dh = Some(match dh {
            Some(acc) => B::float_add(acc, part),
            None => part,
        });
        if with_w {
            dw_parts.push(product::<B>(
                B::float_transpose(dz),
                st.h.clone(),
                st.sc.bf16,
            ));
        }
    }
    // The chosen token's `onehot · g_lp` term: `g_lp · W[t] · inv_t` into ∂L/∂h, and
    // `g_lp · h · inv_t` added into the rows `t` of ∂L/∂W.
    let g = B::float_mul_scalar(g_lp, st.sc.inv_t.into());
    let w_t = B::float_select(st.w.clone(), 0, st.targets.clone());
    let dh = B::float_add(
        dh.unwrap_or_else(|| B::float_mul_scalar(st.h.clone(), 0f32.into())),
        B::float_mul(w_t, g.clone()),
    );
    let dw = with_w.then(|| {
        let dw = B::float_cat(dw_parts, 0);
        let add = B::float_mul(st.h.clone(), g);
        B::float_select_assign(dw, 0, st.targets.clone(), add, IndexingUpdateOp::Add)
    });
    (dh, dw)
}

impl<B: Backend + FusedHead, C: CheckpointStrategy> FusedHead for Autodiff<B, C> {
    fn head_log_prob_entropy(
        h: FloatTensor<Self>,
        w: FloatTensor<Self>,
        targets: IntTensor<Self>,
        inv_t: f32,
        chunk: usize,
        bf16: bool,
    ) -> FloatTensor<Self> {
        let sc = Scale { inv_t, chunk, bf16 };
        match HeadBackward
            .prepare::<C>([h.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (hp, wp) = (h.primitive().clone(), w.primitive().clone());
                let f = forward::<B>(hp.clone(), wp.clone(), targets.clone(), sc);
                let saved = Saved {
                    h: hp,
                    w: wp,
                    targets,
                    lse: f.lse,
                    ez: f.ez,
                    sc,
                };
                prep.finish(saved, f.out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::head_log_prob_entropy(
                h.into_primitive(),
                w.into_primitive(),
                targets,
                inv_t,
                chunk,
                bf16,
            )),
        }
    }
}
