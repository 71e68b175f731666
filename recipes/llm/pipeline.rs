//! The pipelined rollout (`rollout.max_staleness = k`). One generation worker, a thread that
//! samples on the run's device or sends the prompts to the servers, answers the steps' draws in
//! order while the trainer scores and updates. At step t the trainer draws the rollout of step
//! t + k (its prompts and sampling seed, from the run's RNG, so draws keep the run's order) and
//! hands it to the worker with the weights of step t; then it takes step t's rollout. So no
//! sample is more than k updates old, and k = 0 is the synchronous run: step t's rollout drawn,
//! generated and taken at once. Rollouts in flight at a checkpoint are waited for and saved
//! (`pipeline.json`), so a resumed run continues with the very samples the uninterrupted run
//! trains on.

use super::ranks::Shard;
use super::remote::Remote;
use super::replay::Limits;
use crate::lm::step::{TokenRow, responses_and_log_probs, rows_generation};
use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::Device;
use ember_llm::{Generation, Llama, SamplingConfig, generate};
use ember_tasks::task::Example;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The pipeline's file in a checkpoint.
pub const PIPELINE: &str = "pipeline.json";

/// A step's rollout as the trainer drew it.
#[derive(Debug, Clone)]
pub struct Draw {
    /// The RL step that trains on it.
    pub step: usize,
    /// The step whose weights generate it (staleness = step − version).
    pub version: usize,
    pub examples: Vec<Example>,
    pub prompts: Vec<Vec<u32>>,
    pub sc: SamplingConfig,
    /// In a multi-process run, the part this rank generates (the whole draw otherwise).
    pub shard: Option<Shard>,
}

/// A generated rollout and what it cost.
pub struct Produced {
    pub g: Generation,
    /// Seconds the worker waited for this job before it (its idle time).
    pub idle_s: f64,
    /// `(healthy servers, rows sent again)` when servers generated it.
    pub health: Option<(usize, usize)>,
}

/// Who generates a draw: its version's weights on the run's device, or the servers, which were
/// given those weights when it was drawn.
pub enum Generator {
    Local(Box<Llama>),
    Remote(Arc<Mutex<Remote>>),
}

struct Job {
    source: Generator,
    /// The step whose weights must generate it.
    version: usize,
    prompts: Vec<Vec<u32>>,
    sc: SamplingConfig,
    vocab: usize,
    reply: Sender<Result<Produced>>,
}

enum Slot {
    InFlight(Receiver<Result<Produced>>),
    Ready(Box<Produced>),
    /// Its generation failed: the error waits for the step that takes it.
    Failed(String),
}

/// The queue of drawn rollouts (consecutive steps) and the worker that generates them.
pub struct Pipeline {
    /// `rollout.max_staleness` (k): rollouts drawn at most this many updates ahead.
    pub max_staleness: usize,
    queue: VecDeque<(Draw, Slot)>,
    /// The rollout the running step took (what a checkpoint after an error puts back).
    current: Option<(Draw, Generation)>,
    jobs: Sender<Job>,
    device: Device,
}

impl Pipeline {
    /// An empty pipeline of bound `max_staleness` whose worker generates on `device`.
    pub fn new(max_staleness: usize, device: &Device) -> Self {
        let (jobs, rx) = channel::<Job>();
        let dev = device.clone();
        std::thread::spawn(move || {
            loop {
                let waiting = Instant::now();
                let Ok(job) = rx.recv() else { break };
                let idle_s = waiting.elapsed().as_secs_f64();
                let out = run_job(&job, &dev).map(|(g, health)| Produced { g, idle_s, health });
                // The trainer may have gone (an error ended the run): nothing to answer.
                let _ = job.reply.send(out);
            }
        });
        Self {
            max_staleness,
            queue: VecDeque::new(),
            current: None,
            jobs,
            device: device.clone(),
        }
    }

    /// The next step to draw while the running step is `step`, if the bound and the run's
    /// `steps` allow one more.
    pub fn next_to_draw(&self, step: usize, steps: usize) -> Option<usize> {
        let next = step + self.queue.len();
        (self.queue.len() <= self.max_staleness && next < steps).then_some(next)
    }

