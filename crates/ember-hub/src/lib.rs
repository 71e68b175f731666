//! Models by Hugging Face Hub id: `ORG/NAME`, optionally `ORG/NAME@REVISION` (a branch, tag or
//! commit) and a file inside it (`ORG/NAME/model.Q4_1.gguf`), found in the local Hugging Face
//! cache where TRL, verl, candle and mistral.rs users already have their models, laid out as
//! `huggingface_hub` lays it out: `models--ORG--NAME/refs/<revision>` holds a commit hash and
//! `snapshots/<hash>/` the files (links into `blobs/`). A path that exists locally always wins.
//! A model not in the cache is downloaded into it (`download.rs`, the `hub-download` feature)
//! unless `HF_HUB_OFFLINE` is set; otherwise the error names every place searched and the
//! `huggingface-cli download` command that fetches the model into the same cache.
//!
//! Modules: `id` (a Hub id told from a path by its shape), `index` (the shards a sharded
//! checkpoint's index names), `download` (the download into the cache, bounded by the announced
//! size, a read timeout and an overall deadline, checked by size and SHA-256), `error`
//! (`HubError`). The crate depends on nothing of Ember's and on no tensor library: the models
//! (`ember-llm`), the server and the CLI call `resolve`.

#[cfg(feature = "download")]
mod download;
mod error;
mod id;
mod index;

pub use error::{HubError, Result};
use id::{HubId, hub_id};
use std::path::{Path, PathBuf};

/// The cache folders `huggingface_hub` would use, in order: `HF_HUB_CACHE`, `HF_HOME/hub`,
/// `XDG_CACHE_HOME/huggingface/hub`, `~/.cache/huggingface/hub` (`var` reads the environment).
pub fn cache_dirs(var: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut out: Vec<PathBuf> = Vec::new();
    out.extend(set("HF_HUB_CACHE"));
    out.extend(set("HF_HOME").map(|h| h.join("hub")));
    out.extend(set("XDG_CACHE_HOME").map(|x| x.join("huggingface").join("hub")));
    out.extend(set("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")));
    out.dedup();
    out
}

/// `spec` as a local path: the path itself when it exists, else the Hub id's snapshot (or a file
/// in it) from the cache folders of the environment, downloaded into the first of them when it
/// is not there (built with `hub-download`, and `HF_HUB_OFFLINE` not set).
///
/// # Errors
/// A spec that is neither an existing path nor a Hub id in the cache (or on the Hub): the
/// message names every place searched and the command that downloads the model.
pub fn resolve(spec: &Path) -> Result<PathBuf> {
    let var = |k: &str| std::env::var(k).ok();
    resolve_with(spec, &cache_dirs(&var), &var)
}

/// [`resolve`] with the cache folders given, and the environment read through `var`.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_with(
    spec: &Path,
    dirs: &[PathBuf],
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf> {
    let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    });
    let download = cfg!(feature = "download") && !offline && !dirs.is_empty();
    let id = (!spec.exists())
        .then(|| spec.to_str().and_then(hub_id))
        .flatten();
    match (lookup(spec, dirs), &id) {
        // A model folder that another tool left partial (a tokenizer only, an interrupted
        // download) is completed rather than loaded without its weights.
        (Ok(Ok(found)), Some(id)) if download && !complete(&found, id) => {}
        (Ok(Ok(found)), _) => return Ok(found),
        (Ok(Err(_)), _) => {}
        // A ref naming a missing snapshot, a link to a missing blob, a missing file: a
        // download repairs them.
        (Err(_), Some(_)) if download => {}
        (Err(e), _) => return Err(e),
    }
    let Some(id) = id else {
        return Err(missing(spec, "no such file or directory"));
    };
    let searched: Vec<String> = dirs
        .iter()
        .map(|d| d.join(repo_folder(&id)).display().to_string())
        .collect();
    #[cfg(feature = "download")]
    if let (true, Some(dir)) = (download, dirs.first()) {
        let fetched = download::Hub::from_env(var).fetch(&id, dir);
        if let Err(e) = fetched {
            let why = format!("downloading it failed ({e})");
            return Err(not_in_cache(spec, &id, &searched, &why));
        }
        if let Some(found) = snapshot(&dir.join(repo_folder(&id)), &id)? {
            return Ok(found);
        }
    }
    let why = match (offline, cfg!(feature = "download")) {
        (true, _) => "HF_HUB_OFFLINE is set, so nothing is downloaded",
        (false, true) => "no cache folder to download into",
        (false, false) => "downloading is not built in (the `hub-download` feature)",
    };
    Err(not_in_cache(spec, &id, &searched, why))
}

/// `models--ORG--NAME`.
fn repo_folder(id: &HubId) -> String {
    format!("models--{}--{}", id.org, id.name)
}

