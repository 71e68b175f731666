//! Products with weights held in GGUF's quantized blocks, without dequantizing the weights to
//! f32 first: `Q4_1` (32 weights a block, `w = d·q + m`, q a 4-bit code) and `Q8_0` (`w = d·q`,
//! q a signed byte), the block layouts of ggml's `ggml-quants.c` (`block_q4_1`, `block_q8_0`).
//!
//! A decode step reads every weight once per token; held as blocks the weights are 6 bits
//! (`Q4_1`) or 9 bits (`Q8_0`) a weight in memory instead of 32, and the product decodes each
//! block in registers. With `Σ` over one block of row `o` and input `x`:
//! `Q4_1`: `Σ wⱼ xⱼ = d · Σ qⱼ xⱼ + m · Σ xⱼ` (the block sums of x are computed once a call);
//! `Q8_0`: `Σ wⱼ xⱼ = d · Σ qⱼ xⱼ`. The activations stay f32 (llama.cpp also rounds them to 8 bits,
//! which adds an error of its own), so the product equals the f32 product with the dequantized
//! weights up to the order of the sums.
//!
//! The decomposed reference is [`QuantMatrix::dequantize`] followed by an f32 matrix product
//! (`crate::quant_linear_reference`).

use burn::backend::autodiff::{
    Autodiff,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::backend::{Backend, TensorMetadata, backend_extension, tensor::FloatTensor};
use burn::tensor::{FloatDType, TensorData};
use half::f16;
use std::sync::Arc;

/// Weights a block holds along a row (ggml's `QK4_1` and `QK8_0`).
pub const BLOCK: usize = 32;

/// A block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantKind {
    /// ggml `Q4_1` (type 3): f16 scale d, f16 minimum m, 32 four-bit codes; `w = d·q + m`.
    Q4_1,
    /// ggml `Q8_0` (type 8): f16 scale d, 32 signed bytes; `w = d·q`.
    Q8_0,
    /// ggml `BF16` (type 30): each weight a bfloat16, held packed in the layout Intel AMX tiles
    /// read (`ember_amx::PackedB`); its product rounds the activations to bf16 too, so a model
    /// reads it only where bf16 products were chosen (`Kernel::Amx`) and the CPU has the tiles.
    Bf16,
}

impl QuantKind {
    /// The format of GGML type id `t`, if it is one of these.
    pub fn from_ggml(t: u32) -> Option<Self> {
        match t {
            3 => Some(Self::Q4_1),
            8 => Some(Self::Q8_0),
            30 => Some(Self::Bf16),
            _ => None,
        }
    }

    /// The format's name as ggml writes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
            Self::Bf16 => "BF16",
        }
    }

    /// Bytes of one block in a GGUF file.
    fn ggml_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
            Self::Bf16 => 64,
        }
    }

    /// Bytes of codes one block holds.
    fn code_bytes(self) -> usize {
        match self {
            Self::Q4_1 => 16,
            Self::Q8_0 => 32,
            Self::Bf16 => 64,
        }
    }

    /// f32 scales one block holds (`d, m` or `d`).
    pub(crate) fn scales(self) -> usize {
        match self {
            Self::Q4_1 => 2,
            Self::Q8_0 => 1,
            Self::Bf16 => 0,
        }
    }
}

/// A weight matrix that cannot be held as blocks, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantError(pub String);

impl std::fmt::Display for QuantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QuantError {}

/// A `[rows, cols]` weight matrix (row `o` produces output `o`) in blocks of [`BLOCK`] weights
/// along each row, the layout of a GGUF tensor whose first dimension is `cols`. The f16 scales
/// are widened to f32 once, at construction, so the product reads them without a conversion.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    kind: QuantKind,
    rows: usize,
    cols: usize,
    /// Per block: `d, m` (`Q4_1`) or `d` (`Q8_0`).
    scales: Arc<[f32]>,
    /// Per block: 16 bytes of nibbles (`Q4_1`: low nibble `j`, high nibble `j + 16`) or 32 bytes
    /// (empty for `BF16`).
    codes: Arc<[u8]>,
    /// `BF16`: `Wᵀ` (`[cols, rows]`) packed for the tiles; `None` for the other kinds.
    packed: Option<Arc<ember_amx::PackedB>>,
}

