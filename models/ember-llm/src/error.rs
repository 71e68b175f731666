//! Errors of the LLM crate, each naming the file, key or value at fault.

use std::path::PathBuf;
use thiserror::Error;

/// What can go wrong loading, running or saving an LLM.
#[derive(Debug, Error)]
pub enum LlmError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A configuration value is missing, malformed or unsupported.
    #[error("config: `{field}`: {reason}")]
    Config {
        /// The key.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint lacks a tensor, or has one of the wrong shape or dtype.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A directory's files do not match its `manifest.json` (a damaged export).
    #[error(transparent)]
    Manifest(#[from] ember_train::manifest::ManifestError),
    /// GGUF reading failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The tokenizer could not be built or failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// An input is invalid (empty prompt, prompt longer than the context, bad sampling setting).
    #[error("invalid input: {0}")]
    Input(String),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, LlmError>;

impl LlmError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// What can go wrong reading a GGUF file.
#[derive(Debug, Error)]
pub enum GgufError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The bytes are not a valid GGUF file.
    #[error("{path}: not a valid GGUF file: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tensor uses a quantization this reader does not implement.
    #[error("tensor `{name}` has GGML type {ggml_type} ({type_name}), which is not supported")]
    UnsupportedType {
        /// Tensor name.
        name: String,
        /// GGML type id.
        ggml_type: u32,
        /// Its name, when known.
        type_name: &'static str,
    },
    /// A tensor or metadata key that is needed is missing.
    #[error("GGUF file has no {kind} `{name}`")]
    Missing {
        /// "tensor" or "metadata key".
        kind: &'static str,
        /// The name.
        name: String,
    },
}