/// A snapshot that holds what Ember loads: the asked file, or a model folder's `config.json`
/// and safetensors weights (every shard its index names).
fn complete(found: &Path, id: &HubId) -> bool {
    if id.file.is_some() {
        return found.exists();
    }
    let index = found.join("model.safetensors.index.json");
    if index.exists() {
        let names = index::shards(&index);
        return found.join("config.json").exists()
            && !names.is_empty()
            && names.iter().all(|n| found.join(n).exists());
    }
    let has_weights = std::fs::read_dir(found).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors") && e.path().exists())
    });
    found.join("config.json").exists() && has_weights
}

/// [`resolve_with`] that never downloads (the cache alone, as with `HF_HUB_OFFLINE`).
///
/// # Errors
/// As [`resolve`].
pub fn resolve_in(spec: &Path, dirs: &[PathBuf]) -> Result<PathBuf> {
    match lookup(spec, dirs)? {
        Ok(found) => Ok(found),
        Err((id, searched)) => Err(not_in_cache(spec, &id, &searched, "nothing is downloaded")),
    }
}

/// The local path or the cached snapshot; else the Hub id and the folders searched.
fn lookup(
    spec: &Path,
    dirs: &[PathBuf],
) -> Result<std::result::Result<PathBuf, (HubId, Vec<String>)>> {
    if spec.exists() {
        return Ok(Ok(spec.to_path_buf()));
    }
    let Some(id) = spec.to_str().and_then(hub_id) else {
        return Err(missing(spec, "no such file or directory"));
    };
    let mut searched = Vec::new();
    for dir in dirs {
        let repo = dir.join(format!("models--{}--{}", id.org, id.name));
        searched.push(repo.display().to_string());
        if let Some(found) = snapshot(&repo, &id)? {
            return Ok(Ok(found));
        }
    }
    Ok(Err((id, searched)))
}

/// A Hub id that is in none of the cache folders: the places searched, why nothing was
/// downloaded, and the command that downloads it.
fn not_in_cache(spec: &Path, id: &HubId, searched: &[String], why: &str) -> HubError {
    let rev = match id.revision.as_str() {
        "main" => String::new(),
        r => format!(" --revision {r}"),
    };
    let file = id
        .file
        .as_deref()
        .map_or(String::new(), |f| format!(" {f}"));
    missing(
        spec,
        &format!(
            "not a local path, and Hub id {}/{} (revision {}) is not in the Hugging Face cache \
             (searched: {}; set HF_HUB_CACHE or HF_HOME to another); {why}: run \
             `huggingface-cli download {}/{}{file}{rev}`",
            id.org,
            id.name,
            id.revision,
            if searched.is_empty() {
                "no cache folder: HOME is not set".into()
            } else {
                searched.join(", ")
            },
            id.org,
            id.name,
        ),
    )
}

