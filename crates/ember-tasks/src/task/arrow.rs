//! Datasets as the `datasets` library saves them (`Dataset.save_to_disk`): a folder whose
//! `state.json` names its Arrow IPC stream files (`data-00000-of-00001.arrow`, …), or a
//! `DatasetDict`'s folder (`dataset_dict.json`, one such folder per split) whose `train` split is
//! read. Each row is read as the JSON object a JSONL line would be: strings, numbers, booleans,
//! lists and structs (a list of structs is a list of objects, so a `messages` column reads as a
//! conversation); a null stays null, as Parquet's rows and JSONL have it; a column of another
//! type (binary, dates, images) is named in an error.

use super::file::{DataError, open_data_file, read_regular};
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_ipc::reader::StreamReader;
use arrow_schema::DataType;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

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
    let text = read_regular(path).map_err(|source| DataError::Io {
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
    let mut seen = std::collections::HashSet::new();
    names
        .into_iter()
        .map(|n| {
            let plain = Path::new(&n).file_name().is_some_and(|f| f == n.as_str());
            if !plain || !n.ends_with(".arrow") {
                return Err(invalid(
                    &state,
                    format!("{n:?} is not an .arrow file of this folder"),
                ));
            }
            // A file named twice would be read (and its rows counted) twice: a state.json
            // naming one file 200 000 times read it 200 000 times.
            if !seen.insert(n.clone()) {
                return Err(invalid(&state, format!("`_data_files` names {n:?} twice")));
            }
            inside(dir, &dir.join(n))
        })
        .collect()
}

/// `file` when it stays inside `dir` once links are resolved: a symbolic link out of the
/// dataset's folder is refused without opening (and so without showing) what it points to.
fn inside(dir: &Path, file: &Path) -> Result<PathBuf, DataError> {
    let io = |source| DataError::Io {
        path: file.to_path_buf(),
        source,
    };
    let (real_dir, real) = (
        dir.canonicalize().map_err(io)?,
        file.canonicalize().map_err(io)?,
    );
    if real.parent() != Some(real_dir.as_path()) {
        let why = "a link to a file outside the dataset's folder".to_string();
        return Err(invalid(file, why));
    }
    Ok(file.to_path_buf())
}

/// The rows of one Arrow IPC stream file.
fn file_rows(path: &Path) -> Result<Vec<(PathBuf, usize, serde_json::Value)>, DataError> {
    let file = open_data_file(path)?;
    let reader = StreamReader::try_new(std::io::BufReader::new(file), None)
        .map_err(|e| invalid(path, format!("not an Arrow IPC stream: {e}")))?;
    let mut out = Vec::new();
    for batch in reader {
        let first = out.len() + 1;
        let bad = |(at, e): (usize, String)| DataError::Line {
            path: path.to_path_buf(),
            line: first + at,
            reason: format!("not readable: {e}"),
        };
        let batch = batch.map_err(|e| bad((0, e.to_string())))?;
        let rows = batch_rows(&batch).map_err(bad)?;
        for (i, v) in rows.into_iter().enumerate() {
            out.push((path.to_path_buf(), first + i, v));
        }
    }
    Ok(out)
}

/// The rows of a record batch as JSON objects; an error names its row (0-based) and column.
fn batch_rows(batch: &RecordBatch) -> Result<Vec<Value>, (usize, String)> {
    let schema = batch.schema();
    (0..batch.num_rows())
        .map(|i| {
            let mut row = Map::new();
            for (field, col) in schema.fields().iter().zip(batch.columns()) {
                let v = json_at(col.as_ref(), i)
                    .map_err(|e| (i, format!("column `{}`: {e}", field.name())))?;
                row.insert(field.name().clone(), v);
            }
            Ok(Value::Object(row))
        })
        .collect()
}

/// Element `i` of `a` as JSON (non-finite floats as null, as JSON has no such numbers).
fn json_at(a: &dyn Array, i: usize) -> Result<Value, String> {
    if i >= a.len() {
        return Err(format!("row {i} of an array of {}", a.len()));
    }
    if a.is_null(i) {
        return Ok(Value::Null);
    }
    let missing = || format!("an array that is not its type {}", a.data_type());
    macro_rules! prim {
        ($t:ty) => {
            Value::from(a.as_primitive_opt::<$t>().ok_or_else(missing)?.value(i))
        };
    }
    let float = |x: f64| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number);
    Ok(match a.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => Value::Bool(a.as_boolean_opt().ok_or_else(missing)?.value(i)),
        DataType::Int8 => prim!(Int8Type),
        DataType::Int16 => prim!(Int16Type),
        DataType::Int32 => prim!(Int32Type),
        DataType::Int64 => prim!(Int64Type),
        DataType::UInt8 => prim!(UInt8Type),
        DataType::UInt16 => prim!(UInt16Type),
        DataType::UInt32 => prim!(UInt32Type),
        DataType::UInt64 => prim!(UInt64Type),
        DataType::Float16 => float(
            a.as_primitive_opt::<Float16Type>()
                .ok_or_else(missing)?
                .value(i)
                .to_f64(),
        ),
        DataType::Float32 => float(
            a.as_primitive_opt::<Float32Type>()
                .ok_or_else(missing)?
                .value(i)
                .into(),
        ),
        DataType::Float64 => float(
            a.as_primitive_opt::<Float64Type>()
                .ok_or_else(missing)?
                .value(i),
        ),
        DataType::Utf8 => Value::from(a.as_string_opt::<i32>().ok_or_else(missing)?.value(i)),
        DataType::LargeUtf8 => Value::from(a.as_string_opt::<i64>().ok_or_else(missing)?.value(i)),
        DataType::Utf8View => Value::from(a.as_string_view_opt().ok_or_else(missing)?.value(i)),
        DataType::List(_) => list(
            a.as_list_opt::<i32>()
                .ok_or_else(missing)?
                .value(i)
                .as_ref(),
        )?,
        DataType::LargeList(_) => list(
            a.as_list_opt::<i64>()
                .ok_or_else(missing)?
                .value(i)
                .as_ref(),
        )?,
        DataType::FixedSizeList(..) => list(
            a.as_fixed_size_list_opt()
                .ok_or_else(missing)?
                .value(i)
                .as_ref(),
        )?,
        DataType::Struct(fields) => {
            let s = a.as_struct_opt().ok_or_else(missing)?;
            let mut m = Map::new();
            for (f, col) in fields.iter().zip(s.columns()) {
                m.insert(f.name().clone(), json_at(col.as_ref(), i)?);
            }
            Value::Object(m)
        }
        other => {
            return Err(format!(
                "its type {other} is not read (strings, numbers, booleans, lists and structs are)"
            ));
        }
    })
}

