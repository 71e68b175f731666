//! Where Tinker's saved weights live, and the sampler adapters the engine holds.
//!
//! `tinker://MODEL_ID/weights/NAME` is the directory `--tinker-dir/MODEL_ID/weights/NAME`: a
//! PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`, loadable by `peft` or by
//! `ember serve --adapter`) beside the adapter's burn record, the AdamW state and `tinker.json`
//! (the LoRA settings and AdamW's settings); `.../sampler_weights/NAME` holds the PEFT
//! adapter alone. Each is written to a temporary directory and renamed into place with a
//! manifest of checksums (checked on load), so a failed save leaves the previous one intact.
//!
//! The engine holds the adapters of the newest [`SAMPLERS_KEPT`] sampler saves and loaded
//! paths; a sampling session whose adapter was dropped gets an error saying so.

use super::trainer::{Adam, Client};
use crate::api::LoadLora;
use crate::engine::Msg;
use burn::module::{Module, ParamGroup};
use ember_llm::{Llama, LoraSettings};
use ember_train::manifest;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Sampler adapters the engine holds at once for the Tinker service.
pub const SAMPLERS_KEPT: usize = 8;

const ADAPTER: &str = "adapter.bpk";
const OPTIM: &str = "optim.bpk";
const META: &str = "tinker.json";

/// What `tinker.json` records of a training state.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    base_model: String,
    lora: LoraSettings,
    /// AdamW's settings at the last `optim_step` (none before the first).
    adam: Option<Adam>,
}

/// A `save_weights_for_sampler`: a name (a path on disk), or a sampling session to serve.
#[derive(Debug, Clone)]
pub struct SamplerSave {
    /// The name under `sampler_weights/`.
    pub name: Option<String>,
    /// The sampling session that samples this save (no name: ephemeral).
    pub session: Option<String>,
}

/// Sampling sessions and the engine adapters behind them.
pub struct Samplers {
    inner: Mutex<SamplerState>,
}

#[derive(Default)]
struct SamplerState {
    /// Session id → (engine model name, the `tinker://` path it samples, if any).
    sessions: HashMap<String, (String, Option<String>)>,
    /// Engine adapter names loaded for sessions, oldest first.
    loaded: VecDeque<String>,
}

impl Samplers {
    /// No sessions.
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(SamplerState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SamplerState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine name and path behind `session`.
    pub fn get(&self, session: &str) -> Option<(String, Option<String>)> {
        self.lock().sessions.get(session).cloned()
    }

    /// Whether the engine holds `engine_name` for some session.
    pub fn is_loaded(&self, engine_name: &str) -> bool {
        self.lock().loaded.iter().any(|n| n == engine_name)
    }

    /// `session`'s engine name, the adapter behind it marked as the most recently used.
    pub fn use_session(&self, session: &str) -> Option<String> {
        let mut s = self.lock();
        let name = s.sessions.get(session)?.0.clone();
        touch(&mut s.loaded, &name);
        Some(name)
    }

    /// Forgets the sessions whose ids start with `prefix` (a finished session's).
    pub fn end_session(&self, prefix: &str) {
        self.lock().sessions.retain(|id, _| !id.starts_with(prefix));
    }

    /// Records `session` → `engine_name` (an adapter loaded when `adapter`); returns the adapters
    /// to unload past [`SAMPLERS_KEPT`] (their sessions are dropped).
    pub fn register(
        &self,
        session: &str,
        engine_name: &str,
        path: Option<String>,
        adapter: bool,
    ) -> Vec<String> {
        let mut s = self.lock();
        s.sessions
            .insert(session.to_string(), (engine_name.to_string(), path));
        if !adapter || touch(&mut s.loaded, engine_name) {
            return Vec::new();
        }
        s.loaded.push_back(engine_name.to_string());
        let mut gone = Vec::new();
        while s.loaded.len() > SAMPLERS_KEPT {
            if let Some(old) = s.loaded.pop_front() {
                s.sessions.retain(|_, (n, _)| *n != old);
                gone.push(old);
            }
        }
        gone
    }
}

/// Moves `name` to the back of `loaded` (most recently used); false when it is not there.
fn touch(loaded: &mut VecDeque<String>, name: &str) -> bool {
    let Some(i) = loaded.iter().position(|n| n == name) else {
        return false;
    };
    if let Some(n) = loaded.remove(i) {
        loaded.push_back(n);
    }
    true
}

/// The saves of `model_id` (`training_runs/{id}/checkpoints`): `weights/NAME` (training
/// states) and `sampler_weights/NAME`, with their time and size, newest last.
pub fn list(root: &Path, model_id: &str) -> Result<Vec<serde_json::Value>, String> {
    parse_path(&format!("tinker://{model_id}/weights/x"))?;
    let mut out = Vec::new();
    for (kind, what) in [("weights", "training"), ("sampler_weights", "sampler")] {
        let dir = root.join(model_id).join(kind);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if check_name(&name).is_err() || !e.path().is_dir() {
                continue;
            }
            let files = std::fs::read_dir(e.path()).into_iter().flatten().flatten();
            let size: u64 = files
                .filter_map(|f| f.metadata().ok())
                .map(|m| m.len())
                .sum();
            let secs = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            out.push((
                secs,
                serde_json::json!({
                    "checkpoint_id": format!("{kind}/{name}"),
                    "checkpoint_type": what,
                    "time": rfc3339(secs),
                    "tinker_path": format!("tinker://{model_id}/{kind}/{name}"),
                    "size_bytes": size,
                    "public": false,
                }),
            ));
        }
    }
    out.sort_by_key(|(t, _)| *t);
    Ok(out.into_iter().map(|(_, v)| v).collect())
}

