//! A task's unit: a prompt and its reference answer.

use crate::reward::Check;
use serde::{Deserialize, Serialize};

/// A prompt and its reference answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Example {
    /// The compact prompt the character-level policy sees (`12+34=`).
    pub prompt: String,
    /// The verifiable answer (for countdown, one solution).
    pub answer: String,
    /// The question in words, for policies with a real tokenizer (placed into the recipe's
    /// prompt template as `{question}`).
    pub question: String,
    /// How a completion is verified.
    pub check: Check,
    /// A chat dataset's conversation (role, content), rendered through the model's chat
    /// template in place of the recipe's prompt template; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<(String, String)>,
    /// A dataset line's other columns, passed to external and Python rewards.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub columns: serde_json::Map<String, serde_json::Value>,
}
