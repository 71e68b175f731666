//! A rollout shared out over the ranks of a multi-process run: every rank draws the same
//! prompts (the run's RNG is the same on every rank), generates the rows of its own share of
//! them with a seed of its own, and the shares are gathered in rank order, so that every rank
//! holds the whole batch (rewards, rescoring and advantages then see whole groups) and the
//! update takes each rank's share of its rows.
//!
//! Each share draws the very uniform numbers one process would draw for its rows (the sampler's
//! stream is indexed by step and row: `SamplingConfig::rows_in`), so the ranks together sample
//! the tokens one process samples, whatever the world's size, up to the rounding of prompts
//! padded to another width.

use crate::llm::schema::Recipe;
use crate::lm::step::{TokenRow, responses_and_log_probs, rows_generation};
use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use ember_dist::World;
use ember_llm::{Generation, Llama};
use ember_run::Row;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The part of a draw one rank generates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Its prompts, as positions in the draw.
    pub prompts: Range<usize>,
    /// Its rows' place among the draw's rows, `(first, rows)`: the sampler's `rows_in`.
    pub rows_in: (usize, usize),
}

/// This rank's share of a draw of `prompts` prompts of `samples` samples each.
pub fn shard(world: &World, prompts: usize, samples: usize) -> Shard {
    let mine = world.shard(prompts);
    Shard {
        rows_in: (mine.start * samples, prompts * samples),
        prompts: mine,
    }
}

/// One rank's generated rows as they travel.
#[derive(Serialize, Deserialize)]
struct Part {
    first_prompt: usize,
    group_ids: Vec<usize>,
    responses: Vec<Vec<u32>>,
    /// The sampler's log-probs, as bits.
    log_probs: Vec<Vec<u32>>,
    truncated: Vec<bool>,
    widths: [usize; 2],
    decode_positions: usize,
}

/// The whole draw's generation on every rank, from each rank's `mine` (the rows of the prompts
/// `shard.prompts` of `prompts`).
///
/// # Errors
/// The world failed, or a rank's part does not fit the draw.
pub fn gathered(
    world: &World,
    prompts: &[Vec<u32>],
    shard: &Shard,
    mine: &Generation,
    device: &Device,
) -> Result<Generation> {
    let (responses, log_probs) = responses_and_log_probs(mine)?;
    let part = Part {
        first_prompt: shard.prompts.start,
        group_ids: mine.group_ids.clone(),
        responses,
        log_probs: log_probs
            .iter()
            .map(|l| l.iter().map(|x| x.to_bits()).collect())
            .collect(),
        truncated: mine.truncated.clone(),
        widths: [mine.prompt_tokens.dims()[1], mine.tokens.dims()[1]],
        decode_positions: mine.decode_positions,
    };
    let parts = world.gather(serde_json::to_vec(&part)?, "rollout gather")?;
    let parts: Vec<Part> = parts
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<serde_json::Result<_>>()
        .context("a rank's rollout did not parse")?;
    let lps: Vec<Vec<Vec<f32>>> = parts
        .iter()
        .map(|p| {
            p.log_probs
                .iter()
                .map(|l| l.iter().map(|b| f32::from_bits(*b)).collect())
                .collect()
        })
        .collect();
    let mut rows = Vec::new();
    let mut group_ids = Vec::new();
    for (p, lp) in parts.iter().zip(&lps) {
        let same = p.responses.len() == p.group_ids.len()
            && lp.len() == p.group_ids.len()
            && p.truncated.len() == p.group_ids.len();
        if !same {
            bail!("a rank's rollout has lists of different lengths");
        }
        for (i, g) in p.group_ids.iter().enumerate() {
            let at = p.first_prompt.saturating_add(*g);
            let Some(prompt) = prompts.get(at) else {
                bail!("a rank's rollout names prompt {at} of {}", prompts.len());
            };
            group_ids.push(at);
            rows.push(TokenRow {
                prompt,
                response: &p.responses[i],
                log_probs: Some(&lp[i]),
                truncated: p.truncated[i],
            });
        }
    }
    if rows.is_empty() {
        bail!("no rank generated a row");
    }
    let width = |k: usize| parts.iter().map(|p| p.widths[k]).max().unwrap_or(1);
    let mut g = rows_generation(&rows, group_ids, device).pad_to(width(0), width(1));
    g.decode_positions = parts.iter().map(|p| p.decode_positions).sum();
    Ok(g)
}

