//! Recipe keys that took a new name, so that one knob has one spelling in every kind: a recipe
//! written with the old spelling is refused by a message naming the new one, and a recipe an
//! earlier version stored in a run directory (`recipe.resolved.toml`, every checkpoint) is read
//! in today's spelling (`ember eval`, `--resume`).

use anyhow::{Result, bail};

/// A key's old spelling (a dotted path) and the keys that replace it: one, or two that both
/// take the old value (a symmetric bound that became a lower and an upper one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    /// The old dotted path.
    pub old: &'static str,
    /// The new dotted paths (same table as `old`).
    pub new: &'static [&'static str],
}

/// Every renamed key. The group size is `samples_per_prompt`, the groups a step draws
/// `prompts_per_step` (an agent's episode seeds too) and the PPO ratio's clip is
/// `clip_low`/`clip_high` in every kind, as in an LLM recipe's `[rollout]` and `[loss.policy]`.
pub const RENAMED: &[Renamed] = &[
    Renamed {
        old: "rl.group_size",
        new: &["rl.samples_per_prompt"],
    },
    Renamed {
        old: "rl.clip_range",
        new: &["rl.clip_low", "rl.clip_high"],
    },
    Renamed {
        old: "ppo.clip",
        new: &["ppo.clip_low", "ppo.clip_high"],
    },
    Renamed {
        old: "train.samples",
        new: &["train.samples_per_prompt"],
    },
    Renamed {
        old: "forget.samples",
        new: &["forget.samples_per_prompt"],
    },
    Renamed {
        old: "rollout.samples_per_episode",
        new: &["rollout.samples_per_prompt"],
    },
    Renamed {
        old: "rollout.episodes_per_step",
        new: &["rollout.prompts_per_step"],
    },
];

/// The table holding dotted `path`'s last key, and that key.
fn parent<'a>(table: &'a toml::Table, path: &'a str) -> Option<(&'a toml::Table, &'a str)> {
    let (dirs, key) = path.rsplit_once('.').unwrap_or(("", path));
    let mut t = table;
    for d in dirs.split('.').filter(|d| !d.is_empty()) {
        t = t.get(d)?.as_table()?;
    }
    Some((t, key))
}

fn parent_mut<'a>(
    table: &'a mut toml::Table,
    path: &'a str,
) -> Option<(&'a mut toml::Table, &'a str)> {
    let (dirs, key) = path.rsplit_once('.').unwrap_or(("", path));
    let mut t = table;
    for d in dirs.split('.').filter(|d| !d.is_empty()) {
        t = t.get_mut(d)?.as_table_mut()?;
    }
    Some((t, key))
}

/// Refuses a recipe table that spells a key the old way, naming the new spelling.
pub fn refuse_old(table: &toml::Table) -> Result<()> {
    for r in RENAMED {
        if parent(table, r.old).is_some_and(|(t, k)| t.contains_key(k)) {
            let new = r
                .new
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(" and ");
            bail!(
                "`{}` is now spelled {new} (one name in every kind of recipe)",
                r.old
            );
        }
    }
    Ok(())
}

/// Rewrites the old spellings of a stored recipe table into today's (a new key already there
/// is kept).
pub fn migrate(table: &mut toml::Table) {
    for r in RENAMED {
        let Some(value) = parent_mut(table, r.old).and_then(|(t, k)| t.remove(k)) else {
            continue;
        };
        for new in r.new {
            if let Some((t, k)) = parent_mut(table, new) {
                t.entry(k).or_insert_with(|| value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn an_old_spelling_is_refused_naming_the_new_one() {
        let err = refuse_old(&table("[rl]\ngroup_size = 8\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`rl.group_size` is now spelled `rl.samples_per_prompt` (one name in every kind of \
             recipe)"
        );
        let err = refuse_old(&table("[ppo]\nclip = 0.2\n")).unwrap_err();
        assert!(
            err.to_string()
                .contains("`ppo.clip` is now spelled `ppo.clip_low` and `ppo.clip_high`"),
            "{err}"
        );
        refuse_old(&table(
            "[rl]\nsamples_per_prompt = 8\n[eval]\nsamples = 4\n",
        ))
        .unwrap();
        // A key of the same name elsewhere is not the renamed one.
        refuse_old(&table("clip = 1\n[loss]\nclip = 2\n")).unwrap();
    }

    #[test]
    fn a_stored_recipe_is_read_in_todays_spelling() {
        let mut t = table("[rl]\ngroup_size = 8\nclip_range = 0.001\n[ppo]\nclip = 0.2\n");
        migrate(&mut t);
        let want = table(
            "[rl]\nsamples_per_prompt = 8\nclip_low = 0.001\nclip_high = 0.001\n\
             [ppo]\nclip_low = 0.2\nclip_high = 0.2\n",
        );
        assert_eq!(t, want);
        refuse_old(&t).unwrap();
        // A new key already there wins over the old one's value.
        let mut t = table("[train]\nsamples = 3\nsamples_per_prompt = 5\n");
        migrate(&mut t);
        assert_eq!(t, table("[train]\nsamples_per_prompt = 5\n"));
    }
}
