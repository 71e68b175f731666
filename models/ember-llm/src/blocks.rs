//! Weights kept as quantized blocks (GGUF's `Q4_1`, `Q8_0`; `ember_kernels::QuantMatrix`) beside
//! the f32 weights, for decoding steps: a step of a few sequences reads each weight once, so
//! reading 5 to 9 bits a weight instead of 32 is what makes it faster (llama.cpp decodes from
//! the blocks the same way). Passes over many rows (prefill, scoring, training) keep the f32
//! weights, where a matrix product reuses each weight across the rows.
//!
//! Blocks are kept only where they equal the f32 weights (`crate::load::quantize`), so a decoding
//! step computes the model every other pass computes, up to the order of the sums. `BF16`
//! weights (packed once for AMX tiles) are the exception: their product rounds
//! the activations to bf16 as well, so they serve only a model whose products were chosen to
//! be bf16 (`--kernels ember,amx`), and then every product, whatever its rows, since the packed
//! copy spares each product the packing. `ember_kernels::op::reads_blocks` says when a product
//! reads them (`BLOCK_ROWS`); this module holds the product over a model's activations.

use burn::tensor::Tensor;
use ember_kernels::{QuantMatrix, op};

pub use ember_kernels::op::BLOCK_ROWS;

/// `x · Wᵀ (+ bias)` with `W` `[d_out, d_in]` in blocks and `x`'s leading dims as rows.
pub(crate) fn blocks_linear<const D: usize>(
    x: Tensor<D>,
    q: &QuantMatrix,
    bias: Option<Tensor<1>>,
) -> Tensor<D> {
    let mut dims = x.dims();
    let d_in = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    dims[D - 1] = q.shape().0;
    op::blocks_linear(x.reshape([rows, d_in]), q, bias).reshape(dims)
}
