//! LoRA on the decoder's linear layers (Hu et al. 2021), through burn's `apply_lora`, with
//! adapters saved and loaded in the PEFT layout (`adapter_config.json` +
//! `adapter_model.safetensors`) so `peft.PeftModel.from_pretrained` reads them.
//!
//! PEFT stores `lora_A` `[r, in]` and `lora_B` `[out, r]` and scales by `lora_alpha / r`; burn's
//! adapter stores `a` `[in, r]`, `b` `[r, out]` with the same scale, so the two are transposes.

use crate::error::{LlmError, Result};
use crate::files::{write_atomic, write_safetensors};
use crate::model::Llama;
use burn::module::Lora;
use burn::module::{LoraAdapter, Module, Param, ParamGroup, Reparameterizer};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// The linear layers a LoRA can target, by their Hugging Face module names.
pub const TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

fn rank8() -> usize {
    8
}
fn alpha16() -> f64 {
    16.0
}
fn default_targets() -> Vec<String> {
    TARGETS.iter().map(|s| s.to_string()).collect()
}

/// Which layers get adapters, and their rank and α.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSettings {
    /// Rank r.
    #[serde(default = "rank8")]
    pub rank: usize,
    /// α (the update is scaled by α/r).
    #[serde(default = "alpha16")]
    pub alpha: f64,
    /// Module names (`q_proj`, …, `down_proj`).
    #[serde(default = "default_targets")]
    pub targets: Vec<String>,
}

impl Default for LoraSettings {
    fn default() -> Self {
        Self {
            rank: rank8(),
            alpha: alpha16(),
            targets: default_targets(),
        }
    }
}

impl LoraSettings {
    /// Checks rank and target names.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(LlmError::Config {
                field: "lora.rank",
                reason: "must be >= 1".into(),
            });
        }
        if self.targets.is_empty() {
            return Err(LlmError::Config {
                field: "lora.targets",
                reason: "name at least one module".into(),
            });
        }
        for t in &self.targets {
            if !TARGETS.contains(&t.as_str()) {
                return Err(LlmError::Config {
                    field: "lora.targets",
                    reason: format!("unknown module `{t}` (valid: {})", TARGETS.join(", ")),
                });
            }
        }
        Ok(())
    }
}

/// (burn parameter path, Hugging Face module path) of every targeted linear layer.
pub fn target_paths(model: &Llama, targets: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for i in 0..model.n_layers() {
        for t in targets {
            let group = if matches!(t.as_str(), "gate_proj" | "up_proj" | "down_proj") {
                "mlp"
            } else {
                "self_attn"
            };
            out.push((
                format!("layers.{i}.{group}.{t}.weight"),
                format!("model.layers.{i}.{group}.{t}"),
            ));
        }
    }
    out
}

/// Attaches fresh adapters (A ~ N(0, 1/r), B = 0, so the model is unchanged) to the targets and
/// freezes every base parameter: only adapter factors are trained.
pub fn apply_lora(model: Llama, settings: &LoraSettings) -> Result<Llama> {
    settings.validate()?;
    let paths: Vec<String> = target_paths(&model, &settings.targets)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let model = model.no_grad();
    Ok(model.apply_lora(
        Lora::new(settings.rank, settings.alpha).set_param_group(ParamGroup::from_paths(paths)),
    ))
}

/// Each linear layer's adapter, by Hugging Face module path.
fn adapters(model: &Llama) -> Vec<(String, &LoraAdapter)> {
    let mut out = Vec::new();
    for (i, l) in model.layers.iter().enumerate() {
        let a = &l.self_attn;
        let m = &l.mlp;
        for (name, group, lin) in [
            ("q_proj", "self_attn", &a.q_proj),
            ("k_proj", "self_attn", &a.k_proj),
            ("v_proj", "self_attn", &a.v_proj),
            ("o_proj", "self_attn", &a.o_proj),
            ("gate_proj", "mlp", &m.gate_proj),
            ("up_proj", "mlp", &m.up_proj),
            ("down_proj", "mlp", &m.down_proj),
        ] {
            if let Some(ad) = lin.weight.adapter() {
                out.push((format!("model.layers.{i}.{group}.{name}"), ad));
            }
        }
    }
    out
}

