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

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//"))
}

/// The root package's shape (ARCHITECTURE.md): a job (`src/jobs/*.rs`) never imports another
/// job, and nothing but the CLI (`src/main.rs`) imports the jobs; the kits they share (`run`,
/// `recipe`, `llm`, `images`, …) live outside `src/jobs/`.
#[test]
fn no_job_imports_another() {
    let src = root().join("src");
    let jobs = src.join("jobs");
    let job_files: Vec<PathBuf> = rust_files(&jobs);
    assert!(job_files.len() >= 4, "src/jobs/ holds {job_files:?}");
    for f in rust_files(&src) {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        for line in code_lines(&text) {
            if f.starts_with(&jobs) {
                assert!(
                    !line.contains("crate::jobs") && !line.contains("super::"),
                    "{rel}: a job imports another job or the jobs module: `{line}`"
                );
            } else if f != src.join("main.rs") && f != src.join("lib.rs") {
                assert!(
                    !line.contains("crate::jobs") && !line.contains("ember::jobs"),
                    "{rel}: only the CLI imports jobs: `{line}`"
                );
            }
        }
    }
}

/// No file of the root package is over 600 lines unless its module documentation says why
/// (a line starting `//! Over 600 lines:`).
#[test]
fn root_package_files_stay_short() {
    for f in rust_files(&root().join("src")) {
        let text = std::fs::read_to_string(&f).unwrap();
        let n = text.lines().count();
        let explained = text.lines().any(|l| l.starts_with("//! Over 600 lines:"));
        assert!(
            n <= 600 || explained,
            "{} has {n} lines: split it, or say why in a `//! Over 600 lines:` line",
            f.strip_prefix(root()).unwrap().display()
        );
    }
}

/// ARCHITECTURE.md names every module of the root package (each file or directory under
/// `src/`), so the map cannot fall behind the code.
#[test]
fn architecture_names_every_root_module() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for e in std::fs::read_dir(root().join("src"))
        .unwrap()
        .filter_map(|e| e.ok())
    {
        let name = e.file_name().to_string_lossy().to_string();
        let shown = if e.path().is_dir() {
            format!("src/{name}/")
        } else {
            format!("{name}`")
        };
        if !doc.contains(&shown) {
            missing.push(shown);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name {missing:?}"
    );
}