/// `a · b` for sizes read from files, or an error naming `what`.
fn mul(a: usize, b: usize, what: &str) -> Result<usize, QuantError> {
    a.checked_mul(b)
        .ok_or_else(|| QuantError(format!("{what}: {a} × {b} overflows")))
}

impl QuantMatrix {
    /// Blocks in all, checking the shape.
    fn blocks(rows: usize, cols: usize) -> Result<usize, QuantError> {
        if cols == 0 || !cols.is_multiple_of(BLOCK) || rows == 0 {
            return Err(QuantError(format!(
                "a [{rows}, {cols}] matrix cannot be held in blocks of {BLOCK}: rows must be > 0 and columns a positive multiple of {BLOCK}"
            )));
        }
        mul(rows, cols / BLOCK, "blocks")
    }

    /// The matrix holding `scales` and `codes` (in this module's layout).
    fn from_parts(
        kind: QuantKind,
        rows: usize,
        cols: usize,
        scales: Vec<f32>,
        codes: Vec<u8>,
    ) -> Self {
        Self {
            kind,
            rows,
            cols,
            scales: scales.into(),
            codes: codes.into(),
            packed: None,
        }
    }

    /// `w` (`[rows, cols]`, row-major) rounded to bf16 and packed as `Wᵀ`.
    fn bf16(rows: usize, cols: usize, w: &[f32]) -> Result<Self, QuantError> {
        let wt = ember_amx::Matrix::row_major(w, rows, cols).t();
        let packed = ember_amx::PackedB::new(wt).map_err(|e| QuantError(e.to_string()))?;
        Ok(Self {
            packed: Some(Arc::new(packed)),
            ..Self::from_parts(QuantKind::Bf16, rows, cols, Vec::new(), Vec::new())
        })
    }

    /// The `BF16` weights packed for the tiles (`None` for the other kinds).
    #[cfg(feature = "flex")]
    pub(crate) fn packed(&self) -> Option<&ember_amx::PackedB> {
        self.packed.as_deref()
    }

    /// The matrix from a GGUF tensor's bytes in ggml's block layout (`rows` rows of `cols`).
    ///
    /// # Errors
    /// A shape that is not whole blocks, or `raw` of the wrong length.
    pub fn from_ggml(
        kind: QuantKind,
        rows: usize,
        cols: usize,
        raw: &[u8],
    ) -> Result<Self, QuantError> {
        let n = Self::blocks(rows, cols)?;
        let want = mul(n, kind.ggml_bytes(), "bytes")?;
        if raw.len() != want {
            return Err(QuantError(format!(
                "{} [{rows}, {cols}]: {} bytes where {want} were expected",
                kind.name(),
                raw.len()
            )));
        }
        if kind == QuantKind::Bf16 {
            let w: Vec<f32> = raw
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect();
            return Self::bf16(rows, cols, &w);
        }
        let (mut scales, mut codes) = (Vec::with_capacity(n * kind.scales()), Vec::new());
        codes.reserve(n * kind.code_bytes());
        for b in raw.chunks_exact(kind.ggml_bytes()) {
            let (s, c) = b.split_at(2 * kind.scales());
            scales.extend(
                s.chunks_exact(2)
                    .map(|h| f16::from_le_bytes([h[0], h[1]]).to_f32()),
            );
            codes.extend_from_slice(c);
        }
        Ok(Self::from_parts(kind, rows, cols, scales, codes))
    }

