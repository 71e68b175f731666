//! What the engine serves from: loading and unloading LoRA adapters (at most `--max-loras`)
//! and replacing the base weights, each between batches on the engine's thread.

use super::Engine;
use crate::api::{ApiError, LoadLora};
use axum::http::StatusCode;
use ember_llm::load_peft;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

impl Engine {
    /// `self` holding at most `n` adapters at once (`--max-loras`).
    pub fn with_max_loras(self, n: usize) -> Self {
        Self {
            max_loras: n,
            ..self
        }
    }

    fn publish_names(&self) {
        if let Ok(mut n) = self.names.write() {
            *n = std::iter::once(self.base_name.clone())
                .chain(self.adapters.keys().cloned())
                .collect();
        }
    }

    /// Loads a PEFT adapter directory under `name` (the checks of vLLM's endpoint: a name not
    /// the base model's, not already loaded unless `load_inplace`).
    pub fn load(&mut self, req: &LoadLora) -> Result<(), ApiError> {
        let name = req.lora_name.trim();
        if name.is_empty() || name == self.base_name {
            return Err(ApiError::bad(
                "lora_name",
                format!("lora_name `{name}` must be non-empty and not the base model's name"),
            ));
        }
        if self.adapters.contains_key(name) && !req.load_inplace {
            return Err(ApiError::bad(
                "lora_name",
                format!(
                    "the LoRA adapter `{name}` has already been loaded (unload it first, or \
                     send load_inplace = true)"
                ),
            ));
        }
        if !self.adapters.contains_key(name) && self.adapters.len() >= self.max_loras {
            return Err(ApiError::bad(
                "lora_name",
                format!(
                    "{} LoRA adapters are loaded, the --max-loras limit: unload one first",
                    self.adapters.len()
                ),
            ));
        }
        let path = Path::new(&req.lora_path);
        if !path.join("adapter_config.json").is_file() {
            return Err(ApiError::bad(
                "lora_path",
                format!(
                    "{} is not a PEFT adapter directory (no adapter_config.json)",
                    req.lora_path
                ),
            ));
        }
        let loaded = catch_unwind(AssertUnwindSafe(|| {
            load_peft(self.base.clone(), path, &self.device)
        }));
        match loaded {
            Ok(Ok((model, _))) => {
                self.adapters.insert(name.to_string(), model);
                self.publish_names();
                log::info!("loaded LoRA adapter `{name}` from {}", req.lora_path);
                Ok(())
            }
            Ok(Err(e)) => Err(ApiError::bad(
                "lora_path",
                format!("loading {}: {e}", req.lora_path),
            )),
            Err(_) => Err(ApiError::bad(
                "lora_path",
                format!("loading {} failed (the loader panicked)", req.lora_path),
            )),
        }
    }

    /// Replaces the base model's weights with those at `path` (SGLang's
    /// `update_weights_from_disk`): the same architecture (`config.json` equal in every
    /// dimension), and no adapter loaded, since adapters hold the base weights they were loaded
    /// over and would silently keep the old ones.
    pub fn update_weights(&mut self, path: &str) -> Result<(), ApiError> {
        if !self.adapters.is_empty() {
            let names: Vec<&str> = self.adapters.keys().map(String::as_str).collect();
            return Err(ApiError::bad(
                "model_path",
                format!(
                    "unload the LoRA adapters first ({}): they were loaded over the current base \
                     weights",
                    names.join(", ")
                ),
            ));
        }
        let loaded = catch_unwind(AssertUnwindSafe(|| {
            ember_llm::load_with_blocks(Path::new(path), &self.device)
        }));
        match loaded {
            Ok(Ok(l)) if l.config == self.config => {
                self.base = l.model;
                log::info!("base weights updated from {path}");
                Ok(())
            }
            Ok(Ok(l)) => Err(ApiError::bad(
                "model_path",
                format!(
                    "{path} has another architecture than the served model (its config: {:?}; \
                     served: {:?})",
                    l.config, self.config
                ),
            )),
            Ok(Err(e)) => Err(ApiError::bad("model_path", format!("loading {path}: {e}"))),
            Err(_) => Err(ApiError::bad(
                "model_path",
                format!("loading {path} failed (the loader panicked)"),
            )),
        }
    }

    /// Unloads the adapter `name`.
    pub fn unload(&mut self, name: &str) -> Result<(), ApiError> {
        let name = name.trim();
        if self.adapters.remove(name).is_none() {
            return Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("no LoRA adapter named `{name}` is loaded"),
                kind: "not_found_error",
                param: Some("lora_name".into()),
            });
        }
        self.publish_names();
        log::info!("unloaded LoRA adapter `{name}`");
        Ok(())
    }
}
