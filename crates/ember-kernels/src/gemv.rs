//! The product of a few rows with an f32 weight, `x · W` with `x` `[n, k]` and `W` `[k, m]`
//! (burn's `Linear` layout), for decoding steps: with a handful of rows the product reads each
//! weight once and does two flops with it, so its time is the time to stream `W` from memory.
//! burn flex runs products this small (below 192³ multiply-adds) on the calling thread; the
//! CPU implementation here (`cpu_gemv.rs`) splits `W` by blocks of its rows over the cores, so
//! that both cores read weights. The reference is burn's `matmul`.

use burn::backend::autodiff::{Autodiff, checkpoint::strategy::CheckpointStrategy};
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

/// Under autodiff: the backward pass of a matrix product (`crate::product`), in f32.
impl<B: Backend + FusedGemv, C: CheckpointStrategy> FusedGemv for Autodiff<B, C> {
    fn gemv(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::product::tracked::<B, C>(x, w, B::gemv, B::float_matmul)
    }
}
