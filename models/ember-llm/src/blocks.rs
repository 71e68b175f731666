//! Weights kept as quantized blocks (GGUF's `Q4_1`, `Q8_0`; `ember_kernels::QuantMatrix`) beside
//! the f32 weights, for decoding steps: a step of a few sequences reads each weight once, so
//! reading 5 to 9 bits a weight instead of 32 is what makes it faster (llama.cpp decodes from
//! the blocks the same way). Passes over many rows (prefill, scoring, training) keep the f32
//! weights, where a matrix product reuses each weight across the rows.
//!
//! Blocks are kept only where they equal the f32 weights: read from the GGUF file the f32
//! weights were dequantized from ([`crate::load_with_blocks`]), or made by [`Llama::quantized`],
//! which sets the f32 weights to the dequantized blocks. Either way a decoding step computes the
//! model every other pass computes, up to the order of the sums. Anything that changes the base
//! weights ([`crate::merge`]) drops them.

use crate::error::{LlmError, Result};
use crate::gguf::GgufFile;
use crate::load::GgufSource;
use crate::lora::TARGETS;
use crate::model::{Llama, like};
use burn::nn::Linear;
use burn::tensor::{DType, Tensor, TensorData};
use ember_kernels::{Kernel, QuantKind, QuantMatrix};

/// Rows (sequences × positions) up to which a product reads the blocks: decoding steps of up
/// to this many sequences. Above it the f32 product is faster, each weight being reused across
/// enough rows (`ember bench-llm --blocks`, `benches/README.md`).
pub const BLOCK_ROWS: usize = 16;

/// Whether a product with input `x` reads the blocks: few enough rows, f32, the `quant` kernel
/// chosen and on `x`'s device.
pub(crate) fn decodes<const D: usize>(x: &Tensor<D>) -> bool {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    rows <= BLOCK_ROWS
        && x.dtype() == DType::F32
        && ember_kernels::enabled(Kernel::Quant)
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

impl Llama {
    /// Bytes of the quantized blocks kept (0: none).
    pub fn block_bytes(&self) -> usize {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| l.self_attn.blocks.iter().chain(l.mlp.blocks.iter()));
        layers
            .chain([&self.head_blocks])
            .flatten()
            .map(QuantMatrix::bytes)
            .sum()
    }

    /// The model without its quantized blocks (decoding reads the f32 weights).
    pub fn without_blocks(mut self) -> Self {
        for l in &mut self.layers {
            l.self_attn.blocks = Default::default();
            l.mlp.blocks = Default::default();
        }
        self.head_blocks = None;
        self
    }

    /// Every projection and the output head quantized to `kind` (ggml's reference quantizer),
    /// the blocks kept for decoding and the f32 weights set to the dequantized blocks: the
    /// model a GGUF file of that type would give.
    ///
    /// # Errors
    /// A projection carrying an adapter, or a weight whose input width is not a multiple of 32.
    pub fn quantized(mut self, kind: QuantKind) -> Result<Self> {
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let a = &mut layer.self_attn;
            let m = &mut layer.mlp;
            let projections = [
                &mut a.q_proj,
                &mut a.k_proj,
                &mut a.v_proj,
                &mut a.o_proj,
                &mut m.gate_proj,
                &mut m.up_proj,
                &mut m.down_proj,
            ];
            let mut made = Vec::with_capacity(7);
            for (j, l) in projections.into_iter().enumerate() {
                made.push(Some(quantize_linear(
                    l,
                    kind,
                    &format!("layer {i} {}", TARGETS[j]),
                )?));
            }
            let mut made = made.into_iter();
            a.blocks = std::array::from_fn(|_| made.next().flatten());
            m.blocks = std::array::from_fn(|_| made.next().flatten());
        }
        self.head_blocks = Some(match &mut self.lm_head {
            Some(head) => quantize_linear(head, kind, "the output head")?,
            None => {
                let e = &mut self.embed_tokens.weight;
                let w = e.base();
                let (q, deq) = quantize_rows(w.clone(), kind, "the embeddings")?;
                *e = e.clone().map(|_| like(deq, w.dtype()));
                q
            }
        });
        Ok(self)
    }
}

