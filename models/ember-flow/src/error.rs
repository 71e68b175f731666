//! Errors of the flow crate, each naming the value or file at fault.

use std::path::PathBuf;

/// What can go wrong building, loading or running the flow model and its reward model.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// A setting is out of range.
    #[error("flow.{field}: {reason}")]
    Config {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A tensor has the wrong shape.
    #[error("{what}: expected shape {expected:?}, got {got:?}")]
    Shape {
        /// Which input.
        what: &'static str,
        /// Expected dims.
        expected: Vec<usize>,
        /// Actual dims.
        got: Vec<usize>,
    },
    /// A weights file could not be read or does not fit the module.
    #[error("{path}: {reason}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The engine refused a batch.
    #[error(transparent)]
    Engine(#[from] ember_engine::EngineError),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, FlowError>;
