//! Weights kept as quantized blocks (GGUF's `Q4_1`, `Q8_0`; `ember_kernels::QuantMatrix`) beside
//! the f32 weights, for decoding steps: a step of a few sequences reads each weight once, so
//! reading 5 to 9 bits a weight instead of 32 is what makes it faster (llama.cpp decodes from
//! the blocks the same way). Passes over many rows (prefill, scoring, training) keep the f32
//! weights, where a matrix product reuses each weight across the rows.
//!
//! Blocks are kept only where they equal the f32 weights (`crate::quantize`), so a decoding
//! step computes the model every other pass computes, up to the order of the sums. `BF16`
//! weights (packed once for AMX tiles) are the exception: their product rounds
//! the activations to bf16 as well, so they serve only a model whose products were chosen to
//! be bf16 (`--kernels ember,amx`), and then every product, whatever its rows, since the packed
//! copy spares each product the packing. This module holds when a product reads them and the
//! product itself.

use burn::tensor::{DType, Tensor};
use ember_kernels::{Kernel, QuantKind, QuantMatrix};

/// Rows (sequences × positions) up to which a product reads `Q4_1` or `Q8_0` blocks: decoding
/// steps of up to this many sequences. Above it the f32 product is faster, each weight being
/// reused across enough rows (`ember bench-llm --blocks`, `benches/README.md`).
pub const BLOCK_ROWS: usize = 16;

/// Whether a product with input `x` reads the kept weights `q`: f32, the `quant` kernel chosen
/// and on `x`'s device; for `Q4_1` and `Q8_0`, at most [`BLOCK_ROWS`] rows; for `BF16` (packed
/// for AMX tiles, its product rounding the activations to bf16), any rows of an `x` outside the
/// autodiff graph (a tracked `x` takes `ember_kernels::amx_matmul`, whose backward pass runs
/// on the tiles too), where bf16 products were chosen (the `amx` kernel) and the CPU has the
/// tiles, and never otherwise (the f32 weights equal the bf16 ones: the same model in f32).
pub(crate) fn decodes<const D: usize>(x: &Tensor<D>, q: &QuantMatrix) -> bool {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    let kept = x.dtype() == DType::F32
        && ember_kernels::enabled(Kernel::Quant)
        && ember_kernels::fused_on(&x.device());
    kept && match q.kind() {
        QuantKind::Bf16 => ember_kernels::bf16_products() && !x.is_tracked(),
        QuantKind::Q4_1 | QuantKind::Q8_0 => rows <= BLOCK_ROWS,
    }
}

/// Whether a product with input `x` (`[rows, d_in]`) and an f32 weight goes through
/// `ember_kernels::gemv`: a decoding step of at most `ember_kernels::GEMV_ROWS` rows, f32, the
/// `gemv` kernel chosen and on `x`'s device.
pub(crate) fn few_rows(x: &Tensor<2>) -> bool {
    x.dims()[0] <= ember_kernels::GEMV_ROWS
        && x.dtype() == DType::F32
        && ember_kernels::enabled(Kernel::Gemv)
        && ember_kernels::fused_on(&x.device())
}

/// Whether a product with input `x` (`[rows, d_in]`) and an f32 weight goes through
/// `ember_kernels::amx_matmul` (inputs rounded to bf16): at least `ember_kernels::AMX_ROWS`
/// rows, f32, the `amx` kernel chosen, AMX tiles available and `x` on the CPU backend.
pub(crate) fn many_rows_bf16(x: &Tensor<2>) -> bool {
    x.dims()[0] >= ember_kernels::AMX_ROWS
        && x.dtype() == DType::F32
        && ember_kernels::bf16_products()
        && ember_kernels::fused_on(&x.device())
}

/// Whether a product with input `x` (`[rows, d_in]`) and an f32 weight goes through
/// `ember_kernels::f32_matmul` (burn's product without its output copy): f32, the `matmul`
/// kernel chosen and `x` on the CPU backend.
pub(crate) fn rows_f32(x: &Tensor<2>) -> bool {
    x.dtype() == DType::F32
        && ember_kernels::enabled(Kernel::Matmul)
        && ember_kernels::fused_on(&x.device())
}

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
    let y = ember_kernels::quant_linear(x.reshape([rows, d_in]), q);
    let y = match bias {
        Some(b) => y + b.unsqueeze(),
        None => y,
    };
    y.reshape(dims)
}
