//! A dataset's files as every reader opens them: regular files of at most 1 GiB (a FIFO or a
//! device is refused), and why a dataset could not be read.

use std::path::{Path, PathBuf};

/// Why a dataset could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read dataset {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line is not what the loader expects.
    #[error("{path}:{line}: {reason}")]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No usable example.
    #[error("dataset {path} is empty: {reason}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// Which split is empty.
        reason: String,
    },
}

/// The largest Parquet or Arrow file read (bytes).
const MAX_DATA_BYTES: u64 = 1 << 30;

/// A Parquet or Arrow file opened for reading: a regular file of at most 1 GiB.
pub(super) fn open_data_file(path: &Path) -> Result<std::fs::File, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = regular_file(path).map_err(io)?;
    if meta.len() > MAX_DATA_BYTES {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} bytes, more than the 1 GiB limit", meta.len()),
        )));
    }
    std::fs::File::open(path).map_err(io)
}

/// The metadata of `path` when it is a regular file: a FIFO (opening it for reading blocks until
/// a writer comes) or a device is refused, naming what it is (as
/// `ember_train::io::read_to_string`, a crate of the same layer).
pub(super) fn regular_file(path: &Path) -> std::io::Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} is not a regular file (a FIFO, a device or a directory)",
                path.display()
            ),
        ));
    }
    Ok(meta)
}

/// The largest JSON-lines file read (bytes), as for a Parquet file.
const MAX_BYTES: u64 = 1 << 30;

/// The text of `path` when it is a regular file ([`regular_file`]) of at most 1 GiB.
pub(super) fn read_regular(path: &Path) -> std::io::Result<String> {
    let len = regular_file(path)?.len();
    if len > MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{len} bytes, more than the 1 GiB limit"),
        ));
    }
    std::fs::read_to_string(path)
}
