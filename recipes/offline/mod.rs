//! LLM recipes with an `[offline]` table: DPO, IPO, SimPO, RPO, A-LoL and REINFORCE-LOO on a
//! fixed dataset of scored responses. The table's schema is part of the LLM recipe
//! (`crate::llm::schema::offline`); here are the datasets (`data`), the job (`job`) and the
//! objectives' step (`objective`).

pub mod data;
pub mod job;
mod objective;