/// `w` `[rows, cols]` quantized, and the dequantized blocks as an f32 tensor of its shape.
fn quantize_rows(w: Tensor<2>, kind: QuantKind, what: &str) -> Result<(QuantMatrix, Tensor<2>)> {
    let [rows, cols] = w.dims();
    let device = w.device();
    let bad = |reason: String| LlmError::Input(format!("quantizing {what}: {reason}"));
    let data = like(w, DType::F32)
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| bad(format!("{e:?}")))?;
    let q = QuantMatrix::quantize(kind, rows, cols, &data).map_err(|e| bad(e.to_string()))?;
    let deq = Tensor::<2>::from_data(TensorData::new(q.dequantize(), [rows, cols]), &device);
    Ok((q, deq))
}

/// A linear layer's weight (`[d_in, d_out]`) quantized as `[d_out, d_in]` blocks, its f32
/// weight replaced by the dequantized blocks.
fn quantize_linear(l: &mut Linear, kind: QuantKind, what: &str) -> Result<QuantMatrix> {
    if l.weight.adapter().is_some() {
        return Err(LlmError::Input(format!(
            "quantizing {what}: it carries an adapter (quantize the base model first)"
        )));
    }
    let w = l.weight.base();
    let (q, deq) = quantize_rows(w.clone().transpose(), kind, what)?;
    l.weight = l.weight.clone().map(|_| like(deq.transpose(), w.dtype()));
    Ok(q)
}

/// The blocks of a GGUF file's `Q4_1` and `Q8_0` projections and head, kept on `model` (which
/// was built from the same file); tensors of other types keep only their f32 weights.
/// `unpermute`: the `llama` architecture's Q/K rows put back in rotate-half order
/// ([`crate::unpermute_rows`]), `(heads, kv_heads)`.
pub(crate) fn attach_gguf(mut model: Llama, src: &GgufSource) -> Result<Llama> {
    let (file, unpermute) = (src.file(), src.unpermute_heads());
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let mut made = Vec::with_capacity(7);
        for (j, t) in TARGETS.iter().enumerate() {
            let part = if j < 4 { "self_attn" } else { "mlp" };
            let hf = format!("model.layers.{i}.{part}.{t}.weight");
            let heads = match (j, unpermute) {
                (0, Some((h, _))) => Some(h),
                (1, Some((_, kv))) => Some(kv),
                _ => None,
            };
            made.push(read_blocks(file, &hf, heads)?);
        }
        let mut made = made.into_iter();
        layer.self_attn.blocks = std::array::from_fn(|_| made.next().flatten());
        layer.mlp.blocks = std::array::from_fn(|_| made.next().flatten());
    }
    let head = match model.lm_head {
        Some(_) => "lm_head.weight",
        None => "model.embed_tokens.weight",
    };
    model.head_blocks = read_blocks(file, head, None)?;
    Ok(model)
}

/// The blocks of the GGUF tensor that holds Hugging Face tensor `hf`, if it is `Q4_1` or `Q8_0`;
/// `heads`: its rows put back from llama.cpp's interleaved order, per head.
fn read_blocks(file: &GgufFile, hf: &str, heads: Option<usize>) -> Result<Option<QuantMatrix>> {
    let Some(name) = GgufSource::gguf_name(hf) else {
        return Ok(None);
    };
    let Some(kind) = file
        .tensor_info(&name)
        .ok()
        .and_then(|t| QuantKind::from_ggml(t.ggml_type))
    else {
        return Ok(None);
    };
    let (raw, info) = file.read_raw(&name)?;
    let bad = |reason: String| LlmError::Checkpoint {
        path: file.path().to_path_buf(),
        reason: format!("tensor `{name}`: {reason}"),
    };
    let [rows, cols] = info.shape()[..] else {
        return Err(bad(format!("{} dimensions, expected 2", info.dims.len())));
    };
    let q = QuantMatrix::from_ggml(kind, rows, cols, &raw).map_err(|e| bad(e.to_string()))?;
    match heads {
        Some(h) if h > 0 && rows.is_multiple_of(h) && (rows / h).is_multiple_of(2) => {
            // GGUF row `h·d + 2j + s` holds HF row `h·d + s·d/2 + j`.
            let (d, half) = (rows / h, rows / h / 2);
            let order: Vec<usize> = (0..rows)
                .map(|r| {
                    let (head, k) = (r / d, r % d);
                    let (s, j) = (k / half, k % half);
                    head * d + 2 * j + s
                })
                .collect();
            q.select_rows(&order)
                .map(Some)
                .map_err(|e| bad(e.to_string()))
        }
        Some(h) => Err(bad(format!(
            "{rows} rows do not split into {h} heads of even width"
        ))),
        None => Ok(Some(q)),
    }
}