    /// Hands `draw` to the worker.
    pub fn launch(&mut self, draw: Draw, source: Generator, vocab: usize) -> Result<()> {
        let (reply, rx) = channel();
        let (prompts, sc) = match &draw.shard {
            Some(s) => (
                draw.prompts[s.prompts.clone()].to_vec(),
                SamplingConfig {
                    rows_in: Some(s.rows_in),
                    ..draw.sc.clone()
                },
            ),
            None => (draw.prompts.clone(), draw.sc.clone()),
        };
        let job = Job {
            source,
            version: draw.version,
            prompts,
            sc,
            vocab,
            reply,
        };
        self.jobs
            .send(job)
            .map_err(|_| anyhow!("the generation worker has stopped"))?;
        self.queue.push_back((draw, Slot::InFlight(rx)));
        Ok(())
    }

    /// Step `step`'s rollout, waiting for it if it is still being generated; also the seconds
    /// waited.
    pub fn take(&mut self, step: usize) -> Result<(Draw, Produced, f64)> {
        let (draw, slot) = self
            .queue
            .pop_front()
            .context("no rollout was drawn for the step")?;
        if draw.step != step {
            bail!(
                "the pipeline holds step {}'s rollout at step {step}",
                draw.step
            );
        }
        let t = Instant::now();
        let p = ready(slot)?;
        self.current = Some((draw.clone(), p.g.clone()));
        Ok((draw, p, t.elapsed().as_secs_f64()))
    }

    /// The step ended: its rollout is no longer put back.
    pub fn step_done(&mut self) {
        self.current = None;
    }

    /// After an error in step `step`: the queue as the step found it, the rollouts drawn before
    /// it (its own back in front when it was drawn earlier; what the step drew is dropped, as
    /// the run's RNG is rewound to the step's start). A rollout whose generation failed ends the
    /// queue there; when the step's own is gone, nothing is kept, and the resumed run draws
    /// afresh from the rewound RNG.
    pub fn rewind(&mut self, step: usize) {
        let before = |d: &Draw| d.version < step;
        self.queue.retain(|(d, _)| before(d));
        if let Some((d, g)) = self.current.take().filter(|(d, _)| before(d)) {
            let p = Produced {
                g,
                idle_s: 0.0,
                health: None,
            };
            self.queue.push_front((d, Slot::Ready(Box::new(p))));
        }
        let mut kept = VecDeque::new();
        for (d, slot) in std::mem::take(&mut self.queue) {
            match ready(slot) {
                Ok(p) => kept.push_back((d, Slot::Ready(Box::new(p)))),
                Err(_) => break,
            }
        }
        if kept.front().is_some_and(|(d, _)| d.step == step) {
            self.queue = kept;
        }
    }

    /// Writes the queue into checkpoint `dir`, after waiting for what is in flight, up to a
    /// generation that failed (nothing is written when nothing is left).
    pub fn save(&mut self, dir: &Path) -> Result<()> {
        for (d, slot) in std::mem::take(&mut self.queue) {
            let slot = match ready(slot) {
                Ok(p) => Slot::Ready(Box::new(p)),
                Err(e) => Slot::Failed(format!("{e:#}")),
            };
            self.queue.push_back((d, slot));
        }
        // Up to the first failed generation: its step raises the error when it takes it.
        let saved = self
            .queue
            .iter()
            .map_while(|(d, slot)| match slot {
                Slot::Ready(p) => Some(saved_draw(d, p)),
                _ => None,
            })
            .collect::<Result<Vec<_>>>()?;
        if saved.is_empty() {
            return Ok(());
        }
        std::fs::write(dir.join(PIPELINE), serde_json::to_string(&saved)?)
            .context("writing the pipeline's rollouts")
    }

