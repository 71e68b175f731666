//! `kind = "agent"` recipes: multi-turn episodes of an environment. The schema (`schema`), the
//! rollout of a policy against an environment (`rollout`), the job (`job`), and the
//! environment whose student is a model (`tutor`).

pub mod job;
pub mod rollout;
pub mod schema;
pub mod tutor;
