//! The backward pass of a matrix product `y = x · W` (`∂x = dy · Wᵀ`, `∂W = xᵀ · dy`), shared by
//! the kernels that compute the product their own way (`gemv.rs`, `amx.rs`): each names its
//! forward product and the product its backward pass runs.

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, tensor::FloatTensor};

/// A product of two float tensors.
pub(crate) type Product<B> = fn(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>;

/// The backward pass, each gradient one `product` (both inputs kept: `W` is shared with the
/// model, not copied).
struct ProductBackward<B: Backend> {
    product: Product<B>,
}

impl<B: Backend> std::fmt::Debug for ProductBackward<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProductBackward")
    }
}

impl<B: Backend> Backward<B, 2> for ProductBackward<B> {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w) = ops.state;
        if let Some(node) = node_x {
            let dx = (self.product)(dy.clone(), B::float_transpose(w));
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, (self.product)(B::float_transpose(x), dy));
        }
    }
}

/// `forward(x, w)` under autodiff, its backward pass two `backward` products.
pub(crate) fn tracked<B: Backend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    w: FloatTensor<Autodiff<B, C>>,
    forward: Product<B>,
    backward: Product<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let op = ProductBackward { product: backward };
    match op
        .prepare::<C>([x.node(), w.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
            prep.finish((xp.clone(), wp.clone()), forward(xp, wp))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(x.into_primitive(), w.into_primitive())),
    }
}
