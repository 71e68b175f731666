//! Checkpoints: Hugging Face directories (`config.json` + `model.safetensors` or a sharded
//! index) and GGUF files in, Hugging Face safetensors + `config.json` out.
//!
//! One name table per family maps Hugging Face names to GGUF names; Linear weights are stored
//! `[out, in]` in both formats and `[in, out]` in burn, so they are transposed once at load.
//!
//! - `gguf`: the GGUF reader and its dequantization; `hf`: the Hugging Face tensor layout
//!   stated once; `quantize`: a GGUF file's quantized blocks kept beside the f32 weights
//!   (`load_with_blocks`, `Llama::quantized`); `tokenizer`: tokenizers and chat templates
//!   (`Tokenizer::for_checkpoint`).
//!
//! The folder imports the model (`crate::model`, `crate::config`, …), the file I/O
//! (`crate::files`) and decoding's temperature rule; the model imports nothing from here.

pub mod gguf;
pub(crate) mod hf;
pub(crate) mod quantize;
pub(crate) mod tokenizer;

use crate::config::{HfConfig, LlamaConfig, ids_of};
use crate::error::{LlmError, Result};
use crate::files::{SafetensorsSource, WeightSource, write_atomic, write_safetensors};
use crate::load::gguf::{GgufFile, Value};
use crate::model::Llama;
use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use std::path::Path;

/// Tensors of a GGUF file, named the Hugging Face way.
pub struct GgufSource {
    file: GgufFile,
    unpermute_heads: Option<(usize, usize)>,
}

impl GgufSource {
    /// Wraps an open file. For the `llama` architecture, llama.cpp stored Q and K rows permuted
    /// for its interleaved RoPE; they are put back in rotate-half order per head.
    pub fn new(file: GgufFile, n_heads: usize, n_kv_heads: usize) -> Self {
        let arch = file
            .metadata
            .get("general.architecture")
            .and_then(Value::as_str)
            .unwrap_or("");
        let unpermute_heads = (arch == "llama").then_some((n_heads, n_kv_heads));
        Self {
            file,
            unpermute_heads,
        }
    }

    /// The file.
    pub(crate) fn file(&self) -> &GgufFile {
        &self.file
    }

    /// `(heads, kv_heads)` where Q and K rows are stored in llama.cpp's interleaved order.
    pub(crate) fn unpermute_heads(&self) -> Option<(usize, usize)> {
        self.unpermute_heads
    }

    /// The GGUF name of a Hugging Face tensor name.
    pub fn gguf_name(hf: &str) -> Option<String> {
        if hf == "model.embed_tokens.weight" {
            return Some("token_embd.weight".into());
        }
        if hf == "model.norm.weight" {
            return Some("output_norm.weight".into());
        }
        if hf == "lm_head.weight" {
            return Some("output.weight".into());
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, tail) = rest.split_once('.')?;
        let table = [
            ("input_layernorm.weight", "attn_norm.weight"),
            ("post_attention_layernorm.weight", "ffn_norm.weight"),
            ("self_attn.q_proj.weight", "attn_q.weight"),
            ("self_attn.k_proj.weight", "attn_k.weight"),
            ("self_attn.v_proj.weight", "attn_v.weight"),
            ("self_attn.o_proj.weight", "attn_output.weight"),
            ("self_attn.q_proj.bias", "attn_q.bias"),
            ("self_attn.k_proj.bias", "attn_k.bias"),
            ("self_attn.v_proj.bias", "attn_v.bias"),
            ("self_attn.q_norm.weight", "attn_q_norm.weight"),
            ("self_attn.k_norm.weight", "attn_k_norm.weight"),
            ("mlp.gate_proj.weight", "ffn_gate.weight"),
            ("mlp.up_proj.weight", "ffn_up.weight"),
            ("mlp.down_proj.weight", "ffn_down.weight"),
        ];
        let g = table.iter().find(|(h, _)| *h == tail)?.1;
        Some(format!("blk.{layer}.{g}"))
    }
}

