//! The product of a few rows with an f32 weight, `x · W` with `x` `[n, k]` and `W` `[k, m]`
//! (burn's `Linear` layout), for decoding steps: with a handful of rows the product reads each
//! weight once and does two flops with it, so its time is the time to stream `W` from memory.
//! burn flex runs products this small (below 192³ multiply-adds) on the calling thread; the
//! CPU implementation here (`cpu_gemv.rs`) splits `W` by blocks of its rows over the cores, so
//! that both cores read weights. The reference is burn's `matmul`.

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// The few-row product as a burn backend extension: the CPU backend streams the weight over
/// the cores, the autodiff backend adds the backward pass of a matrix product.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait FusedGemv: Backend {
    /// `x · W`: `x` `[n, k]`, `W` `[k, m]` → `[n, m]`.
    fn gemv(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, w)
    }
}

#[cfg(feature = "flex")]
impl FusedGemv for burn::backend::Flex {
    fn gemv(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        use crate::cpu::{dense, elems, is_f32, tensor};
        use burn::backend::TensorMetadata;
        use burn::backend::ops::FloatTensorOps;
        // A weight that is not a contiguous f32 matrix (a transposed view) would be copied
        // whole on every call: the reference reads it as it lies.
        let contiguous = w.as_slice::<f32>().is_some();
        let ([n, k], m) = ([x.shape()[0], x.shape()[1]], w.shape()[1]);
        // A weight small enough for one core gains nothing from the split: burn's product.
        if !(is_f32(&x) && contiguous && crate::cpu_gemv::splits(k, m)) {
            return Self::float_matmul(x, w);
        }
        let x = dense(x);
        let y = crate::cpu_gemv::products(elems(&x), elems(&w), [n, k, m]);
        tensor(y, burn::tensor::Shape::new([n, m]))
    }
}

/// The backward pass of [`FusedGemv::gemv`], a matrix product's: `∂x = dy · Wᵀ`, `∂W = xᵀ · dy`
/// (both inputs kept: `W` is shared with the model, not copied).
#[derive(Debug)]
struct GemvBackward;

impl<B: Backend> Backward<B, 2> for GemvBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w) = ops.state;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::float_matmul(dy.clone(), B::float_transpose(w)));
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::float_matmul(B::float_transpose(x), dy));
        }
    }
}

impl<B: Backend + FusedGemv, C: CheckpointStrategy> FusedGemv for Autodiff<B, C> {
    fn gemv(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match GemvBackward
            .prepare::<C>([x.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
                prep.finish((xp.clone(), wp.clone()), B::gemv(xp, wp))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::gemv(x.into_primitive(), w.into_primitive()))
            }
        }
    }
}
