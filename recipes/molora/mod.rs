//! `ember molora`: LoRA vs a learned-router MoLoRA vs ReMix at equal activated adapter
//! parameters. The comparison recipe (`schema`) and the job (`job`).

pub mod job;
pub mod schema;
