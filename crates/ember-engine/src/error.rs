//! Typed errors of the engine: every one names the input that was wrong.

use thiserror::Error;

/// What can go wrong when the engine is handed a batch or a configuration.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// A batch with no rows (or no steps) was passed where at least one is needed.
    #[error("empty batch: `{0}` has no rows")]
    EmptyBatch(&'static str),
    /// Two tensors that must agree in shape do not.
    #[error("shape mismatch: `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The offending input.
        name: &'static str,
        /// Its shape.
        actual: Vec<usize>,
        /// The shape it must have.
        expected: Vec<usize>,
    },
    /// An estimator or loss needs an input the batch does not carry.
    #[error("`{what}` needs `{input}`, which the batch does not carry")]
    MissingInput {
        /// The estimator, loss or term that needs it.
        what: &'static str,
        /// The missing input.
        input: &'static str,
    },
    /// A configuration value is out of its valid range.
    #[error("invalid config: `{field}` = {value}: {reason}")]
    InvalidConfig {
        /// The configuration field.
        field: &'static str,
        /// Its value, printed.
        value: String,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// The multi-process world under a data-parallel update failed (its engine's message).
    #[error("the distributed world failed at {what}: {message}")]
    Collective {
        /// The operation.
        what: &'static str,
        /// The engine's message.
        message: String,
    },
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// Checks that a tensor's dims equal the expected ones.
pub(crate) fn check_shape<const D: usize>(
    name: &'static str,
    actual: [usize; D],
    expected: [usize; D],
) -> Result<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(EngineError::ShapeMismatch {
            name,
            actual: actual.to_vec(),
            expected: expected.to_vec(),
        })
    }
}

/// Checks that a configuration value satisfies `ok`.
pub(crate) fn check_config(
    field: &'static str,
    value: f64,
    ok: bool,
    reason: &'static str,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidConfig {
            field,
            value: value.to_string(),
            reason,
        })
    }
}
