//! Pushing the policy's weights to the servers before a rollout: an adapter under a name per
//! step (the last `max_staleness + 1` kept loaded), or the whole weights with
//! `update_weights_from_disk`.

use super::Remote;
use crate::lm::Policy;
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use serde_json::json;

impl Remote {
    /// The step whose weights the servers hold (the last push).
    pub fn pushed(&self) -> Option<usize> {
        self.pushed
    }

    /// Before the rollout of `step`: the policy's adapter on every server, unless it was pushed
    /// for this step already.
    pub fn sync(&mut self, policy: &Policy, step: usize) -> Result<()> {
        if self.pushed == Some(step) {
            return Ok(());
        }
        if policy.lora.is_some() {
            self.push_adapter(policy, step)?;
        } else {
            self.push_weights(policy, step)?;
        }
        self.pushed = Some(step);
        Ok(())
    }

    /// A policy that trains every weight: the model written as a Hugging Face directory and
    /// loaded on every server with SGLang's `update_weights_from_disk` (which `ember serve`
    /// answers too), then checked: each server's `/v1/models` must give the new directory as
    /// the base model's `root` before the rollout goes out.
    pub fn push_weights(&mut self, policy: &Policy, step: usize) -> Result<()> {
        let dir = self.adapters_dir.join(format!("step-{step:08}"));
        let tmp = self.adapters_dir.join(format!(".step-{step:08}.tmp"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        match policy.tok {
            crate::lm::Tok::Char(_) => crate::lm::save_tiny(policy, &tmp)?,
            crate::lm::Tok::Real { .. } => {
                ember_llm::save_hf(&policy.model.valid(), &policy.config, &policy.stop, &tmp)?;
            }
        }
        ember_train::manifest::publish(&tmp, &dir)
            .with_context(|| format!("writing {}", dir.display()))?;
        let path = std::fs::canonicalize(&dir)?.display().to_string();
        let version = format!("{}-step{step}", self.run_tag);
        let body = json!({"model_path": path, "weight_version": version});
        self.on_every_server(&format!("the step-{step} weights"), |me, url, retries| {
            me.request_with(url, "/update_weights_from_disk", Some(&body), retries)?;
            let models = me.request_with(url, "/v1/models", None, retries)?;
            let root = models["data"].as_array().and_then(|d| {
                d.iter()
                    .find(|m| m["id"].as_str() == Some(me.base_model.as_str()))
                    .and_then(|m| m["root"].as_str())
            });
            if root != Some(path.as_str()) {
                bail!(
                    "{url} answered the weight update but serves `{}` from {root:?}, not {path}",
                    me.base_model
                );
            }
            Ok(())
        })?;
        if let Some(p) = self.pushed.filter(|&p| p != step) {
            std::fs::remove_dir_all(self.adapters_dir.join(format!("step-{p:08}"))).ok();
        }
        self.current = Some(self.base_model.clone());
        Ok(())
    }

    /// Writes the policy's adapter and loads it on every server under a fresh name, then
    /// unloads the previous one; rollouts use the new name from now on.
    pub fn push_adapter(&mut self, policy: &Policy, step: usize) -> Result<()> {
        let settings = policy
            .lora
            .as_ref()
            .ok_or_else(|| anyhow!("the openai backend needs a LoRA policy"))?;
        let name = format!("{}-step{step}", self.run_tag);
        let dir = self.adapters_dir.join(format!("step-{step:08}"));
        let tmp = self.adapters_dir.join(format!(".step-{step:08}.tmp"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        ember_llm::save_peft(&policy.model.valid(), settings, &self.base_model, &tmp)?;
        ember_train::manifest::publish(&tmp, &dir)
            .with_context(|| format!("writing {}", dir.display()))?;
        let path = std::fs::canonicalize(&dir)?.display().to_string();
        let body = json!({"lora_name": name, "lora_path": path, "load_inplace": true});
        self.on_every_server(&format!("the step-{step} adapter"), |me, url, retries| {
            me.request_with(url, "/v1/load_lora_adapter", Some(&body), retries)?;
            Ok(())
        })?;
        self.current = Some(name.clone());
        self.loaded.retain(|(v, _)| *v != step);
        self.loaded.push_back((step, name));
        // The oldest versions beyond `keep` go: no rollout in flight is that stale.
        while self.loaded.len() > self.keep {
            let Some((p, old)) = self.loaded.pop_front() else {
                break;
            };
            let live: Vec<&String> = (self.urls.iter().zip(&self.healthy))
                .filter_map(|(u, &h)| h.then_some(u))
                .collect();
            for url in live {
                // A failed unload costs memory on that server, not correctness.
                if let Err(e) = self.request(
                    url,
                    "/v1/unload_lora_adapter",
                    Some(&json!({"lora_name": old})),
                ) {
                    log::warn!("unloading {old} on {url}: {e:#}");
                }
            }
            if p != step {
                std::fs::remove_dir_all(self.adapters_dir.join(format!("step-{p:08}"))).ok();
            }
        }
        Ok(())
    }
}
