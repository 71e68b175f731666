//! Ember's own kernels, added to burn through its backend extension (`#[backend_extension]`,
//! routed to the CPU backend with the `flex` feature and to autodiff with a hand-written
//! `Backward`): each keeps its decomposed burn-op reference beside it and a test comparing values
//! and gradients with it.
//!
//! - [`head_log_probs`]: the LM head's chosen-token log-probability and entropy by an online
//!   log-sum-exp over vocabulary chunks, the `[rows, vocab]` logits never held whole, forward or
//!   backward (`head.rs`).
//! - [`attention()`]: grouped-query attention with masks whose backward pass keeps no
//!   `[t, keys]` score matrix (`attention.rs`); a decoding step's few queries in one pass per
//!   sequence and key/value head (`cpu_attention.rs`).
//! - [`rms_norm`] and [`swiglu`]: RMSNorm and SwiGLU's gate, each one vectorised pass over the
//!   cores forward and one backward, keeping only what the backward pass reads (`rms_norm.rs`,
//!   `swiglu.rs`; the CPU loops over f32 slices, with a branch-free `exp`, in `cpu.rs`; the
//!   CubeCL kernels in `cube.rs`).
//! - [`rope`]: the rotary embedding, one pass each way keeping only its tables (`rope.rs`; a
//!   CubeCL kernel, the decomposed passes elsewhere).
//! - [`quant_linear`]: a product with weights held in GGUF's `Q4_1` or `Q8_0` blocks
//!   ([`QuantMatrix`]), decoded in registers instead of dequantized to f32 (`quant.rs`,
//!   `cpu_quant.rs`: AVX-512 or AVX2 through pulp, portable loops elsewhere): decoding steps read
//!   5 to 9 bits a weight instead of 32; or as `BF16`, packed once for Intel AMX tiles
//!   (`ember_amx::PackedB`), where bf16 products were chosen.
//! - [`gemv`]: the product of a few rows with an f32 weight, the weight streamed over the cores
//!   by blocks of its rows (`gemv.rs`, `cpu_gemv.rs`): decoding steps on f32 weights.
//! - [`amx_matmul`]: a many-row product with both inputs rounded to bf16 and f32 sums, on Intel
//!   AMX tiles (`amx.rs`, the `ember-amx` crate): chosen by name only, since it changes the
//!   products' precision. `f32_matmul`: the many-row f32 product without burn flex's copy of each
//!   output (`ember_amx::matmul_f32`: burn's values bit for bit). Both backward passes are two
//!   products of the same kind, through the matrix-product backward `gemv` shares (`product.rs`).
//! - `on_workers`: a closure run on a worker of the CPU backend's rayon pool, so that its
//!   parallel products split their work with the other workers instead of waiting on them.
//!
//! The fused kernels run on the CPU backend (`flex`), with and without autodiff; [`fused_on`]
//! says whether a device has them. With the `cube` feature, the head, attention, RMSNorm and
//! SwiGLU also run on CubeCL devices (wgpu, CUDA): their chunked and blocked passes and their
//! hand-written backward passes in burn's CubeCL ops ([`cube_on`]; `kernel_on` says which
//! kernel runs where). `op` (public) has one function per op, the one place that
//! chooses between a kernel and its reference by the device, the dtype and `--kernels`: models
//! call those. `Kernel` is the
//! process-wide choice (`--kernels ember|burn|head,attention,…`, `ember,amx`, `EMBER_KERNELS`;
//! `Kernel::DEFAULT` leaves `amx` out). The tests: `tests.rs`, `op_tests.rs`, `amx_tests.rs`, `gemv_tests.rs`,
//! `quant_tests.rs` (against ggml's bytes in `fixtures/quant_blocks.json`) and `tests/amx_head.rs`.

// Without a backend selected, the generated dispatch takes the arguments without using them.
#![cfg_attr(not(feature = "flex"), allow(unused_variables))]

