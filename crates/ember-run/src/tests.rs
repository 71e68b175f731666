//! Unit tests of the run kit: the end-of-step protocol, the lock, signals' exit codes, the
//! non-finite streak, metric formatting.

use super::*;
use crate::stop::exit_code_for;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-run-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn spec(steps: usize) -> RunSpec<'static> {
    RunSpec {
        name: "t",
        resolved: "name = \"t\"\n",
        steps,
        checkpoint_every: 0,
        keep_checkpoints: 2,
        curves: ("reward", "eval/accuracy"),
        restate: None,
    }
}

fn row(step: usize, eval: bool) -> BTreeMap<String, f64> {
    let mut r = BTreeMap::from([("step".to_string(), step as f64), ("reward".into(), 0.5)]);
    if eval {
        r.insert("eval/accuracy".into(), 0.25);
    }
    r
}

/// The end-of-step protocol: `metrics.csv` and `curves.png` appear at the first evaluation
/// (not only at the end), a stop before the last step checkpoints and ends the loop, and the
/// last step checkpoints.
#[test]
fn every_evaluation_publishes_and_a_stop_checkpoints() {
    let d = tmpdir("protocol");
    let opts = RunOptions {
        quiet: true,
        stop_after: Some(3),
        ..RunOptions::default()
    };
    let mut run = Run::open(&d, &opts, &spec(4)).unwrap();
    assert!(
        !d.join("metrics.jsonl").exists(),
        "created before the first row"
    );
    let save = |run: &Run, step: usize| {
        let st = run.state(step, 7, 0.0, 0.25);
        move |dir: &Path| {
            std::fs::write(dir.join(checkpoint::STATE), serde_json::to_string(&st)?)?;
            Ok(())
        }
    };
    let end = run.step_end(1);
    assert!(!end.checkpoint && !end.stop);
    let s = save(&run, 1);
    assert!(!run.end_step(end, row(1, false), false, "", s).unwrap());
    assert!(!d.join("metrics.csv").exists());
    let end = run.step_end(2);
    let s = save(&run, 2);
    assert!(!run.end_step(end, row(2, true), true, "", s).unwrap());
    let csv = std::fs::read_to_string(d.join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert!(d.join("curves.png").exists());
    let end = run.step_end(3);
    assert!(end.checkpoint && end.stop);
    let s = save(&run, 3);
    assert!(run.end_step(end, row(3, false), false, "", s).unwrap());
    let latest = checkpoint::latest(&d.join("checkpoints")).unwrap().unwrap();
    assert_eq!(checkpoint::read_state(&latest).unwrap().step, 3);
    // Resuming keeps the three rows and starts at step 3; the last step checkpoints.
    drop(run);
    let opts = RunOptions {
        quiet: true,
        resume: true,
        ..RunOptions::default()
    };
    let run = Run::open(&d, &opts, &spec(4)).unwrap();
    assert_eq!(run.first_step(), 3);
    let end = run.step_end(4);
    assert!(end.checkpoint && !end.stop);
    drop(run);
    // A different recipe is refused on resume.
    let other = RunSpec {
        resolved: "name = \"u\"\n",
        ..spec(4)
    };
    let err = Run::open(&d, &opts, &other).err().unwrap();
    assert!(format!("{err:#}").contains("recipe differs"), "{err:#}");
    // Unless the stored recipe, restated in today's form, is the new one (an earlier
    // version's spelling); a restatement that still differs is refused.
    let today = |stored: &str| Some(stored.replace("\"t\"", "\"u\""));
    let renamed = RunSpec {
        restate: Some(&today),
        ..other.clone()
    };
    assert_eq!(Run::open(&d, &opts, &renamed).unwrap().first_step(), 3);
    let unchanged = |stored: &str| Some(stored.to_string());
    let still = RunSpec {
        restate: Some(&unchanged),
        ..other
    };
    assert!(Run::open(&d, &opts, &still).is_err());
    std::fs::remove_dir_all(&d).ok();
}

/// A second writer on the same run directory is refused while the first holds it, and the
/// lock goes with the first run.
#[test]
fn a_second_writer_is_refused() {
    let d = tmpdir("lock");
    let opts = RunOptions {
        quiet: true,
        ..RunOptions::default()
    };
    let first = Run::open(&d, &opts, &spec(2)).unwrap();
    let overwrite = RunOptions {
        overwrite: true,
        ..opts.clone()
    };
    let err = Run::open(&d, &overwrite, &spec(2)).err().unwrap();
    assert!(format!("{err:#}").contains("another process"), "{err:#}");
    drop(first);
    assert!(Run::open(&d, &overwrite, &spec(2)).is_ok());
    std::fs::remove_dir_all(&d).ok();
}

/// Steps whose updates were all skipped (a non-finite loss) are counted; the third in a
/// row ends the run with an error naming the last step with learned weights. A good step
/// resets the count.
#[test]
fn non_finite_steps_in_a_row_stop_the_run() {
    let d = tmpdir("nonfinite");
    let opts = RunOptions {
        quiet: true,
        ..RunOptions::default()
    };
    let mut run = Run::open(&d, &opts, &spec(10)).unwrap();
    let skipped = |step: usize, n: f64| {
        let mut r = row(step, false);
        r.insert("actor/skipped_steps".into(), n);
        r
    };
    let end = |run: &mut Run, step: usize, n: f64| {
        let e = run.step_end(step);
        run.end_step(e, skipped(step, n), false, "", |_| Ok(()))
    };
    assert!(!end(&mut run, 1, 1.0).unwrap());
    assert!(!end(&mut run, 2, 0.0).unwrap());
    assert!(!end(&mut run, 3, 1.0).unwrap());
    assert!(!end(&mut run, 4, 2.0).unwrap());
    let err = end(&mut run, 5, 1.0).unwrap_err().to_string();
    assert!(
        err.contains("3 steps in a row") && err.contains("of step 2"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).ok();
}

/// A stop's exit status names its signal: 128 + n, and 130 for `--stop-after`.
#[test]
fn stop_status_follows_the_signal() {
    assert_eq!(exit_code_for(0), 130);
    assert_eq!(exit_code_for(2), 130);
    assert_eq!(exit_code_for(15), 143);
    assert_eq!(exit_code_for(1), 129);
}

#[test]
fn no_negative_zero() {
    assert_eq!(fmt_metric(-0.0, 4), "0.0000");
    assert_eq!(fmt_metric(-0.00001, 4), "0.0000");
    assert_eq!(fmt_metric(-0.00009, 4), "-0.0001");
    assert_eq!(fmt_metric(0.25, 3), "0.250");
    assert_eq!(fmt_metric(f64::NAN, 3), "NaN");
}

/// A job that records its start and the steps it ran, checkpointing through the run's
/// end-of-step protocol; its recipe is its number of steps.
struct Counter {
    run: Run,
    ran: Vec<usize>,
}

impl<'r> Job<'r> for Counter {
    type Recipe = usize;
    type Summary = (Vec<usize>, bool);

    fn setup(steps: &'r usize, out: &'r Path, opts: &RunOptions) -> Result<Self> {
        let run = Run::open(out, opts, &spec(*steps))?;
        Ok(Counter { run, ran: vec![] })
    }

    fn start(mut self) -> Result<Self> {
        self.ran.push(usize::MAX);
        Ok(self)
    }

    fn run(&self) -> &Run {
        &self.run
    }

    fn step(mut self, step: usize) -> Result<(Self, bool)> {
        self.ran.push(step);
        let end = self.run.step_end(step + 1);
        let st = self.run.state(step + 1, 7, 0.0, 0.0);
        let stop = self
            .run
            .end_step(end, row(step + 1, false), false, "", move |dir| {
                std::fs::write(dir.join(checkpoint::STATE), serde_json::to_string(&st)?)?;
                Ok(())
            })?;
        Ok((self, stop))
    }

    fn finish(self, interrupted: bool, seconds: f64) -> Result<Self::Summary> {
        assert!(seconds >= 0.0);
        Ok((self.ran, interrupted))
    }
}

/// The job loop starts the job once, runs steps 0..steps, ends at a stop (interrupted), and a resumed run starts at
/// the step after the checkpoint and runs to the last.
#[test]
fn the_job_loop_stops_and_resumes_at_the_checkpoint() {
    let d = tmpdir("job-loop");
    let opts = RunOptions {
        quiet: true,
        stop_after: Some(2),
        ..RunOptions::default()
    };
    let (ran, interrupted) = train::<Counter>(&5, &d, &opts).unwrap();
    assert_eq!((ran, interrupted), (vec![usize::MAX, 0, 1], true));
    let opts = RunOptions {
        quiet: true,
        resume: true,
        ..RunOptions::default()
    };
    let (ran, interrupted) = train::<Counter>(&5, &d, &opts).unwrap();
    assert_eq!((ran, interrupted), (vec![usize::MAX, 2, 3, 4], false));
    let rows = std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 5, "{rows}");
    std::fs::remove_dir_all(&d).ok();
}

/// Phases are logged as `timing_s/<phase>`, a repeated phase adding up, and `record` adds to
/// a row as `log` does.
#[test]
fn timings_log_each_phase_once() {
    let mut t = Timings::default();
    assert_eq!(t.time("gen", || 3), 3);
    t.add("update_actor", 2.0);
    t.add("update_actor", 0.5);
    let mut row = Row::new();
    t.log(&mut row);
    assert_eq!(row.len(), 2);
    assert_eq!(row["timing_s/update_actor"], 2.5);
    assert!(row["timing_s/gen"] >= 0.0);
    // A phase timed where only the row travels adds to the same key.
    Timings::record(&mut row, "update_actor", 1.0);
    Timings::record(&mut row, "sync", 0.25);
    assert_eq!(row["timing_s/update_actor"], 3.5);
    assert_eq!(row["timing_s/sync"], 0.25);
}