/// What a save at `path` holds (`weights_info`): the base model and the LoRA settings.
pub fn info(root: &Path, base_name: &str, path: &str) -> Result<serde_json::Value, String> {
    let (model, kind, name) = parse_path(path)?;
    let dir = root.join(model).join(kind).join(name);
    let config = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&config).map_err(|_| format!("{path} does not exist"))?;
    let peft: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{path}: adapter_config.json: {e}"))?;
    let targets: Vec<String> = peft["target_modules"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let has = |names: &[&str]| names.iter().any(|n| targets.iter().any(|t| t == n));
    Ok(serde_json::json!({
        "base_model": base_name,
        "is_lora": true,
        "lora_rank": peft["r"],
        "train_attn": has(&["q_proj", "k_proj", "v_proj", "o_proj"]),
        "train_mlp": has(&["gate_proj", "up_proj", "down_proj"]),
        "train_unembed": false,
    }))
}

/// `secs` after the Unix epoch as an RFC 3339 UTC time (the civil date by Hinnant's
/// `civil_from_days`).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The checkpoint directory and the engine's queue.
pub struct Store {
    pub(super) dir: PathBuf,
    base_name: String,
    engine: mpsc::Sender<Msg>,
    samplers: Arc<Samplers>,
}

/// A name of a saved state: letters, digits and `._-` (no path separators, not `.` or `..`).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name `{name}`: use 1 to 128 letters, digits, `.`, `_` or `-`, not starting with `.`"
        ))
    }
}

/// `tinker://MODEL_ID/KIND/NAME` split into its parts (each checked).
pub fn parse_path(path: &str) -> Result<(String, String, String), String> {
    let rest = path
        .strip_prefix("tinker://")
        .ok_or_else(|| format!("`{path}` is not a tinker:// path"))?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [model, kind, name] = parts[..] else {
        return Err(format!("`{path}`: expected tinker://MODEL_ID/KIND/NAME"));
    };
    if !matches!(kind, "weights" | "sampler_weights") {
        return Err(format!(
            "`{path}`: the kind must be weights or sampler_weights"
        ));
    }
    let model_ok = !model.is_empty()
        && !model.starts_with('.')
        && model
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '.' | '_' | '-'));
    if !model_ok {
        return Err(format!("`{path}`: bad model id `{model}`"));
    }
    check_name(name)?;
    Ok((model.into(), kind.into(), name.into()))
}

impl Store {
    /// A store under `dir` for a server of `base_name`.
    pub fn new(
        dir: PathBuf,
        base_name: String,
        engine: mpsc::Sender<Msg>,
        samplers: Arc<Samplers>,
    ) -> Self {
        Self {
            dir,
            base_name,
            engine,
            samplers,
        }
    }

