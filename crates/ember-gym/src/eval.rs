//! One evaluation: the source screen, the compiler, the object checks, the harness on the
//! visible and hidden shapes, then the timing and the profile: a [`Report`].

use crate::checks;
use crate::error::GymError;
use crate::harness;
use crate::report::{EvalConfig, Job, Report};
use crate::sandbox::{self, Finished};
use crate::task::Task;
use crate::verdict::Verdict;
use std::path::Path;

/// Evaluates `code` (a C translation unit defining the task's function) on `task`; `seed`
/// draws the hidden shapes and every input.
///
/// # Errors
/// [`GymError`] when the gym itself cannot run (no compiler, no scratch space, a harness bug).
pub fn evaluate(task: &Task, code: &str, seed: u64, cfg: &EvalConfig) -> Result<Report, GymError> {
    let start = std::time::Instant::now();
    let mut report = match checks::source(code) {
        Err(v) => Report::new(task, v),
        Ok(()) => {
            let dir = tempfile::Builder::new().prefix("ember-gym-").tempdir()?;
            let job = Job {
                task,
                code: code.to_string(),
                seed,
            };
            build_and_run(&job, cfg, dir.path())?
        }
    };
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Compiles, screens the object, links and runs the harness in `dir`.
fn build_and_run(job: &Job<'_>, cfg: &EvalConfig, dir: &Path) -> Result<Report, GymError> {
    let task = job.task;
    std::fs::write(dir.join("kernel.c"), &job.code)?;
    if let Err(v) = preprocess(dir, cfg)? {
        return Ok(Report::new(task, v));
    }
    // A `main` of the candidate's (a test driver models often add) is renamed and never run.
    let flags = [
        "-std=gnu11",
        "-O2",
        "-march=native",
        "-Dmain=candidate_main",
        "-c",
    ];
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    args.extend(["kernel.c".into(), "-o".into(), "kernel.o".into()]);
    let out = sandbox::run(dir, &cfg.cc, &args, &cfg.compile)?;
    if out.status.is_none_or(|s| !s.success()) {
        return Ok(Report::new(task, Verdict::CompileError(compiler_log(&out))));
    }
    if let Err(v) = screen_object(task, dir, cfg)? {
        return Ok(Report::new(task, v));
    }
    let keep = format!("--keep-global-symbol={}", task.entry);
    if let Err(v) = tool(dir, "objcopy", &[&keep, "kernel.o"], cfg)? {
        return Ok(Report::new(task, v));
    }
    let harness = format!("{}{}", harness::defines(), harness::source(task));
    std::fs::write(dir.join("harness.c"), harness)?;
    let mut link: Vec<String> = [
        "-std=gnu11",
        "-O2",
        "-march=native",
        "-Wl,-z,relro,-z,now",
        "harness.c",
        "kernel.o",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    link.extend(["-lm".into(), "-o".into(), "run".into()]);
    let out = sandbox::run(dir, &cfg.cc, &link, &cfg.compile)?;
    if out.status.is_none_or(|s| !s.success()) {
        // The object passed the checks, so a link failure is a name clash the screen missed.
        return Ok(Report::new(task, Verdict::CompileError(compiler_log(&out))));
    }
    crate::outcome::run_harness(job, cfg, dir)
}

/// `cc -M`: the files the preprocessor reads must be the compiler's own headers. Its messages
/// are shown only where they quote `kernel.c` (an included file's lines never reach the policy).
fn preprocess(dir: &Path, cfg: &EvalConfig) -> Result<Result<(), Verdict>, GymError> {
    let args: Vec<String> = ["-std=gnu11", "-M", "kernel.c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let out = sandbox::run(dir, &cfg.cc, &args, &cfg.compile)?;
    if out.status.is_none_or(|s| !s.success()) {
        let own: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.starts_with("kernel.c:"))
            .take(20)
            .collect();
        return Ok(Err(Verdict::CompileError(own.join("\n"))));
    }
    Ok(checks::dependencies(&out.stdout))
}

/// `nm`, `objdump -h` and `objdump -d` of `kernel.o` through [`checks::object`].
fn screen_object(
    task: &Task,
    dir: &Path,
    cfg: &EvalConfig,
) -> Result<Result<(), Verdict>, GymError> {
    let (nm, sections, dis) = match (
        tool(dir, "nm", &["-P", "kernel.o"], cfg)?,
        tool(dir, "objdump", &["-h", "kernel.o"], cfg)?,
        tool(dir, "objdump", &["-d", "kernel.o"], cfg)?,
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(v), _, _) | (_, Err(v), _) | (_, _, Err(v)) => return Ok(Err(v)),
    };
    let library: Vec<&str> = task.library.iter().map(|l| l.name).collect();
    Ok(checks::object(
        &checks::parse_nm(&nm),
        &sections,
        &dis,
        task.entry,
        &library,
    ))
}

/// A binutils tool's whole output. That it cannot start is the gym's error; that it fails,
/// runs past its time or prints more than can be read is the object's verdict.
fn tool(
    dir: &Path,
    program: &str,
    args: &[&str],
    cfg: &EvalConfig,
) -> Result<Result<String, Verdict>, GymError> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = sandbox::run(dir, program, &args, &cfg.compile)?;
    if out.status.is_none_or(|s| !s.success()) || out.truncated {
        return Ok(Err(Verdict::Rejected(format!(
            "the object could not be screened ({program} {})",
            args.join(" ")
        ))));
    }
    Ok(Ok(out.stdout))
}

/// The compiler's messages: errors first, at most 40 lines.
fn compiler_log(out: &Finished) -> String {
    if out.status.is_none() {
        return "the compiler ran past its time limit".into();
    }
    let lines: Vec<&str> = out.stderr.lines().collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("error"))
        .chain(lines.iter().copied().filter(|l| !l.contains("error")))
        .take(40)
        .collect();
    errors.join("\n")
}
