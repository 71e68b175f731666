//! `targets = "plop"` in `[pretrained.lora]` and `ember plop`: PLoP's normalised feature norms
//! (`ember_llm::plop`, Hayou et al. 2025) of the recipe's pretrained model on its task's
//! training prompts, the projection types with the lowest scores chosen for the adapters.
//!
//! A run makes the choice once, when it starts, and writes it to `plop.json` in its directory;
//! a resumed run, and `ember eval` of the run, read it back, so the adapters in the checkpoints
//! always match the recipe the run is continued with.

use crate::llm::build_policy;
use crate::llm::schema::Recipe;
use crate::lm::{Policy, load_checkpoint, warm_up};
use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use ember_engine::SplitMix64;
use ember_llm::LORA_TARGETS as TARGETS;
use ember_llm::left_pad;
use ember_llm::plop::{NfnScores, nfn_scores};
use ember_run::Run;
use ember_tasks::task::TaskSet;
use serde::{Deserialize, Serialize};
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::Path;

/// The file a run keeps its choice in.
pub const FILE: &str = "plop.json";

/// Prompts per forward pass.
const BATCH: usize = 16;

/// Seed salt: the scored prompts are drawn from their own stream, so scoring does not move the
/// run's own draws.
const SALT: u64 = 0x504c_6f50;

/// PLoP's scores and the choice they make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    /// The chosen projection types, in `q_proj` … `down_proj` order.
    pub targets: Vec<String>,
    /// Each type's score (mean NFN over tokens, then layers).
    pub scores: BTreeMap<String, f64>,
    /// Per layer, each type's mean NFN over the tokens.
    pub per_layer: Vec<BTreeMap<String, f64>>,
    /// Prompts scored.
    pub prompts: usize,
    /// Tokens scored (padding excluded).
    pub tokens: usize,
}

impl Choice {
    fn new(s: &NfnScores, count: usize, prompts: usize) -> Result<Self> {
        let named = |row: &[f64; 7]| -> BTreeMap<String, f64> {
            TARGETS
                .iter()
                .zip(row)
                .map(|(t, x)| (t.to_string(), *x))
                .collect()
        };
        Ok(Self {
            targets: s.choose(count)?,
            scores: named(&s.by_type()),
            per_layer: s.per_layer.iter().map(named).collect(),
            prompts,
            tokens: s.tokens,
        })
    }

    /// The scores, lowest first, one line each, the chosen ones marked.
    pub fn table(&self) -> String {
        let mut rows: Vec<(&String, &f64)> = self.scores.iter().collect();
        rows.sort_by(|a, b| a.1.total_cmp(b.1));
        let mut out = format!(
            "PLoP normalised feature norms ({} prompts, {} tokens; lowest get adapters):\n",
            self.prompts, self.tokens
        );
        for (name, score) in rows {
            let (lo, hi) = self
                .per_layer
                .iter()
                .filter_map(|l| l.get(name))
                .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
            let mark = if self.targets.contains(name) {
                "*"
            } else {
                " "
            };
            out.push_str(&format!(
                "{mark} {name:<10} {score:>8.3}   (layers {lo:.3}..{hi:.3})\n"
            ));
        }
        out.push_str(&format!("targets = {:?}\n", self.targets));
        out
    }
}

/// PLoP's scores of the recipe's pretrained model (its base weights) on `prompts` training
/// prompts of its task, rendered as the run renders them, and the `count` lowest types.
pub fn score(
    r: &Recipe,
    task: &TaskSet,
    count: usize,
    prompts: usize,
    device: &Device,
) -> Result<Choice> {
    if r.pretrained.is_none() {
        bail!("PLoP scores a [pretrained] model; the tiny [model] has no LoRA");
    }
    // Adapters on every type (B = 0) only to build the policy; the scores read base weights.
    let mut named = r.clone();
    if let Some(pp) = named.pretrained.as_mut() {
        pp.lora = pp
            .lora
            .with_targets(TARGETS.iter().map(|s| s.to_string()).collect());
    }
    let policy = build_policy(&named, device)?;
    let mut rng = SplitMix64(r.header.seed ^ SALT);
    let examples = task.train(&mut rng, prompts);
    let ids = examples
        .iter()
        .map(|e| policy.prompt_ids(e, r.rollout.max_new_tokens))
        .collect::<Result<Vec<_>>>()?;
    let batches: Vec<_> = ids.chunks(BATCH).map(|c| left_pad(c, device)).collect();
    let scores = nfn_scores(&policy.model, &batches)?;
    Choice::new(&scores, count, examples.len())
}