/// Undoes llama.cpp's Q/K permutation: GGUF row `h·d + 2j + s` holds HF row `h·d + s·d/2 + j`.
pub fn unpermute_rows(w: &[f32], rows: usize, cols: usize, n_heads: usize) -> Vec<f32> {
    let d = rows / n_heads;
    let half = d / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_heads {
        for j in 0..half {
            for s in 0..2 {
                let src = h * d + 2 * j + s;
                let dst = h * d + s * half + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

impl WeightSource for GgufSource {
    fn get(&mut self, name: &str, _shape_hint: &[usize]) -> Result<Option<(Vec<f32>, Vec<usize>)>> {
        let Some(g) = Self::gguf_name(name) else {
            return Ok(None);
        };
        if self.file.tensor_info(&g).is_err() {
            return Ok(None);
        }
        let (mut data, shape) = self.file.read_f32(&g)?;
        if let Some((nh, nkv)) = self.unpermute_heads {
            let heads = if name.ends_with("q_proj.weight") {
                Some(nh)
            } else if name.ends_with("k_proj.weight") {
                Some(nkv)
            } else {
                None
            };
            if let (Some(heads), [rows, cols]) = (heads, shape.as_slice()) {
                data = unpermute_rows(&data, *rows, *cols, heads);
            }
        }
        Ok(Some((data, shape)))
    }
    fn path(&self) -> &Path {
        self.file.path()
    }
}

/// Our config from GGUF metadata (`{arch}.*` keys).
pub fn config_from_gguf(file: &GgufFile) -> Result<LlamaConfig> {
    let arch = file
        .get("general.architecture")?
        .as_str()
        .unwrap_or("")
        .to_string();
    let family = match arch.as_str() {
        "llama" => crate::config::Family::Llama,
        "qwen2" => crate::config::Family::Qwen2,
        "qwen3" => crate::config::Family::Qwen3,
        other => {
            return Err(LlmError::Config {
                field: "general.architecture",
                reason: format!("`{other}` is not supported (supported: llama, qwen2, qwen3)"),
            });
        }
    };
    let u = |k: &str| -> Result<usize> {
        let key = format!("{arch}.{k}");
        file.get(&key)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| LlmError::Config {
                field: "gguf metadata",
                reason: format!("`{key}` is not an integer"),
            })
    };
    let f = |k: &str, default: f64| {
        file.metadata
            .get(&format!("{arch}.{k}"))
            .and_then(Value::as_f64)
            .unwrap_or(default)
    };
    let n_heads = u("attention.head_count")?;
    let vocab = match u("vocab_size") {
        Ok(v) => v,
        Err(_) => file
            .get("tokenizer.ggml.tokens")?
            .as_array()
            .map_or(0, <[Value]>::len),
    };
    let d_model = u("embedding_length")?;
    let head_dim = u("attention.key_length")
        .or_else(|_| u("rope.dimension_count"))
        .ok()
        .filter(|hd| *hd != d_model / n_heads.max(1));
    let cfg = LlamaConfig::new(
        family,
        vocab,
        d_model,
        u("feed_forward_length")?,
        u("block_count")?,
        n_heads,
        u("attention.head_count_kv").unwrap_or(n_heads),
    )
    .with_head_dim(head_dim)
    .with_rms_norm_eps(f("attention.layer_norm_rms_epsilon", 1e-5))
    .with_rope_theta(f("rope.freq_base", 10000.0))
    .with_rope_scaling(gguf_rope(file, &arch)?)
    .with_max_position_embeddings(u("context_length").unwrap_or(2048))
    .with_qkv_bias(family == crate::config::Family::Qwen2)
    .with_qk_norm(family == crate::config::Family::Qwen3)
    .with_tie_embeddings(file.tensor_info("output.weight").is_err());
    cfg.validate()?;
    Ok(cfg)
}

/// RoPE scaling in GGUF metadata: `{arch}.rope.scaling.type` `linear` with its factor, or the
/// per-frequency divisors llama.cpp's converter stores for Llama 3.x (`rope_freqs.weight`).
fn gguf_rope(file: &GgufFile, arch: &str) -> Result<Option<crate::RopeScaling>> {
    let kind = file
        .metadata
        .get(&format!("{arch}.rope.scaling.type"))
        .and_then(Value::as_str)
        .unwrap_or("none");
    let factor = file
        .metadata
        .get(&format!("{arch}.rope.scaling.factor"))
        .and_then(Value::as_f64);
    match (kind, factor) {
        ("none", _) if file.tensor_info("rope_freqs.weight").is_ok() => {
            let (factors, _) = file.read_f32("rope_freqs.weight")?;
            if factors.iter().any(|f| !f.is_finite() || *f <= 0.0) {
                return Err(LlmError::Config {
                    field: "rope_freqs.weight",
                    reason: "a frequency divisor is not a positive number".into(),
                });
            }
            Ok(Some(crate::RopeScaling::Factors { factors }))
        }
        ("none", _) => Ok(None),
        ("linear", Some(factor)) if factor.is_finite() && factor > 0.0 => {
            Ok(Some(crate::RopeScaling::Linear { factor }))
        }
        (t, _) => Err(LlmError::Config {
            field: "rope.scaling.type",
            reason: format!(
                "`{t}` (factor {factor:?}) is not supported in GGUF files (supported: none, \
                 linear, and llama.cpp's rope_freqs tensor)"
            ),
        }),
    }
}

/// Builds the model from `source`, checking every tensor's shape: the structure of
/// [`LlamaConfig::init`] (whose parameters are initialised lazily, so its random values are never
/// drawn) with each parameter of the Hugging Face layout ([`crate::load::hf::visit`]) read from
/// `source`.
pub fn build_model(
    cfg: &LlamaConfig,
    source: &mut dyn WeightSource,
    device: &Device,
) -> Result<Llama> {
    let mut model = cfg.init(device);
    let mut loader = Loader { source, device };
    crate::load::hf::visit(&mut model, &mut loader)?;
    Ok(model)
}

/// Fills parameters from a [`WeightSource`].
struct Loader<'a> {
    source: &'a mut dyn WeightSource,
    device: &'a Device,
}

impl Loader<'_> {
    /// The tensor `name` with exactly `shape`.
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (data, actual) = self
            .source
            .get(name, shape)?
            .ok_or_else(|| LlmError::Checkpoint {
                path: self.source.path().to_path_buf(),
                reason: format!("missing tensor `{name}`"),
            })?;
        if actual != shape {
            return Err(LlmError::Checkpoint {
                path: self.source.path().to_path_buf(),
                reason: format!("tensor `{name}` has shape {actual:?}, expected {shape:?}"),
            });
        }
        Ok(data)
    }
}