    /// `w` (`[rows, cols]`, row-major) quantized as ggml quantizes it (`quantize_row_q4_1_ref`:
    /// `d = (max − min)/15`, `m = min`, `q = ⌊(w − m)/d + ½⌋` clamped to 15; `quantize_row_q8_0_ref`:
    /// `d = max|w|/127`, `q = round(w/d)`), the scales stored at f16 precision.
    ///
    /// # Errors
    /// A shape that is not whole blocks, `w` of the wrong length, or a weight that is not finite.
    pub fn quantize(
        kind: QuantKind,
        rows: usize,
        cols: usize,
        w: &[f32],
    ) -> Result<Self, QuantError> {
        let n = Self::blocks(rows, cols)?;
        if w.len() != mul(n, BLOCK, "weights")? {
            return Err(QuantError(format!(
                "[{rows}, {cols}]: {} weights given",
                w.len()
            )));
        }
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err(QuantError(format!("weight {i} is {}", w[i])));
        }
        if kind == QuantKind::Bf16 {
            return Self::bf16(rows, cols, w);
        }
        let (mut scales, mut codes) = (Vec::new(), Vec::new());
        let f16r = |v: f32| f16::from_f32(v).to_f32();
        let (blocks, _) = w.as_chunks::<BLOCK>();
        for x in blocks {
            match kind {
                QuantKind::Q4_1 => {
                    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let d = (hi - lo) / 15.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    let q = |v: f32| (((v - lo) * id + 0.5) as u8).min(15);
                    scales.extend([f16r(d), f16r(lo)]);
                    codes.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
                }
                QuantKind::Q8_0 => {
                    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    scales.push(f16r(d));
                    codes.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
                }
                // Not made of blocks: packed whole above.
                QuantKind::Bf16 => {}
            }
        }
        Ok(Self::from_parts(kind, rows, cols, scales, codes))
    }

    /// The blocks in ggml's layout, as a GGUF file stores them (f16 scales, then the codes).
    pub fn to_ggml(&self) -> Vec<u8> {
        if self.kind == QuantKind::Bf16 {
            let w = self.dequantize();
            return w
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect();
        }
        let (ns, nc) = (self.kind.scales(), self.kind.code_bytes());
        let mut out = Vec::with_capacity(self.codes.len() / nc * self.kind.ggml_bytes());
        for (s, c) in self
            .scales
            .chunks_exact(ns)
            .zip(self.codes.chunks_exact(nc))
        {
            for v in s {
                out.extend(f16::from_f32(*v).to_le_bytes());
            }
            out.extend_from_slice(c);
        }
        out
    }

    /// The block format.
    pub fn kind(&self) -> QuantKind {
        self.kind
    }

    /// `(rows, cols)`: outputs and inputs.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes held (scales and codes).
    pub fn bytes(&self) -> usize {
        self.scales.len() * 4 + self.codes.len() + self.packed.as_ref().map_or(0, |p| p.bytes())
    }

    /// The weights as f32 `[rows, cols]`, row-major: ggml's `dequantize_row_q4_1` (`q·d + m`)
    /// and `dequantize_row_q8_0` (`q·d`).
    pub fn dequantize(&self) -> Vec<f32> {
        if let Some(p) = &self.packed {
            // Held as `Wᵀ` `[cols, rows]`.
            let wt = p.unpack();
            let at = |i: usize| wt[(i % self.cols) * self.rows + i / self.cols];
            return (0..self.rows * self.cols).map(at).collect();
        }
        let mut out = Vec::with_capacity(self.rows * self.cols);
        let (ns, nc) = (self.kind.scales(), self.kind.code_bytes());
        for (s, c) in self
            .scales
            .chunks_exact(ns)
            .zip(self.codes.chunks_exact(nc))
        {
            match self.kind {
                QuantKind::Q4_1 => {
                    out.extend(c.iter().map(|q| f32::from(q & 0x0F) * s[0] + s[1]));
                    out.extend(c.iter().map(|q| f32::from(q >> 4) * s[0] + s[1]));
                }
                QuantKind::Q8_0 => out.extend(c.iter().map(|q| f32::from(*q as i8) * s[0])),
                QuantKind::Bf16 => {}
            }
        }
        out
    }

    /// The matrix whose row `i` is row `order[i]` of this one (llama.cpp's Q/K row order put
    /// back, for instance).
    ///
    /// # Errors
    /// `order` of the wrong length or naming a row that does not exist.
    pub fn select_rows(&self, order: &[usize]) -> Result<Self, QuantError> {
        if order.len() != self.rows || order.iter().any(|&r| r >= self.rows) {
            return Err(QuantError(format!(
                "a row order of {} entries for {} rows",
                order.len(),
                self.rows
            )));
        }
        if self.kind == QuantKind::Bf16 {
            let w = self.dequantize();
            let rows: Vec<f32> = order
                .iter()
                .flat_map(|&r| &w[r * self.cols..(r + 1) * self.cols])
                .copied()
                .collect();
            return Self::bf16(self.rows, self.cols, &rows);
        }
        let per_row = self.cols / BLOCK;
        let (ns, nc) = (
            per_row * self.kind.scales(),
            per_row * self.kind.code_bytes(),
        );
        let mut scales = Vec::with_capacity(self.scales.len());
        let mut codes = Vec::with_capacity(self.codes.len());
        for &r in order {
            scales.extend_from_slice(&self.scales[r * ns..(r + 1) * ns]);
            codes.extend_from_slice(&self.codes[r * nc..(r + 1) * nc]);
        }
        Ok(Self {
            scales: scales.into(),
            codes: codes.into(),
            ..self.clone()
        })
    }

    /// Row `o`'s scales and codes.
    #[cfg(feature = "flex")]
    pub(crate) fn row(&self, o: usize) -> (&[f32], &[u8]) {
        let per_row = self.cols / BLOCK;
        let (ns, nc) = (
            per_row * self.kind.scales(),
            per_row * self.kind.code_bytes(),
        );
        (
            &self.scales[o * ns..(o + 1) * ns],
            &self.codes[o * nc..(o + 1) * nc],
        )
    }

    /// The dequantized weights as a `[rows, cols]` tensor on `x`'s device, in `x`'s dtype.
    fn dense<B: Backend>(&self, x: &FloatTensor<B>) -> FloatTensor<B> {
        let data = TensorData::new(self.dequantize(), [self.rows, self.cols]);
        let w = B::float_from_data(data, &x.device());
        match x.dtype() == w.dtype() {
            true => w,
            false => B::float_cast(w, FloatDType::from(x.dtype())),
        }
    }
}

