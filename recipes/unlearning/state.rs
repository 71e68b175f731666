//! The unlearning job's state between steps (`UnlearningJob`, `Learner`), its set-up (the run
//! directory, the corpus, fresh models or a resumed run's) and what a checkpoint holds beside
//! the run kit's records: the teachers and their optimizers (`teacher<k>.bpk`,
//! `teacher<k>_optim.bpk`), ReRULE's stored hard groups and the metrics after the supervised
//! stage (`unlearning.json`).

use super::eval::evaluate;
use super::schema::{Method, UnlearningRecipe};
use super::targets::HardGroup;
use crate::common::run::{RunLoop, load_pair, load_records, open_run, save_pair};
use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::Device;
use ember_engine::SplitMix64;
use ember_llm::{Family, Llama, LlamaConfig};
use ember_run::{Row, Run, RunOptions, checkpoint};
use ember_tasks::facts::Facts;
use ember_train::{Optimizer, OptimizerConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The file of the job's own state in a checkpoint.
const STATE: &str = "unlearning.json";

/// What `unlearning.json` holds.
#[derive(Debug, Serialize, Deserialize)]
struct Extra {
    hard: Vec<HardGroup>,
    learned: Row,
}

/// Builds a job: [`Setup::new`], then [`UnlearningJob::start`].
/// A fresh model (seeded by the run's seed and `which`: 0 the model, k + 1 teacher k).
fn fresh(r: &UnlearningRecipe, vocab: usize, ad: &Device, which: u64) -> Learner {
    ad.seed(r.header.seed ^ 0x554e_4c00 ^ (which << 40));
    let m = &r.model;
    let model = LlamaConfig::new(
        Family::Llama,
        vocab,
        m.d_model,
        m.d_ff,
        m.layers,
        m.heads,
        m.kv_heads,
    )
    .with_max_position_embeddings(32)
    .init(ad);
    let optim = OptimizerConfig {
        grad_clip: 1.0,
        ..OptimizerConfig::default()
    }
    .init();
    Learner { model, optim }
}

/// A model and its optimizer.
pub(super) struct Learner {
    pub(super) model: Llama,
    pub(super) optim: Optimizer,
}

/// The run between steps.
pub(super) struct UnlearningJob<'a> {
    pub(super) r: &'a UnlearningRecipe,
    pub(super) run: Run,
    pub(super) base: Device,
    pub(super) ad: Device,
    pub(super) facts: Facts,
    pub(super) learner: Learner,
    /// The leave-one-out ensemble's teachers (shard k each).
    pub(super) teachers: Vec<Learner>,
    /// ReRULE's stored hard groups, oldest first.
    pub(super) hard: Vec<HardGroup>,
    pub(super) rng: SplitMix64,
    pub(super) learned: BTreeMap<String, f64>,
    pub(super) latest: BTreeMap<String, f64>,
    pub(super) steps_done: usize,
}

impl UnlearningJob<'_> {
    /// Opens the run directory, builds the corpus and fresh models (seeded).
    pub(super) fn open<'a>(
        r: &'a UnlearningRecipe,
        out: &'a Path,
        opts: &RunOptions,
    ) -> Result<UnlearningJob<'a>> {
        let facts = Facts::new(&r.facts).map_err(anyhow::Error::msg)?;
        let curves = ("forget/accuracy", "retain/accuracy");
        let run = open_run(
            out,
            opts,
            &r.header.name,
            r,
            RunLoop {
                steps: r.total_steps(),
                checkpoint_every: 0,
                keep_checkpoints: 2,
            },
            curves,
        )?;
        let base = crate::common::device::device(&r.header.device)?;
        let ad = base.clone().autodiff();
        let v = facts.vocab_size();
        let learner = fresh(r, v, &ad, 0);
        let teachers = match r.forget.method {
            Method::LooEnsemble => (0..r.forget.teachers as u64)
                .map(|k| fresh(r, v, &ad, k + 1))
                .collect(),
            _ => Vec::new(),
        };
        Ok(UnlearningJob {
            rng: SplitMix64(r.header.seed),
            hard: Vec::new(),
            learned: Row::new(),
            latest: Row::new(),
            steps_done: run.first_step(),
            r,
            run,
            base,
            ad,
            facts,
            learner,
            teachers,
        })
    }
}

impl UnlearningJob<'_> {
    /// A resumed run's models, optimizers, hard prompts and RNG; a fresh run's first
    /// evaluation.
    pub(super) fn begin(mut self) -> Result<Self> {
        let resumed = self
            .run
            .resumed()
            .map(|(d, st)| (d.to_path_buf(), st.clone()));
        if let Some((dir, st)) = resumed {
            self.rng = SplitMix64(st.rng);
            let l = &mut self.learner;
            let optim = std::mem::replace(&mut l.optim, OptimizerConfig::default().init());
            (l.model, l.optim) = load_records(&dir, l.model.clone(), optim)?;
            for (k, t) in self.teachers.iter_mut().enumerate() {
                let optim = std::mem::replace(&mut t.optim, OptimizerConfig::default().init());
                (t.model, t.optim) =
                    load_pair(&dir, &format!("teacher{k}"), t.model.clone(), optim)?;
            }
            let p = dir.join(STATE);
            let text = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            let extra: Extra = serde_json::from_slice(&text)
                .with_context(|| format!("parsing {}", p.display()))?;
            let (facts, v) = (self.facts.facts.len(), self.facts.vocab_size());
            let bad = |g: &HardGroup| {
                g.fact >= facts
                    || g.answers.iter().any(|t| *t as usize >= v)
                    || g.answers.len() != g.log_probs.len()
                    || g.answers.len() != g.advantages.len()
                    || g.log_probs
                        .iter()
                        .chain(&g.advantages)
                        .any(|x| !x.is_finite())
            };
            if let Some(g) = extra.hard.iter().find(|g| bad(g)) {
                bail!(
                    "{}: a stored hard group of fact {} is malformed",
                    p.display(),
                    g.fact
                );
            }
            (self.hard, self.learned) = (extra.hard, extra.learned);
        }
        self.latest = evaluate(&self.learner.model.valid(), &self.facts, &self.base);
        if self.run.resumed().is_none() {
            let mut row = self.latest.clone();
            row.insert("step".into(), 0.0);
            self.run.log(row)?;
        }
        self.run.say(&format!(
            "{} facts ({} to forget), {} steps",
            self.facts.facts.len(),
            self.facts.forget.len(),
            self.r.total_steps()
        ));
        Ok(self)
    }
}

/// Fills a checkpoint directory: the model and its optimizer as the run kit's records, the
/// teachers, and the job's own state.
pub(super) fn save_state(
    d: &Path,
    learner: &Learner,
    teachers: &[Learner],
    hard: &[HardGroup],
    learned: &Row,
    ts: &checkpoint::TrainState,
) -> Result<()> {
    checkpoint::write_records(d, learner.model.clone().into_record(), &learner.optim, ts)?;
    for (k, t) in teachers.iter().enumerate() {
        save_pair(
            d,
            &format!("teacher{k}"),
            t.model.clone().into_record(),
            &t.optim,
        )?;
    }
    let extra = Extra {
        hard: hard.to_vec(),
        learned: learned.clone(),
    };
    std::fs::write(d.join(STATE), serde_json::to_vec(&extra)?)
        .with_context(|| format!("writing {}", d.join(STATE).display()))
}
