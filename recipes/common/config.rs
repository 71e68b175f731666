//! Recipe parsing shared by every kind: `--set key=value` overrides checked against the
//! schema, the `kind` tag, value checks, and the serde defaults stated once.

use anyhow::{Context, Result, bail};

/// The serde defaults of every recipe schema (one place, so a default is stated once).
pub(crate) mod defaults {
    pub fn one() -> usize {
        1
    }
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
    /// `skip_serializing_if` of a count whose default is 0.
    pub fn is_zero(n: &usize) -> bool {
        *n == 0
    }
    /// `skip_serializing_if` of a switch whose default is on.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    pub fn is_true(v: &bool) -> bool {
        *v
    }
}

/// Removes the top-level `kind` from a recipe table and returns it (`"llm"` when absent).
pub fn take_kind(table: &mut toml::Table) -> Result<&'static str> {
    let kind = match table.remove("kind") {
        None => return Ok("llm"),
        Some(toml::Value::String(k)) => k,
        Some(other) => {
            bail!(
                "kind = {other}: a recipe's kind is \"llm\" (the default), \"flow\", \"agent\" or \"control\""
            )
        }
    };
    Ok(match kind.as_str() {
        "llm" => "llm",
        "flow" => "flow",
        "agent" => "agent",
        "control" => "control",
        "molora" => "molora",
        _ => bail!(
            "kind = {kind:?}: a recipe's kind is \"llm\" (the default), \"flow\", \"agent\" or \"control\""
        ),
    })
}

/// How an error message names a recipe of `kind` (`"an image (kind = \"flow\")"`).
pub fn describe_kind(kind: &str) -> String {
    match kind {
        "flow" => "an image (kind = \"flow\")".into(),
        "agent" => "a multi-turn (kind = \"agent\")".into(),
        "molora" => "a MoLoRA comparison (kind = \"molora\")".into(),
        "control" => "a continuous-control (kind = \"control\")".into(),
        k => format!("a kind = {k:?}"),
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

/// A loop's own settings: the recipe table it lives in and the kind's defaults for the keys of
/// the training configs it embeds from `ember-train`.
pub trait LoopSettings: serde::de::DeserializeOwned {
    /// The recipe table (`"train"`, `"rl"`, `"ppo"`), prefixing error messages.
    const TABLE: &'static str;
    /// `(key, value)`: the kind's defaults where they differ from `ember-train`'s (the update
    /// schedule's counts as integers).
    const DEFAULTS: &'static [(&'static str, f64)] = &[];
}

/// One recipe table holding a loop's own settings beside the three training configs it embeds
/// from `ember-train`, each stated once, there: an LLM or program recipe's `[train]`, an image
/// recipe's `[rl]`, a control recipe's `[ppo]`. Read through [`Split`]: the kind's defaults
/// filled in, every key taken by one part, a key none takes refused with the valid ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Training<L> {
    /// The loop's own settings (steps, evaluation, checkpoints, the kind's losses).
    #[serde(flatten)]
    pub run: L,
    /// `lr`, `warmup_steps`, `min_lr_ratio` (`ember_train::LrConfig`).
    #[serde(flatten)]
    pub schedule: ember_train::LrConfig,
    /// `grad_clip`, `weight_decay`, `adam_eps`, `grad_clip_mode` (`ember_train::OptimizerConfig`).
    #[serde(flatten)]
    pub optim: ember_train::OptimizerConfig,
    /// `epochs`, `mini_batches`, `micro_batch_rows`, `micro_batch_tokens`
    /// (`ember_train::UpdateSchedule`).
    #[serde(flatten)]
    pub update: ember_train::UpdateSchedule,
}

impl<L: LoopSettings> Training<L> {
    /// The table's parts from `table`, the kind's defaults filled in where a key is absent.
    fn split(mut table: toml::Table) -> std::result::Result<Self, String> {
        for &(key, value) in L::DEFAULTS {
            let value = match key {
                "epochs" | "mini_batches" | "micro_batch_rows" | "micro_batch_tokens"
                | "warmup_steps" => toml::Value::Integer(value as i64),
                _ => toml::Value::Float(value),
            };
            table.entry(key).or_insert(value);
        }
        let mut split = Split::new(table);
        let parts = (|| {
            let parts = Self {
                run: split.take()?,
                schedule: split.take()?,
                optim: split.take()?,
                update: split.take()?,
            };
            split.finish()?;
            Ok(parts)
        })();
        parts.map_err(|e: String| format!("{}: {e}", L::TABLE))
    }
}

impl<'de, L: LoopSettings> serde::Deserialize<'de> for Training<L> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let table = <toml::Table as serde::Deserialize>::deserialize(d)?;
        Self::split(table).map_err(serde::de::Error::custom)
    }
}

/// A table of only defaults, for the kinds whose loop settings all have one.
impl<L: LoopSettings + Default> Default for Training<L> {
    fn default() -> Self {
        Self::split(toml::Table::new())
            .unwrap_or_else(|e| unreachable!("the [{}] defaults parse: {e}", L::TABLE))
    }
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
    short_as(x, x)
}