/// The product with blocked weights as a burn backend extension: the CPU backend decodes the
/// blocks in registers (its implementation is in `cpu_quant.rs`), the autodiff backend adds the input's gradient
/// `∂x = dy · W` (the weights themselves are frozen).
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait FusedQuantLinear: Backend {
    /// `x · Wᵀ`: `x` `[n, cols]` → `[n, rows]`.
    fn quant_linear(x: FloatTensor<Self>, w: QuantMatrix) -> FloatTensor<Self> {
        reference::<Self>(x, &w)
    }
}

/// The decomposed product: the dequantized weights, then one matrix product.
pub(crate) fn reference<B: Backend>(x: FloatTensor<B>, w: &QuantMatrix) -> FloatTensor<B> {
    let dense = w.dense::<B>(&x);
    B::float_matmul(x, B::float_transpose(dense))
}

/// The backward pass of [`FusedQuantLinear::quant_linear`]: `∂x = dy · W`, W dequantized.
#[derive(Debug)]
struct QuantLinearBackward;

impl<B: Backend + FusedQuantLinear> Backward<B, 1> for QuantLinearBackward {
    type State = QuantMatrix;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node_x {
            let w = ops.state.dense::<B>(&dy);
            grads.register::<B>(node.id, B::float_matmul(dy, w));
        }
    }
}

impl<B: Backend + FusedQuantLinear, C: CheckpointStrategy> FusedQuantLinear for Autodiff<B, C> {
    fn quant_linear(x: FloatTensor<Self>, w: QuantMatrix) -> FloatTensor<Self> {
        match QuantLinearBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::quant_linear(x.primitive().clone(), w.clone());
                prep.finish(w, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::quant_linear(x.into_primitive(), w)),
        }
    }
}
