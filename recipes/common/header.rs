//! The keys every recipe starts with (`name`, `seed`, `device`), written once: a recipe of any
//! kind is its [`RunHeader`] and the kind's own tables, read through [`Split`] so that an
//! unknown key is still refused with the list of valid ones.

use super::config::Split;
use serde::{Deserialize, Serialize};

/// `name`, `seed`, `device`: the top of every recipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunHeader {
    /// Run name (the default run directory is `runs/<name>`).
    pub name: String,
    /// Seed of every random choice (default 0).
    #[serde(default)]
    pub seed: u64,
    /// `cpu`, `cuda`, `wgpu` or `auto` (the default).
    #[serde(default = "super::config::defaults::auto")]
    pub device: String,
}

/// A recipe: its header and the kind's own keys and tables (`body`, whose fields read through
/// `Deref`: `r.rollout` is `r.body.rollout`). Written as one TOML table, header first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Headed<B> {
    /// `name`, `seed`, `device`.
    #[serde(flatten)]
    pub header: RunHeader,
    /// The kind's own keys and tables.
    #[serde(flatten)]
    pub body: B,
}

impl<B> std::ops::Deref for Headed<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.body
    }
}

impl<B> std::ops::DerefMut for Headed<B> {
    fn deref_mut(&mut self) -> &mut B {
        &mut self.body
    }
}

impl<'de, B: serde::de::DeserializeOwned> Deserialize<'de> for Headed<B> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let table = <toml::Table as Deserialize>::deserialize(d)?;
        let mut split = Split::new(table);
        let parts = (|| {
            let parts = Self {
                header: split.take()?,
                body: split.take()?,
            };
            split.finish()?;
            Ok(parts)
        })();
        parts.map_err(|e: String| serde::de::Error::custom(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        steps: usize,
        #[serde(default)]
        lr: f32,
    }

    #[test]
    fn the_header_and_the_body_share_one_table() {
        let r: Headed<Body> = toml::from_str("name = \"x\"\nsteps = 3\n").unwrap();
        assert_eq!(r.header.name, "x");
        assert_eq!((r.header.seed, r.header.device.as_str()), (0, "auto"));
        assert_eq!((r.steps, r.lr), (3, 0.0));
        let text = toml::to_string(&r).unwrap();
        assert_eq!(
            text,
            "name = \"x\"\nseed = 0\ndevice = \"auto\"\nsteps = 3\nlr = 0.0\n"
        );
        assert_eq!(toml::from_str::<Headed<Body>>(&text).unwrap(), r);
        let err = toml::from_str::<Headed<Body>>("name = \"x\"\nsteps = 3\nbogus = 1\n")
            .unwrap_err()
            .message()
            .to_string();
        assert_eq!(
            err,
            "unknown field `bogus`, expected one of `name`, `seed`, `device`, `steps`, `lr`"
        );
        let err = toml::from_str::<Headed<Body>>("steps = 3\n").unwrap_err();
        assert!(err.message().contains("missing field `name`"), "{err}");
    }
}