/// What a multi-process run supports today: the synchronous rollout on the run's own device,
/// sharded by rank; the rest is refused up front, naming the key.
pub fn supported(r: &Recipe, world: &World) -> Result<()> {
    let parts = r.algorithm_parts();
    let refused = [
        (r.rollout.max_staleness > 0, "rollout.max_staleness > 0"),
        (
            !r.rollout.backend.is_local(),
            "rollout.backend = \"openai\"",
        ),
        (
            parts.adaptive.is_some(),
            "Reinforce-Ada's rounds ([adaptive])",
        ),
        (r.lanpo.is_some(), "[lanpo]"),
        (
            r.pretrained.as_ref().is_some_and(|p| p.lora.is_plop()),
            "targets = \"plop\"",
        ),
    ];
    if let Some((_, what)) = refused.iter().find(|(on, _)| *on) {
        bail!(
            "{what} does not run over several processes yet (this run has {} ranks from {}); \
             run it in one process, or use [data_parallel] for the devices of one machine",
            world.size(),
            world.launch().launcher.name()
        );
    }
    if r.rollout.prompts_per_step < world.size() {
        bail!(
            "rollout.prompts_per_step = {} is less than the {} ranks: every rank generates the \
             groups of at least one prompt",
            r.rollout.prompts_per_step,
            world.size()
        );
    }
    Ok(())
}

/// How often the ranks compare their trained parameters beside the checkpoints and the last
/// step: `EMBER_DIST_CHECK_EVERY` steps (0 or unset: only then), rank 0's value on every rank
/// (a variable `mpirun` did not pass to every node would otherwise make the ranks disagree).
///
/// # Errors
/// A value that is not a number of steps, or the world failed.
pub fn check_every(world: &World) -> Result<usize> {
    let mine = match std::env::var("EMBER_DIST_CHECK_EVERY") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("EMBER_DIST_CHECK_EVERY={v:?} is not a number of steps"))?,
        Err(_) => 0usize,
    };
    let got = world.broadcast((mine as u64).to_le_bytes().to_vec(), "check interval")?;
    let got: [u8; 8] = got
        .as_slice()
        .try_into()
        .context("rank 0 sent no check interval")?;
    usize::try_from(u64::from_le_bytes(got)).context("rank 0's check interval")
}

/// When steps `done` is due (a checkpoint's step, the last, or every `every` steps), checks
/// that every rank holds rank 0's trained parameters bit for bit, and says so in `row`
/// (`dist/params_checked`); `dist/ranks` always.
///
/// # Errors
/// The world failed, or the ranks diverged (named).
pub fn check_step(
    world: &World,
    model: &Llama,
    due: [usize; 3],
    done: usize,
    row: &mut Row,
) -> Result<()> {
    let [every, checkpoint_every, steps] = due;
    let on = |k: usize| k > 0 && done.is_multiple_of(k);
    row.insert("dist/ranks".into(), world.size() as f64);
    if on(every) || on(checkpoint_every) || done >= steps {
        ember_train::check_identical(world, model)?;
        row.insert("dist/params_checked".into(), 1.0);
    }
    Ok(())
}

/// `score()` in a single process; over several ranks, rank 0's `score()` sent to every rank
/// (the others do not score), so that every rank's rewards, and the filters and skipped updates
/// they decide, are rank 0's.
///
/// # Errors
/// The scoring failed, the world failed, or rank 0 sent something else than rewards.
pub fn scored_on_rank_zero(
    world: Option<&World>,
    score: impl FnOnce() -> Result<Vec<f32>>,
) -> Result<Vec<f32>> {
    let Some(w) = world.filter(|w| w.size() > 1) else {
        return score();
    };
    let mine = match w.is_writer() {
        true => score()?,
        false => Vec::new(),
    };
    Ok(w.broadcast_floats(&mine, "rewards from rank 0")?)
}
