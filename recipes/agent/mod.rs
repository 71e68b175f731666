//! `kind = "agent"` recipes: multi-turn episodes of an environment. The schema (`schema`), the
//! rollout of a policy against an environment (`rollout`) and the job (`job`).

pub mod job;
pub mod rollout;
pub mod schema;
