//! Keeping a model's weights also as quantized blocks (`crate::blocks`): read from the GGUF
//! file the f32 weights were dequantized from ([`load_with_blocks`]), or made by
//! [`Llama::quantized`], which sets the f32 weights to the dequantized blocks. Anything that
//! changes the base weights ([`crate::merge`]) drops them.

use crate::error::{LlmError, Result};
use crate::load::gguf::GgufFile;
use crate::load::{GgufSource, Loaded, config_from_gguf, load};
use crate::lora::TARGETS;
use crate::model::{Llama, like};
use burn::nn::Linear;
use burn::tensor::{DType, Device, Tensor, TensorData};
use ember_kernels::{QuantKind, QuantMatrix};
use std::path::Path;

/// [`load`], keeping a `.gguf` file's `Q4_1` and `Q8_0` projections and head also as their
/// quantized blocks, which decoding steps read instead of the f32 weights (`crate::blocks`;
/// `ember serve`). A directory loads as with [`load`].
///
/// # Errors
/// As [`load`]; a quantized tensor whose bytes do not make whole blocks.
pub fn load_with_blocks(path: &Path, device: &Device) -> Result<Loaded> {
    let mut loaded = load(path, device)?;
    if path.is_file() {
        let file = GgufFile::open(path)?;
        let config = config_from_gguf(&file)?;
        let src = GgufSource::new(file, config.n_heads, config.n_kv_heads);
        loaded.model = attach_gguf(loaded.model, &src)?;
    }
    Ok(loaded)
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
fn attach_gguf(mut model: Llama, src: &GgufSource) -> Result<Llama> {
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

/// The blocks of the GGUF tensor that holds Hugging Face tensor `hf`, if it is `Q4_1` or `Q8_0`,
/// or `BF16` where a product would read it (bf16 products chosen and AMX tiles present: else
/// the copy would only take memory); `heads`: its rows put back from llama.cpp's interleaved
/// order, per head.
fn read_blocks(file: &GgufFile, hf: &str, heads: Option<usize>) -> Result<Option<QuantMatrix>> {
    let Some(name) = GgufSource::gguf_name(hf) else {
        return Ok(None);
    };
    let Some(kind) = file
        .tensor_info(&name)
        .ok()
        .and_then(|t| QuantKind::from_ggml(t.ggml_type))
        .filter(|k| ember_kernels::op::reads_kind(*k))
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