/// The snapshot of `id` in the repository folder `repo`, None when the repository or the
/// revision is not there.
///
/// # Errors
/// A ref that names no snapshot, or a snapshot whose file (or the asked one) is a link to a
/// missing blob (an interrupted download).
fn snapshot(repo: &Path, id: &HubId) -> Result<Option<PathBuf>> {
    if !repo.is_dir() {
        return Ok(None);
    }
    let hash = match std::fs::read_to_string(repo.join("refs").join(&id.revision)) {
        Ok(h) => h.trim().to_string(),
        // A commit hash names its snapshot directly.
        Err(_) if repo.join("snapshots").join(&id.revision).is_dir() => id.revision.clone(),
        Err(_) => return Ok(None),
    };
    if hash.is_empty() || !hash.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(missing(
            &repo.join("refs").join(&id.revision),
            &format!("names {hash:?}, not a commit"),
        ));
    }
    let snap = repo.join("snapshots").join(&hash);
    if !snap.is_dir() {
        return Err(missing(
            &snap,
            &format!(
                "refs/{} names commit {hash}, whose snapshot is not in the cache (an \
                 interrupted download?)",
                id.revision
            ),
        ));
    }
    let found = match &id.file {
        Some(f) => snap.join(f),
        None => snap.clone(),
    };
    let files: Vec<PathBuf> = match &id.file {
        Some(_) => vec![found.clone()],
        None => std::fs::read_dir(&snap)
            .map_err(|e| HubError::io(&snap, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect(),
    };
    for f in files {
        if f.symlink_metadata().is_ok() && !f.exists() {
            return Err(missing(
                &f,
                "a link to a blob that is not in the cache (an interrupted download?)",
            ));
        }
        if !f.exists() {
            return Err(missing(&f, "not in the snapshot"));
        }
    }
    Ok(Some(found))
}

/// `path: why` (one message: an I/O error's source would repeat it in an error chain).
fn missing(path: &Path, why: &str) -> HubError {
    HubError::Missing(format!("{}: {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ember-hub-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A cache with `models--org--tiny`: `main` and `v1` refs, one blob linked from each
    /// snapshot.
    fn cache(tag: &str) -> PathBuf {
        let hub = tree(tag);
        let repo = hub.join("models--org--tiny");
        for (r, h) in [("main", "aaa111"), ("v1", "bbb222")] {
            std::fs::create_dir_all(repo.join("refs")).unwrap();
            std::fs::write(repo.join("refs").join(r), format!("{h}\n")).unwrap();
            let snap = repo.join("snapshots").join(h);
            std::fs::create_dir_all(&snap).unwrap();
            std::fs::create_dir_all(repo.join("blobs")).unwrap();
            let blob = repo.join("blobs").join(format!("cfg-{h}"));
            std::fs::write(&blob, "{}").unwrap();
            #[cfg(unix)]
            std::os::unix::fs::symlink(&blob, snap.join("config.json")).unwrap();
            #[cfg(not(unix))]
            std::fs::copy(&blob, snap.join("config.json")).unwrap();
        }
        hub
    }

    #[test]
    fn hub_ids_are_told_from_paths() {
        let id = hub_id("Qwen/Qwen3-0.6B").unwrap();
        assert_eq!((id.org.as_str(), id.name.as_str()), ("Qwen", "Qwen3-0.6B"));
        assert_eq!((id.revision.as_str(), id.file), ("main", None));
        let id = hub_id("org/m@v1.0/sub/x.gguf").unwrap();
        assert_eq!(id.revision, "v1.0");
        assert_eq!(id.file.as_deref(), Some("sub/x.gguf"));
        for not in [
            "/abs/path",
            "./rel/x",
            "x",
            "../a/b",
            "a/b/../c",
            "a b/c",
            "a/",
        ] {
            assert_eq!(hub_id(not), None, "{not}");
        }
    }

    #[test]
    fn the_cache_folders_follow_huggingface_hub() {
        let env = |k: &str| match k {
            "HF_HOME" => Some("/h".to_string()),
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        assert_eq!(
            cache_dirs(&env),
            vec![
                PathBuf::from("/h/hub"),
                PathBuf::from("/home/u/.cache/huggingface/hub")
            ]
        );
    }

    #[test]
    fn a_hub_id_resolves_to_its_snapshot_by_revision() {
        let hub = cache("ok");
        let dirs = [PathBuf::from("/nonexistent/hub"), hub.clone()];
        let snap = |h: &str| hub.join("models--org--tiny/snapshots").join(h);
        let got = resolve_in(Path::new("org/tiny"), &dirs).unwrap();
        assert_eq!(got, snap("aaa111"));
        let got = resolve_in(Path::new("org/tiny@v1"), &dirs).unwrap();
        assert_eq!(got, snap("bbb222"));
        // A commit hash names its snapshot directly; a file inside it is taken as asked.
        let got = resolve_in(Path::new("org/tiny@bbb222/config.json"), &dirs).unwrap();
        assert_eq!(got, snap("bbb222").join("config.json"));
        // A local path wins over the cache.
        let local = tree("local");
        assert_eq!(resolve_in(&local, &dirs).unwrap(), local);
        std::fs::remove_dir_all(&hub).ok();
        std::fs::remove_dir_all(&local).ok();
    }

    #[test]
    fn a_missing_model_names_the_places_and_the_command() {
        let hub = cache("missing");
        let dirs = [hub.clone()];
        let e = resolve_in(Path::new("org/other@v2"), &dirs)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&hub.join("models--org--other").display().to_string()),
            "{e}"
        );
        assert!(
            e.contains("huggingface-cli download org/other --revision v2"),
            "{e}"
        );
        // A ref that names a snapshot not in the cache, a broken link, a file not there.
        let repo = hub.join("models--org--tiny");
        std::fs::write(repo.join("refs/dev"), "ccc333").unwrap();
        let e = resolve_in(Path::new("org/tiny@dev"), &dirs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("whose snapshot is not in the cache"), "{e}");
        std::fs::write(repo.join("refs/bad"), "../../etc").unwrap();
        let e = resolve_in(Path::new("org/tiny@bad"), &dirs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a commit"), "{e}");
        let e = resolve_in(Path::new("org/tiny/weights.gguf"), &dirs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the snapshot"), "{e}");
        #[cfg(unix)]
        {
            std::fs::remove_file(repo.join("blobs/cfg-aaa111")).unwrap();
            let e = resolve_in(Path::new("org/tiny"), &dirs)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("a link to a blob that is not in the cache"),
                "{e}"
            );
        }
        // Not a path and not an id: the plain not-found.
        let e = resolve_in(Path::new("/no/such/model"), &dirs)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such file or directory"), "{e}");
        std::fs::remove_dir_all(&hub).ok();
    }
}