    /// The queue saved in checkpoint `dir` of a run resumed at `step`, each draw's sampling
    /// settings from its seed (`sc_of`); every entry checked, so a damaged file is named.
    pub fn load(
        &mut self,
        dir: &Path,
        limits: &Limits,
        sc_of: &dyn Fn(u64) -> SamplingConfig,
    ) -> Result<()> {
        let p = dir.join(PIPELINE);
        if !p.exists() {
            return Ok(());
        }
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let saved: Vec<SavedDraw> = serde_json::from_str(&text)
            .map_err(|e| anyhow!("{}: not a pipeline of rollouts: {e}", p.display()))?;
        if saved.len() > self.max_staleness + 1 {
            bail!(
                "{}: {} rollouts, more than max_staleness + 1",
                p.display(),
                saved.len()
            );
        }
        for (i, s) in saved.into_iter().enumerate() {
            let bad = |m: String| anyhow!("{}: rollout {i}: {m}", p.display());
            s.check(limits.step + i, limits).map_err(bad)?;
            let g = s.generation(&self.device);
            let draw = Draw {
                step: s.step,
                version: s.version,
                sc: sc_of(s.seed),
                examples: s.examples,
                prompts: s.prompts,
                shard: None,
            };
            let p = Produced {
                g,
                idle_s: 0.0,
                health: s.health,
            };
            self.queue.push_back((draw, Slot::Ready(Box::new(p))));
        }
        Ok(())
    }
}

/// A slot's rollout, waiting for the worker when it is in flight.
fn ready(slot: Slot) -> Result<Produced> {
    match slot {
        Slot::Ready(p) => Ok(*p),
        Slot::Failed(e) => Err(anyhow!("{e}")),
        Slot::InFlight(rx) => rx
            .recv()
            .map_err(|_| anyhow!("the generation worker stopped before answering"))?,
    }
}

/// One job on the worker: the rollout, and the servers' health when they generated it.
fn run_job(job: &Job, device: &Device) -> Result<(Generation, Option<(usize, usize)>)> {
    match &job.source {
        Generator::Local(model) => Ok((generate(model, &job.prompts, &job.sc, device)?, None)),
        Generator::Remote(rm) => {
            let broken = || anyhow!("the servers' client was left broken by a failed call");
            let mut held = rm.lock().map_err(|_| broken())?;
            // The draw's weights must answer it: its own adapter (loaded under a name of its
            // own), or the base model holding its step's weights.
            let model = held.model_for(job.version)?;
            if !held.versioned() {
                // Whole weights: a push must not overtake this rollout, so the lock is held.
                let g = held.generate_with(&model, &job.prompts, &job.sc, job.vocab, device)?;
                return Ok((g, Some(held.health())));
            }
            // Adapters: the rollout names its version, so newer pushes may go on meanwhile.
            let mut mine = held.clone();
            drop(held);
            let g = mine.generate_with(&model, &job.prompts, &job.sc, job.vocab, device);
            let mut held = rm.lock().map_err(|_| broken())?;
            held.merge_health(&mine);
            Ok((g?, Some(held.health())))
        }
    }
}

/// A rollout as `pipeline.json` holds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedDraw {
    step: usize,
    version: usize,
    examples: Vec<Example>,
    prompts: Vec<Vec<u32>>,
    seed: u64,
    group_ids: Vec<usize>,
    responses: Vec<Vec<u32>>,
    log_probs: Vec<Vec<f32>>,
    truncated: Vec<bool>,
    /// The sampler's prompt and response columns (the layout is restored exactly, so that
    /// every sum over it adds in the same order).
    widths: [usize; 2],
    /// Positions its decode computed (`perf/decode_positions`; absent in older checkpoints).
    #[serde(default)]
    decode_positions: Option<usize>,
    /// `(healthy servers, rows sent again)` when servers generated it, so that the resumed
    /// run's first row logs them as the uninterrupted run did (absent in older checkpoints).
    #[serde(default)]
    health: Option<(usize, usize)>,
}

/// `g` as saved (one host read of its log-probs).
fn saved_draw(d: &Draw, p: &Produced) -> Result<SavedDraw> {
    let g = &p.g;
    let (responses, log_probs) = responses_and_log_probs(g)?;
    let n = g.tokens.dims()[1];
    Ok(SavedDraw {
        step: d.step,
        version: d.version,
        examples: d.examples.clone(),
        prompts: d.prompts.clone(),
        seed: d.sc.seed,
        group_ids: g.group_ids.clone(),
        responses,
        log_probs,
        truncated: g.truncated.clone(),
        widths: [g.prompt_tokens.dims()[1], n],
        decode_positions: Some(g.decode_positions),
        health: p.health,
    })
}

