//! RMSNorm over the last axis (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization",
//! eq. 4; HF `LlamaRMSNorm`, in f32): `y = x · r · γ`, `r = 1/√(mean(x²) + ε)`, as one operation:
//! one pass over each row forward and one backward, keeping `x` and the per-row `r` for the
//! backward pass, where burn's decomposed form makes six passes (square, mean, add, sqrt,
//! divide, scale) and a tensor for each.
//!
//! With `gy = dy ∘ γ`: `∂L/∂x = r · gy − x · r³ · Σ(x ∘ gy) / d` per row, `∂L/∂γ = Σ_rows dy ∘ x · r`.

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, TensorMetadata, backend_extension, tensor::FloatTensor};
use burn::tensor::Shape;

/// The fused RMSNorm as a burn backend extension: the CPU backend runs one vectorised pass per
/// row, the autodiff backend adds the backward pass.
#[backend_extension(
    Flex: cfg(feature = "flex"),
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Autodiff
)]
pub trait FusedRmsNorm: Backend {
    /// `[rows, d]`: `x · r · γ` for `x` `[rows, d]`, `γ` `[d]`.
    #[fusion(dtype = x, shape = x)]
    fn rms_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        forward::<Self>(x, gamma, eps).0
    }

    /// `(y, r)`: the output and each row's `r` `[rows, 1]`.
    #[fusion(meta = |x, _gamma, _eps| (x.clone(), burn::backend::fusion::custom::TensorSpec::new(
        Shape::new([x.shape[0], 1]),
        x.dtype,
    )))]
    fn rms_norm_saved(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        forward::<Self>(x, gamma, eps)
    }

    /// `(∂L/∂x, ∂L/∂γ)` from the output's gradient `dy` and the saved `r`.
    #[fusion(meta = |x, gamma, _r, _dy| (x.clone(), gamma.clone()))]
    fn rms_norm_grad(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        grads::<Self>(x, gamma, r, dy)
    }
}

/// The decomposed forward pass in burn ops: `(y, r)`.
fn forward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    eps: f32,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let d = x.shape()[1];
    let ms = B::float_mean_dim(B::float_mul(x.clone(), x.clone()), 1);
    let r = B::float_recip(B::float_sqrt(B::float_add_scalar(ms, eps.into())));
    let g = B::float_reshape(gamma, Shape::new([1, d]));
    (B::float_mul(B::float_mul(x, r.clone()), g), r)
}

/// The decomposed backward pass in burn ops (the module's formulas).
fn grads<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    r: FloatTensor<B>,
    dy: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let d = x.shape()[1];
    let g = B::float_reshape(gamma, Shape::new([1, d]));
    let gy = B::float_mul(dy.clone(), g);
    let dot = B::float_sum_dim(B::float_mul(x.clone(), gy.clone()), 1);
    let r3 = B::float_mul(B::float_mul(r.clone(), r.clone()), r.clone());
    let c = B::float_mul_scalar(B::float_mul(r3, dot), (1.0 / d as f32).into());
    let dx = B::float_sub(B::float_mul(gy, r.clone()), B::float_mul(x.clone(), c));
    let dgamma = B::float_sum_dim(B::float_mul(B::float_mul(dy, x), r), 0);
    (dx, B::float_reshape(dgamma, Shape::new([d])))
}

#[cfg(feature = "cube")]
impl FusedRmsNorm for burn_cubecl::CubeBackend {
    fn rms_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        Self::rms_norm_saved(x, gamma, eps).0
    }

    fn rms_norm_saved(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        match crate::cube::all_f32(&[&x, &gamma]) {
            true => crate::cube::rms_norm(x, gamma, eps),
            false => forward::<Self>(x, gamma, eps),
        }
    }

    fn rms_norm_grad(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        match crate::cube::all_f32(&[&x, &gamma, &r, &dy]) {
            true => crate::cube::rms_norm_grad(x, gamma, r, dy),
            false => grads::<Self>(x, gamma, r, dy),
        }
    }
}

#[cfg(feature = "flex")]
impl FusedRmsNorm for burn::backend::Flex {
    fn rms_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        Self::rms_norm_saved(x, gamma, eps).0
    }

    fn rms_norm_saved(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        match crate::cpu::is_f32(&x) && crate::cpu::is_f32(&gamma) {
            true => crate::cpu::rms_norm(x, gamma, eps),
            false => forward::<Self>(x, gamma, eps),
        }
    }

    fn rms_norm_grad(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let f32s = [&x, &gamma, &r, &dy].into_iter().all(crate::cpu::is_f32);
        match f32s {
            true => crate::cpu::rms_norm_grad(x, gamma, r, dy),
            false => grads::<Self>(x, gamma, r, dy),
        }
    }
}

/// What the backward pass keeps: `x`, `γ` and each row's `r`.
#[derive(Debug, Clone)]
struct Saved<B: Backend> {
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    r: FloatTensor<B>,
}

/// The backward pass of [`FusedRmsNorm::rms_norm_rows`].
#[derive(Debug)]
struct RmsNormBackward;

impl<B: Backend + FusedRmsNorm> Backward<B, 2> for RmsNormBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_g] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let Saved { x, gamma, r } = ops.state;
        let (dx, dgamma) = B::rms_norm_grad(x, gamma, r, dy);
        for (node, g) in [(node_x, dx), (node_g, dgamma)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

impl<B: Backend + FusedRmsNorm, C: CheckpointStrategy> FusedRmsNorm for Autodiff<B, C> {
    fn rms_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        match RmsNormBackward
            .prepare::<C>([x.node(), gamma.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (x, gamma) = (x.primitive().clone(), gamma.primitive().clone());
                let (y, r) = B::rms_norm_saved(x.clone(), gamma.clone(), eps);
                prep.finish(Saved { x, gamma, r }, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::rms_norm_rows(
                x.into_primitive(),
                gamma.into_primitive(),
                eps,
            )),
        }
    }
}
