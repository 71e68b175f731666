//! Parquet datasets as the Hugging Face Hub ships them: one `.parquet` file, or a dataset
//! directory whose `train` split is one or more shards (`data/train-00000-of-00002.parquet`),
//! each row read as the JSON object a JSONL line would be (lists of structs become lists of
//! objects, so a `messages` column reads as a conversation).

use super::file::{DataError, open_data_file};
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::path::{Path, PathBuf};

/// Whether `path` names Parquet data: a `.parquet` file, or a directory.
pub(super) fn is_parquet(path: &Path) -> bool {
    path.is_dir() || path.extension().is_some_and(|e| e == "parquet")
}

/// Every row of the data at `path`, with the file and 1-based row number it came from.
pub(super) fn rows(path: &Path) -> Result<Vec<(PathBuf, usize, serde_json::Value)>, DataError> {
    let mut out = Vec::new();
    for file in files(path)? {
        // A damaged file must be an error, not a panic inside the reader.
        let read = std::panic::catch_unwind(|| file_rows(&file));
        match read {
            Ok(rows) => out.extend(rows?),
            Err(_) => {
                return Err(DataError::Io {
                    path: file,
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the Parquet reader failed on it (a damaged file?)",
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// The files of `path`: itself, or a directory's `train*.parquet` shards (or every `.parquet`
/// file when none is named `train`), in it or in its `data/`, in name order.
fn files(path: &Path) -> Result<Vec<PathBuf>, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut all = Vec::new();
    for dir in [path.to_path_buf(), path.join("data")] {
        if !dir.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let p = entry.map_err(io)?.path();
            if p.extension().is_some_and(|e| e == "parquet") {
                all.push(p);
            }
        }
    }
    all.sort();
    let named = |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("train"))
    };
    if all.iter().any(named) {
        all.retain(named);
    }
    if all.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            reason: "no .parquet file in it or in its data/ folder".into(),
        });
    }
    Ok(all)
}

/// The rows of one Parquet file.
fn file_rows(path: &Path) -> Result<Vec<(PathBuf, usize, serde_json::Value)>, DataError> {
    let bad = |e: parquet::errors::ParquetError| DataError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a readable Parquet file: {e}"),
        ),
    };
    let file = open_data_file(path)?;
    let reader = SerializedFileReader::new(file).map_err(bad)?;
    let iter = reader.get_row_iter(None).map_err(bad)?;
    let mut out = Vec::new();
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|e| DataError::Line {
            path: path.to_path_buf(),
            line: i + 1,
            reason: format!("row not readable: {e}"),
        })?;
        out.push((path.to_path_buf(), i + 1, row.to_json_value()));
    }
    Ok(out)
}
