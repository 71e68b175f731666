//! SwiGLU's gate `silu(g) · u` (Shazeer 2020, "GLU Variants Improve Transformer", eq. 5; HF
//! `LlamaMLP`: `act_fn(gate_proj(x)) * up_proj(x)`) as one operation: one pass forward and one
//! backward, and only `g` and `u` kept for the backward pass, where burn's decomposed
//! `g · sigmoid(g) · u` keeps `sigmoid(g)`, `silu(g)` and `u` besides `g` (two more tensors of
//! the MLP's width per position per layer).
//!
//! With `s = σ(g)`: `∂/∂u = dy · g · s`, `∂/∂g = dy · u · s · (1 + g (1 − s))`.

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// The fused gate as a burn backend extension: the CPU backend runs one vectorised pass,
/// CubeCL devices one kernel (`cube.rs`, deferred through burn's fusion), the autodiff backend
/// adds the backward pass that keeps only the two inputs.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Autodiff
)]
pub trait FusedSwiglu: Backend {
    /// `silu(gate) · up`, element-wise (`gate` and `up` of one shape).
    #[fusion(dtype = gate, shape = gate)]
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        forward::<Self>(gate, up)
    }

    /// `(∂L/∂gate, ∂L/∂up)` of [`swiglu`](FusedSwiglu::swiglu) from the output's gradient.
    #[fusion(meta = |gate, _up, _dy| (gate.clone(), gate.clone()))]
    fn swiglu_grad(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        grads::<Self>(gate, up, dy)
    }
}

/// The decomposed forward pass: `gate · sigmoid(gate) · up` in burn ops.
fn forward<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
    let s = B::sigmoid(gate.clone());
    B::float_mul(B::float_mul(gate, s), up)
}

/// The decomposed backward: the formulas of the module's comment in burn ops.
fn grads<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let s = B::sigmoid(gate.clone());
    let du = B::float_mul(B::float_mul(dy.clone(), gate.clone()), s.clone());
    // 1 + g (1 − s) = 1 + g − g s.
    let gs = B::float_mul(gate.clone(), s.clone());
    let inner = B::float_add_scalar(B::float_sub(gate, gs), 1f32.into());
    let dg = B::float_mul(B::float_mul(B::float_mul(dy, up), s), inner);
    (dg, du)
}

#[cfg(feature = "cube")]
impl FusedSwiglu for burn_cubecl::CubeBackend {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match crate::cube::all_f32(&[&gate, &up]) {
            true => crate::cube::swiglu(gate, up),
            false => forward::<Self>(gate, up),
        }
    }

    fn swiglu_grad(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        match crate::cube::all_f32(&[&gate, &up, &dy]) {
            true => crate::cube::swiglu_grad(gate, up, dy),
            false => grads::<Self>(gate, up, dy),
        }
    }
}

#[cfg(feature = "flex")]
impl FusedSwiglu for burn::backend::Flex {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match crate::cpu::is_f32(&gate) && crate::cpu::is_f32(&up) {
            true => crate::cpu::swiglu(gate, up),
            false => forward::<Self>(gate, up),
        }
    }

    fn swiglu_grad(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let f32s = [&gate, &up, &dy].into_iter().all(crate::cpu::is_f32);
        match f32s {
            true => crate::cpu::swiglu_grad(gate, up, dy),
            false => grads::<Self>(gate, up, dy),
        }
    }
}

/// The backward pass of [`FusedSwiglu::swiglu`], keeping `(gate, up)`.
#[derive(Debug)]
struct SwigluBackward;

impl<B: Backend + FusedSwiglu> Backward<B, 2> for SwigluBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_g, node_u] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        let (dg, du) = B::swiglu_grad(gate, up, dy);
        for (node, g) in [(node_g, dg), (node_u, du)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

impl<B: Backend + FusedSwiglu, C: CheckpointStrategy> FusedSwiglu for Autodiff<B, C> {
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match SwigluBackward
            .prepare::<C>([gate.node(), up.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (g, u) = (gate.primitive().clone(), up.primitive().clone());
                let out = B::swiglu(g.clone(), u.clone());
                prep.finish((g, u), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::swiglu(gate.into_primitive(), up.into_primitive()))
            }
        }
    }
}
