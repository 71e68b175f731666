//! The harness run and what its lines mean: the shapes (the prompt's, then hidden ones drawn
//! from the evaluation's seed), the verdict of the checks, the timing and the profile.

use crate::error::GymError;
use crate::report::{EvalConfig, Job, Report};
use crate::sandbox;
use crate::task::Task;
use crate::verdict::Verdict;
use std::path::Path;

/// SplitMix64's step (the gym draws its hidden shapes and inputs with it).
pub(crate) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The visible shapes, then `hidden` shapes drawn in the task's ranges.
pub fn shapes(task: &Task, seed: u64, hidden: usize) -> Vec<Vec<i32>> {
    let mut s = seed ^ 0x5eed_5ba9e;
    let mut out: Vec<Vec<i32>> = task.visible.iter().map(|v| v.to_vec()).collect();
    for _ in 0..hidden {
        let shape = task
            .hidden
            .iter()
            .map(|&(lo, hi)| {
                let span = u64::from((hi - lo).unsigned_abs()) + 1;
                lo + i32::try_from(splitmix(&mut s) % span).unwrap_or(0)
            })
            .collect();
        out.push(shape);
    }
    out
}

/// Runs the linked harness in `dir` and reads its lines into a report.
pub(crate) fn run_harness(job: &Job<'_>, cfg: &EvalConfig, dir: &Path) -> Result<Report, GymError> {
    let (task, code, seed) = (job.task, job.code.as_str(), job.seed);
    let shapes = shapes(task, seed, cfg.hidden_shapes);
    let mut args = vec![
        splitmix(&mut seed.clone()).to_string(),
        format!("{:e}", task.atol),
        format!("{:e}", task.rtol),
    ];
    for s in &shapes {
        args.push("check".into());
        args.extend(s.iter().map(i32::to_string));
    }
    let timed = task.visible.len() - 1;
    if cfg.time {
        args.push("time".into());
        args.extend(task.visible[timed].iter().map(i32::to_string));
    }
    let out = sandbox::run(dir, "./run", &args, &cfg.run)?;
    let lines: Vec<&str> = out.stdout.lines().collect();
    let mut report = Report {
        shapes: shapes.clone(),
        ..Report::new(task, Verdict::Ok)
    };
    report.verdict = checks_verdict(task, code, &shapes, &lines);
    if report.verdict == Verdict::Ok && !lines.contains(&"done") {
        report.verdict = ended(task, &out)?;
    }
    if report.verdict == Verdict::Ok && cfg.time {
        timing(&mut report, &lines, &shapes[timed])?;
    }
    Ok(report)
}

/// The verdict of the `check` lines: the first failure, named; a failure on hidden shapes alone
/// by a source that names a visible shape's size is special-casing.
fn checks_verdict(task: &Task, code: &str, shapes: &[Vec<i32>], lines: &[&str]) -> Verdict {
    let visible = task.visible.len();
    let mut first_hidden: Option<Verdict> = None;
    for line in lines.iter().filter(|l| l.starts_with("check ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(i) = f.get(1).and_then(|s| s.parse::<usize>().ok()) else {
            continue;
        };
        let Some(kind) = f.get(2).copied() else {
            continue;
        };
        if kind == "ok" {
            continue;
        }
        let shape = shapes.get(i).cloned().unwrap_or_default();
        let v = failure(kind, &f[3..], &shape);
        if i < visible {
            return v;
        }
        first_hidden.get_or_insert(v);
    }
    match first_hidden {
        None => Verdict::Ok,
        Some(v) if names_a_visible_size(task, code) => {
            Verdict::ShapeSpecialised(format!("{}; {}", v.name(), v.explain()))
        }
        Some(v) => v,
    }
}

/// A failure line's verdict.
fn failure(kind: &str, rest: &[&str], shape: &[i32]) -> Verdict {
    let at = format!("at shape {shape:?}");
    let buf = rest.first().copied().unwrap_or("?");
    let idx = rest.get(1).copied().unwrap_or("?");
    match kind {
        "died" => died(rest, &at),
        "untouched" => Verdict::SkipsWork(format!("{buf}[{idx}] {at}")),
        "bounds" => Verdict::OutOfBounds(format!("{buf}, {idx} past its end, {at}")),
        "input" => Verdict::ModifiesInput(format!("{buf}[{idx}] {at}")),
        _ => Verdict::Wrong(format!(
            "{buf}[{idx}] = {} where the reference gives {} {at}",
            rest.get(2).copied().unwrap_or("?"),
            rest.get(3).copied().unwrap_or("?")
        )),
    }
}