    /// The directory of a `tinker://` path.
    pub fn resolve(&self, path: &str) -> Result<(PathBuf, String), String> {
        let (model, kind, name) = parse_path(path)?;
        Ok((self.dir.join(model).join(&kind).join(name), kind))
    }

    /// Writes `client`'s adapter and optimizer as `tinker://MODEL_ID/weights/NAME`.
    pub fn save_state(
        &self,
        model_id: &str,
        name: &str,
        c: &Client,
        overwrite: bool,
    ) -> Result<String, String> {
        check_name(name)?;
        let path = format!("tinker://{model_id}/weights/{name}");
        let meta = Meta {
            base_model: self.base_name.clone(),
            lora: c.lora.clone(),
            adam: c.adam,
        };
        self.publish(&path, overwrite, |tmp| {
            let rec = c
                .model
                .clone()
                .into_record_group(ParamGroup::from_predicate(".lora."));
            rec.save(tmp.join(ADAPTER)).map_err(|e| format!("{e}"))?;
            c.optim
                .to_record()
                .save(tmp.join(OPTIM))
                .map_err(|e| format!("{e}"))?;
            let text = serde_json::to_string_pretty(&meta).map_err(|e| e.to_string())?;
            std::fs::write(tmp.join(META), text).map_err(|e| e.to_string())?;
            ember_llm::save_peft(&c.model.valid(), &c.lora, &self.base_name, tmp)
                .map_err(|e| e.to_string())
        })?;
        Ok(path)
    }

