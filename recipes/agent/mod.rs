//! `kind = "agent"` recipes: multi-turn episodes of an environment. The schema (`schema`), the
//! rollout of a policy against an environment (`rollout`), the job (`job`), the environment
//! whose student is a model (`tutor`) and its problems (`problems`).

pub mod job;
pub mod problems;
pub mod rollout;
pub mod schema;
pub mod tutor;