/// `x` (whose value is `v`) in exponent form when `v` is very small or very large.
fn short_as<T: std::fmt::Display + std::fmt::LowerExp>(v: f64, x: T) -> String {
    if v.is_finite() && v != 0.0 && !(1e-4..1e7).contains(&v.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// The PPO ratio's clip of a kind's `prefix` table: `clip_low` in [0, 1) and `clip_high` ≥ 0,
/// the rule of an LLM recipe's `[loss.policy]` (`ember_engine::PolicyLossKind::validate`).
pub(crate) fn check_ppo_clip(prefix: &str, clip_low: f32, clip_high: f32) -> Result<()> {
    let ppo = ember_engine::PolicyLossKind::Ppo {
        clip_low,
        clip_high,
        dual_clip: None,
    };
    if ppo.validate().is_err() {
        bail!(
            "{prefix}.clip_low = {} must be in [0, 1) and {prefix}.clip_high = {} >= 0 (the PPO \
             ratio is clipped to [1 − clip_low, 1 + clip_high])",
            short32(clip_low),
            short32(clip_high)
        );
    }
    Ok(())
}

/// The most samples of one prompt (a group) any kind draws in a step.
pub(crate) const MAX_SAMPLES_PER_PROMPT: usize = 4096;

/// A kind's group size (`key` ends in `samples_per_prompt`): at least `min` (2 where the
/// baseline is the group's other samples) and at most [`MAX_SAMPLES_PER_PROMPT`].
pub(crate) fn check_samples_per_prompt(key: &str, n: usize, min: usize) -> Result<()> {
    if !(min..=MAX_SAMPLES_PER_PROMPT).contains(&n) {
        bail!(
            "{key} = {n} must be in {min}..={MAX_SAMPLES_PER_PROMPT} (the samples of one prompt: \
             a group)"
        );
    }
    Ok(())
}

/// [`short`] of an `f32` key, written as the recipe wrote it (`0.001`, not `0.0010000000474974513`).
fn short32(x: f32) -> String {
    short_as(f64::from(x), x)
}

/// A count or size within `lo..=hi` (the length of something built up front: 2^63 − 1 used to
/// abort on allocation), named in the error.
pub(crate) fn check_count(key: &str, value: usize, lo: usize, hi: usize) -> Result<()> {
    if !(lo..=hi).contains(&value) {
        bail!("{key} = {value} must be in {lo}..={hi}");
    }
    Ok(())
}

/// `value` of recipe key `key` is finite and > 0.
pub(crate) fn check_positive(key: &str, value: f64) -> Result<()> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{key} = {} must be a finite number > 0", short(value));
    }
    Ok(())
}

/// The largest learning rate a recipe takes: AdamW moves every weight by about the learning rate
/// per step, so a larger one fills the weights (and every kept checkpoint) with garbage.
pub(crate) const MAX_LR: f64 = 1.0;

/// A learning rate: finite and in (0, [`MAX_LR`]].
pub(crate) fn check_lr(key: &str, value: f64) -> Result<()> {
    if !(value.is_finite() && value > 0.0 && value <= MAX_LR) {
        bail!(
            "{key} = {} must be a finite number in (0, {MAX_LR}]",
            short(value)
        );
    }
    Ok(())
}

/// The most passes over one step's rollout (`epochs`): more is a step that never ends.
pub(crate) const MAX_EPOCHS: usize = 1000;

/// The training settings every kind embeds (`ember_train`'s schedule, optimizer and update
/// schedule) under `prefix` (`train`, `rl`, `ppo`): finite and in range, so that no setting
/// fills the weights with NaN, makes a step that never ends or silently trains nothing.
pub(crate) fn check_training(
    prefix: &str,
    schedule: &ember_train::LrConfig,
    optim: &ember_train::OptimizerConfig,
    update: &ember_train::UpdateSchedule,
) -> Result<()> {
    let key = |k: &str| format!("{prefix}.{k}");
    check_lr(&key("lr"), schedule.lr)?;
    if let Some(eta) = update.lopti_threshold {
        if prefix != "train" {
            bail!(
                "{}: Lopti splits the update by token probability; the steps of [{prefix}] \
                 have densities, not probabilities",
                key("lopti_threshold")
            );
        }
        if !(eta > 0.0 && eta < 1.0) {
            bail!(
                "{} = {eta} must be in (0, 1): a probability threshold (the paper's η, 0.5)",
                key("lopti_threshold")
            );
        }
    }
    check_range(&key("min_lr_ratio"), schedule.min_lr_ratio, 0.0, 1.0)?;
    check_range(&key("grad_clip"), optim.grad_clip.into(), 0.0, f64::MAX)?;
    check_range(&key("weight_decay"), optim.weight_decay.into(), 0.0, 1e6)?;
    // Decoupled decay multiplies every weight by 1 − lr·λ each step: past 1 the weights flip
    // sign and grow until they overflow, and checkpoints would keep the overflowed weights.
    let decay = schedule.lr * f64::from(optim.weight_decay);
    if decay > 1.0 {
        bail!(
            "{} × {} = {} must be at most 1 (decoupled weight decay multiplies every weight by \
             1 − lr·weight_decay each step)",
            key("lr"),
            key("weight_decay"),
            short(decay)
        );
    }
    // An epsilon near 1 or above divides every AdamW step away: nothing trains.
    check_positive(&key("adam_eps"), optim.epsilon.into())?;
    check_range(&key("adam_eps"), optim.epsilon.into(), 0.0, 0.1)?;
    if !(1..=MAX_EPOCHS).contains(&update.epochs) || update.mini_batches == 0 {
        bail!(
            "{} = {} must be 1 to {MAX_EPOCHS}, and {} >= 1",
            key("epochs"),
            update.epochs,
            key("mini_batches")
        );
    }
    Ok(())
}

/// Deserialises a recipe table, naming the first bad key or value.
pub(crate) fn from_toml<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T> {
    super::renamed::refuse_old(&table)?;
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("invalid recipe: {}", e.message()))
}

/// A recipe an earlier version stored (`recipe.resolved.toml`): its TOML table in today's
/// spelling ([`super::renamed`]).
pub fn stored_table(text: &str) -> Result<toml::Table> {
    let mut table = apply_overrides(text, &[])?;
    super::renamed::migrate(&mut table);
    Ok(table)
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