mod amx;
mod attention;
#[cfg(feature = "flex")]
mod cpu;
#[cfg(feature = "flex")]
mod cpu_attention;
#[cfg(feature = "flex")]
mod cpu_gemv;
#[cfg(feature = "flex")]
mod cpu_quant;
#[cfg(feature = "cube")]
mod cube;
mod gemv;
mod head;
pub mod op;
mod product;
mod quant;
mod rms_norm;
mod rope;
mod swiglu;

pub use amx::FusedAmx;
pub use attention::FusedAttention;
use burn::backend::Dispatch;
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Int, Tensor};
pub use gemv::FusedGemv;
pub use head::FusedHead;
pub use quant::{FusedQuantLinear, QuantError, QuantKind, QuantMatrix};
pub use rms_norm::FusedRmsNorm;
pub use rope::FusedRope;
pub use swiglu::FusedSwiglu;

/// One of Ember's fused kernels, as `--kernels` and `EMBER_KERNELS` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The LM head's log-probability and entropy ([`head_log_probs`]): `head`.
    Head,
    /// Attention without the score matrix ([`attention()`]): `attention`.
    Attention,
    /// RMSNorm in one pass ([`rms_norm`]): `rmsnorm`.
    RmsNorm,
    /// SwiGLU's gate in one pass ([`swiglu`]): `swiglu`.
    Swiglu,
    /// Products with quantized blocks where a model holds them ([`quant_linear`]): `quant`.
    Quant,
    /// Few-row products with f32 weights over the cores ([`gemv`]): `gemv`.
    Gemv,
    /// Many-row products in bf16 on AMX tiles ([`amx_matmul`]): `amx`. Not among
    /// [`Kernel::DEFAULT`]: it rounds the products' inputs to bf16.
    Amx,
    /// Many-row f32 products without burn flex's copy of each output ([`f32_matmul`]):
    /// `matmul`.
    Matmul,
    /// The rotary embedding in one pass each way ([`rope`]; CubeCL devices): `rope`.
    Rope,
}

impl Kernel {
    /// Every kernel, in the order of their bits.
    pub const ALL: [Kernel; 9] = [
        Kernel::Head,
        Kernel::Attention,
        Kernel::RmsNorm,
        Kernel::Swiglu,
        Kernel::Quant,
        Kernel::Gemv,
        Kernel::Amx,
        Kernel::Matmul,
        Kernel::Rope,
    ];

    /// The kernels `ember` names and a run takes unless told otherwise: every kernel that
    /// computes what its reference computes in f32 (all but [`Kernel::Amx`]).
    pub const DEFAULT: [Kernel; 8] = [
        Kernel::Head,
        Kernel::Attention,
        Kernel::RmsNorm,
        Kernel::Swiglu,
        Kernel::Quant,
        Kernel::Gemv,
        Kernel::Matmul,
        Kernel::Rope,
    ];

    /// The kernel's name in `--kernels`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Head => "head",
            Kernel::Attention => "attention",
            Kernel::RmsNorm => "rmsnorm",
            Kernel::Swiglu => "swiglu",
            Kernel::Quant => "quant",
            Kernel::Gemv => "gemv",
            Kernel::Amx => "amx",
            Kernel::Matmul => "matmul",
            Kernel::Rope => "rope",
        }
    }

    fn bit(self) -> u16 {
        match self {
            Kernel::Head => 1,
            Kernel::Attention => 2,
            Kernel::RmsNorm => 4,
            Kernel::Swiglu => 8,
            Kernel::Quant => 16,
            Kernel::Gemv => 32,
            Kernel::Amx => 64,
            Kernel::Matmul => 128,
            Kernel::Rope => 256,
        }
    }
}

/// The kernels chosen, one bit each ([`Kernel::bit`]); [`UNSET`] until [`set_kernels`] or the
/// first read of `EMBER_KERNELS`.
static ENABLED: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(UNSET);
const UNSET: u16 = 0x8000;

