//! An open run directory (`Run`): the lock, the resume checks, the metrics log, the progress
//! line or the dashboard, and the one end-of-step protocol.

use crate::checkpoint::{self, TrainState};
#[cfg(feature = "dashboard")]
use crate::dashboard::Dashboard;
use crate::live;
#[cfg(not(feature = "dashboard"))]
use crate::live::NoDashboard as Dashboard;
use crate::metrics::MetricsLog;
use crate::report::{End, ReportTo, Reporter, counts_json};
use crate::stop::stop_requested;
use crate::write::write_atomic;
use anyhow::{Context, Result, bail};
use ember_dist::World;
use ember_engine::keys;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Steps in a row whose updates were all skipped (a non-finite loss) before a run stops.
pub const MAX_NONFINITE_STEPS: usize = 3;

/// Takes the run directory's lock (`out/.lock`, an exclusive `flock` that the OS releases when
/// the process ends, so a crashed run leaves no stale lock).
fn lock_dir(out: &Path) -> Result<std::fs::File> {
    let path = out.join(".lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "another process is writing to {} (it holds {}); wait for it to end, or pass \
             --out <dir> for a new run",
            out.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// How to run a recipe (the `ember train` flags).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// No progress output.
    pub quiet: bool,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Replace an existing run directory's logs.
    pub overwrite: bool,
    /// Stop (with a checkpoint) once this many steps are done, as Ctrl-C would.
    pub stop_after: Option<usize>,
    /// Show burn-train's dashboard instead of the progress line when stdout and stderr are
    /// terminals (a binary built with the `dashboard` feature).
    pub dashboard: bool,
    /// The experiment trackers the run reports to (`--report-to`).
    pub report: ReportTo,
    /// The multi-process world, when the run has several ranks: rank 0 writes the run
    /// directory, the others read it (the checkpoint they resume from) and write nothing.
    pub world: Option<World>,
}

/// Rewrites a recipe stored by an earlier version in today's form (its renamed keys, its new
/// defaults), or None where it cannot; compared on `--resume` when the text differs.
pub type Restate<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What a job tells the run kit about itself.
#[derive(Clone)]
pub struct RunSpec<'a> {
    /// The recipe's name (progress lines are prefixed `[name]`).
    pub name: &'a str,
    /// The resolved recipe (TOML): written to `recipe.resolved.toml`, stored in every
    /// checkpoint, and compared on `--resume`.
    pub resolved: &'a str,
    /// Steps of the run.
    pub steps: usize,
    /// Checkpoint every this many steps (0 = only at the end and on a stop).
    pub checkpoint_every: usize,
    /// Checkpoints kept (the newest).
    pub keep_checkpoints: usize,
    /// The metrics drawn in `curves.png`: (reward, held-out accuracy).
    pub curves: (&'a str, &'a str),
    /// The stored recipe in today's form, for `--resume` across versions (None: the text must
    /// be the same).
    pub restate: Option<Restate<'a>>,
}

/// What the end of a step does; decided before the step's last work (evaluation), so that a
/// job can prepare what the checkpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepEnd {
    /// Steps done after this one.
    pub done: usize,
    /// A checkpoint is written.
    pub checkpoint: bool,
    /// The run stops here before its last step (Ctrl-C or `--stop-after`).
    pub stop: bool,
}

/// An open run directory.
pub struct Run {
    out: PathBuf,
    name: String,
    resolved: String,
    opts: RunOptions,
    steps: usize,
    checkpoint_every: usize,
    keep: usize,
    ckpt_root: PathBuf,
    resumed: Option<(PathBuf, TrainState)>,
    /// The metrics log (rank 0's only).
    log: Option<MetricsLog>,
    tty: bool,
    mid_line: bool,
    /// The live dashboard, while it is up.
    live: Option<Dashboard>,
    /// The last progress line (printed when the dashboard closes).
    last_line: Option<String>,
    /// Steps in a row whose updates were all skipped for a non-finite loss.
    nonfinite_steps: usize,
    /// The experiment trackers, each row sent to them too.
    report: Reporter,
    /// The world of a run with several ranks.
    world: Option<World>,
    /// This process writes the run directory (rank 0, or the only process).
    writer: bool,
    /// The run stopped before its last step (the trackers are told so).
    stopped: bool,
    /// `out/.lock`, held (`flock`) while the run is open: a second process on the same
    /// directory is refused instead of interleaving rows and checkpoints.
    _lock: Option<std::fs::File>,
}

