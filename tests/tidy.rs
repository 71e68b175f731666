//! Keeps the house honest by reading every member `Cargo.toml` and the sources: the crates'
//! layers (every arrow points down; engine crates never depend on model crates), no burn
//! backend in a library crate (only leaf packages enable one, and never burn's unrelated `rl`
//! feature), no circle between the leaf's folders, no job importing another, functions on one
//! screen, one path per public name, and ARCHITECTURE.md naming every crate and folder.

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
    libs.extend(manifests(&root().join("servers")));
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

/// The layers of the workspace, lowest first: a member may depend only on members of a lower
/// layer, so Cargo's arrows all point down (ARCHITECTURE.md). A new member must be placed here.
const LAYERS: &[(&str, u8)] = &[
    ("ember-amx", 0),
    ("ember-hub", 0),
    ("ember-engine", 1),
    ("ember-kernels", 1),
    ("ember-dist", 1),
    ("ember-gym", 1),
    ("ember-collectives", 2),
    ("ember-train", 2),
    ("ember-tasks", 2),
    ("ember-molora", 2),
    ("ember-run", 3),
    ("ember-llm", 3),
    ("ember-flow", 3),
    ("ember-control", 3),
    ("ember-serve", 4),
    ("ember", 5),
];

fn layer(name: &str) -> Option<u8> {
    LAYERS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

#[test]
fn crate_dependencies_point_down() {
    let mut members = manifests(&root().join("crates"));
    members.extend(manifests(&root().join("models")));
    members.extend(manifests(&root().join("servers")));
    members.push(root().join("Cargo.toml"));
    for path in &members {
        let m = read(path);
        let name = m["package"]["name"].as_str().unwrap().to_string();
        let own = layer(&name).unwrap_or_else(|| panic!("{name} has no layer in tests/tidy.rs"));
        for (section, deps) in dep_tables(&m) {
            for dep in deps.keys().filter(|d| d.starts_with("ember")) {
                let theirs = layer(dep).unwrap_or_else(|| panic!("{dep} has no layer"));
                assert!(
                    theirs < own,
                    "{name} (layer {own}) [{section}] depends on {dep} (layer {theirs}): an \
                     arrow that does not point down"
                );
            }
        }
    }
}

/// The folders of the root package's leaf (`recipes/<folder>/`, plus `kinds.rs`) and the
/// folders each imports through `crate::<folder>` (the CLI imports through `ember::`).
fn leaf_imports() -> Vec<(String, Vec<String>)> {
    let leaf = root().join("recipes");
    let mut units: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for e in std::fs::read_dir(&leaf).unwrap().filter_map(|e| e.ok()) {
        let p = e.path();
        let name = e
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if p.is_dir() {
            units.push((name, rust_files(&p)));
        } else if name == "kinds" {
            units.push((name, vec![p]));
        }
    }
    let names: Vec<String> = units.iter().map(|(n, _)| n.clone()).collect();
    units.sort();
    units
        .into_iter()
        .map(|(unit, files)| {
            let mut out: Vec<String> = Vec::new();
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                for line in code_lines(&text) {
                    // `use crate::{a, b::c}` names `a` and `b` as `crate::a::` would.
                    let grouped: Vec<&str> = line
                        .split_once("crate::{")
                        .map(|(_, rest)| rest.split('}').next().unwrap_or(""))
                        .map(|names| names.split(',').map(|n| n.trim()).collect())
                        .unwrap_or_default();
                    for other in &names {
                        let used = line.contains(&format!("crate::{other}::"))
                            || line.contains(&format!("crate::{other};"))
                            || line.contains(&format!("ember::{other}::"))
                            || grouped.iter().any(|g| {
                                *g == other.as_str() || g.starts_with(&format!("{other}::"))
                            });
                        if used && *other != unit && !out.contains(other) {
                            out.push(other.clone());
                        }
                    }
                }
            }
            out.sort();
            (unit, out)
        })
        .collect()
}