impl SavedDraw {
    /// The step it is for, a version not after it, one example per prompt, and rows of known
    /// prompts with one log-prob per token and token ids inside the vocabulary.
    fn check(&self, step: usize, l: &Limits) -> std::result::Result<(), String> {
        if self.step != step || self.version > self.step {
            return Err(format!(
                "for step {} with the weights of step {}, expected step {step}",
                self.step, self.version
            ));
        }
        let rows = self.group_ids.len();
        let same = [
            self.responses.len(),
            self.log_probs.len(),
            self.truncated.len(),
        ];
        let n = self.prompts.len();
        if n == 0 || same.iter().any(|&x| x != rows) || self.examples.len() != n {
            return Err("lists of different lengths".into());
        }
        if n > 100_000 || rows != n * l.samples {
            return Err(format!(
                "{rows} rows for {n} prompts of {} samples",
                l.samples
            ));
        }
        let known = self.group_ids.iter().all(|&g| g < self.prompts.len());
        let fits = self
            .responses
            .iter()
            .zip(&self.log_probs)
            .all(|(r, l)| r.len() == l.len() && l.iter().all(|x| x.is_finite() && *x <= 0.0));
        let ids = self.prompts.iter().chain(&self.responses).flatten();
        if !known || !fits || ids.clone().any(|&t| t as usize >= l.vocab) {
            return Err(
                "a row of an unknown prompt, a bad log-prob or a token id out of range".into(),
            );
        }
        if self.prompts.iter().any(Vec::is_empty) {
            return Err("an empty prompt".into());
        }
        let longest = |v: &[Vec<u32>]| v.iter().map(Vec::len).max().unwrap_or(0);
        let [p, n] = self.widths;
        let too_long = n > l.max_new || p.saturating_add(n) > l.context;
        if p < longest(&self.prompts) || n < longest(&self.responses) || too_long {
            return Err(format!("columns {:?} do not hold the rows", self.widths));
        }
        Ok(())
    }

    /// The rollout laid out as the sampler lays it out.
    fn generation(&self, device: &Device) -> Generation {
        let rows: Vec<TokenRow> = (0..self.group_ids.len())
            .map(|i| TokenRow {
                prompt: &self.prompts[self.group_ids[i]],
                response: &self.responses[i],
                log_probs: Some(&self.log_probs[i]),
                truncated: self.truncated[i],
            })
            .collect();
        let [p, n] = self.widths;
        let mut g = rows_generation(&rows, self.group_ids.clone(), device).pad_to(p, n);
        g.decode_positions = self.decode_positions.unwrap_or(rows.len() * n);
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rollout the servers generated keeps their health through a checkpoint: the resumed
    /// run's first row logs `rollout/servers_healthy` and `rollout/resent_rows` as the
    /// uninterrupted run's did (they were missing); a checkpoint from before reads as unknown.
    #[test]
    fn a_saved_rollout_keeps_the_servers_health() {
        let device = crate::common::device::device("cpu").unwrap();
        let row = TokenRow {
            prompt: &[1, 2],
            response: &[3],
            log_probs: Some(&[-0.5]),
            truncated: false,
        };
        let draw = Draw {
            step: 3,
            version: 2,
            examples: Vec::new(),
            prompts: vec![vec![1, 2]],
            sc: SamplingConfig::default(),
            shard: None,
        };
        let produced = Produced {
            g: rows_generation(&[row], vec![0], &device),
            idle_s: 0.0,
            health: Some((2, 5)),
        };
        let text = serde_json::to_string(&saved_draw(&draw, &produced).unwrap()).unwrap();
        let back: SavedDraw = serde_json::from_str(&text).unwrap();
        assert_eq!(back.health, Some((2, 5)));
        let mut older: serde_json::Value = serde_json::from_str(&text).unwrap();
        older.as_object_mut().unwrap().remove("health");
        let older: SavedDraw = serde_json::from_value(older).unwrap();
        assert_eq!(older.health, None);
    }
}