/// Every element of `a` as a JSON list.
fn list(a: &dyn Array) -> Result<Value, String> {
    (0..a.len())
        .map(|i| json_at(a, i))
        .collect::<Result<_, _>>()
        .map(Value::Array)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, BinaryArray, Float64Array, Int64Array, StringArray};
    use std::sync::Arc;

    /// Numbers, strings and nulls as JSON (a NaN as null); a binary column is named with its row.
    #[test]
    fn rows_are_json_and_unread_types_are_named() {
        let cols: Vec<(&str, ArrayRef)> = vec![
            ("n", Arc::new(Int64Array::from(vec![Some(3), None]))),
            ("x", Arc::new(Float64Array::from(vec![0.5, f64::NAN]))),
            ("s", Arc::new(StringArray::from(vec![Some("a"), None]))),
        ];
        let batch = RecordBatch::try_from_iter(cols.clone()).unwrap_or_else(|e| panic!("{e}"));
        let rows = batch_rows(&batch).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(rows[0], serde_json::json!({"n": 3, "x": 0.5, "s": "a"}));
        assert_eq!(
            rows[1],
            serde_json::json!({"n": null, "x": null, "s": null})
        );
        let mut with_bytes = cols;
        let bytes: ArrayRef = Arc::new(BinaryArray::from(vec![&b"png"[..], &b"jpg"[..]]));
        with_bytes.push(("image", bytes));
        let batch = RecordBatch::try_from_iter(with_bytes).unwrap_or_else(|e| panic!("{e}"));
        let (row, e) = batch_rows(&batch).err().unwrap_or_default();
        assert_eq!(row, 0);
        assert!(e.contains("column `image`") && e.contains("Binary"), "{e}");
    }
}