/// Number of trainable adapter parameters.
pub fn adapter_param_count(model: &Llama) -> usize {
    adapters(model)
        .iter()
        .map(|(_, a)| {
            a.a.val().dims().iter().product::<usize>() + a.b.val().dims().iter().product::<usize>()
        })
        .sum()
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// Saves the adapters alone in the PEFT layout.
pub fn save_peft(
    model: &Llama,
    settings: &LoraSettings,
    base_model: &str,
    dir: &Path,
) -> Result<()> {
    let ads = adapters(model);
    if ads.is_empty() {
        return Err(LlmError::Input(
            "the model has no LoRA adapters to save".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| LlmError::io(dir, e))?;
    let mut tensors = Vec::new();
    for (path, ad) in &ads {
        let a = ad.a.val();
        let [d_in, r] = a.dims();
        let b = ad.b.val();
        let [_, d_out] = b.dims();
        let av = a.try_into_vec_as::<f32>().unwrap_or_default();
        let bv = b.try_into_vec_as::<f32>().unwrap_or_default();
        let bytes = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        tensors.push((
            format!("base_model.model.{path}.lora_A.weight"),
            vec![r, d_in],
            bytes(transpose(&av, d_in, r)),
        ));
        tensors.push((
            format!("base_model.model.{path}.lora_B.weight"),
            vec![d_out, r],
            bytes(transpose(&bv, r, d_out)),
        ));
    }
    write_safetensors(
        &dir.join("adapter_model.safetensors"),
        &tensors,
        Some(&[("format", "pt")]),
    )?;
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": 0.0,
        "target_modules": settings.targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "use_rslora": false,
        "use_dora": false,
    });
    write_atomic(
        &dir.join("adapter_config.json"),
        serde_json::to_string_pretty(&config)
            .unwrap_or_default()
            .as_bytes(),
    )
}

struct PeftLoad {
    factors: HashMap<String, (Tensor<2>, Tensor<2>)>,
    scale: f64,
}

impl Reparameterizer for PeftLoad {
    type Reparam = LoraAdapter;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<LoraAdapter>) {
        let base = param.set_require_grad(false);
        match (D, self.factors.remove(path)) {
            (2, Some((a, b))) => (
                base,
                Some(LoraAdapter {
                    a: Param::from_tensor(a),
                    b: Param::from_tensor(b),
                    scale: self.scale,
                }),
            ),
            _ => (base, None),
        }
    }
}

/// Loads PEFT adapters from `dir` onto `model` (which must have none yet).
pub fn load_peft(model: Llama, dir: &Path, device: &Device) -> Result<(Llama, LoraSettings)> {
    ember_train::manifest::verify_export(dir)?;
    let cfg_path = dir.join("adapter_config.json");
    let text =
        ember_train::io::read_to_string(&cfg_path).map_err(|e| LlmError::io(&cfg_path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| LlmError::Config {
        field: "adapter_config.json",
        reason: e.to_string(),
    })?;
    if v.get("peft_type").and_then(|x| x.as_str()) != Some("LORA") {
        return Err(LlmError::Config {
            field: "peft_type",
            reason: "only LORA adapters are supported".into(),
        });
    }
    for flag in ["use_rslora", "use_dora", "fan_in_fan_out"] {
        if v.get(flag).and_then(|x| x.as_bool()) == Some(true) {
            return Err(LlmError::Config {
                field: "adapter_config.json",
                reason: format!("`{flag}` is not supported"),
            });
        }
    }
    let rank = v
        .get("r")
        .and_then(|x| x.as_u64())
        .ok_or(LlmError::Config {
            field: "r",
            reason: "missing".into(),
        })? as usize;
    let alpha = v
        .get("lora_alpha")
        .and_then(|x| x.as_f64())
        .unwrap_or(rank as f64);
    let targets: Vec<String> = match v.get("target_modules") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    };
    let settings = LoraSettings {
        rank,
        alpha,
        targets,
    };
    settings.validate()?;
    let st_path = dir.join("adapter_model.safetensors");
    let mut src = crate::files::SafetensorsSource::open_file(&st_path)?;
    let mut factors = HashMap::new();
    for (ours, hf) in target_paths(&model, &settings.targets) {
        use crate::files::WeightSource;
        let missing = |k: &str| LlmError::Checkpoint {
            path: st_path.clone(),
            reason: format!("missing tensor `{k}`"),
        };
        let ka = format!("base_model.model.{hf}.lora_A.weight");
        let kb = format!("base_model.model.{hf}.lora_B.weight");
        let (av, ash) = src.get(&ka, &[])?.ok_or_else(|| missing(&ka))?;
        let (bv, bsh) = src.get(&kb, &[])?.ok_or_else(|| missing(&kb))?;
        let (&[r, d_in], &[d_out, r2]) = (ash.as_slice(), bsh.as_slice()) else {
            return Err(LlmError::Checkpoint {
                path: st_path.clone(),
                reason: format!("`{ka}`/`{kb}` are not matrices"),
            });
        };
        if r != rank || r2 != rank {
            return Err(LlmError::Checkpoint {
                path: st_path.clone(),
                reason: format!("`{ka}` has rank {r}, config says {rank}"),
            });
        }
        let a = Tensor::<2>::from_data(TensorData::new(transpose(&av, r, d_in), [d_in, r]), device);
        let b = Tensor::<2>::from_data(
            TensorData::new(transpose(&bv, d_out, r), [r, d_out]),
            device,
        );
        factors.insert(ours, (a, b));
    }
    let model = model.no_grad().apply_reparameterization(PeftLoad {
        factors,
        scale: alpha / rank as f64,
    });
    Ok((model, settings))
}

/// Folds the adapters into the base weights (W ← W + (α/r)·A·B) and drops them, with the
/// quantized blocks of the old base weights (`crate::blocks`).
pub fn merge(model: Llama) -> Llama {
    model.materialize().without_blocks()
}
