//! The program job's state between steps (`ProgramsJob`), its set-up (the run directory, the
//! task, a fresh programmer or a resumed run's) and what a checkpoint holds beside the run
//! kit's records: the memory of the best programs (`programs_memory.json`), checked on resume
//! against the task.

use super::methods::{self, Memory};
use super::schema::ProgramsRecipe;
use crate::common::run::{RunLoop, load_records, open_run};
use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::Device;
use ember_engine::SplitMix64;
use ember_engine::keys;
use ember_llm::{ConstrainedLlama, Family, LlamaConfig};
use ember_run::{Row, Run, RunOptions, checkpoint};
use ember_tasks::program::ProgramTask;
use ember_train::{LrSchedule, Optimizer};
use std::path::Path;

/// The memory's file in a checkpoint.
const MEMORY: &str = "programs_memory.json";

/// Builds a job: [`Setup::new`], then [`ProgramsJob::start`].
/// The run between steps.
pub(super) struct ProgramsJob<'a> {
    pub(super) r: &'a ProgramsRecipe,
    pub(super) run: Run,
    pub(super) base: Device,
    pub(super) ad: Device,
    pub(super) task: ProgramTask,
    pub(super) model: ConstrainedLlama,
    pub(super) optim: Optimizer,
    pub(super) rng: SplitMix64,
    pub(super) schedule: LrSchedule,
    pub(super) memory: methods::Memory,
    /// Held-out accuracy: of the initial policy, and the latest; the latest mean F1.
    pub(super) before: f64,
    pub(super) after: f64,
    pub(super) f1_after: f64,
    pub(super) steps_done: usize,
}

impl ProgramsJob<'_> {
    /// Opens the run directory, builds the task and a fresh programmer (seeded).
    pub(super) fn open<'a>(
        r: &'a ProgramsRecipe,
        out: &'a Path,
        opts: &RunOptions,
    ) -> Result<ProgramsJob<'a>> {
        let task = ProgramTask::new(&r.kb, r.max_exprs).map_err(anyhow::Error::msg)?;
        let t = &r.train.run;
        let curves = (keys::ROLLOUT_REWARD_MEAN, keys::EVAL_ACCURACY);
        let run = open_run(
            out,
            opts,
            &r.header.name,
            r,
            RunLoop {
                steps: t.steps,
                checkpoint_every: t.checkpoint_every,
                keep_checkpoints: t.keep_checkpoints,
            },
            curves,
        )?;
        let base = crate::common::device::device(&r.header.device)?;
        let ad = base.clone().autodiff();
        let (model, optim) = fresh(r, &task, &ad, 0);
        Ok(ProgramsJob {
            rng: SplitMix64(r.header.seed),
            schedule: r.train.schedule.schedule(t.steps),
            optim,
            model,
            memory: Memory::new(),
            before: f64::NAN,
            after: f64::NAN,
            f1_after: f64::NAN,
            steps_done: run.first_step(),
            r,
            run,
            base,
            ad,
            task,
        })
    }
}

/// A freshly initialised programmer (seeded by the run's seed and `stage`: 0 at the start, 1
/// after NSM's maximum-likelihood stage) and its optimizer.
pub(super) fn fresh(
    r: &ProgramsRecipe,
    task: &ProgramTask,
    ad: &burn::tensor::Device,
    stage: u64,
) -> (ConstrainedLlama, Optimizer) {
    ad.seed(r.header.seed ^ 0x4e53_4d00 ^ (stage << 40));
    let m = &r.model;
    let llama = LlamaConfig::new(
        Family::Llama,
        task.vocab.len(),
        m.d_model,
        m.d_ff,
        m.layers,
        m.heads,
        m.kv_heads,
    )
    .with_max_position_embeddings(64)
    .init(ad);
    (ConstrainedLlama { llama }, r.train.optim.init())
}

impl ProgramsJob<'_> {
    /// A resumed run's programmer, optimizer, memory and RNG; a fresh run's first evaluation.
    pub(super) fn begin(mut self) -> Result<Self> {
        let resumed = self
            .run
            .resumed()
            .map(|(d, st)| (d.to_path_buf(), st.clone()));
        if let Some((dir, st)) = resumed {
            (self.rng, self.before, self.after) =
                (SplitMix64(st.rng), st.accuracy_before, st.accuracy_after);
            let optim = std::mem::replace(&mut self.optim, self.r.train.optim.init());
            (self.model, self.optim) = load_records(&dir, self.model.clone(), optim)?;
            self.memory = load_memory(&dir.join(MEMORY), &self.task)?;
        } else {
            (self.before, self.f1_after) = self.evaluate()?;
            self.after = self.before;
            self.run.log(eval_row(0, self.before, self.f1_after))?;
        }
        self.run.say(&format!(
            "{} training and {} held-out questions; initial held-out accuracy {:.3}",
            self.task.train.len(),
            self.task.held_out.len(),
            self.before
        ));
        Ok(self)
    }
}

/// Fills a checkpoint directory: the programmer and its optimizer as the run kit's records,
/// the run state, and the memory.
pub(super) fn save_state(
    d: &Path,
    model: &ConstrainedLlama,
    optim: &Optimizer,
    memory: &Memory,
    ts: &checkpoint::TrainState,
) -> Result<()> {
    checkpoint::write_records(d, model.clone().into_record(), optim, ts)?;
    std::fs::write(d.join(MEMORY), serde_json::to_vec(memory)?)
        .with_context(|| format!("writing {}", d.join(MEMORY).display()))
}

/// The memory a checkpoint holds, each entry checked against the task: a known question, a
/// reward in (0, 1], and a program the computer runs to that reward.
fn load_memory(p: &Path, task: &ProgramTask) -> Result<Memory> {
    let text = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    let memory: Memory =
        serde_json::from_slice(&text).with_context(|| format!("parsing {}", p.display()))?;
    for (q, list) in &memory {
        let Some(question) = task.questions.get(*q) else {
            bail!("{}: question {q} is not one of the task's", p.display());
        };
        if list.is_empty() || list.len() > super::methods::KEPT {
            bail!(
                "{}: question {q} holds {} programs",
                p.display(),
                list.len()
            );
        }
        for best in list {
            let reward = task.reward(question, &best.program);
            if !(best.reward > 0.0 && best.reward <= 1.0) || reward != best.reward {
                bail!(
                    "{}: question {q}'s program earns {reward}, not the stored {}",
                    p.display(),
                    best.reward
                );
            }
        }
    }
    Ok(memory)
}

/// The evaluation as a metrics row.
pub(super) fn eval_row(step: usize, accuracy: f64, f1: f64) -> Row {
    Row::from([
        ("step".to_string(), step as f64),
        (keys::EVAL_ACCURACY.to_string(), accuracy),
        ("eval/f1".to_string(), f1),
    ])
}
