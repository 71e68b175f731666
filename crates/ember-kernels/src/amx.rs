//! The matrix product `x · W` with both inputs rounded to bf16 and the sums kept in f32, on
//! Intel AMX tiles where the CPU has them (`ember-amx`; `TDPBF16PS`, Intel SDM vol. 2), for
//! the many-row products of prefill and training: the same product at lower input precision,
//! chosen by name (`--kernels ember,amx`), never by default. Its backward pass is two products
//! of the same kind (`∂x = dy · Wᵀ`, `∂W = xᵀ · dy`), the transposes read as they lie. The
//! reference is burn's `matmul` on the inputs rounded to bf16 (`amx_matmul_reference`).

use burn::backend::autodiff::{Autodiff, checkpoint::strategy::CheckpointStrategy};
use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// The bf16 product as a burn backend extension: the CPU backend runs it on AMX tiles (burn's
/// f32 `matmul` where the CPU has none), the autodiff backend adds a product's backward pass.
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait FusedAmx: Backend {
    /// `x · W`: `x` `[n, k]`, `W` `[k, m]` → `[n, m]`.
    fn amx_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, w)
    }

    /// `x · W` in f32 (`crate::f32_matmul`): burn's `matmul` by default.
    fn f32_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, w)
    }
}

/// CubeCL devices multiply in f32 (burn's `matmul`): bf16 products there come from bf16
/// activations, not from this extension.
#[cfg(feature = "cube")]
impl FusedAmx for burn::backend::Cube {}

#[cfg(feature = "flex")]
impl FusedAmx for burn::backend::Flex {
    fn amx_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        through(x, w, ember_amx::matmul)
    }

    fn f32_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        through(x, w, ember_amx::matmul_f32)
    }
}

/// `x · w` by one of `ember-amx`'s products on the two tensors' strided views; burn's f32
/// `matmul` where the views cannot be read (another dtype, a negative stride) or the product
/// refuses them (no AMX for `ember_amx::matmul`).
#[cfg(feature = "flex")]
fn through(
    x: FloatTensor<burn::backend::Flex>,
    w: FloatTensor<burn::backend::Flex>,
    product: fn(
        ember_amx::Matrix<'_>,
        ember_amx::Matrix<'_>,
    ) -> Result<Vec<f32>, ember_amx::AmxError>,
) -> FloatTensor<burn::backend::Flex> {
    use burn::backend::TensorMetadata;
    use burn::backend::ops::FloatTensorOps;
    let y = match (view(&x), view(&w)) {
        (Some(a), Some(b)) => product(a, b).ok(),
        _ => None,
    };
    match y {
        Some(y) => {
            let shape = burn::tensor::Shape::new([x.shape()[0], w.shape()[1]]);
            crate::cpu::tensor(y, shape)
        }
        None => burn::backend::Flex::float_matmul(x, w),
    }
}

/// `a · b` as a bf16 product ([`FusedAmx::amx_matmul`]) when `bf16`, else the f32 product
/// ([`FusedAmx::f32_matmul`]: burn's values, without burn flex's copy of the output): the fused
/// kernels' own products (the head's chunks) follow the choice the model's projections follow,
/// made by the caller.
pub(crate) fn product<B: FusedAmx>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    bf16: bool,
) -> FloatTensor<B> {
    match bf16 {
        true => B::amx_matmul(a, b),
        false => B::f32_matmul(a, b),
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

/// Under autodiff: the backward pass of a matrix product (`crate::product`), each gradient a
/// bf16 product too.
impl<B: Backend + FusedAmx, C: CheckpointStrategy> FusedAmx for Autodiff<B, C> {
    fn amx_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::product::tracked::<B, C>(x, w, B::amx_matmul, B::amx_matmul)
    }

    fn f32_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::product::tracked::<B, C>(x, w, B::f32_matmul, B::f32_matmul)
    }
}
