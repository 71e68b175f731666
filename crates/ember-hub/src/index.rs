//! A sharded checkpoint's index, `model.safetensors.index.json`.

use std::path::Path;

/// The shard files the index names in its `weight_map`, sorted, each once (none when it does
/// not read).
pub(crate) fn shards(index: &Path) -> Vec<String> {
    let v: Option<serde_json::Value> = std::fs::read(index)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let mut names: Vec<String> = v
        .as_ref()
        .and_then(|v| v["weight_map"].as_object())
        .map(|m| {
            m.values()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.dedup();
    names
}
