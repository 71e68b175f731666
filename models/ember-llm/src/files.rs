//! Tensor files: a named-tensor source ([`WeightSource`]) and safetensors files read
//! ([`SafetensorsSource`]) and written ([`write_safetensors`]), and atomic, durable writes
//! ([`write_atomic`]); the model's LoRA I/O and the loaders share them.

use crate::error::{LlmError, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where weights come from: Hugging Face tensor names in, row-major f32 out.
pub trait WeightSource {
    /// The tensor `name` (Hugging Face name) as f32 with its shape, or None if absent.
    fn get(&mut self, name: &str, shape_hint: &[usize]) -> Result<Option<(Vec<f32>, Vec<usize>)>>;
    /// The file, for error messages.
    fn path(&self) -> &Path;
}

/// Tensors of one or more `.safetensors` files.
pub struct SafetensorsSource {
    files: Vec<(PathBuf, Vec<u8>)>,
    index: HashMap<String, usize>,
    path: PathBuf,
}

impl SafetensorsSource {
    /// Opens `model.safetensors`, or every shard named by `model.safetensors.index.json`.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if single.exists() {
            vec!["model.safetensors".into()]
        } else if index_path.exists() {
            let text = ember_train::io::read_to_string(&index_path)
                .map_err(|e| LlmError::io(&index_path, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| LlmError::Checkpoint {
                    path: index_path.clone(),
                    reason: e.to_string(),
                })?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| LlmError::Checkpoint {
                    path: index_path.clone(),
                    reason: "no `weight_map` object".into(),
                })?;
            let mut names: Vec<String> = map
                .values()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            // A shard is a plain file name inside the model directory: no absolute path, no
            // `..`, no subdirectory, so an index cannot make the loader read other files.
            if let Some(bad) = names.iter().find(|n| {
                let p = Path::new(n.as_str());
                p.components().count() != 1
                    || !matches!(p.components().next(), Some(std::path::Component::Normal(_)))
            }) {
                return Err(LlmError::Checkpoint {
                    path: index_path.clone(),
                    reason: format!("shard `{bad}` is not a file name inside the model directory"),
                });
            }
            names
        } else {
            return Err(LlmError::Checkpoint {
                path: dir.to_path_buf(),
                reason: "neither model.safetensors nor model.safetensors.index.json exists".into(),
            });
        };
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for (i, name) in shard_names.iter().enumerate() {
            let p = dir.join(name);
            let bytes = ember_train::io::read(&p).map_err(|e| LlmError::io(&p, e))?;
            let st = SafeTensors::deserialize(&bytes).map_err(|e| LlmError::Checkpoint {
                path: p.clone(),
                reason: e.to_string(),
            })?;
            for n in st.names() {
                index.insert(n.to_string(), i);
            }
            files.push((p, bytes));
        }
        Ok(Self {
            files,
            index,
            path: dir.to_path_buf(),
        })
    }
}

impl SafetensorsSource {
    /// Opens one `.safetensors` file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let bytes = ember_train::io::read(path).map_err(|e| LlmError::io(path, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| LlmError::Checkpoint {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let index = st.names().into_iter().map(|n| (n.to_string(), 0)).collect();
        Ok(Self {
            files: vec![(path.to_path_buf(), bytes)],
            index,
            path: path.to_path_buf(),
        })
    }
}

impl WeightSource for SafetensorsSource {
    fn get(&mut self, name: &str, _shape_hint: &[usize]) -> Result<Option<(Vec<f32>, Vec<usize>)>> {
        let Some(&i) = self.index.get(name) else {
            return Ok(None);
        };
        let (path, bytes) = &self.files[i];
        let bad = |reason: String| LlmError::Checkpoint {
            path: path.clone(),
            reason,
        };
        let st = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        let view = st.tensor(name).map_err(|e| bad(e.to_string()))?;
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(bad(format!(
                    "tensor `{name}` has dtype {other:?} (supported: F32, F16, BF16)"
                )));
            }
        };
        Ok(Some((values, view.shape().to_vec())))
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes f32 tensors `(name, shape, little-endian bytes)` as a safetensors file, atomically.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
    metadata: Option<&[(&str, &str)]>,
) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| LlmError::Checkpoint {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<_>>()?;
    let meta: Option<HashMap<String, String>> = metadata.map(|m| {
        m.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    let bytes = safetensors::tensor::serialize(views, meta).map_err(|e| LlmError::Checkpoint {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` atomically and durably (`ember_train::io::write_atomic`: temporary
/// file, fsync, rename, directory sync).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    ember_train::io::write_atomic(path, bytes).map_err(|e| LlmError::io(path, e))
}
