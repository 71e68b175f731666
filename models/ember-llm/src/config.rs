//! Model configuration: our burn config, and the Hugging Face `config.json` it is read from.

use crate::error::LlmError;
use crate::rope::RopeScaling;

type Res<T> = std::result::Result<T, LlmError>;
use burn::config::Config;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Architecture family.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Family {
    /// Llama (Llama 2/3, SmolLM, TinyLlama, Mistral without sliding window).
    Llama,
    /// Qwen2 / Qwen2.5 (q/k/v biases).
    Qwen2,
    /// Qwen3 dense (RMSNorm of each query and key head before RoPE, no biases by default).
    Qwen3,
}

/// A decoder-only transformer of the Llama/Qwen2 family.
#[derive(Config, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Architecture family.
    pub family: Family,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub d_model: usize,
    /// MLP inner size.
    pub d_ff: usize,
    /// Number of decoder layers.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention).
    pub n_kv_heads: usize,
    /// Per-head size (default `d_model / n_heads`).
    #[config(default = "None")]
    pub head_dim: Option<usize>,
    /// RMSNorm ε.
    #[config(default = 1e-5)]
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    #[config(default = 10000.0)]
    pub rope_theta: f64,
    /// Longest sequence the model supports.
    #[config(default = 2048)]
    pub max_position_embeddings: usize,
    /// Biases on q/k/v projections (Qwen2).
    #[config(default = false)]
    pub qkv_bias: bool,
    /// Biases on the o/MLP projections (`attention_bias`/`mlp_bias` of Llama configs).
    #[config(default = false)]
    pub out_bias: bool,
    /// The output head shares the embedding matrix.
    #[config(default = false)]
    pub tie_embeddings: bool,
    /// Scaled RoPE (Llama 3.x, linear, YaRN); `None` for plain RoPE.
    #[config(default = "None")]
    pub rope_scaling: Option<RopeScaling>,
    /// RMSNorm of each query and key head before RoPE (Qwen3's `q_norm`/`k_norm`).
    #[config(default = false)]
    pub qk_norm: bool,
}

impl LlamaConfig {
    /// Per-head size.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads.max(1))
    }

    /// Checks the dimensions agree.
    pub fn validate(&self) -> Res<()> {
        let bad = |field: &'static str, reason: String| Err(LlmError::Config { field, reason });
        if self.n_heads == 0 || self.n_kv_heads == 0 || self.n_layers == 0 || self.vocab_size == 0 {
            return bad(
                "num_attention_heads/num_key_value_heads/num_hidden_layers/vocab_size",
                "must be > 0".into(),
            );
        }
        // Sizes from a file drive allocations: far beyond any real model they are a damaged or
        // hostile file, refused before anything is allocated.
        for (field, v, max) in [
            ("num_hidden_layers", self.n_layers, 1 << 10),
            ("num_attention_heads", self.n_heads, 1 << 10),
            ("hidden_size", self.d_model, 1 << 16),
            ("intermediate_size", self.d_ff, 1 << 20),
            ("vocab_size", self.vocab_size, 1 << 23),
            ("head_dim", self.head_dim(), 1 << 12),
        ] {
            if v > max {
                return bad(field, format!("{v} is beyond {max}"));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.n_kv_heads, self.n_heads
                ),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("{} must be even for rotary embeddings", self.head_dim()),
            );
        }
        if let Some(RopeScaling::Factors { factors }) = &self.rope_scaling
            && factors.len() != self.head_dim() / 2
        {
            return bad(
                "rope_freqs",
                format!(
                    "{} frequency divisors for head size {}",
                    factors.len(),
                    self.head_dim()
                ),
            );
        }
        if self.head_dim.is_none() && !self.d_model.is_multiple_of(self.n_heads) {
            return bad(
                "hidden_size",
                format!(
                    "{} is not a multiple of num_attention_heads {}",
                    self.d_model, self.n_heads
                ),
            );
        }
        Ok(())
    }
}

