//! A recipe of any kind, parsed by its `kind` tag: the one parse the CLI runs.

use crate::agent;
use crate::common::config::apply_overrides;
use crate::control;
use crate::flow;
use crate::llm;
use crate::programs;
use crate::unlearning;
use anyhow::{Result, bail};

/// A parsed recipe of any kind.
#[derive(Debug, Clone)]
pub enum AnyRecipe {
    /// An LLM recipe (`kind = "llm"` or no `kind`).
    Llm(Box<llm::schema::Recipe>),
    /// An image recipe (`kind = "flow"`).
    Flow(Box<flow::schema::FlowRecipe>),
    /// A multi-turn recipe (`kind = "agent"`).
    Agent(Box<agent::schema::AgentRecipe>),
    /// A continuous-control recipe (`kind = "control"`).
    Control(Box<control::schema::ControlRecipe>),
    /// A program-synthesis recipe (`kind = "programs"`).
    Programs(Box<programs::schema::ProgramsRecipe>),
    /// An unlearning recipe (`kind = "unlearning"`).
    Unlearning(Box<unlearning::schema::UnlearningRecipe>),
}

impl AnyRecipe {
    /// The run name (the default run directory is `runs/<name>`).
    pub fn name(&self) -> &str {
        match self {
            Self::Llm(r) => &r.header.name,
            Self::Flow(r) => &r.header.name,
            Self::Agent(r) => &r.header.name,
            Self::Control(r) => &r.header.name,
            Self::Programs(r) => &r.header.name,
            Self::Unlearning(r) => &r.header.name,
        }
    }
}

/// Parses a recipe of any kind, with `key=value` overrides, and checks every value.
pub fn parse_any(text: &str, overrides: &[String]) -> Result<AnyRecipe> {
    let table = apply_overrides(text, overrides)?;
    match table.get("kind").map(|k| k.as_str()) {
        None | Some(Some("llm")) => {
            let mut table = table;
            table.remove("kind");
            Ok(AnyRecipe::Llm(Box::new(llm::schema::from_table(table)?)))
        }
        Some(Some("flow")) => Ok(AnyRecipe::Flow(Box::new(flow::schema::from_table(table)?))),
        Some(Some("agent")) => Ok(AnyRecipe::Agent(Box::new(agent::schema::from_table(
            table,
        )?))),
        Some(Some("control")) => Ok(AnyRecipe::Control(Box::new(control::schema::from_table(
            table,
        )?))),
        Some(Some("programs")) => Ok(AnyRecipe::Programs(Box::new(programs::schema::from_table(
            table,
        )?))),
        Some(Some("unlearning")) => Ok(AnyRecipe::Unlearning(Box::new(
            unlearning::schema::from_table(table)?,
        ))),
        Some(Some("molora")) => bail!(
            "kind = \"molora\" recipes are run by `ember molora <recipe>` (a comparison of \
             adapter arms, not a training run)"
        ),
        Some(k) => bail!(
            "kind = {}: a recipe's kind is \"llm\" (the default), \"flow\", \"agent\", \"control\", \
             \"programs\" or \"unlearning\"",
            k.map_or_else(|| table["kind"].to_string(), |s| format!("{s:?}"))
        ),
    }
}
