//! Keeps the dependency direction and the backend rule honest by reading every member
//! `Cargo.toml`: engine crates (`crates/`) never depend on model crates (`models/`), and no
//! library crate enables a burn backend feature (only leaf packages may), nor burn's unrelated
//! `rl` feature.

use std::path::{Path, PathBuf};

const BACKEND_FEATURES: &[&str] = &[
    "flex",
    "cpu",
    "cuda",
    "rocm",
    "wgpu",
    "vulkan",
    "metal",
    "webgpu",
    "ndarray",
    "tch",
    "simd",
    "rayon",
    "fusion",
    "autotune",
    "remote",
    "openblas",
    "accelerate",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifests(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("Cargo.toml"))
        .filter(|p| p.exists())
        .collect();
    v.sort();
    v
}

fn read(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dep_tables(manifest: &toml::Table) -> Vec<(&str, &toml::Table)> {
    ["dependencies", "build-dependencies"]
        .iter()
        .filter_map(|k| manifest.get(*k).and_then(|v| v.as_table()).map(|t| (*k, t)))
        .collect()
}

fn burn_features(dep: &toml::Value) -> Vec<String> {
    dep.get("features")
        .and_then(|f| f.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn model_crate_names() -> Vec<String> {
    manifests(&root().join("models"))
        .iter()
        .filter_map(|m| {
            read(m)
                .get("package")?
                .get("name")?
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn workspace_burn_has_no_backend() {
    let ws = read(&root().join("Cargo.toml"));
    let burn = &ws["workspace"]["dependencies"]["burn"];
    for f in burn_features(burn) {
        let base = f.split('/').next().unwrap_or(&f);
        assert!(
            !BACKEND_FEATURES.contains(&base),
            "workspace burn enables backend feature `{f}`"
        );
        assert_ne!(
            base, "rl",
            "burn's `rl` feature defines an unrelated Policy: keep it off"
        );
    }
    assert_eq!(
        burn.get("default-features").and_then(|v| v.as_bool()),
        Some(false)
    );
}

#[test]
fn library_crates_enable_no_backend_and_engine_knows_no_model() {
    let models = model_crate_names();
    let mut libs = manifests(&root().join("crates"));
    let engine_libs = libs.clone();
    libs.extend(manifests(&root().join("models")));
    assert!(!libs.is_empty(), "no member crates found");
    for path in &libs {
        let m = read(path);
        assert!(
            m.get("features")
                .and_then(|f| f.as_table())
                .is_none_or(|f| {
                    f.values()
                        .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                        .all(|v| {
                            let s = v.as_str().unwrap_or("");
                            !(s.starts_with("burn/")
                                && BACKEND_FEATURES.contains(&s.trim_start_matches("burn/")))
                        })
                }),
            "{} forwards a burn backend feature",
            path.display()
        );
        for (section, deps) in dep_tables(&m) {
            if let Some(burn) = deps.get("burn") {
                for f in burn_features(burn) {
                    assert!(
                        !BACKEND_FEATURES.contains(&f.as_str()),
                        "{} [{section}] enables burn/{f}",
                        path.display()
                    );
                    assert_ne!(
                        f,
                        "rl",
                        "{}: burn's `rl` feature must stay off",
                        path.display()
                    );
                }
            }
            if engine_libs.contains(path) {
                for name in deps.keys() {
                    assert!(
                        !models.contains(name),
                        "engine crate {} depends on model crate {name}",
                        path.display()
                    );
                    let p = deps[name]
                        .get("path")
                        .and_then(|v| v.as_str())
                        .unwrap_or("");
                    assert!(
                        !p.contains("models/"),
                        "engine crate {} depends on {p}",
                        path.display()
                    );
                }
            }
        }
    }
}