impl crate::load::hf::Visitor for Loader<'_> {
    fn vector(&mut self, name: &str, p: &mut Param<Tensor<1>>) -> Result<()> {
        let [n] = p.lazy_shape().dims();
        let v = self.take(name, &[n])?;
        *p = Param::from_tensor(Tensor::from_data(TensorData::new(v, [n]), self.device));
        Ok(())
    }

    fn matrix(&mut self, name: &str, p: &mut Param<Tensor<2>>, transposed: bool) -> Result<()> {
        let [d0, d1] = p.lazy_shape().dims();
        let v = if transposed {
            crate::load::hf::transpose(&self.take(name, &[d1, d0])?, d1, d0)
        } else {
            self.take(name, &[d0, d1])?
        };
        *p = Param::from_tensor(Tensor::from_data(TensorData::new(v, [d0, d1]), self.device));
        Ok(())
    }
}

/// A loaded checkpoint: model, config, and the eos ids the checkpoint declares.
#[derive(Debug)]
pub struct Loaded {
    /// The model.
    pub model: Llama,
    /// Its config.
    pub config: LlamaConfig,
    /// EOS ids from `generation_config.json` / `config.json` (HF) or GGUF metadata.
    pub eos_ids: Vec<u32>,
    /// The sampling defaults of `generation_config.json` (none for GGUF files).
    pub generation: GenerationDefaults,
}

/// The sampling settings a Hugging Face directory's `generation_config.json` recommends
/// (transformers' `GenerationConfig`; vLLM serves with them by default): what a server uses
/// when a request leaves a setting out. Values outside their range are dropped with a warning.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// Temperature (0 when `do_sample` is false: transformers then decodes greedily).
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k (0 = off).
    pub top_k: Option<usize>,
    /// Min-p.
    pub min_p: Option<f32>,
}

impl GenerationDefaults {
    /// The defaults of a parsed `generation_config.json`.
    pub fn from_json(v: &serde_json::Value) -> Self {
        let num = |k: &str, ok: fn(f64) -> bool| {
            let x = v.get(k).and_then(serde_json::Value::as_f64)?;
            if ok(x) {
                Some(x as f32)
            } else {
                log::warn!("generation_config.json: ignoring {k} = {x} (out of range)");
                None
            }
        };
        let greedy = v.get("do_sample").and_then(serde_json::Value::as_bool) == Some(false);
        Self {
            temperature: if greedy {
                Some(0.0)
            } else {
                num("temperature", |x| {
                    crate::decode::temperature::temperature_ok(x, true)
                })
            },
            top_p: num("top_p", |x| x > 0.0 && x <= 1.0),
            top_k: v
                .get("top_k")
                .and_then(serde_json::Value::as_u64)
                .and_then(|k| usize::try_from(k).ok()),
            min_p: num("min_p", |x| (0.0..1.0).contains(&x)),
        }
    }
}