/// Which kernels `spec` chooses: `ember` (the [`Kernel::DEFAULT`] kernels), `burn` (none: the
/// decomposed burn-op references everywhere), or a comma-separated list of kernel names and
/// `ember` (`head,attention`, `ember,amx`).
///
/// # Errors
/// An unknown name, listed with the names there are.
pub fn parse_kernels(spec: &str) -> Result<Vec<Kernel>, String> {
    if spec.trim() == "burn" {
        return Ok(Vec::new());
    }
    let mut chosen = Vec::new();
    for n in spec.split(',').map(str::trim) {
        if n == "ember" {
            chosen.extend(Kernel::DEFAULT);
            continue;
        }
        let k = Kernel::ALL.into_iter().find(|k| k.name() == n).ok_or_else(|| {
            let names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
            format!(
                "kernels {spec:?}: {n:?} is not a kernel; expected ember, burn or a comma-separated list of ember and {}",
                names.join(", ")
            )
        })?;
        chosen.push(k);
    }
    Ok(chosen)
}

/// Chooses the fused kernels for the whole process; the others take their burn-op references.
pub fn set_kernels(kernels: &[Kernel]) {
    let bits = kernels.iter().fold(0, |acc, k| acc | k.bit());
    ENABLED.store(bits, std::sync::atomic::Ordering::Relaxed);
}

/// The [`Kernel::DEFAULT`] kernels (`true`) or none (the burn-op references) for the whole
/// process.
pub fn set_enabled(on: bool) {
    set_kernels(if on { &Kernel::DEFAULT } else { &[] });
}

/// Whether `kernel` is chosen: [`set_kernels`], else `EMBER_KERNELS` (as [`parse_kernels`]
/// reads it; a value it refuses leaves the [`Kernel::DEFAULT`] kernels on, with a warning),
/// else whether it is among [`Kernel::DEFAULT`].
pub fn enabled(kernel: Kernel) -> bool {
    let mut bits = ENABLED.load(std::sync::atomic::Ordering::Relaxed);
    if bits == UNSET {
        let chosen = match std::env::var("EMBER_KERNELS") {
            Err(_) => Kernel::DEFAULT.to_vec(),
            Ok(v) => parse_kernels(&v).unwrap_or_else(|e| {
                eprintln!("EMBER_KERNELS: {e}; the default kernels stay on");
                Kernel::DEFAULT.to_vec()
            }),
        };
        set_kernels(&chosen);
        bits = ENABLED.load(std::sync::atomic::Ordering::Relaxed);
    }
    bits & kernel.bit() != 0
}

/// Vocabulary columns of one chunk of the fused head for `rows` rows: the chunk's logits stay
/// under 2²² elements (16 MiB of f32), at least 256 columns wide.
pub fn head_chunk(rows: usize) -> usize {
    ((1usize << 22) / rows.max(1)).max(256)
}

/// Whether `device` is a CubeCL device (wgpu, CUDA; with or without autodiff) in a build with
/// the `cube` feature: there the head, attention, RMSNorm and SwiGLU run as their extensions
/// (chunked, blocked, with their own backward passes) in burn's CubeCL ops.
pub fn cube_on(device: &Device) -> bool {
    #[cfg(feature = "cube")]
    {
        matches!(
            device.clone().inner().as_dispatch(),
            burn::backend::DispatchDevice::Cube(_)
        )
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        false
    }
}

/// Whether `kernel` exists for `device`: every kernel but `rope` on the CPU backend
/// ([`fused_on`]); the head, attention, RMSNorm, SwiGLU and RoPE on CubeCL devices
/// ([`cube_on`]).
pub fn kernel_on(kernel: Kernel, device: &Device) -> bool {
    let on_cube = matches!(
        kernel,
        Kernel::Head | Kernel::Attention | Kernel::RmsNorm | Kernel::Swiglu | Kernel::Rope
    );
    (kernel != Kernel::Rope && fused_on(device)) || (on_cube && cube_on(device))
}

