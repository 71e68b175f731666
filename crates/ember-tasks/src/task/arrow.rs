//! Datasets as the `datasets` library saves them (`Dataset.save_to_disk`): a folder whose
//! `state.json` names its Arrow IPC stream files (`data-00000-of-00001.arrow`, …), or a
//! `DatasetDict`'s folder (`dataset_dict.json`, one such folder per split) whose `train` split is
//! read. Each row is read as the JSON object a JSONL line would be (arrow's JSON writer: lists of
//! structs become lists of objects, so a `messages` column reads as a conversation; a null stays
//! null, as Parquet's rows and JSONL have it).

use super::jsonl::DataError;
use arrow_ipc::reader::StreamReader;
use std::path::{Path, PathBuf};

/// The largest Arrow file read (bytes).
const MAX_BYTES: u64 = 1 << 30;

/// Whether `path` is a folder `save_to_disk` wrote (a dataset or a dataset dictionary).
pub(super) fn is_saved_dataset(path: &Path) -> bool {
    path.is_dir() && (path.join("state.json").is_file() || path.join("dataset_dict.json").is_file())
}

/// An error about `path` that is not a row's.
fn invalid(path: &Path, reason: String) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    }
}

/// Every row of the saved dataset at `path`, with the file and 1-based row number it came from.
pub(super) fn rows(path: &Path) -> Result<Vec<(PathBuf, usize, serde_json::Value)>, DataError> {
    let mut out = Vec::new();
    for file in files(&split_dir(path)?)? {
        // A damaged file must be an error, not a panic inside the reader.
        match std::panic::catch_unwind(|| file_rows(&file)) {
            Ok(rows) => out.extend(rows?),
            Err(_) => {
                let why = "the Arrow reader failed on it (a damaged file?)".to_string();
                return Err(invalid(&file, why));
            }
        }
    }
    if out.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            reason: "its Arrow files hold no row".into(),
        });
    }
    Ok(out)
}

/// A JSON file of the saved dataset, parsed.
fn json_of(path: &Path) -> Result<serde_json::Value, DataError> {
    let text = super::jsonl::read_regular(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| invalid(path, format!("not JSON: {e}")))
}

/// The folder of the split to read: `path` itself, or a dictionary's `train` split.
fn split_dir(path: &Path) -> Result<PathBuf, DataError> {
    let dict = path.join("dataset_dict.json");
    if !dict.is_file() {
        return Ok(path.to_path_buf());
    }
    let splits: Vec<String> = json_of(&dict)?
        .get("splits")
        .and_then(|s| s.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|s| Some(s.as_str()?.to_string()))
                .collect()
        })
        .unwrap_or_default();
    if !splits.iter().any(|s| s == "train") {
        let why = format!("a dataset dictionary without a `train` split (splits: {splits:?})");
        return Err(invalid(&dict, why));
    }
    Ok(path.join("train"))
}

/// The Arrow files `state.json` names, in its order: plain `.arrow` file names inside `dir`.
fn files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let state = dir.join("state.json");
    let names: Vec<String> = json_of(&state)?
        .get("_data_files")
        .and_then(|f| f.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|f| Some(f.get("filename")?.as_str()?.to_string()))
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return Err(invalid(&state, "`_data_files` names no file".into()));
    }
    names
        .into_iter()
        .map(|n| {
            let plain = Path::new(&n).file_name().is_some_and(|f| f == n.as_str());
            if !plain || !n.ends_with(".arrow") {
                return Err(invalid(&state, format!("{n:?} is not an .arrow file of this folder")));
            }
            Ok(dir.join(n))
        })
        .collect()
}

/// The rows of one Arrow IPC stream file.
fn file_rows(path: &Path) -> Result<Vec<(PathBuf, usize, serde_json::Value)>, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = super::jsonl::regular_file(path).map_err(io)?;
    if meta.len() > MAX_BYTES {
        let why = format!("{} bytes, more than the 1 GiB limit", meta.len());
        return Err(invalid(path, why));
    }
    let file = std::fs::File::open(path).map_err(io)?;
    let reader = StreamReader::try_new(std::io::BufReader::new(file), None)
        .map_err(|e| invalid(path, format!("not an Arrow IPC stream: {e}")))?;
    let mut out = Vec::new();
    for batch in reader {
        let first = out.len() + 1;
        let bad = |e: String| DataError::Line {
            path: path.to_path_buf(),
            line: first,
            reason: format!("rows from here not readable: {e}"),
        };
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        let mut w = arrow_json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow_json::writer::JsonArray>(Vec::new());
        w.write(&batch).map_err(|e| bad(e.to_string()))?;
        w.finish().map_err(|e| bad(e.to_string()))?;
        let bytes = w.into_inner();
        let rows: Vec<serde_json::Value> = match bytes.is_empty() {
            true => Vec::new(),
            false => serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?,
        };
        for (i, v) in rows.into_iter().enumerate() {
            out.push((path.to_path_buf(), first + i, v));
        }
    }
    Ok(out)
}