/// Loads a Hugging Face directory or a `.gguf` file.
pub fn load(path: &Path, device: &Device) -> Result<Loaded> {
    if !path.exists() {
        return Err(LlmError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ));
    }
    if path.is_file() {
        let file = GgufFile::open(path)?;
        let config = config_from_gguf(&file)?;
        let eos_ids = file
            .metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(Value::as_u64)
            .map(|v| vec![v as u32])
            .unwrap_or_default();
        let mut src = GgufSource::new(file, config.n_heads, config.n_kv_heads);
        let model = build_model(&config, &mut src, device)?;
        return Ok(Loaded {
            model,
            config,
            eos_ids,
            generation: GenerationDefaults::default(),
        });
    }
    // A run's `final/` or a directory pushed to servers carries a manifest: damage is an error.
    ember_train::manifest::verify_export(path)?;
    let cfg_path = path.join("config.json");
    let text =
        ember_train::io::read_to_string(&cfg_path).map_err(|e| LlmError::io(&cfg_path, e))?;
    let hf = HfConfig::from_json(&text)?;
    let config = hf.to_config()?;
    let mut eos_ids = hf.eos_ids();
    let mut generation = GenerationDefaults::default();
    let gen_path = path.join("generation_config.json");
    if gen_path.exists() {
        let text =
            ember_train::io::read_to_string(&gen_path).map_err(|e| LlmError::io(&gen_path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| LlmError::Config {
            field: "generation_config.json",
            reason: e.to_string(),
        })?;
        let ids = ids_of(v.get("eos_token_id"));
        if !ids.is_empty() {
            eos_ids = ids;
        }
        generation = GenerationDefaults::from_json(&v);
    }
    let mut src = SafetensorsSource::open_dir(path)?;
    let model = build_model(&config, &mut src, device)?;
    Ok(Loaded {
        model,
        config,
        eos_ids,
        generation,
    })
}

/// Collects parameters as `(name, shape, little-endian bytes)` in the Hugging Face layout.
#[derive(Default)]
struct Saver {
    tensors: Vec<(String, Vec<usize>, Vec<u8>)>,
}

impl Saver {
    fn push(&mut self, name: &str, shape: Vec<usize>, v: &[f32]) {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensors.push((name.to_string(), shape, bytes));
    }
}

fn host_vec<const D: usize>(name: &str, t: Tensor<D>) -> Result<Vec<f32>> {
    t.try_into_vec_as::<f32>()
        .map_err(|e| LlmError::Input(format!("reading `{name}` from the device: {e:?}")))
}

impl crate::load::hf::Visitor for Saver {
    fn vector(&mut self, name: &str, p: &mut Param<Tensor<1>>) -> Result<()> {
        let v = host_vec(name, p.val())?;
        self.push(name, vec![v.len()], &v);
        Ok(())
    }

    fn matrix(&mut self, name: &str, p: &mut Param<Tensor<2>>, transposed: bool) -> Result<()> {
        let [d0, d1] = p.dims();
        let v = host_vec(name, p.val())?;
        if transposed {
            self.push(name, vec![d1, d0], &crate::load::hf::transpose(&v, d0, d1));
        } else {
            self.push(name, vec![d0, d1], &v);
        }
        Ok(())
    }
}

/// Writes `model` (its effective weights: LoRA merged) as Hugging Face `model.safetensors` plus
/// `config.json` into `dir`, which `transformers` loads with `from_pretrained`. Files are written
/// atomically, so an interrupted save leaves no half-written checkpoint.
pub fn save_hf(model: &Llama, cfg: &LlamaConfig, eos_ids: &[u32], dir: &Path) -> Result<()> {
    if let Some(crate::RopeScaling::Factors { .. }) = cfg.rope_scaling {
        return Err(LlmError::Config {
            field: "rope_scaling",
            reason: "the per-frequency RoPE divisors of a GGUF file have no transformers \
                     config form; export from the Hugging Face checkpoint instead"
                .into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| LlmError::io(dir, e))?;
    let mut saver = Saver::default();
    crate::load::hf::visit(&mut model.clone(), &mut saver)?;
    write_safetensors(
        &dir.join("model.safetensors"),
        &saver.tensors,
        Some(&[("format", "pt")]),
    )?;
    let json = serde_json::to_string_pretty(&cfg.to_hf_json(eos_ids, None)).unwrap_or_default();
    write_atomic(&dir.join("config.json"), json.as_bytes())
}