impl Run {
    /// Checks `out` (no clobbering without `--resume`/`--overwrite`), creates it, finds the
    /// checkpoint to resume from and checks that the recipe is unchanged, writes
    /// `recipe.resolved.toml` for a new run, and opens the metrics log (keeping the rows up to
    /// the resumed step).
    pub fn open(out: &Path, opts: &RunOptions, spec: &RunSpec) -> Result<Self> {
        if opts.resume && opts.overwrite {
            bail!("--resume and --overwrite contradict each other");
        }
        let world = opts.world.clone().filter(|w| w.size() > 1);
        if let Some(w) = world.as_ref().filter(|w| !w.is_writer()) {
            return Self::open_follower(out, opts, spec, w.clone());
        }
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let lock = lock_dir(out)?;
        let ckpt_root = out.join("checkpoints");
        if opts.resume {
            if checkpoint::latest(&ckpt_root)?.is_none() {
                bail!(
                    "--resume: {} holds no checkpoint to resume from",
                    out.display()
                );
            }
        } else {
            if out.join("metrics.jsonl").exists() && !opts.overwrite {
                bail!(
                    "{} already holds a run (metrics.jsonl); pass --resume to continue it, \
                     --overwrite to replace it, or --out <dir> for a new one",
                    out.display()
                );
            }
            if opts.overwrite && ckpt_root.exists() {
                std::fs::remove_dir_all(&ckpt_root)
                    .with_context(|| format!("removing {}", ckpt_root.display()))?;
            }
        }
        let resumed = match opts.resume {
            true => match checkpoint::latest(&ckpt_root)? {
                Some(dir) => {
                    let st = checkpoint::read_state(&dir)?;
                    let restated = || spec.restate.and_then(|f| f(&st.recipe));
                    if st.recipe != spec.resolved && restated().is_none_or(|r| r != spec.resolved) {
                        bail!(
                            "--resume: the recipe differs from the one {} was started with (see \
                             {}); resume with the same recipe and --set values",
                            out.display(),
                            out.join("recipe.resolved.toml").display()
                        );
                    }
                    Some((dir, st))
                }
                None => None,
            },
            false => None,
        };
        if resumed.is_none() {
            write_atomic(&out.join("recipe.resolved.toml"), spec.resolved.as_bytes())?;
        }
        let log = MetricsLog::open(
            out,
            resumed.as_ref().map(|(_, s)| s.step),
            (spec.curves.0.to_string(), spec.curves.1.to_string()),
        )?;
        let first = resumed.as_ref().map_or(0, |(_, s)| s.step);
        let resumed_step = resumed.as_ref().map(|(_, s)| s.step);
        let report = Reporter::start(&opts.report, out, spec.resolved, resumed_step)?;
        let mut run = Self {
            out: out.to_path_buf(),
            name: spec.name.to_string(),
            resolved: spec.resolved.to_string(),
            opts: opts.clone(),
            steps: spec.steps,
            checkpoint_every: spec.checkpoint_every,
            keep: spec.keep_checkpoints,
            ckpt_root,
            resumed,
            log: Some(log),
            tty: std::io::stderr().is_terminal(),
            mid_line: false,
            live: match opts.dashboard && !opts.quiet {
                true => Dashboard::open(
                    spec.name,
                    spec.steps,
                    first,
                    &[spec.curves.0, spec.curves.1],
                ),
                false => None,
            },
            last_line: None,
            nonfinite_steps: 0,
            report,
            world: None,
            writer: true,
            stopped: false,
            _lock: Some(lock),
        };
        if let Some(w) = world {
            crate::world::announce(&w, out, run.first_step(), spec.resolved)?;
            run.world = Some(w);
        }
        if let Some((dir, st)) = &run.resumed {
            run.say(&format!(
                "resuming from {} (step {})",
                dir.display(),
                st.step
            ));
        }
        Ok(run)
    }

    /// A rank other than 0 of a multi-process run: it waits for rank 0 to open the directory,
    /// checks that it sees the same directory (a file system every rank shares) and the same
    /// checkpoint, and writes nothing.
    fn open_follower(out: &Path, opts: &RunOptions, spec: &RunSpec, world: World) -> Result<Self> {
        let first = crate::world::follow(&world, out, spec.resolved)?;
        let ckpt_root = out.join("checkpoints");
        let resumed = match first {
            0 => None,
            step => {
                let dir = checkpoint::latest(&ckpt_root)?.with_context(|| {
                    format!(
                        "rank 0 resumes from step {step}, but {} holds no checkpoint",
                        out.display()
                    )
                })?;
                let st = checkpoint::read_state(&dir)?;
                if st.step != step {
                    bail!(
                        "rank 0 resumes from step {step}, this rank sees step {} in {}",
                        st.step,
                        dir.display()
                    );
                }
                Some((dir, st))
            }
        };
        let opts = RunOptions {
            quiet: true,
            dashboard: false,
            report: ReportTo::default(),
            ..opts.clone()
        };
        Ok(Self {
            out: out.to_path_buf(),
            name: spec.name.to_string(),
            resolved: spec.resolved.to_string(),
            report: Reporter::start(&opts.report, out, spec.resolved, None)?,
            opts,
            steps: spec.steps,
            checkpoint_every: spec.checkpoint_every,
            keep: spec.keep_checkpoints,
            ckpt_root,
            resumed,
            log: None,
            tty: false,
            mid_line: false,
            live: None,
            last_line: None,
            nonfinite_steps: 0,
            world: Some(world),
            writer: false,
            stopped: false,
            _lock: None,
        })
    }

