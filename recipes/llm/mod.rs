//! LLM recipes (`kind = "llm"`): the recipe's schema (`schema`), what it makes of the LM policy
//! kit ([`setup`]: its policy, sampler, update schedule and optimizer), the teacher, rollouts
//! from servers and pipelines, replay, adaptive sampling, LANPO, PLoP, and the jobs (`jobs`).

pub mod adaptive;
pub mod critic;
pub mod jobs;
pub mod lanpo;
pub mod pipeline;
pub mod plop;
pub mod ranks;
pub mod remote;
pub mod replay;
pub mod saved;
pub mod schema;
pub mod setup;
pub mod teacher;

pub use setup::{build_policy, build_policy_with, read_reference};
