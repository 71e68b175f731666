//! Persistent GPU kernel and autotune caches.
//!
//! On the GPU backends (CUDA, wgpu) burn runs CubeCL kernels that are compiled, and for matrix
//! products and reductions autotuned, the first time a shape is seen. Both results are kept in a
//! CubeCL *environment*: one database file that outlives the process, so a second run of the
//! same recipe starts warm. Ember puts that file in a directory it chooses and reports:
//!
//! 1. `--kernel-cache <dir>` on the command line (`off` keeps both caches in memory only);
//! 2. else the `EMBER_KERNEL_CACHE` environment variable (same values);
//! 3. else `$EMBER_CACHE/kernels` (`EMBER_CACHE` defaults to `~/.cache/ember`).
//!
//! Other CubeCL settings still come from a `cubecl.toml` in the working directory or its
//! parents, as CubeCL reads it; only the cache location and the compiled-kernel cache switch
//! are set here. The CPU backend compiles nothing, so on a CPU-only build this is a no-op.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where the kernel cache lives, as decided by [`resolve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// Persist compiled kernels and autotune results under this directory.
    Dir(PathBuf),
    /// Keep both in memory for this process only.
    Off,
}

impl fmt::Display for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dir(d) => write!(f, "{}", d.display()),
            Self::Off => f.write_str("off (in memory only)"),
        }
    }
}

/// A kernel cache that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KernelCacheError {
    /// The directory could not be created.
    #[error(
        "kernel cache directory {dir}: {source} (choose another with --kernel-cache <dir> or EMBER_KERNEL_CACHE, or `off`)"
    )]
    Create {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The location names no directory.
    #[error("kernel cache location `{0}` is empty or not a path; give a directory or `off`")]
    Invalid(String),
    /// Something already started a GPU runtime with other settings in this process.
    #[error(
        "the GPU runtime's configuration was read before the kernel cache was set up; \
         configure the cache before creating the first GPU device"
    )]
    TooLate,
}

/// The cache location: `flag` (from `--kernel-cache`), else `EMBER_KERNEL_CACHE`, else
/// `$EMBER_CACHE/kernels`.
pub fn resolve(flag: Option<&str>) -> Result<KernelCache, KernelCacheError> {
    let env = std::env::var("EMBER_KERNEL_CACHE").ok();
    let chosen = flag.map(str::to_string).or(env);
    match chosen.as_deref().map(str::trim) {
        Some("off") | Some("none") => Ok(KernelCache::Off),
        Some("") => Err(KernelCacheError::Invalid(String::new())),
        Some(p) => Ok(KernelCache::Dir(expand_home(p))),
        None => Ok(KernelCache::Dir(default_dir())),
    }
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// `$EMBER_CACHE/kernels`, `EMBER_CACHE` defaulting to `~/.cache/ember`.
pub fn default_dir() -> PathBuf {
    let root = match std::env::var("EMBER_CACHE") {
        Ok(c) if !c.trim().is_empty() => expand_home(c.trim()),
        _ => expand_home("~/.cache/ember"),
    };
    root.join("kernels")
}

/// Sets up the kernel cache for the GPU backends compiled in; call it before the first GPU
/// device is created. Returns the database file the GPU runtime will use (`None` when the
/// cache is off or no GPU backend is compiled in).
pub fn configure(cache: &KernelCache) -> Result<Option<PathBuf>, KernelCacheError> {
    let gpu_compiled = cfg!(any(feature = "cuda", feature = "wgpu"));
    if let (true, KernelCache::Dir(dir)) = (gpu_compiled, cache) {
        std::fs::create_dir_all(dir).map_err(|source| KernelCacheError::Create {
            dir: dir.clone(),
            source,
        })?;
    }
    let db = gpu::configure(cache)?;
    let _ = CONFIGURED.set((cache.clone(), db.clone()));
    Ok(db)
}

static CONFIGURED: std::sync::OnceLock<(KernelCache, Option<PathBuf>)> = std::sync::OnceLock::new();

/// A line describing the kernel cache of this process, for `ember info` and the warm-up report.
pub fn describe() -> String {
    if !cfg!(any(feature = "cuda", feature = "wgpu")) {
        return "none (the CPU backend compiles no kernels)".into();
    }
    match CONFIGURED.get() {
        Some((_, Some(db))) => format!("{} (compiled kernels and autotune results)", db.display()),
        Some((KernelCache::Off, _)) => "off (in memory only)".into(),
        Some((c, None)) => c.to_string(),
        None => "CubeCL's default (not configured by Ember)".into(),
    }
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod gpu {
    use super::{KernelCache, KernelCacheError};
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    use std::path::PathBuf;

    pub(super) fn configure(cache: &KernelCache) -> Result<Option<PathBuf>, KernelCacheError> {
        // The configuration CubeCL would read by itself (cubecl.toml, CUBECL_* variables), with
        // the cache settings replaced.
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        match cache {
            KernelCache::Dir(dir) => {
                config.environment.path = CacheConfig::Directory(dir.clone());
                config.compilation.cache = true;
                config.autotune.disable_cache = false;
            }
            KernelCache::Off => {
                config.compilation.cache = false;
                config.autotune.disable_cache = true;
            }
        }
        if !CubeClRuntimeConfig::try_set(config) {
            return Err(KernelCacheError::TooLate);
        }
        Ok(match cache {
            KernelCache::Dir(_) => Some(burn::cubecl::environment::path()),
            KernelCache::Off => None,
        })
    }
}

#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
mod gpu {
    use super::{KernelCache, KernelCacheError};
    use std::path::PathBuf;

    pub(super) fn configure(_cache: &KernelCache) -> Result<Option<PathBuf>, KernelCacheError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_wins_and_off_is_off() {
        assert_eq!(resolve(Some("off")).unwrap(), KernelCache::Off);
        assert_eq!(
            resolve(Some("/tmp/k")).unwrap(),
            KernelCache::Dir(PathBuf::from("/tmp/k"))
        );
        assert!(matches!(
            resolve(Some("  ")),
            Err(KernelCacheError::Invalid(_))
        ));
    }

    #[test]
    fn default_is_under_the_ember_cache() {
        assert!(default_dir().ends_with("kernels"));
    }
}