    /// `end` as every rank sees it: a stop asked on any rank (a signal, `--stop-after`) stops
    /// them all after the same step.
    fn agree(&self, mut end: StepEnd) -> Result<StepEnd> {
        if let Some(w) = &self.world
            && w.any(end.stop, "stop flag")?
            && !end.stop
            && end.done < self.steps
        {
            end.stop = true;
            end.checkpoint = true;
        }
        Ok(end)
    }

    /// The run directory.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// The checkpoint resumed from and its state.
    pub fn resumed(&self) -> Option<(&Path, &TrainState)> {
        self.resumed.as_ref().map(|(d, s)| (d.as_path(), s))
    }

    /// The first step to run (0, or the resumed checkpoint's step).
    pub fn first_step(&self) -> usize {
        self.resumed.as_ref().map_or(0, |(_, s)| s.step)
    }

    /// Steps of the run (the last step's number).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// No progress output.
    pub fn quiet(&self) -> bool {
        self.opts.quiet
    }

    /// A line on stderr, prefixed with the run's name (nothing when quiet).
    pub fn say(&self, msg: &str) {
        if !self.opts.quiet {
            if self.mid_line {
                eprintln!();
            }
            if let Some(live) = &self.live {
                live.note(msg);
            }
            live::line(&format!("[{}] {msg}", self.name));
        }
    }

    /// Appends sampled completions of step `step` to `samples.jsonl` (and, with `text`, to
    /// TensorBoard's Text tab).
    pub fn samples(
        &mut self,
        step: usize,
        samples: &[serde_json::Map<String, serde_json::Value>],
        text: bool,
    ) -> Result<()> {
        match &mut self.log {
            Some(log) if !samples.is_empty() => log.samples(step, samples, text),
            _ => Ok(()),
        }
    }

    /// Logs a row outside the step protocol (the step-0 evaluation).
    pub fn log(&mut self, row: BTreeMap<String, f64>) -> Result<()> {
        self.report.push(&row);
        self.log.as_mut().map_or(Ok(()), |log| log.push(row))
    }

    /// The checkpoint state of step `step` (the resolved recipe included).
    pub fn state(&self, step: usize, rng: u64, before: f64, after: f64) -> TrainState {
        TrainState {
            step,
            rng,
            accuracy_before: before,
            accuracy_after: after,
            recipe: self.resolved.clone(),
        }
    }

    /// What the end of the step that makes `done` steps will do.
    pub fn step_end(&self, done: usize) -> StepEnd {
        let stop = stop_requested() || self.opts.stop_after == Some(done);
        let periodic = self.checkpoint_every > 0 && done.is_multiple_of(self.checkpoint_every);
        let last = done >= self.steps;
        StepEnd {
            done,
            checkpoint: stop || periodic || last,
            stop: stop && !last,
        }
    }