/// The fields of a Hugging Face `config.json` for Llama/Qwen2 models.
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    /// e.g. `["LlamaForCausalLM"]`.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// `llama`, `mistral`, `qwen2` or `qwen3`.
    pub model_type: String,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP size.
    pub intermediate_size: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// KV heads (defaults to query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Layers.
    pub num_hidden_layers: usize,
    /// RMSNorm ε.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE θ (transformers < 5).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// RoPE settings (transformers ≥ 5): `{rope_theta, rope_type}`.
    #[serde(default)]
    pub rope_parameters: Option<Value>,
    /// Vocabulary.
    pub vocab_size: usize,
    /// Context length.
    #[serde(default = "default_ctx")]
    pub max_position_embeddings: usize,
    /// Tied head.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama's bias on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Llama's bias on the MLP.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Explicit head size.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Activation (must be `silu`).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Scaled RoPE (transformers < 5): see [`RopeScaling::from_hf`].
    #[serde(default)]
    pub rope_scaling: Option<Value>,
    /// Qwen2 sliding window switch (must be false).
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Llama pretraining tensor parallelism (must be 1).
    #[serde(default = "one")]
    pub pretraining_tp: usize,
    /// BOS id.
    #[serde(default)]
    pub bos_token_id: Option<Value>,
    /// EOS id(s).
    #[serde(default)]
    pub eos_token_id: Option<Value>,
    /// Everything else (ignored, logged).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_ctx() -> usize {
    2048
}
fn default_act() -> String {
    "silu".into()
}
fn one() -> usize {
    1
}

/// Keys of `config.json` that do not change the computation.
const HARMLESS: &[&str] = &[
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "initializer_range",
    "use_cache",
    "pad_token_id",
    "attention_dropout",
    "max_window_layers",
    "sliding_window",
    "is_llama_config",
    "rope_interleaved",
    "layer_types",
    "bos_token_id",
    "eos_token_id",
];

impl HfConfig {
    /// Parses `config.json` text.
    pub fn from_json(text: &str) -> Res<Self> {
        serde_json::from_str(text).map_err(|e| LlmError::Config {
            field: "config.json",
            reason: e.to_string(),
        })
    }

    /// The eos ids named in the config.
    pub fn eos_ids(&self) -> Vec<u32> {
        ids_of(self.eos_token_id.as_ref())
    }

    /// Converts to our config, refusing what we do not implement.
    pub fn to_config(&self) -> Res<LlamaConfig> {
        let bad = |field: &'static str, reason: String| Err(LlmError::Config { field, reason });
        let family = self.family()?;
        if self.hidden_act != "silu" {
            return bad(
                "hidden_act",
                format!("`{}` is not supported (only silu)", self.hidden_act),
            );
        }
        let (rope_theta, rope_scaling) = self.rope()?;
        if self.pretraining_tp != 1 {
            return bad(
                "pretraining_tp",
                format!("{} is not supported (only 1)", self.pretraining_tp),
            );
        }
        if self.extra.get("rope_interleaved").and_then(Value::as_bool) == Some(true) {
            return bad(
                "rope_interleaved",
                "interleaved RoPE checkpoints are not supported".into(),
            );
        }
        let unknown: Vec<&String> = self
            .extra
            .keys()
            .filter(|k| !HARMLESS.contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            log::warn!("config.json: ignoring keys {unknown:?}");
        }
        let (qkv_bias, out_bias) = match family {
            Family::Llama if self.attention_bias != self.mlp_bias => {
                return bad(
                    "attention_bias/mlp_bias",
                    "must be equal (mixed output biases are not supported)".into(),
                );
            }
            Family::Llama => (self.attention_bias, self.attention_bias),
            Family::Qwen2 => (true, false),
            Family::Qwen3 if self.attention_bias => {
                return bad(
                    "attention_bias",
                    "Qwen3 with attention biases is not supported (only the MLP-free o_proj \
                     bias would differ from Llama's layout)"
                        .into(),
                );
            }
            Family::Qwen3 => (false, false),
        };
        let cfg = LlamaConfig::new(
            family,
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads.unwrap_or(self.num_attention_heads),
        )
        .with_head_dim(self.head_dim)
        .with_rms_norm_eps(self.rms_norm_eps)
        .with_rope_theta(rope_theta)
        .with_rope_scaling(rope_scaling)
        .with_max_position_embeddings(self.context()?)
        .with_qkv_bias(qkv_bias)
        .with_out_bias(out_bias)
        .with_qk_norm(family == Family::Qwen3)
        .with_tie_embeddings(self.tie_word_embeddings);
        cfg.validate()?;
        Ok(cfg)
    }