/// The leaf's folders import one another one way only: no circle (a depth-first search), and
/// `common` imports none of them.
#[test]
fn recipe_folders_form_no_circle() {
    let graph = leaf_imports();
    assert!(graph.len() >= 8, "recipes/ holds {graph:?}");
    let edges = |u: &str| graph.iter().find(|(n, _)| n == u).map(|(_, e)| e.clone());
    assert_eq!(
        edges("common"),
        Some(vec![]),
        "common imports a recipe folder"
    );
    fn visit(
        u: &str,
        edges: &dyn Fn(&str) -> Option<Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) {
        if done.iter().any(|d| d == u) {
            return;
        }
        assert!(
            !path.iter().any(|p| p == u),
            "import circle between recipe folders: {path:?} -> {u}"
        );
        path.push(u.to_string());
        for v in edges(u).unwrap_or_default() {
            visit(&v, edges, path, done);
        }
        path.pop();
        done.push(u.to_string());
    }
    let mut done = Vec::new();
    for (u, _) in &graph {
        visit(u, &edges, &mut Vec::new(), &mut done);
    }
}

/// The kinds with a job of their own: the folders of `recipes/` holding `job.rs` or `job/`.
fn job_kinds() -> Vec<String> {
    let leaf = root().join("recipes");
    let mut kinds: Vec<String> = std::fs::read_dir(&leaf)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("job.rs").is_file() || e.path().join("job").is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    kinds.sort();
    kinds
}

/// A path that names a job module: `<kind>::job` or `llm::jobs`.
fn names_a_job(line: &str, kinds: &[String]) -> bool {
    kinds
        .iter()
        .any(|k| line.contains(&format!("{k}::job::")) || line.contains(&format!("{k}::job;")))
        || line.contains("llm::jobs")
}

/// A job (`recipes/<kind>/job.rs`, `recipes/llm/jobs/*.rs` or a folder there) never imports
/// another job, and nothing but the CLI (`recipes/cli/`) imports the jobs; what they share lives
/// outside them.
#[test]
fn no_job_imports_another() {
    let leaf = root().join("recipes");
    let llm_jobs = leaf.join("llm").join("jobs");
    let kinds = job_kinds();
    assert!(kinds.len() >= 7, "kinds with a job: {kinds:?}");
    let files = rust_files(&leaf);
    let jobs = files
        .iter()
        .filter(|f| f.ends_with("job.rs") || f.parent() == Some(llm_jobs.as_path()))
        .count();
    assert!(jobs >= 8, "found {jobs} job files under recipes/");
    for f in files {
        if f.starts_with(leaf.join("cli")) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // A job's own tests (`use super::*`) are the job's.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        let in_jobs = f.parent() == Some(llm_jobs.as_path());
        for line in code_lines(code) {
            if line.starts_with("pub mod ") || line.starts_with("mod ") {
                continue;
            }
            // A job file's `super::` is the jobs module; inside a job's own folder, `super::` is
            // the job and `super::super::` the jobs module.
            let sibling = (in_jobs && line.contains("super::"))
                || (f.starts_with(&llm_jobs) && line.contains("super::super"));
            assert!(
                !(names_a_job(line, &kinds) || sibling),
                "{rel}: only the CLI imports jobs, and no job imports another: `{line}`"
            );
        }
    }
}

/// Every training job runs through the one job loop: each job's public `train` is
/// `ember_run::train` over its `Job` (set-up, start, steps, end), never a loop of its own.
#[test]
fn every_job_runs_through_the_job_loop() {
    let leaf = root().join("recipes");
    let mut trains = 0;
    for f in rust_files(&leaf) {
        let text = std::fs::read_to_string(&f).unwrap();
        let Some((_, body)) = text.split_once("\npub fn train(") else {
            continue;
        };
        let body = body.split("\n}\n").next().unwrap_or("");
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        assert!(
            body.contains("ember_run::train::<"),
            "{rel}: `train` runs its job through `ember_run::train`"
        );
        trains += 1;
    }
    assert!(trains >= 7, "found {trains} jobs' `train`");
}

/// Every function of the libraries, the models and the leaf (tests aside) reads on one screen:
/// at most 120 lines, signature to closing brace.
#[test]
fn functions_read_on_one_screen() {
    let mut long = Vec::new();
    for dir in ["crates", "models", "servers", "recipes"] {
        for f in rust_files(&root().join(dir)) {
            let text = std::fs::read_to_string(&f).unwrap();
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            for (name, n) in function_lengths(&text) {
                if n > 120 {
                    long.push(format!("{rel}: fn {name} has {n} lines"));
                }
            }
        }
    }
    assert!(long.is_empty(), "functions over 120 lines: {long:#?}");
}