    /// Ends a step: the progress line (`stats`), the row logged (CSV and plot published when
    /// `evaluated`), the checkpoint written by `save` into the directory it is given when `end`
    /// says so. Returns true when the run stops here. A step whose row reports skipped updates
    /// (`actor/skipped_steps` > 0: a non-finite loss, so the weights did not change) is counted;
    /// [`MAX_NONFINITE_STEPS`] of them in a row are an error that ends the run (every
    /// checkpoint still holds finite weights).
    pub fn end_step(
        &mut self,
        end: StepEnd,
        row: BTreeMap<String, f64>,
        evaluated: bool,
        stats: &str,
        save: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<bool> {
        let end = self.agree(end)?;
        self.progress(end.done, stats, &row);
        let skipped = row.get(keys::ACTOR_SKIPPED_STEPS).is_some_and(|s| *s > 0.0);
        self.nonfinite_steps = if skipped { self.nonfinite_steps + 1 } else { 0 };
        self.report.push(&row);
        if let Some(log) = &mut self.log {
            log.push(row)?;
            if evaluated {
                log.publish()?;
            }
        }
        if end.checkpoint && !self.writer {
            self.stopped |= end.stop;
            if end.stop {
                return Ok(true);
            }
        } else if end.checkpoint {
            let dir = checkpoint::save(&self.ckpt_root, end.done, self.keep, save)?;
            if end.stop {
                self.close_live();
                self.say(&format!(
                    "stopped after step {}; checkpoint {}; continue with `ember train <recipe> \
                     --out {} --resume` (same --set values)",
                    end.done,
                    dir.display(),
                    self.out.display()
                ));
                self.mid_line = false;
                self.stopped = true;
                return Ok(true);
            }
        }
        let n = self.nonfinite_steps;
        if n >= MAX_NONFINITE_STEPS {
            if self.mid_line && !self.opts.quiet {
                eprintln!();
                self.mid_line = false;
            }
            bail!(
                "the loss was not finite in {n} steps in a row (up to step {}): their updates \
                 were skipped, so the weights and the checkpoints in {} are those of step {}; \
                 lower the learning rate, or check the rewards",
                end.done,
                self.out.display(),
                end.done - n
            );
        }
        Ok(false)
    }

    /// After an error in a step that had not yet changed the weights (a reward program that
    /// failed, a prompt too long, weights that stopped learning): writes a checkpoint of the last
    /// completed step `done` with `save` (unless the latest checkpoint is that step already), so
    /// that `--resume` continues from it, and returns the error with a note saying so.
    pub fn checkpoint_after_error(
        &mut self,
        done: usize,
        err: anyhow::Error,
        save: impl FnOnce(&Path) -> Result<()>,
    ) -> anyhow::Error {
        if self.mid_line && !self.opts.quiet {
            eprintln!();
            self.mid_line = false;
        }
        if !self.writer {
            return err.context(format!(
                "step {} failed (rank 0 keeps the checkpoints)",
                done + 1
            ));
        }
        let latest = checkpoint::latest(&self.ckpt_root)
            .ok()
            .flatten()
            .and_then(|d| checkpoint::read_state(&d).ok())
            .map(|s| s.step);
        let resume = format!(
            "fix the cause, then continue with `ember train <recipe> --out {} --resume`",
            self.out.display()
        );
        if latest == Some(done) {
            return err.context(format!(
                "step {} failed; the checkpoint of step {done} is kept: {resume}",
                done + 1
            ));
        }
        match checkpoint::save(&self.ckpt_root, done, self.keep, save) {
            Ok(d) => err.context(format!(
                "step {} failed; wrote the checkpoint of step {done} ({}): {resume}",
                done + 1,
                d.display()
            )),
            Err(e) => err.context(format!(
                "step {} failed, and writing the checkpoint of step {done} failed too ({e:#})",
                done + 1
            )),
        }
    }

    /// One progress line: a bar redrawn in place on a terminal, a line per step otherwise; the
    /// dashboard's step while it is up.
    fn progress(&mut self, done: usize, stats: &str, row: &BTreeMap<String, f64>) {
        if self.opts.quiet {
            return;
        }
        let total = self.steps.max(1);
        if let Some(live) = &self.live {
            live.step(done, row);
            self.last_line = Some(format!("[{}] step {done:>4}/{total} {stats}", self.name));
            return;
        }
        if self.tty {
            let width = 24;
            let fill = done.min(total) * width / total;
            eprint!(
                "\r[{}] {done:>5}/{total} [{}{}] {stats}\x1b[K",
                self.name,
                "#".repeat(fill),
                "-".repeat(width - fill)
            );
            self.mid_line = true;
        } else {
            eprintln!("[{}] step {done:>4}/{total} {stats}", self.name);
        }
    }

    /// Closes the dashboard (the held stderr is written out) and prints the last progress line.
    fn close_live(&mut self) {
        if let Some(mut live) = self.live.take() {
            live.close();
            if let Some(line) = self.last_line.take() {
                eprintln!("{line}");
            }
        }
    }

    /// After the loop: ends the progress line, publishes the CSV and the plot, ends the
    /// trackers' runs, writes `summary.json` (with the trackers' counts as `report`).
    pub fn finish(&mut self, summary: &serde_json::Value) -> Result<()> {
        if !self.writer {
            return Ok(());
        }
        self.close_live();
        if self.mid_line && !self.opts.quiet {
            eprintln!();
            self.mid_line = false;
        }
        if let Some(log) = &mut self.log {
            log.publish()?;
        }
        let end = if self.stopped {
            End::Stopped
        } else {
            End::Finished
        };
        let counts = self.report.close(end);
        let mut summary = summary.clone();
        if let (Some(m), false) = (summary.as_object_mut(), counts.is_empty()) {
            m.insert("report".into(), counts_json(&counts));
        }
        write_atomic(
            &self.out.join("summary.json"),
            serde_json::to_string_pretty(&summary)?.as_bytes(),
        )
    }
}