/// The fused kernels run on `device` (the CPU backend, with or without autodiff).
pub fn fused_on(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    {
        matches!(
            device.clone().inner().as_dispatch(),
            burn::backend::DispatchDevice::Flex(_)
        )
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = device;
        false
    }
}

/// The log-probability of each row's target token under `softmax(h Wᵀ / temperature)` and that
/// distribution's entropy, fused: no `[rows, vocab]` tensor is held, in the forward pass or for
/// the backward pass, which recomputes the logits chunk by chunk (`head.rs`). Differentiable in
/// `h` and `w`. Runs where [`kernel_on`] says so.
///
/// # Shapes
/// `h` `[rows, d]`, `w` `[vocab, d]`, `targets` `[rows]` → (`[rows]`, `[rows]`).
pub fn head_log_probs(
    h: Tensor<2>,
    w: Tensor<2>,
    targets: Tensor<1, Int>,
    temperature: f32,
) -> (Tensor<1>, Tensor<1>) {
    let [rows, d] = h.dims();
    let [vocab, dw] = w.dims();
    let bf16 = bf16_products() && fused_on(&h.device());
    assert_eq!(
        d, dw,
        "head_log_probs: h is [{rows}, {d}], w is [{vocab}, {dw}]"
    );
    assert_eq!(
        targets.dims(),
        [rows],
        "head_log_probs: targets for {rows} rows"
    );
    let out = Tensor::<2>::from_dispatch(<Dispatch as FusedHead>::head_log_prob_entropy(
        h.into_dispatch(),
        w.into_dispatch(),
        targets.into_dispatch(),
        1.0 / temperature,
        head_chunk(rows),
        bf16,
    ));
    let lp = out.clone().slice([0..rows, 0..1]).reshape([rows]);
    (lp, out.slice([0..rows, 1..2]).reshape([rows]))
}

/// The decomposed reference of [`head_log_probs`]: the whole logits, `log_softmax`, a gather and
/// `−Σ p log p` (what `models/ember-llm`'s `chosen_log_probs` computes).
///
/// # Shapes
/// As [`head_log_probs`].
pub fn head_log_probs_reference(
    h: Tensor<2>,
    w: Tensor<2>,
    targets: Tensor<1, Int>,
    temperature: f32,
) -> (Tensor<1>, Tensor<1>) {
    let [rows, _] = h.dims();
    let logp = log_softmax(h.matmul(w.transpose()) / temperature, 1);
    let lp = logp
        .clone()
        .gather(1, targets.reshape([rows, 1]))
        .reshape([rows]);
    let ent = (logp.clone().exp() * logp).sum_dim(1).reshape([rows]).neg();
    (lp, ent)
}

/// Query positions of one block of the fused attention for `rows` = batch × heads and `keys`
/// keys: a block's scores stay under 2²² elements (16 MiB of f32), at least 16 positions.
pub fn attention_block(rows: usize, keys: usize) -> usize {
    ((1usize << 22) / rows.saturating_mul(keys).max(1)).max(16)
}

/// Grouped-query attention `softmax(q kᵀ / √hd + bias) v` whose backward pass keeps no score
/// matrix: only the inputs and the output are kept, and the backward pass recomputes the
/// probabilities block by block (`attention.rs`). Query head `kv·groups + g`
/// reads key/value head `kv`. Differentiable in `q`, `k`, `v` (not in `bias`). Runs where
/// [`kernel_on`] says so, in f32.
///
/// # Shapes
/// `q` `[b, heads, t, hd]`, `k`, `v` `[b, kv_heads, keys, hd]`, `bias` `[b, 1, t, keys]` →
/// `[b, heads, t, hd]`.
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, bias: Tensor<4>) -> Tensor<4> {
    let [b, heads, t, hd] = q.dims();
    let [bk, kv, keys, hdk] = k.dims();
    assert!(
        bk == b && hdk == hd && kv > 0 && heads.is_multiple_of(kv) && v.dims() == k.dims(),
        "attention: q is {:?}, k {:?}, v {:?}",
        q.dims(),
        k.dims(),
        v.dims()
    );
    assert_eq!(bias.dims(), [b, 1, t, keys], "attention: the bias's shape");
    Tensor::<4>::from_dispatch(<Dispatch as FusedAttention>::attention_rows(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        bias.into_dispatch(),
        1.0 / (hd as f32).sqrt(),
        attention_block(b * heads, keys),
    ))
}