/// The recipe with `targets = "plop"` replaced by the choice: a resumed run's `out/plop.json`
/// (`resumed`), else scored now and written to `out/plop.json` (replacing a file left by an
/// earlier run in the directory) when `out` is given. Recipes with named targets come back
/// unchanged.
pub fn resolve(
    r: &Recipe,
    task: &TaskSet,
    out: Option<&Path>,
    resumed: bool,
    device: &Device,
) -> Result<(Recipe, Option<Choice>)> {
    let Some(p) = r.pretrained.as_ref().filter(|p| p.lora.is_plop()) else {
        return Ok((r.clone(), None));
    };
    let (count, prompts) = p.lora.plop();
    let path = out.map(|d| d.join(FILE));
    let choice = match path.as_deref().filter(|_| resumed) {
        Some(f) if !f.exists() => bail!(
            "the run being resumed chose its adapters with PLoP but {} is missing",
            f.display()
        ),
        Some(f) => read(f, count)?,
        None => {
            let c = score(r, task, count, prompts, device)?;
            if let Some(f) = &path {
                let text = serde_json::to_string_pretty(&c)?;
                ember_run::write_atomic(f, text.as_bytes())
                    .with_context(|| format!("writing {}", f.display()))?;
            }
            c
        }
    };
    Ok((with_choice(r, &choice), Some(choice)))
}

/// A recipe and, once its run is open, the same with its LoRA targets placed: a job borrows
/// the placed one for the whole run.
pub struct Placing<'a> {
    given: &'a Recipe,
    placed: OnceCell<Recipe>,
}

impl<'a> Placing<'a> {
    /// `given` before placement.
    pub fn new(given: &'a Recipe) -> Self {
        Self {
            given,
            placed: OnceCell::new(),
        }
    }

    /// The recipe as written.
    pub fn given(&self) -> &'a Recipe {
        self.given
    }

    /// The recipe with its targets placed for `run` ([`place`]), kept for the run (once).
    pub fn place(&self, task: &TaskSet, run: &Run, device: &Device) -> Result<&Recipe> {
        if self
            .placed
            .set(place(self.given, task, run, device)?)
            .is_err()
        {
            bail!("a run's LoRA targets are placed once");
        }
        self.placed.get().context("the placed recipe")
    }
}

/// [`resolve`] at the start of a run (`ember train`, the offline job): the choice is read back
/// when the run resumes, else made and written to the run directory, and its table is said.
fn place(r: &Recipe, task: &TaskSet, run: &Run, device: &Device) -> Result<Recipe> {
    let (placed, choice) = resolve(r, task, Some(run.out()), run.resumed().is_some(), device)?;
    if let Some(c) = &choice {
        run.say(c.table().trim_end());
    }
    Ok(placed)
}

/// The recipe of a run directory with its recorded choice applied (`ember eval`).
pub fn apply_recorded(r: &Recipe, run: &Path) -> Result<Recipe> {
    match r.pretrained.as_ref().filter(|p| p.lora.is_plop()) {
        None => Ok(r.clone()),
        Some(p) => {
            let f = run.join(FILE);
            if !f.exists() {
                bail!(
                    "{} names targets = \"plop\" but the run has no {FILE}",
                    run.display()
                );
            }
            Ok(with_choice(r, &read(&f, p.lora.plop().0)?))
        }
    }
}

fn with_choice(r: &Recipe, c: &Choice) -> Recipe {
    let mut out = r.clone();
    if let Some(p) = out.pretrained.as_mut() {
        p.lora = p.lora.with_targets(c.targets.clone());
    }
    out
}

/// Reads a recorded choice, checking it names `count` distinct known projection types.
fn read(f: &Path, count: usize) -> Result<Choice> {
    let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
    let c: Choice =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", f.display()))?;
    let mut seen = c.targets.clone();
    seen.sort();
    seen.dedup();
    if seen.len() != c.targets.len()
        || c.targets.len() != count
        || c.targets.iter().any(|t| !TARGETS.contains(&t.as_str()))
    {
        bail!(
            "{}: targets {:?} must be {count} distinct names among {}",
            f.display(),
            c.targets,
            TARGETS.join(", ")
        );
    }
    Ok(c)
}

/// The recipe's policy as a run of it starts: built, then warmed up (the tiny model, with the
/// job's RNG, so the weights equal those an `ember train` of the recipe begins its RL from), or
/// loaded from `checkpoint` instead. With `targets = "plop"`, the choice recorded by the run the
/// checkpoint belongs to, else PLoP's choice made now.
pub fn policy_at_start(
    r: &Recipe,
    task: &TaskSet,
    checkpoint: Option<&Path>,
    rng: &mut SplitMix64,
    device: &Device,
) -> Result<Policy> {
    let recorded = checkpoint.and_then(|d| d.ancestors().take(3).find(|a| a.join(FILE).exists()));
    let placed = match recorded {
        Some(run) => apply_recorded(r, run)?,
        None => resolve(r, task, None, false, device)?.0,
    };
    let r = &placed;
    let mut policy = build_policy(r, device)?;
    match (checkpoint, &r.warmup) {
        (Some(dir), _) => policy = load_checkpoint(policy, dir)?,
        (None, Some(w)) if policy.lora.is_none() => {
            let vocab = policy.vocab();
            policy.model = warm_up(policy.model, vocab, w, task, rng, device)?.0;
        }
        _ => {}
    }
    Ok(policy)
}