/// Arguments travel as the struct they belong to, not as an anonymous tuple destructured in
/// the signature (`(exp, base, ad): (&LlmExperience, &Device, &Device)`): at most 8 such
/// parameters in the libraries, the models and the leaf (tests aside), a bound that may only
/// come down (10, then 8 once `ember_train::update` took an `UpdateData`).
#[test]
fn few_parameters_destructure_anonymous_tuples() {
    let mut found = Vec::new();
    for dir in ["crates", "models", "servers", "recipes"] {
        for f in rust_files(&root().join(dir)) {
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            for line in code.lines().map(str::trim) {
                let destructured = line.starts_with('(')
                    && line.ends_with(',')
                    && line.split_once("): (").is_some_and(|(names, _)| {
                        names[1..].chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || "_, ".contains(c)
                        })
                    });
                if destructured {
                    found.push(format!("{rel}: {line}"));
                }
            }
        }
    }
    assert!(
        found.len() <= 8,
        "{} tuple parameters: {found:#?}",
        found.len()
    );
}

/// `(name, lines)` of each function with a body, up to the first `#[cfg(test)]` (rustfmt's
/// layout: the body ends at the first line that is the signature's indentation plus `}`).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let after = [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "const ",
            "async ",
            "unsafe ",
        ]
        .iter()
        .fold(body, |b, p| b.strip_prefix(p).unwrap_or(b));
        let Some(rest) = after.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j] == close) {
            out.push((name, end - i + 1));
        }
    }
    out
}

/// No file of the root package is over 600 lines unless its module documentation says why
/// (a line starting `//! Over 600 lines:`).
#[test]
fn root_package_files_stay_short() {
    for f in rust_files(&root().join("recipes")) {
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

/// ARCHITECTURE.md names every member crate and every folder of the leaf (`recipes/<folder>/`),
/// so the map cannot fall behind the code.
#[test]
fn architecture_names_every_crate_and_folder() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for top in ["crates", "models", "servers", "recipes"] {
        for e in std::fs::read_dir(root().join(top))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
        {
            let shown = format!("{top}/{}", e.file_name().to_string_lossy());
            if !doc.contains(&shown) {
                missing.push(shown);
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name {missing:?}"
    );
}

/// A crate's public names have one path each: a library root that re-exports a module's items
/// (`pub use m::…`) keeps that module private (`mod m;`), as burn-train does.
#[test]
fn one_path_per_public_name() {
    let mut members = manifests(&root().join("crates"));
    members.extend(manifests(&root().join("models")));
    members.extend(manifests(&root().join("servers")));
    for m in members {
        let lib = m.parent().unwrap().join("src").join("lib.rs");
        let text = std::fs::read_to_string(&lib).unwrap();
        let rel = lib.strip_prefix(root()).unwrap().display().to_string();
        for line in code_lines(&text) {
            let Some(rest) = line.strip_prefix("pub use ") else {
                continue;
            };
            let module = rest.split("::").next().unwrap_or("");
            assert!(
                !text.contains(&format!("pub mod {module};")),
                "{rel}: `{module}` is public and re-exported (`{}`): two paths per name",
                line.trim()
            );
        }
    }
}

/// The relative links `[text](target)` of a markdown file that point into the repository.
fn local_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end]
            .split('#')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            out.push(target);
        }
    }
    out
}

