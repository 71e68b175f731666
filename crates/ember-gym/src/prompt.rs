//! What the policy reads: the task (its reference, signature, library and shapes) and, after
//! each turn, the gym's feedback (the verdict, the speed-up and the profile).

use crate::report::Report;
use crate::task::Task;
use std::fmt::Write;

/// The first observation of an episode of `task`.
pub fn task_prompt(task: &Task) -> String {
    let mut p = format!(
        "Write a faster C version of this function. It computes {}.\n\n```c\n{}```\n\n",
        task.summary,
        task.reference_source()
    );
    if !task.library.is_empty() {
        p.push_str("You may call these library functions:\n");
        for l in task.library {
            let _ = writeln!(p, "- `void {}({})`: {}", l.name, l.params, l.doc);
        }
        p.push('\n');
    }
    let shapes: Vec<String> = task
        .visible
        .iter()
        .map(|s| {
            task.dims
                .iter()
                .zip(s.iter())
                .map(|(d, v)| format!("{d}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect();
    let _ = write!(
        p,
        "It is checked at {} and at other sizes, and timed at the last. Keep the signature \
         `{};`, include only standard headers such as <math.h>, and answer with the whole \
         function in one ```c block.",
        shapes.join("; "),
        task.signature(task.entry)
    );
    p
}

/// The feedback after a turn: what the gym found, for the next turn.
pub fn feedback(report: &Report) -> String {
    let mut f = format!("Result: {}.", report.verdict.explain());
    if let (Some(s), Some(c)) = (report.speedup, report.coverage) {
        let _ = write!(
            f,
            " Speed-up over the reference: {s:.2}x. Share of the time in your own code (not \
             library calls): {:.0}%.",
            c * 100.0
        );
    }
    f.push_str(" Improve the function and answer with the whole function in one ```c block.");
    f
}
