//! The kernel gym over HTTP, so its evaluations scale out to other machines: `ember gym serve`
//! answers evaluations (`server.rs`), and [`remote::Remote`] is the executor a recipe's
//! `[env] remote = ["http://host:port", …]` sends them through (`remote.rs`). Imports `serve`'s
//! accept loop and key check.

pub mod remote;
pub mod server;

/// One evaluation asked of a gym server.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    /// The task's name.
    pub task: String,
    /// The kernel's C source.
    pub code: String,
    /// Draws the hidden shapes and inputs.
    pub seed: u64,
    /// Hidden shapes checked beside the prompt's.
    pub hidden_shapes: usize,
    /// CPU seconds the harness run may take (at most the server's `--max-cpu-s`).
    pub cpu_s: u64,
}