/// The decomposed reference of [`attention`]: the whole scores `[b, kv, groups, t, keys]`,
/// `softmax`, the product with `v` (what `models/ember-llm`'s `Attention::heads` computes).
///
/// # Shapes
/// As [`attention`].
pub fn attention_reference(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, bias: Tensor<4>) -> Tensor<4> {
    let [b, heads, t, hd] = q.dims();
    let [_, kv, keys, _] = k.dims();
    let groups = heads / kv;
    let scores = q
        .reshape([b, kv, groups * t, hd])
        .matmul(k.swap_dims(2, 3))
        .reshape([b, kv, groups, t, keys])
        * (1.0 / (hd as f32).sqrt())
        + bias.reshape([b, 1, 1, t, keys]);
    softmax(scores, 4)
        .reshape([b, kv, groups * t, keys])
        .matmul(v)
        .reshape([b, heads, t, hd])
}

/// RMSNorm over the last axis, `x · r · γ` with `r = 1/√(mean(x²) + ε)`, in one pass per row
/// forward and backward, keeping `x` and `r` for the backward pass (`rms_norm.rs`).
/// Differentiable in `x` and `γ`. Runs where [`kernel_on`] says so, in f32.
///
/// # Shapes
/// `x` `[..., d]`, `gamma` `[d]` → `[..., d]`.
pub fn rms_norm<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, eps: f64) -> Tensor<D> {
    let dims = x.dims();
    let d = dims[D - 1];
    assert_eq!(gamma.dims(), [d], "rms_norm: x is {dims:?}");
    let rows = dims[..D - 1].iter().product::<usize>();
    let y = Tensor::<2>::from_dispatch(<Dispatch as FusedRmsNorm>::rms_norm_rows(
        x.reshape([rows, d]).into_dispatch(),
        gamma.into_dispatch(),
        eps as f32,
    ));
    y.reshape(dims)
}

/// The decomposed reference of [`rms_norm`]: burn's `RmsNorm::forward` (square, mean, add
/// `ε`, square root, divide, scale).
///
/// # Shapes
/// As [`rms_norm`].
pub fn rms_norm_reference<const D: usize>(x: Tensor<D>, gamma: Tensor<1>, eps: f64) -> Tensor<D> {
    let rms = (x.clone().square().mean_dim(D - 1) + eps).sqrt();
    (x / rms) * gamma.unsqueeze()
}

/// The rotary embedding `x ∘ cos + swap(x) ∘ s` (rotate-half form, `s = [−sin, sin]`), one
/// pass forward and one backward keeping only the tables (`rope.rs`). Differentiable in `x`
/// (not in the tables). A CubeCL kernel on CubeCL devices, in f32; the decomposed passes
/// elsewhere.
///
/// # Shapes
/// `x` `[b, heads, t, d]` (`d` even), `cos`, `signed_sin` `[b, 1, t, d]` → `[b, heads, t, d]`.
pub fn rope(x: Tensor<4>, cos: Tensor<4>, signed_sin: Tensor<4>) -> Tensor<4> {
    let [b, _, t, d] = x.dims();
    assert!(
        d.is_multiple_of(2) && cos.dims() == [b, 1, t, d] && signed_sin.dims() == [b, 1, t, d],
        "rope: x is {:?}, the tables {:?} and {:?}",
        x.dims(),
        cos.dims(),
        signed_sin.dims()
    );
    Tensor::<4>::from_dispatch(<Dispatch as FusedRope>::rope(
        x.into_dispatch(),
        cos.into_dispatch(),
        signed_sin.into_dispatch(),
    ))
}

