//! Errors of the Hub client, each naming the path, model or file at fault.

use std::path::PathBuf;
use thiserror::Error;

/// What can go wrong finding or downloading a model.
#[derive(Debug, Error)]
pub enum HubError {
    /// A file of the cache could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The model is not where the spec says, or the Hub refused or broke off its download.
    #[error("{0}")]
    Missing(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, HubError>;

impl HubError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
