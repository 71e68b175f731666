//! Decoding: the samplers, the continuous batcher's rows, constraints and the one temperature
//! rule.
//!
//! - `sample`: batched seeded sampling (temperature, top-k, top-p, min-p, stop tokens);
//!   `temperature`: the one temperature rule of every surface.
//! - `constrain`: constrained decoding: a `TokenConstraint` names each row's allowed tokens
//!   before each step; `ConstrainedLlama` scores the same distribution in the update.
//! - `running`: continuous batching (rows join a decode batch at any step and leave as they
//!   end); `shrink`: the decode batch without its finished rows.
//!
//! The folder imports the model (`crate::model`, `crate::cache`, `crate::mixture`); the model
//! imports nothing from here.

pub(crate) mod constrain;
pub mod running;
pub(crate) mod sample;
pub(crate) mod shrink;
pub(crate) mod temperature;