/// The guide (`docs/`, an mdBook) lists only chapters that exist and lists every chapter, and
/// the README's and the guide's links into the repository resolve (`mdbook build docs` in CI
/// builds it).
#[test]
fn guide_and_readme_links_resolve() {
    let src = root().join("docs").join("src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed = local_links(&summary);
    assert!(listed.len() >= 10, "SUMMARY.md lists {listed:?}");
    for e in std::fs::read_dir(&src).unwrap().filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            assert!(
                listed.contains(&name),
                "docs/src/{name} is not in SUMMARY.md"
            );
        }
    }
    let mut broken = Vec::new();
    let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    files.extend(
        std::fs::read_dir(&src)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for target in local_links(&text) {
            if !f.parent().unwrap().join(&target).exists() {
                broken.push(format!("{}: {target}", f.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links that do not resolve: {broken:#?}");
}

/// The code before a file's `#[cfg(test)]` module (tests may pick the CPU device directly).
fn non_test_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// A backend's device is named in one place, `recipes/common/device.rs`, under its feature:
/// elsewhere `Device::flex()` (the CPU backend) would not compile in a `cuda`- or `wgpu`-only
/// build, which CI type-checks only at its very end.
#[test]
fn only_the_device_module_names_a_backend_device() {
    let root = root();
    let mut offenders = Vec::new();
    for dir in ["recipes", "crates", "models", "servers", "benches"] {
        for f in rust_files(&root.join(dir)) {
            let rel = f
                .strip_prefix(&root)
                .unwrap_or(&f)
                .to_string_lossy()
                .to_string();
            if rel == "recipes/common/device.rs" || rel.contains("/tests/") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for line in code_lines(non_test_part(&text)) {
                if ["Device::flex()", "Device::cuda(", "Device::wgpu("]
                    .iter()
                    .any(|d| line.contains(d))
                {
                    offenders.push(format!("{rel}: {line}"));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "use crate::common::device::device(name) (or take a &Device) instead:\n{}",
        offenders.join("\n")
    );
}

/// The paragraphs and table cells of a markdown text outside code fences: a paragraph is a run
/// of non-blank lines that are not table rows or headings, a list item starting a new one, as
/// its lines joined by spaces; a cell is the text between two `|` of a table row.
fn markdown_blocks(text: &str) -> (Vec<String>, Vec<String>) {
    let (mut paragraphs, mut cells) = (Vec::new(), Vec::new());
    let mut current: Vec<&str> = Vec::new();
    let mut fenced = false;
    let flush = |current: &mut Vec<&str>, out: &mut Vec<String>| {
        if !current.is_empty() {
            out.push(current.join(" ").trim().to_string());
            current.clear();
        }
    };
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            fenced = !fenced;
            flush(&mut current, &mut paragraphs);
            continue;
        }
        let item = t.starts_with("- ")
            || t.starts_with("* ")
            || t.split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if fenced || t.is_empty() || t.starts_with('|') || t.starts_with('#') || item {
            flush(&mut current, &mut paragraphs);
        }
        if t.starts_with('|') && !fenced {
            cells.extend(t.trim_matches('|').split('|').map(|c| c.trim().to_string()));
        } else if !(fenced || t.is_empty() || t.starts_with('#')) {
            current.push(t);
        }
    }
    flush(&mut current, &mut paragraphs);
    (paragraphs, cells)
}

/// The texts a newcomer reads first stay a front door, a map and an index, not a notebook:
/// README.md and ARCHITECTURE.md under a length, benches/README.md under a line count, and in
/// each no paragraph over 600 characters and no table cell over 300 (the dated history of
/// results lives in docs/src/results.md and benches/log/).
#[test]
fn front_door_texts_stay_short() {
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    let limits = [("README.md", 12_000), ("ARCHITECTURE.md", 15_000)];
    for (file, most) in limits {
        let n = read(file).chars().count();
        assert!(n <= most, "{file} has {n} characters (at most {most})");
    }
    let lines = read("benches/README.md").lines().count();
    assert!(
        lines <= 200,
        "benches/README.md has {lines} lines (at most 200)"
    );
    for file in ["README.md", "ARCHITECTURE.md", "benches/README.md"] {
        let (paragraphs, cells) = markdown_blocks(&read(file));
        for p in paragraphs {
            let n = p.chars().count();
            assert!(
                n <= 600,
                "{file}: a paragraph of {n} characters (at most 600): {p}"
            );
        }
        for c in cells {
            let n = c.chars().count();
            assert!(
                n <= 300,
                "{file}: a table cell of {n} characters (at most 300): {c}"
            );
        }
    }
}

/// Every crate's `lib.rs` (and the root package's `recipes/lib.rs`) names each module it
/// declares in its `//!` doc, where rustdoc shows the module map beside the code.
#[test]
fn every_lib_names_its_modules() {
    let mut libs: Vec<PathBuf> = manifests(&root().join("crates"))
        .into_iter()
        .chain(manifests(&root().join("models")))
        .chain(manifests(&root().join("servers")))
        .map(|m| m.parent().unwrap().join("src").join("lib.rs"))
        .collect();
    libs.push(root().join("recipes").join("lib.rs"));
    let mut missing = Vec::new();
    for lib in libs {
        let text = std::fs::read_to_string(&lib).unwrap();
        let doc: String = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        for line in code_lines(&text) {
            let decl = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "));
            let Some(name) = decl.and_then(|d| d.strip_suffix(';')) else {
                continue;
            };
            if name != "tests" && !doc.contains(&format!("`{name}")) {
                let rel = lib.strip_prefix(root()).unwrap().display().to_string();
                missing.push(format!("{rel}: `{name}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules a lib.rs doc does not name: {missing:#?}"
    );
}

#[test]
fn markdown_blocks_split_paragraphs_items_and_cells() {
    let text = "# T\none\ntwo\n\n- a\n  b\n1. c\n| x | y |\n```\nlong code\n```\nend\n";
    let (p, c) = markdown_blocks(text);
    assert_eq!(p, ["one two", "- a b", "1. c", "end"]);
    assert_eq!(c, ["x", "y"]);
}

/// A metric key that several places write or read is spelled once, as a constant of
/// `ember_engine::keys`: no library, model, server or recipe code (tests aside) writes its
/// literal; and every phase time goes through `ember_run::Timings`, the one place that writes
/// the `timing_s/` prefix.
#[test]
fn shared_metric_keys_are_spelled_once() {
    let text = std::fs::read_to_string(root().join("crates/ember-engine/src/keys.rs")).unwrap();
    let literals: Vec<&str> = code_lines(&text)
        .filter_map(|l| l.split_once("= \"")?.1.strip_suffix("\";"))
        .collect();
    assert!(literals.len() >= 10, "keys.rs: {literals:?}");
    let mut found = Vec::new();
    for (rel, code) in library_code(&["crates", "models", "servers", "recipes"]) {
        if rel.ends_with("ember-engine/src/keys.rs") {
            continue;
        }
        for k in &literals {
            if code.contains(&format!("\"{k}\"")) {
                found.push(format!("{rel}: \"{k}\""));
            }
        }
        if !rel.starts_with("crates/ember-run/") && code.contains("\"timing_s/") {
            found.push(format!("{rel}: a `timing_s/` key outside Timings"));
        }
    }
    assert!(
        found.is_empty(),
        "spell these as ember_engine::keys constants: {found:#?}"
    );
}

/// One place chooses a kernel (`ember_kernels::op`): the models call one function per op and
/// ask nothing of the kernels' switches, devices or CPU features themselves.
#[test]
fn models_hold_no_kernel_dispatch() {
    let asks = [
        "ember_kernels::enabled",
        "ember_kernels::fused_on",
        "ember_kernels::bf16_products",
        "ember_kernels::amx_available",
        "Kernel::",
    ];
    let mut found = Vec::new();
    for (rel, code) in library_code(&["models"]) {
        for line in code_lines(&code) {
            if let Some(a) = asks.iter().find(|a| line.contains(*a)) {
                found.push(format!("{rel}: {a}"));
            }
        }
    }
    assert!(found.is_empty(), "kernel dispatch in a model: {found:#?}");
}

/// Each Rust file below `dirs` that is not a test (no `tests` folder, no `tests.rs`), as its
/// path from the root and its code before `#[cfg(test)]`.
fn library_code(dirs: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in dirs {
        for f in rust_files(&root().join(dir)) {
            let rel = f.strip_prefix(root()).unwrap().display().to_string();
            if rel.contains("/tests") || rel.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or("").to_string();
            out.push((rel, code));
        }
    }
    out
}

/// `models/ember-llm` is three rooms: the model (the files of `src/`), `load/` and `decode/`.
/// Loading and decoding import the model; the model imports neither, and decoding does not
/// import loading (`lib.rs` only re-exports).
#[test]
fn the_llm_rooms_import_one_way() {
    let src = root().join("models").join("ember-llm").join("src");
    let mut wrong = Vec::new();
    for f in rust_files(&src) {
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        let forbidden: &[&str] = if rel.starts_with("decode/") {
            &["crate::load"]
        } else if rel.starts_with("load/") || rel == "lib.rs" {
            &[]
        } else {
            &["crate::load", "crate::decode"]
        };
        let text = std::fs::read_to_string(&f).unwrap();
        for line in code_lines(non_test_part(&text)) {
            if let Some(name) = forbidden.iter().find(|n| line.contains(*n)) {
                wrong.push(format!("{rel} imports {name}: `{line}`"));
            }
        }
    }
    assert!(rust_files(&src).len() >= 20, "ember-llm's files moved");
    assert!(wrong.is_empty(), "{wrong:#?}");
}
