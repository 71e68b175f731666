//! The matrix product `x · W` with both inputs rounded to bf16 and the sums kept in f32, on
//! Intel AMX tiles where the CPU has them (`ember-amx`; `TDPBF16PS`, Intel SDM vol. 2), for
//! the many-row products of prefill and training: the same product at lower input precision,
//! chosen by name (`--kernels ember,amx`), never by default. Its backward pass is two products
//! of the same kind (`∂x = dy · Wᵀ`, `∂W = xᵀ · dy`), the transposes read as they lie. The
//! reference is burn's `matmul` on the inputs rounded to bf16 (`amx_matmul_reference`).

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// The bf16 product as a burn backend extension: the CPU backend runs it on AMX tiles (burn's
/// f32 `matmul` where the CPU has none), the autodiff backend adds a product's backward pass.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait FusedAmx: Backend {
    /// `x · W`: `x` `[n, k]`, `W` `[k, m]` → `[n, m]`.
    fn amx_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, w)
    }
}

#[cfg(feature = "flex")]
impl FusedAmx for burn::backend::Flex {
    fn amx_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        use burn::backend::TensorMetadata;
        use burn::backend::ops::FloatTensorOps;
        let y = match (view(&x), view(&w)) {
            (Some(a), Some(b)) => ember_amx::matmul(a, b).ok(),
            _ => None,
        };
        match y {
            Some(y) => {
                let shape = burn::tensor::Shape::new([x.shape()[0], w.shape()[1]]);
                crate::cpu::tensor(y, shape)
            }
            None => Self::float_matmul(x, w),
        }
    }
}

/// `a · b` as a bf16 product ([`FusedAmx::amx_matmul`]) when `bf16`, else burn's f32 product:
/// the fused kernels' own products (the head's chunks) follow the choice the model's
/// projections follow, made by the caller.
pub(crate) fn product<B: FusedAmx>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    bf16: bool,
) -> FloatTensor<B> {
    match bf16 {
        true => B::amx_matmul(a, b),
        false => B::float_matmul(a, b),
    }
}

/// `t` rounded to bf16 and widened back when `bf16` (a product computed outside [`product`]
/// then agrees with those inside it), else `t`.
pub(crate) fn rounded<B: Backend>(t: FloatTensor<B>, bf16: bool) -> FloatTensor<B> {
    use burn::tensor::FloatDType;
    match bf16 {
        true => B::float_cast(B::float_cast(t, FloatDType::BF16), FloatDType::F32),
        false => t,
    }
}

/// A 2-D f32 CPU tensor as the strided view `ember-amx` reads (`None` for another dtype or a
/// negative stride).
#[cfg(feature = "flex")]
fn view(t: &FloatTensor<burn::backend::Flex>) -> Option<ember_amx::Matrix<'_>> {
    let layout = t.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    if !crate::cpu::is_f32(t) || shape.num_dims() != 2 {
        return None;
    }
    Some(ember_amx::Matrix {
        data: t.storage::<f32>(),
        offset: layout.start_offset(),
        rows: shape[0],
        cols: shape[1],
        row_stride: usize::try_from(strides[0]).ok()?,
        col_stride: usize::try_from(strides[1]).ok()?,
    })
}

/// The backward pass of [`FusedAmx::amx_matmul`]: `∂x = dy · Wᵀ`, `∂W = xᵀ · dy`, each a bf16
/// product (both inputs kept: `W` is shared with the model, not copied).
#[derive(Debug)]
struct AmxBackward;

impl<B: Backend + FusedAmx> Backward<B, 2> for AmxBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, w) = ops.state;
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::amx_matmul(dy.clone(), B::float_transpose(w)));
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, B::amx_matmul(B::float_transpose(x), dy));
        }
    }
}

impl<B: Backend + FusedAmx, C: CheckpointStrategy> FusedAmx for Autodiff<B, C> {
    fn amx_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match AmxBackward
            .prepare::<C>([x.node(), w.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (xp, wp) = (x.primitive().clone(), w.primitive().clone());
                prep.finish((xp.clone(), wp.clone()), B::amx_matmul(xp, wp))
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::amx_matmul(x.into_primitive(), w.into_primitive()))
            }
        }
    }
}
