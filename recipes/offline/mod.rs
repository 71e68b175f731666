//! LLM recipes with an `[offline]` table: DPO, IPO, SimPO, RPO, A-LoL, REINFORCE-LOO, TOPR, REC,
//! OPMD, AsymRE and SFT on a
//! fixed dataset of scored responses. The table's schema is part of the LLM recipe
//! (`crate::llm::schema::offline`); here are the datasets (`data`), the job (`job`), the
//! objectives' step (`objective`) and A-LoL's fitted value estimate (`value`).

pub mod data;
pub mod job;
mod objective;
pub mod value;