/// The decomposed reference of [`rope`] (HF `apply_rotary_pos_emb`): `x · cos` plus the
/// halves of `x` exchanged (one concatenation) times `s`.
///
/// # Shapes
/// As [`rope`].
pub fn rope_reference(x: Tensor<4>, cos: Tensor<4>, signed_sin: Tensor<4>) -> Tensor<4> {
    let d = x.dims()[3];
    let half = d / 2;
    let swapped = Tensor::cat(
        vec![
            x.clone().narrow(3, half, d - half),
            x.clone().narrow(3, 0, half),
        ],
        3,
    );
    x * cos + swapped * signed_sin
}

/// SwiGLU's gate `silu(gate) · up` in one pass forward and one backward, keeping only `gate`
/// and `up` for the backward pass (`swiglu.rs`). Differentiable in both. Runs where
/// [`kernel_on`] says so, in f32.
///
/// # Shapes
/// `gate`, `up` of one shape → that shape.
pub fn swiglu<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    assert_eq!(
        gate.dims(),
        up.dims(),
        "swiglu: gate and up differ in shape"
    );
    Tensor::<D>::from_dispatch(<Dispatch as FusedSwiglu>::swiglu(
        gate.into_dispatch(),
        up.into_dispatch(),
    ))
}

/// The decomposed reference of [`swiglu`]: burn's `silu` (`g · sigmoid(g)`) times `up`.
///
/// # Shapes
/// As [`swiglu`].
pub fn swiglu_reference<const D: usize>(gate: Tensor<D>, up: Tensor<D>) -> Tensor<D> {
    burn::tensor::activation::silu(gate) * up
}

/// `x · Wᵀ` with `W` held in quantized blocks, decoded in registers on the CPU backend
/// (`quant.rs`), or `BF16` weights on AMX tiles (`x` rounded to bf16 too); elsewhere, and for
/// other dtypes, the dequantized weights and one product.
/// Differentiable in `x` (the weights are frozen).
///
/// # Shapes
/// `x` `[n, cols]`, `w` `[rows, cols]` → `[n, rows]`.
pub fn quant_linear(x: Tensor<2>, w: &QuantMatrix) -> Tensor<2> {
    let [n, cols] = x.dims();
    assert_eq!(
        cols,
        w.shape().1,
        "quant_linear: x is [{n}, {cols}], w {:?}",
        w.shape()
    );
    Tensor::<2>::from_dispatch(<Dispatch as FusedQuantLinear>::quant_linear(
        x.into_dispatch(),
        w.clone(),
    ))
}

/// The decomposed reference of [`quant_linear`]: [`QuantMatrix::dequantize`], then `x · Wᵀ`.
///
/// # Shapes
/// As [`quant_linear`].
pub fn quant_linear_reference(x: Tensor<2>, w: &QuantMatrix) -> Tensor<2> {
    let (rows, cols) = w.shape();
    let dense = Tensor::<2>::from_data(
        burn::tensor::TensorData::new(w.dequantize(), [rows, cols]),
        &x.device(),
    );
    x.matmul(dense.transpose())
}

/// Rows up to which a product with an f32 weight goes through [`gemv`] (decoding steps of up
/// to this many sequences); from about here burn flex's own product runs on every core.
pub const GEMV_ROWS: usize = 4;

/// `x · W` for a few rows `x` and an f32 weight `W` in burn's `Linear` layout, the weight's
/// columns split over the cores (`gemv.rs`); elsewhere, and for other dtypes, burn's `matmul`.
/// Differentiable in `x` and `W`.
///
/// # Shapes
/// `x` `[n, k]`, `w` `[k, m]` → `[n, m]`.
pub fn gemv(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let ([n, k], [kw, m]) = (x.dims(), w.dims());
    assert_eq!(k, kw, "gemv: x is [{n}, {k}], w [{kw}, {m}]");
    Tensor::<2>::from_dispatch(<Dispatch as FusedGemv>::gemv(
        x.into_dispatch(),
        w.into_dispatch(),
    ))
}

