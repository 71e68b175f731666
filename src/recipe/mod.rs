//! Recipes: one TOML file per run, with `--set key=value` overrides checked against the schema.
//! One parse for every kind: the top-level `kind` (`"llm"`, the default, or `"flow"`) picks the
//! schema; `ember molora` reads its comparison recipe with the same override rules.

pub mod agent;
pub mod critic;
pub mod flow;
pub mod llm;
pub mod molora;
pub mod offline;
pub mod policy;
pub mod rollout;
pub mod task;

pub use llm::{Recipe, parse};

use anyhow::{Context, Result, bail};
use std::path::PathBuf;

/// The serde defaults of every recipe schema (one place, so a default is stated once).
pub(crate) mod defaults {
    pub fn two() -> usize {
        2
    }
    pub fn four() -> usize {
        4
    }
    pub fn ten() -> usize {
        10
    }
    pub fn one_f32() -> f32 {
        1.0
    }
    pub fn yes() -> bool {
        true
    }
    pub fn auto() -> String {
        "auto".into()
    }
}

/// A parsed recipe of any kind.
#[derive(Debug, Clone)]
pub enum AnyRecipe {
    /// An LLM recipe (`kind = "llm"` or no `kind`).
    Llm(Box<llm::Recipe>),
    /// An image recipe (`kind = "flow"`).
    Flow(Box<flow::FlowRecipe>),
    /// A multi-turn recipe (`kind = "agent"`).
    Agent(Box<agent::AgentRecipe>),
}

impl AnyRecipe {
    /// The run name (the default run directory is `runs/<name>`).
    pub fn name(&self) -> &str {
        match self {
            Self::Llm(r) => &r.name,
            Self::Flow(r) => &r.name,
            Self::Agent(r) => &r.name,
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
            Ok(AnyRecipe::Llm(Box::new(llm::from_table(table)?)))
        }
        Some(Some("flow")) => Ok(AnyRecipe::Flow(Box::new(flow::from_table(table)?))),
        Some(Some("agent")) => Ok(AnyRecipe::Agent(Box::new(agent::from_table(table)?))),
        Some(Some("molora")) => bail!(
            "kind = \"molora\" recipes are run by `ember molora <recipe>` (a comparison of \
             adapter arms, not a training run)"
        ),
        Some(k) => bail!(
            "kind = {}: a recipe's kind is \"llm\" (the default), \"flow\" or \"agent\"",
            k.map_or_else(|| table["kind"].to_string(), |s| format!("{s:?}"))
        ),
    }
}

/// The field names (as serialised) of a struct, read from its `Deserialize` impl: serde passes
/// them to `deserialize_struct`, which this deserializer records and then declines.
pub(crate) fn fields_of<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    struct Names(Option<&'static [&'static str]>);
    impl<'de> serde::Deserializer<'de> for &mut Names {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(serde::de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut names = Names(None);
    let _ = T::deserialize(&mut names);
    names.0.unwrap_or(&[])
}

/// One recipe table shared by several structs (a recipe's own keys and the configs it embeds
/// from the crates, each with its serde defaults): each [`Split::take`] takes its struct's keys,
/// and [`Split::finish`] refuses any key none took, listing the valid ones as serde's
/// `deny_unknown_fields` would (which cannot be combined with `#[serde(flatten)]`).
pub(crate) struct Split {
    table: toml::Table,
    valid: Vec<&'static str>,
}

impl Split {
    pub(crate) fn new(table: toml::Table) -> Self {
        Self {
            table,
            valid: Vec::new(),
        }
    }

    /// The struct `T` from its keys of the table.
    pub(crate) fn take<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, String> {
        let fields = fields_of::<T>();
        self.valid.extend(fields);
        let part: toml::Table = fields
            .iter()
            .filter_map(|f| self.table.remove(*f).map(|v| (f.to_string(), v)))
            .collect();
        toml::Value::Table(part)
            .try_into()
            .map_err(|e: toml::de::Error| e.message().to_string())
    }

    /// Refuses a key that no struct took.
    pub(crate) fn finish(self) -> Result<(), String> {
        match self.table.keys().next() {
            None => Ok(()),
            Some(k) => Err(format!(
                "unknown field `{k}`, expected one of {}",
                self.valid
                    .iter()
                    .map(|v| format!("`{v}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// `value` of recipe key `key` is finite and within `lo..=hi` (a NaN or infinite learning rate,
/// coefficient or weight would turn every weight into NaN several steps later).
pub(crate) fn check_range(key: &str, value: f64, lo: f64, hi: f64) -> Result<()> {
    if !(value.is_finite() && lo <= value && value <= hi) {
        bail!(
            "{key} = {} must be a finite number in [{lo}, {}]",
            short(value),
            short(hi)
        );
    }
    Ok(())
}

/// A number for an error message: `1e300`, not three hundred digits.
fn short(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-4..1e7).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// `value` of recipe key `key` is finite and > 0.
pub(crate) fn check_positive(key: &str, value: f64) -> Result<()> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{key} = {} must be a finite number > 0", short(value));
    }
    Ok(())
}

/// Deserialises a recipe table, naming the first bad key or value.
pub(crate) fn from_toml<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T> {
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("invalid recipe: {}", e.message()))
}

/// Parses TOML `text` and applies `key=value` overrides (dotted keys address nested tables;
/// values are TOML, bare words are strings).
pub fn apply_overrides(text: &str, overrides: &[String]) -> Result<toml::Table> {
    let mut root: toml::Table = text.parse().context("recipe is not valid TOML")?;
    for o in overrides {
        let (key, value) = o
            .split_once('=')
            .with_context(|| format!("--set {o:?}: expected key=value"))?;
        let value: toml::Value = match format!("v = {value}").parse::<toml::Table>() {
            Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(value.into())),
            Err(_) => toml::Value::String(value.to_string()),
        };
        let parts: Vec<&str> = key.trim().split('.').collect();
        let mut table = &mut root;
        for p in &parts[..parts.len() - 1] {
            table = table
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .with_context(|| format!("--set {key}: `{p}` is not a table"))?;
        }
        table.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(root)
}

/// Expands a leading `~/` and `$NAME` / `${NAME}` / `${NAME:-default}` environment variables
/// (an unset variable without a default is an error naming it).
pub fn expand_path(p: &str) -> Result<PathBuf> {
    let mut out = String::new();
    let mut rest = p;
    if let Some(r) = rest.strip_prefix("~/") {
        out += &std::env::var("HOME").context("`~` in a path needs HOME")?;
        out.push('/');
        rest = r;
    }
    while let Some(i) = rest.find('$') {
        out += &rest[..i];
        let tail = &rest[i + 1..];
        let (name, after) = if let Some(t) = tail.strip_prefix('{') {
            let end = t
                .find('}')
                .with_context(|| format!("unclosed `${{` in {p:?}"))?;
            (&t[..end], &t[end + 1..])
        } else {
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            (&tail[..end], &tail[end..])
        };
        let (name, default) = match name.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (name, None),
        };
        match (std::env::var(name), default) {
            (Ok(v), _) if !v.is_empty() => out += &v,
            (_, Some(d)) => match d.strip_prefix("~/") {
                Some(t) => {
                    out += &std::env::var("HOME").context("`~` in a path needs HOME")?;
                    out.push('/');
                    out += t;
                }
                None => out += d,
            },
            _ => bail!("environment variable {name} (in {p:?}) is not set"),
        }
        rest = after;
    }
    out += rest;
    Ok(PathBuf::from(out))
}