    /// Writes directory `path` with `fill`, through a temporary directory and a manifest.
    fn publish(
        &self,
        path: &str,
        overwrite: bool,
        fill: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<(), String> {
        let (dst, _) = self.resolve(path)?;
        if dst.exists() && !overwrite {
            return Err(format!("{path} exists (pass overwrite=True to replace it)"));
        }
        let parent = dst.parent().ok_or("bad checkpoint path")?;
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        let tmp = parent.join(format!(
            ".{}.tmp",
            dst.file_name().and_then(|n| n.to_str()).unwrap_or("save")
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
        let written = fill(&tmp).and_then(|()| {
            manifest::publish(&tmp, &dst).map_err(|e| format!("publishing {path}: {e}"))
        });
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        written
    }

    /// A client from the state at `path` (a `weights` save), with its optimizer state when
    /// `optimizer`.
    pub fn load_client(&self, base: &Llama, path: &str, optimizer: bool) -> Result<Client, String> {
        let (dir, kind) = self.resolve(path)?;
        if kind != "weights" {
            return Err(format!(
                "{path}: load a training state (tinker://…/weights/NAME)"
            ));
        }
        if !dir.is_dir() {
            return Err(format!("{path} does not exist"));
        }
        manifest::verify(&dir).map_err(|e| format!("{path}: {e}"))?;
        let text = std::fs::read_to_string(dir.join(META)).map_err(|e| format!("{path}: {e}"))?;
        let meta: Meta = serde_json::from_str(&text).map_err(|e| format!("{path}: {META}: {e}"))?;
        if meta.base_model != self.base_name {
            return Err(format!(
                "{path} was trained on `{}`; this server serves `{}`",
                meta.base_model, self.base_name
            ));
        }
        let model = ember_llm::apply_lora(base.clone(), &meta.lora).map_err(|e| e.to_string())?;
        let rec = burn::store::ModuleRecord::load(dir.join(ADAPTER))
            .map_err(|e| format!("{path}: {ADAPTER}: {e}"))?
            .allow_partial(true);
        let model = model
            .try_load_record(rec)
            .map_err(|e| format!("{path}: applying {ADAPTER}: {e}"))?;
        let mut client = Client::new(model, meta.lora);
        if optimizer {
            let rec = burn::optim::OptimizerRecord::load(dir.join(OPTIM))
                .map_err(|e| format!("{path}: {OPTIM}: {e}"))?;
            if let Some(adam) = meta.adam {
                client.optim = adam.optimizer();
            }
            client.optim = client.optim.load_record(rec);
            client.adam = meta.adam;
        }
        Ok(client)
    }

    /// `save_weights_for_sampler` from the trainer's thread: a named save on disk, or an
    /// ephemeral adapter loaded into the engine for a sampling session.
    pub fn save_sampler(
        &self,
        model_id: &str,
        model: &Llama,
        lora: &LoraSettings,
        s: SamplerSave,
    ) -> Result<serde_json::Value, String> {
        let write = |dir: &Path| {
            ember_llm::save_peft(model, lora, &self.base_name, dir).map_err(|e| e.to_string())
        };
        if let Some(name) = &s.name {
            check_name(name)?;
            let path = format!("tinker://{model_id}/sampler_weights/{name}");
            self.publish(&path, true, write)?;
            let (dir, _) = self.resolve(&path)?;
            if let Some(session) = &s.session {
                self.install_blocking(session, &path, &dir, Some(path.clone()))?;
            } else if self.samplers.is_loaded(&path) {
                // Saved again under a name the engine holds: its sessions sample the new weights.
                self.load_blocking(&path, &dir)?;
            }
            return Ok(serde_json::json!({"path": path, "type": "save_weights_for_sampler"}));
        }
        let session = s
            .session
            .ok_or("save_weights_for_sampler: give a path or a session")?;
        let dir = self.dir.join(".ephemeral").join(&session);
        let _ = std::fs::remove_dir_all(&dir);
        write(&dir)?;
        let loaded = self.install_blocking(&session, &session, &dir, None);
        let _ = std::fs::remove_dir_all(&dir);
        loaded?;
        Ok(serde_json::json!({"sampling_session_id": session, "type": "save_weights_for_sampler"}))
    }

    /// Loads the PEFT adapter at `dir` into the engine as `engine_name` and points `session`
    /// at it (from a thread outside the async runtime).
    fn install_blocking(
        &self,
        session: &str,
        engine_name: &str,
        dir: &Path,
        path: Option<String>,
    ) -> Result<(), String> {
        self.load_blocking(engine_name, dir)?;
        for old in self.samplers.register(session, engine_name, path, true) {
            let (tx, _rx) = oneshot::channel();
            let _ = self.engine.blocking_send(Msg::Unload(old, tx));
        }
        Ok(())
    }

    /// Loads (or replaces) the engine's adapter `engine_name` from the PEFT directory `dir`.
    fn load_blocking(&self, engine_name: &str, dir: &Path) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        let req = LoadLora {
            lora_name: engine_name.to_string(),
            lora_path: dir.display().to_string(),
            load_inplace: true,
        };
        let stopped = |_| "the engine has stopped".to_string();
        self.engine
            .blocking_send(Msg::Load(req, tx))
            .map_err(stopped)?;
        rx.blocking_recv()
            .map_err(|_| "the engine has stopped".to_string())?
            .map_err(|e| e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        // 2026-12-07 23:20:40 UTC and a leap day.
        assert_eq!(rfc3339(1_796_685_640), "2026-12-07T23:20:40Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn paths_and_names_are_checked() {
        assert_eq!(
            parse_path("tinker://s1:train:0/weights/step-3").unwrap(),
            ("s1:train:0".into(), "weights".into(), "step-3".into())
        );
        for bad in [
            "s1:train:0/weights/a",
            "tinker://s1:train:0/weights/../x",
            "tinker://../weights/a",
            "tinker://s/other/a",
            "tinker://s/weights/a/b",
            "tinker://s/weights/.hidden",
        ] {
            assert!(parse_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_oldest_sampler_adapters_are_dropped_past_the_bound() {
        let s = Samplers::new();
        assert!(s.register("base", "smol", None, false).is_empty());
        for i in 0..SAMPLERS_KEPT {
            assert!(
                s.register(&format!("s{i}"), &format!("a{i}"), None, true)
                    .is_empty()
            );
        }
        // a1 used again: after a0, a2 is the oldest.
        assert_eq!(s.use_session("s1").as_deref(), Some("a1"));
        let late = s.register("late", "a-late", None, true);
        assert_eq!(late, vec!["a0".to_string()]);
        let later = s.register("later", "a-later", None, true);
        assert_eq!(later, vec!["a2".to_string()]);
        assert!(s.get("s0").is_none());
        assert_eq!(s.get("s1").unwrap().0, "a1");
        assert_eq!(s.get("base").unwrap().0, "smol");
    }
}