/// Runs `f` on one of the CPU backend's worker threads (rayon's pool) and waits for it, so that
/// the parallel kernels `f` calls split their work between the calling worker and the others,
/// instead of the calling thread waiting while every worker takes a part and then spins.
pub fn on_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    #[cfg(feature = "flex")]
    {
        rayon::scope(|_| f())
    }
    #[cfg(not(feature = "flex"))]
    {
        f()
    }
}

/// Rows from which a product goes through [`amx_matmul`] when `amx` is chosen: fewer rows
/// (decoding steps) would round the whole weight to bf16 for a handful of rows.
pub const AMX_ROWS: usize = 64;

/// Whether products run in bf16 on AMX tiles: the [`Kernel::Amx`] kernel chosen and
/// [`amx_available`].
pub fn bf16_products() -> bool {
    enabled(Kernel::Amx) && amx_available()
}

/// Whether [`amx_matmul`] runs on AMX tiles here (the CPU has AMX-BF16 and the operating
/// system granted the tile state); elsewhere it is burn's f32 `matmul`.
pub fn amx_available() -> bool {
    #[cfg(feature = "flex")]
    {
        ember_amx::available()
    }
    #[cfg(not(feature = "flex"))]
    {
        false
    }
}

/// `x · W` with `x` and `W` rounded to bf16 (to nearest, ties to even) and the sums kept in f32,
/// on AMX tiles (`amx.rs`); burn's f32 `matmul` where [`amx_available`] is false or off the
/// CPU backend. Differentiable in both: each gradient is a product of the same kind.
///
/// # Shapes
/// `x` `[n, k]`, `w` `[k, m]` → `[n, m]`.
pub fn amx_matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let ([n, k], [kw, m]) = (x.dims(), w.dims());
    assert_eq!(k, kw, "amx_matmul: x is [{n}, {k}], w [{kw}, {m}]");
    Tensor::<2>::from_dispatch(<Dispatch as FusedAmx>::amx_matmul(
        x.into_dispatch(),
        w.into_dispatch(),
    ))
}

/// `x · W` in f32 through the gemm crate as burn flex calls it (the same sums, bit for bit),
/// without the copy of the output burn flex's `matmul` makes (`ember_amx::matmul_f32`); burn's
/// `matmul` off the CPU backend or with the `matmul` kernel off. Differentiable in both: each
/// gradient is a product of the same kind.
///
/// # Shapes
/// `x` `[n, k]`, `w` `[k, m]` → `[n, m]`.
pub fn f32_matmul(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let ([n, k], [kw, m]) = (x.dims(), w.dims());
    assert_eq!(k, kw, "f32_matmul: x is [{n}, {k}], w [{kw}, {m}]");
    Tensor::<2>::from_dispatch(<Dispatch as FusedAmx>::f32_matmul(
        x.into_dispatch(),
        w.into_dispatch(),
    ))
}

/// The reference of [`amx_matmul`]: burn's `matmul` of the inputs rounded to bf16 and back.
///
/// # Shapes
/// As [`amx_matmul`].
pub fn amx_matmul_reference(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    let bf16 = |t: Tensor<2>| {
        t.cast(burn::tensor::DType::BF16)
            .cast(burn::tensor::DType::F32)
    };
    bf16(x).matmul(bf16(w))
}

/// The reference of [`gemv`]: burn's `matmul`.
///
/// # Shapes
/// As [`gemv`].
pub fn gemv_reference(x: Tensor<2>, w: Tensor<2>) -> Tensor<2> {
    x.matmul(w)
}

#[cfg(test)]
mod amx_tests;
#[cfg(test)]
mod gemv_tests;
#[cfg(test)]
mod op_tests;
#[cfg(test)]
mod quant_tests;
#[cfg(test)]
mod tests;
