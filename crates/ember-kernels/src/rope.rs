//! Rotary position embedding in the rotate-half form (Su et al. 2021, "RoFormer", eq. 34; HF
//! `apply_rotary_pos_emb`): `y = x ∘ cos + swap(x) ∘ s` with `swap` exchanging the two halves
//! of the head dimension and `s = [−sin, sin]` (`models/ember-llm`'s `rope_tables`), as one
//! operation: one pass forward and one backward, keeping only the tables for the backward pass.
//!
//! `swap` is its own transpose, so `∂L/∂x = dy ∘ cos + swap(dy ∘ s)`. The tables take no
//! gradient (they are functions of the positions).

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, Slice, TensorMetadata, backend_extension, tensor::FloatTensor};

/// The fused rotation as a burn backend extension: CubeCL devices run one kernel each way
/// (`cube.rs`, deferred through burn's fusion), the autodiff backend adds the backward pass
/// that keeps only the tables; elsewhere the decomposed passes.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Autodiff
)]
pub trait FusedRope: Backend {
    /// `x ∘ cos + swap(x) ∘ s` for `x` `[b, heads, t, d]` (`d` even), `cos` and `s`
    /// `[b, 1, t, d]`.
    #[fusion(dtype = x, shape = x)]
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        forward::<Self>(x, cos, signed_sin)
    }

    /// `∂L/∂x = dy ∘ cos + swap(dy ∘ s)` from the output's gradient `dy`.
    #[fusion(dtype = dy, shape = dy)]
    fn rope_grad(
        dy: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        grad::<Self>(dy, cos, signed_sin)
    }
}

/// `x` with the two halves of its last axis exchanged.
fn swap<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let s = x.shape();
    let (d, half) = (s[3], s[3] / 2);
    let all = |m: usize| Slice::from(0..m);
    let part = |r: std::ops::Range<usize>| {
        B::float_slice(
            x.clone(),
            &[all(s[0]), all(s[1]), all(s[2]), Slice::from(r)],
        )
    };
    B::float_cat(vec![part(half..d), part(0..half)], 3)
}

/// The decomposed forward pass in burn ops.
fn forward<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    signed_sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let swapped = swap::<B>(x.clone());
    B::float_add(B::float_mul(x, cos), B::float_mul(swapped, signed_sin))
}

/// The decomposed backward pass in burn ops.
fn grad<B: Backend>(
    dy: FloatTensor<B>,
    cos: FloatTensor<B>,
    signed_sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let scaled = swap::<B>(B::float_mul(dy.clone(), signed_sin));
    B::float_add(B::float_mul(dy, cos), scaled)
}

#[cfg(feature = "flex")]
impl FusedRope for burn::backend::Flex {}

#[cfg(feature = "cube")]
impl FusedRope for burn_cubecl::CubeBackend {
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match crate::cube::all_f32(&[&x, &cos, &signed_sin]) {
            true => crate::cube::rope(x, cos, signed_sin, false),
            false => forward::<Self>(x, cos, signed_sin),
        }
    }

    fn rope_grad(
        dy: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match crate::cube::all_f32(&[&dy, &cos, &signed_sin]) {
            true => crate::cube::rope(dy, cos, signed_sin, true),
            false => grad::<Self>(dy, cos, signed_sin),
        }
    }
}

/// The backward pass of [`FusedRope::rope`], keeping the tables.
#[derive(Debug)]
struct RopeBackward;

impl<B: Backend + FusedRope> Backward<B, 1> for RopeBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (cos, signed_sin) = ops.state;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::rope_grad(dy, cos, signed_sin));
        }
    }
}

impl<B: Backend + FusedRope, C: CheckpointStrategy> FusedRope for Autodiff<B, C> {
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (c, s) = (cos.into_primitive(), signed_sin.into_primitive());
        match RopeBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::rope(x.primitive().clone(), c.clone(), s.clone());
                prep.finish((c, s), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rope(x.into_primitive(), c, s)),
        }
    }
}