/// How the kernel's process ended (`signal N`, `exit N`, `answered out of turn`).
fn died(rest: &[&str], at: &str) -> Verdict {
    const SIGKILL: i32 = 9;
    const SIGXCPU: i32 = 24;
    const SIGSYS: i32 = 31;
    let n = rest.get(1).and_then(|n| n.parse::<i32>().ok());
    match (rest.first().copied(), n) {
        (Some("signal"), Some(SIGSYS)) => {
            Verdict::SandboxViolation(format!("a system call outside the sandbox's {at}"))
        }
        (Some("signal"), Some(SIGKILL | SIGXCPU)) => Verdict::TimedOut,
        (Some("signal"), Some(sig)) => Verdict::Crashed(format!("{} {at}", signal_name(sig))),
        (Some("exit"), Some(code)) => Verdict::Crashed(format!("exited with status {code} {at}")),
        _ => Verdict::InconsistentRuns(format!("its process {} {at}", rest.join(" "))),
    }
}

/// Whether the source compares with a visible shape's size (above 2), written as a number
/// (decimal, hex or octal) beside `==`, `!=` or after `case`: a tile size or an unroll factor
/// is not a comparison.
fn names_a_visible_size(task: &Task, code: &str) -> bool {
    let sizes: Vec<i64> = task
        .visible
        .iter()
        .flat_map(|s| s.iter().copied())
        .filter(|&d| d > 2)
        .map(i64::from)
        .collect();
    let number = |w: &str| {
        let w = w.trim_end_matches(['u', 'U', 'l', 'L']);
        if let Some(h) = w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
            i64::from_str_radix(h, 16).ok()
        } else if w.len() > 1 && w.starts_with('0') {
            i64::from_str_radix(&w[1..], 8).ok()
        } else {
            w.parse::<i64>().ok()
        }
    };
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_alphanumeric() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        let Some(n) = number(&code[start..i]) else {
            continue;
        };
        let before = code[..start].trim_end();
        let after = code[i..].trim_start();
        let compared = before.ends_with("==")
            || before.ends_with("!=")
            || before.ends_with("case")
            || after.starts_with("==")
            || after.starts_with("!=");
        if compared && sizes.contains(&n) {
            return true;
        }
    }
    false
}

/// Why a run that passed its checks did not finish: a signal, the clock or the harness.
fn ended(task: &Task, out: &sandbox::Finished) -> Result<Verdict, GymError> {
    const SIGKILL: i32 = 9;
    const SIGXCPU: i32 = 24;
    Ok(match (out.status, out.signal()) {
        (None, _) | (_, Some(SIGKILL | SIGXCPU)) => Verdict::TimedOut,
        (_, Some(sig)) => Verdict::Crashed(signal_name(sig)),
        // The harness ran out of something (memory, processes): the kernel's doing or not, it
        // ends this evaluation, not the caller's run.
        _ => {
            let said = out.stdout.lines().find(|l| l.starts_with("harness "));
            let code = out.status.and_then(|s| s.code()).unwrap_or(-1);
            Verdict::Crashed(format!(
                "the harness for {} stopped (status {code}{})",
                task.name,
                said.map(|l| format!(": {l}")).unwrap_or_default()
            ))
        }
    })
}

/// A signal's name.
fn signal_name(sig: i32) -> String {
    match sig {
        4 => "SIGILL".into(),
        6 => "SIGABRT".into(),
        7 => "SIGBUS".into(),
        8 => "SIGFPE".into(),
        11 => "SIGSEGV".into(),
        n => format!("signal {n}"),
    }
}

/// The `time` and `timed` lines into the report: a failure in a timed run is a verdict of its
/// own (the checks passed), and a timing line that is not exactly one of finite numbers is the
/// harness's error.
fn timing(report: &mut Report, lines: &[&str], shape: &[i32]) -> Result<(), GymError> {
    if let Some(l) = lines.iter().find(|l| l.starts_with("timed ")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let kind = f.get(2).copied().unwrap_or("wrong");
        let v = failure(kind, f.get(3..).unwrap_or(&[]), shape);
        report.verdict = match v {
            Verdict::SandboxViolation(_) | Verdict::TimedOut | Verdict::Crashed(_) => v,
            Verdict::InconsistentRuns(_) => v,
            _ => Verdict::InconsistentRuns(v.explain()),
        };
        return Ok(());
    }
    let times: Vec<&&str> = lines.iter().filter(|l| l.starts_with("time ")).collect();
    let f: Vec<f64> = match times[..] {
        [l] => l
            .split_whitespace()
            .skip(2)
            .filter_map(|x| x.parse().ok())
            .collect(),
        _ => Vec::new(),
    };
    let [r, k, lib, noise, reps, overhead] = f[..] else {
        return Err(GymError::Harness {
            task: report.task.clone(),
            detail: format!("timing lines {times:?}"),
        });
    };
    if f.iter().any(|x| !x.is_finite()) || r <= 0.0 || k <= 0.0 {
        return Err(GymError::Harness {
            task: report.task.clone(),
            detail: format!("timing line {times:?}"),
        });
    }
    {
        report.ref_ns = Some(r);
        report.kernel_ns = Some(k);
        report.speedup = (k > 0.0).then(|| r / k);
        report.coverage = Some((1.0 - lib).clamp(0.0, 1.0));
        report.noise = Some(noise);
        report.reps = Some(reps as u32);
        report.overhead_ns = Some(overhead);
    }
    Ok(())
}
