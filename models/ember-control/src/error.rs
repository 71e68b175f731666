//! The control crate's errors.

/// What can go wrong building a control model or environment.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A setting out of its range, named.
    #[error("{what} = {value}: {why}")]
    BadSetting {
        /// The setting's name.
        what: &'static str,
        /// Its value, as written.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// Tensors of the wrong shape.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        /// Where.
        what: &'static str,
        /// The shape required.
        expected: String,
        /// The shape given.
        got: String,
    },
}

/// The control crate's result.
pub type Result<T> = std::result::Result<T, ControlError>;

/// Checks `ok`, naming the setting and its rule otherwise.
pub(crate) fn check(
    what: &'static str,
    value: impl std::fmt::Display,
    ok: bool,
    why: &'static str,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(ControlError::BadSetting {
            what,
            value: value.to_string(),
            why,
        })
    }
}
