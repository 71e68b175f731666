//! One function per op, the one place that chooses its kernel: Ember's fused kernel where it
//! runs (the kernel chosen with `--kernels`, a device whose backend has it, the dtype it takes),
//! else the decomposed reference. The models call these and hold no dispatch of their own, so a
//! kernel for another backend joins here and nowhere else.

use crate::{
    AMX_ROWS, GEMV_ROWS, Kernel, QuantKind, QuantMatrix, amx_matmul, attention as fused_attention,
    bf16_products, enabled, f32_matmul, fused_on, gemv, kernel_on, quant_linear,
    rms_norm as fused_rms_norm, rms_norm_reference, rope as fused_rope, rope_reference,
    swiglu as fused_swiglu, swiglu_reference,
};
use burn::tensor::activation::softmax;
use burn::tensor::module::linear as burn_linear;
use burn::tensor::{DType, Device, FloatDType, Tensor};

/// Rows up to which a product reads a model's weights kept in `Q4_1` or `Q8_0` blocks (a
/// decoding step's few rows); longer inputs use the f32 weights, whose product amortises the
/// weight's reading over enough rows (`ember bench-llm --blocks`, `benches/README.md`).
pub const BLOCK_ROWS: usize = 16;

/// Whether `kernel` is chosen and runs on `device`.
pub fn runs(kernel: Kernel, device: &Device) -> bool {
    enabled(kernel) && kernel_on(kernel, device)
}

/// Whether a new tensor shape costs `device` nothing: the CPU backend compiles no kernel per
/// shape (GPU backends compile, and autotune, one per shape), so a buffer there may grow as it
/// fills instead of being allocated at its largest.
pub fn shapes_are_free(device: &Device) -> bool {
    fused_on(device)
}

/// `x` in dtype `dt` (no-op when it already is): how every op, and the models around them,
/// move between the activations' dtype and f32.
pub fn like<const D: usize>(x: Tensor<D>, dt: DType) -> Tensor<D> {
    if x.dtype() == dt {
        x
    } else {
        x.cast(FloatDType::from(dt))
    }
}

/// RMSNorm over the last axis computed in f32 and returned in `x`'s dtype (HF
/// `LlamaRMSNorm`): the fused kernel ([`crate::rms_norm`]) for f32 where it runs, else
/// [`rms_norm_reference`] on an f32 copy.
pub fn rms_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, eps: f64) -> Tensor<D> {
    let dt = x.dtype();
    if dt == DType::F32 && runs(Kernel::RmsNorm, &x.device()) {
        return fused_rms_norm(x, gamma, eps);
    }
    like(rms_norm_reference(like(x, DType::F32), gamma, eps), dt)
}

/// The rotary embedding `x ∘ cos + swap(x) ∘ s` (rotate-half form; HF
/// `apply_rotary_pos_emb`): the fused kernel ([`crate::rope`]) for f32 where it runs and the
/// tables are `[b, 1, t, d]` with `d` even, else [`rope_reference`].
pub fn rope(x: Tensor<4>, cos: &Tensor<4>, signed_sin: &Tensor<4>) -> Tensor<4> {
    let [b, _, t, d] = x.dims();
    let tables = [b, 1, t, d];
    let fits = d % 2 == 0 && cos.dims() == tables && signed_sin.dims() == tables;
    let f32s = [x.dtype(), cos.dtype(), signed_sin.dtype()] == [DType::F32; 3];
    match fits && f32s && runs(Kernel::Rope, &x.device()) {
        true => fused_rope(x, cos.clone(), signed_sin.clone()),
        false => rope_reference(x, cos.clone(), signed_sin.clone()),
    }
}

/// SwiGLU's gate `silu(gate) · up`: the fused kernel ([`crate::swiglu`]) for f32 where it
/// runs, else [`swiglu_reference`].
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    match gate.dtype() == DType::F32 && runs(Kernel::Swiglu, &gate.device()) {
        true => fused_swiglu(gate, up),
        false => swiglu_reference(gate, up),
    }
}

/// Grouped-query attention `softmax(q kᵀ / √hd + bias) v` (query head `kv·groups + g` reads
/// key/value head `kv`, HF `repeat_kv`): the fused kernel ([`crate::attention`], no score
/// matrix kept for backward) for f32 where it runs; else, with `burn_fused`, burn's `attention`
/// over K and V repeated per group; else the decomposed form, the `groups` query heads of one
/// KV head as the rows of one product (K and V never copied), scores, mask and softmax in f32,
/// the products in the activations' dtype.
///
/// # Shapes
/// `q` `[b, heads, t, hd]`, `k`, `v` `[b, kv_heads, keys, hd]`, `bias` `[b, 1, t, keys]` →
/// `[b, heads, t, hd]`.
pub fn attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    bias: Tensor<4>,
    burn_fused: bool,
) -> Tensor<4> {
    let [b, h, t, hd] = q.dims();
    let [_, kv, keys, _] = k.dims();
    let groups = h / kv;
    let dt = q.dtype();
    if t > 0
        && dt == DType::F32
        && bias.dims() == [b, 1, t, keys]
        && runs(Kernel::Attention, &q.device())
    {
        return fused_attention(q, k, v, bias);
    }
    if burn_fused {
        let repeat = |x: Tensor<4>| match groups {
            1 => x,
            _ => x
                .reshape([b, kv, 1, keys, hd])
                .expand([b, kv, groups, keys, hd])
                .reshape([b, h, keys, hd]),
        };
        let bias = like(bias, dt).expand([b, h, t, keys]);
        let opts = Default::default();
        return burn::tensor::module::attention(q, repeat(k), repeat(v), None, Some(bias), opts);
    }
    let scores = like(
        q.reshape([b, kv, groups * t, hd]).matmul(k.swap_dims(2, 3)),
        DType::F32,
    )
    .reshape([b, kv, groups, t, keys])
        * (1.0 / (hd as f32).sqrt())
        + bias.reshape([b, 1, 1, t, keys]);
    let probs = like(softmax(scores, 4), dt).reshape([b, kv, groups * t, keys]);
    probs.matmul(v).reshape([b, h, t, hd])
}