    /// The family of `model_type`, checked against `architectures`.
    fn family(&self) -> Res<Family> {
        let bad = |field: &'static str, reason: String| Err(LlmError::Config { field, reason });
        let family = match self.model_type.as_str() {
            "llama" | "mistral" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            other => {
                return bad(
                    "model_type",
                    format!(
                        "`{other}` is not supported (supported: llama, mistral, qwen2, qwen3; \
                         mixture-of-experts families such as qwen3_moe and mixtral, and \
                         gemma/phi, have other layers)"
                    ),
                );
            }
        };
        for a in &self.architectures {
            if !ARCHITECTURES.contains(&a.as_str()) {
                return bad(
                    "architectures",
                    format!(
                        "`{a}` is not supported (supported: {})",
                        ARCHITECTURES.join(", ")
                    ),
                );
            }
        }
        Ok(family)
    }

    /// RoPE θ and scaling from `rope_theta`/`rope_scaling` (transformers < 5) or
    /// `rope_parameters` (≥ 5).
    fn rope(&self) -> Res<(f64, Option<RopeScaling>)> {
        let scaling_obj = self
            .rope_scaling
            .as_ref()
            .filter(|s| !s.is_null())
            .or(self.rope_parameters.as_ref());
        let scaling = match scaling_obj {
            Some(p) => RopeScaling::from_hf(p, self.max_position_embeddings)?,
            None => None,
        };
        let theta = self
            .rope_theta
            .or_else(|| {
                self.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta").and_then(Value::as_f64))
            })
            .unwrap_or(10000.0);
        Ok((theta, scaling))
    }

    /// The longest sequence served exactly. With sliding-window attention (Mistral's
    /// `sliding_window`, Qwen's `use_sliding_window`) attention is the full causal attention
    /// as long as a sequence fits in the window, so the context is capped at the window.
    fn context(&self) -> Res<usize> {
        let window = self.extra.get("sliding_window").and_then(Value::as_u64);
        let windowed = match self.model_type.as_str() {
            "mistral" => window,
            _ if self.use_sliding_window => Some(window.ok_or(LlmError::Config {
                field: "sliding_window",
                reason: "use_sliding_window is set but sliding_window is not an integer".into(),
            })?),
            _ => None,
        };
        match windowed {
            Some(w) if (w as usize) < self.max_position_embeddings => {
                log::warn!(
                    "config.json: sliding window {w}: sequences are limited to {w} positions, \
                     where sliding-window and full attention agree"
                );
                Ok(w as usize)
            }
            _ => Ok(self.max_position_embeddings),
        }
    }
}

/// The `architectures` entries we load.
const ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
];

impl LlamaConfig {
    /// The Hugging Face `config.json` of this model (used when exporting).
    pub fn to_hf_json(&self, eos_ids: &[u32], bos_id: Option<u32>) -> Value {
        let (arch, ty) = match self.family {
            Family::Llama => ("LlamaForCausalLM", "llama"),
            Family::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            Family::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        };
        let mut v = serde_json::json!({
            "architectures": [arch],
            "model_type": ty,
            "hidden_size": self.d_model,
            "intermediate_size": self.d_ff,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "num_hidden_layers": self.n_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        if let Some(hd) = self.head_dim {
            v["head_dim"] = hd.into();
        }
        if let Some(r) = &self.rope_scaling {
            v["rope_scaling"] = r.to_hf();
        }
        if self.family == Family::Qwen3 {
            v["head_dim"] = self.head_dim().into();
            v["attention_bias"] = Value::Bool(false);
        }
        if self.family == Family::Llama {
            v["attention_bias"] = Value::Bool(self.out_bias);
            v["mlp_bias"] = Value::Bool(self.out_bias);
        }
        match eos_ids {
            [] => {}
            [one] => v["eos_token_id"] = (*one).into(),
            many => v["eos_token_id"] = many.to_vec().into(),
        }
        if let Some(b) = bos_id {
            v["bos_token_id"] = b.into();
        }
        v
    }
}

/// Token ids from a JSON int or list of ints.
pub fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => Vec::new(),
    }
}