/// `x · w (+ bias)` for `x` `[rows, d_in]` and `w` `[d_in, d_out]` (burn's `Linear` layout):
/// [`gemv`] for at most [`GEMV_ROWS`] f32 rows (a decoding step), [`amx_matmul`] for at
/// least [`AMX_ROWS`] f32 rows where bf16 products were chosen, [`f32_matmul`] for f32 rows and
/// weights, each where its kernel runs; else burn's `linear`.
pub fn linear(x: Tensor<2>, w: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<2> {
    let [rows, _] = x.dims();
    let f32_rows = x.dtype() == DType::F32 && fused_on(&x.device());
    let product = if f32_rows && rows <= GEMV_ROWS && enabled(Kernel::Gemv) {
        gemv
    } else if f32_rows && rows >= AMX_ROWS && bf16_products() {
        amx_matmul
    } else if f32_rows && w.dtype() == DType::F32 && enabled(Kernel::Matmul) {
        f32_matmul
    } else {
        return burn_linear(x, w, bias);
    };
    let y = product(x, w);
    match bias {
        Some(b) => y + b.unsqueeze(),
        None => y,
    }
}

/// The logits `h · wᵀ` of a head whose weight is `[vocab, d]` (tied embeddings):
/// [`amx_matmul`] for at least [`AMX_ROWS`] f32 rows where bf16 products were chosen, else
/// burn's `matmul`.
pub fn logits(h: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let [rows, _] = h.dims();
    let bf16 = h.dtype() == DType::F32 && rows >= AMX_ROWS && fused_on(&h.device());
    match bf16 && bf16_products() {
        true => amx_matmul(h, w.transpose()),
        false => h.matmul(w.transpose()),
    }
}

/// Whether a product with input `x` reads the kept weights `q`: f32, the `quant` kernel
/// chosen and on `x`'s device; for `Q4_1` and `Q8_0`, at most [`BLOCK_ROWS`] rows; for `BF16`
/// (packed for AMX tiles, its product rounding the activations to bf16), any rows of an `x`
/// outside the autodiff graph (a tracked `x` takes [`amx_matmul`], whose backward pass runs on
/// the tiles too), where bf16 products were chosen, and never otherwise (the f32 weights equal
/// the bf16 ones: the same model in f32).
pub fn reads_blocks<const D: usize>(x: &Tensor<D>, q: &QuantMatrix) -> bool {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    let kept = x.dtype() == DType::F32 && runs(Kernel::Quant, &x.device());
    kept && match q.kind() {
        QuantKind::Bf16 => bf16_products() && !x.is_tracked(),
        QuantKind::Q4_1 | QuantKind::Q8_0 => rows <= BLOCK_ROWS,
    }
}

/// Whether a product can ever read blocks of `kind`, so that a model keeps them: `Q4_1` and
/// `Q8_0` always, `BF16` where bf16 products were chosen and the CPU has AMX tiles (else the
/// copy would only take memory).
pub fn reads_kind(kind: QuantKind) -> bool {
    kind != QuantKind::Bf16 || bf16_products()
}

/// `x · Wᵀ (+ bias)` with `W` `[d_out, d_in]` held as `q`'s blocks ([`quant_linear`]), for
/// inputs [`reads_blocks`] accepts.
pub fn blocks_linear(x: Tensor<2>, q: &QuantMatrix, bias: Option<Tensor<1>>) -> Tensor<2> {
    let y = quant_linear(x, q);
    match bias {
        Some(b) => y + b.unsqueeze(),
        None => y,
    }
}

/// Whether the fused head ([`crate::head_log_probs`]: each row's target log-probability and
/// entropy without the `[rows, vocab]` logits) runs for activations `h` and a weight of dtype
/// `w`: f32 both, where it runs. Asked before the weight is made ready for it (a transpose);
/// elsewhere the caller computes the logits its own way.
pub fn head_runs<const D: usize>(h: &Tensor<D>, w: DType) -> bool {
    h.dtype() == DType::F32 && w == DType::F32 && runs(Kernel::Head, &h.device())
}
