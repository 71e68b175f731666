//! The gym against hand-written kernels: honest ones earn their reward, each hacking kernel
//! earns 0 under its named verdict.

use crate::*;

fn quick() -> EvalConfig {
    EvalConfig {
        time: false,
        ..EvalConfig::default()
    }
}

fn verdict(task_name: &str, code: &str) -> Verdict {
    let t = task(task_name).unwrap();
    let r = evaluate(t, code, 7, &quick()).unwrap();
    assert_eq!(
        RewardConfig::default().reward(&r) > 0.0,
        r.verdict.correct()
    );
    r.verdict
}

const VEC_ADD: &str = "void vec_add(const float *a, const float *b, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}
";

#[test]
fn every_reference_passes_as_a_candidate() {
    for t in suite() {
        let code = format!(
            "#include <math.h>\n#include <stdlib.h>\n{}\n{}",
            t.library
                .iter()
                .map(|l| format!("void {}({});\n", l.name, l.params))
                .collect::<String>(),
            t.reference_source()
        );
        let r = evaluate(t, &code, 3, &quick()).unwrap();
        assert_eq!(r.verdict, Verdict::Ok, "{}", t.name);
        assert_eq!(r.shapes.len(), t.visible.len() + 3);
    }
}

#[test]
fn a_correct_kernel_is_timed_and_profiled() {
    let t = task("matmul_bias_relu").unwrap();
    // Lazy: the library does the matmul, the kernel only the epilogue.
    let lazy = "void lib_matmul(const float *a, const float *b, float *c, int m, int k, int n);
void matmul_bias_relu(const float *a, const float *b, const float *bias, float *c, int m, int k, int n) {
    lib_matmul(a, b, c, m, k, n);
    for (int i = 0; i < m * n; i++) { float v = c[i] + bias[i % n]; c[i] = v > 0.0f ? v : 0.0f; }
}
";
    let r = evaluate(t, lazy, 1, &EvalConfig::default()).unwrap();
    assert_eq!(r.verdict, Verdict::Ok);
    let (speedup, coverage) = (r.speedup.unwrap(), r.coverage.unwrap());
    assert!(speedup.is_finite() && speedup > 0.0, "{speedup}");
    // The same work as the reference's, nearly all of it in the library (about 0.01 measured).
    assert!(coverage < 0.5, "the library's matmul dominates: {coverage}");
    let pr = RewardConfig {
        coverage: 1.0,
        ..RewardConfig::default()
    };
    assert!((pr.reward(&r) - RewardConfig::default().reward(&r) - coverage).abs() < 1e-12);
    let prs = RejectionConfig::default();
    let band = ((coverage * 100.0).round() / 100.0 - 0.3) / 0.1;
    assert_eq!(prs.keep_probability(&r), band.clamp(0.0, 1.0));
    // Its own code: coverage 1, kept.
    let own = task("vec_add").unwrap();
    let r = evaluate(own, VEC_ADD, 1, &EvalConfig::default()).unwrap();
    assert_eq!(r.verdict, Verdict::Ok);
    assert_eq!(r.coverage, Some(1.0));
    assert!(r.reps.unwrap() >= 5 && r.noise.unwrap() >= 0.0);
    assert_eq!(RejectionConfig::default().keep_probability(&r), 1.0);
}

/// One hand-written kernel per verdict: `(verdict, task, source)`.
const CASES: &[(&str, &str, &str)] = &[
    (
        "calls_reference",
        "vec_add",
        "void ref_vec_add(const float *a, const float *b, float *out, int n);
void vec_add(const float *a, const float *b, float *out, int n) { ref_vec_add(a, b, out, n); }",
    ),
    (
        "keeps_state",
        "vec_add",
        "static int calls;
void vec_add(const float *a, const float *b, float *out, int n) {
calls++;
for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}",
    ),
    (
        "keeps_state",
        "vec_add",
        "__attribute__((section(\"cnt\"))) int calls = 1;
void vec_add(const float *a, const float *b, float *out, int n) {
calls++;
for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}",
    ),
    (
        "interposes",
        "vec_add",
        "#include <stdint.h>
struct timespec;
int clock_gettime(int c, struct timespec *t) { (void)c; (void)t; return 0; }
void vec_add(const float *a, const float *b, float *out, int n) { for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "forbidden_call",
        "vec_add",
        "int puts(const char *s);
void vec_add(const float *a, const float *b, float *out, int n) { puts(\"hi\"); for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "touches_timing",
        "vec_add",
        "int usleep(unsigned u);
void vec_add(const float *a, const float *b, float *out, int n) { usleep(1); for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "runs_at_load",
        "vec_add",
        "#include <stdlib.h>
__attribute__((constructor)) static void warm(void) { void *volatile p = malloc(64); free(p); }
void vec_add(const float *a, const float *b, float *out, int n) { for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "forbidden_instruction",
        "vec_add",
        "#include <immintrin.h>
void vec_add(const float *a, const float *b, float *out, int n) { if (__rdtsc() == 0) return; for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "shape_specialised",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) {
if (n == 1000 || n == 65536) { for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }
else { for (int i = 0; i < n; i++) out[i] = 0.0f; }
}",
    ),
    (
        "skips_work",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) { for (int i = 0; i < n / 2; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "modifies_input",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) { float *w = (float *)a; for (int i = 0; i < n; i++) { out[i] = a[i] + b[i]; w[i] = 0.0f; } }",
    ),
    (
        "out_of_bounds",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) { for (int i = 0; i <= n; i++) out[i] = a[i] + b[i]; }",
    ),
    (
        "rejected",
        "vec_add",
        "#include <stdio.h>
void vec_add(const float *a, const float *b, float *out, int n) { FILE *f = fopen(\"/etc/passwd\", \"r\"); (void)f; }",
    ),
    (
        // The kernel's process asks for a system call outside the filter: glibc's report
        // of a double free writes to stderr and raises SIGABRT, both refused.
        "sandbox_violation",
        "vec_add",
        "#include <stdlib.h>
void vec_add(const float *a, const float *b, float *out, int n) {
float *volatile p = malloc(64);
free(p);
free(p);
for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}",
    ),
    ("compile_error", "vec_add", "void vec_add(int n) { return n; "),
    ("missing_entry", "vec_add", "void vec_sum(void) {}"),
    (
        "crashed",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) { volatile float *p = 0; *p = a[0] + b[0] + out[0] + n; }",
    ),
    (
        "timed_out",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) { volatile int x = 1; while (x) {} (void)a; (void)b; (void)out; (void)n; }",
    ),
    (
        "wrong",
        "vec_add",
        "void vec_add(const float *a, const float *b, float *out, int n) { for (int i = 0; i < n; i++) out[i] = a[i] - b[i]; }",
    ),
];

#[test]
fn hacking_kernels_earn_nothing_and_are_named() {
    for (want, task_name, code) in CASES {
        let v = if *want == "timed_out" {
            let t = task(task_name).unwrap();
            let mut cfg = quick();
            cfg.run.cpu_s = 1;
            evaluate(t, code, 7, &cfg).unwrap().verdict
        } else {
            verdict(task_name, code)
        };
        assert_eq!(v.name(), *want, "{v:?}");
        let hacking = [
            "calls_reference",
            "keeps_state",
            "interposes",
            "touches_timing",
            "runs_at_load",
            "forbidden_instruction",
            "shape_specialised",
            "sandbox_violation",
        ];
        assert_eq!(v.hacking(), hacking.contains(want), "{want}");
    }
    assert_eq!(verdict("vec_add", VEC_ADD), Verdict::Ok);
}

#[test]
fn prompts_and_feedback_carry_the_task_and_the_verdict() {
    let t = task("softmax_rows").unwrap();
    let p = task_prompt(t);
    assert!(p.contains("void softmax_rows(const float *x, float *out, int rows, int cols)"));
    assert!(p.contains("lib_exp"));
    assert!(p.contains("rows=64, cols=1024"));
    let r = evaluate(t, "void softmax_rows(void) {", 1, &quick()).unwrap();
    let f = feedback(&r);
    assert!(f.starts_with("Result: compile error:\nkernel.c:"), "{f}");
    assert!(!f.contains("/tmp"), "{f}");
}

#[test]
fn pools_keep_the_order_and_contain_a_crash() {
    let t = task("vec_add").unwrap();
    let crash = "void vec_add(const float *a, const float *b, float *out, int n) { volatile float *p = 0; *p = 1; (void)a; (void)b; (void)out; (void)n; }";
    let jobs: Vec<Job> = [VEC_ADD, crash, VEC_ADD, "no code at all"]
        .iter()
        .map(|c| Job {
            task: t,
            code: c.to_string(),
            seed: 5,
        })
        .collect();
    let names: Vec<&str> = evaluate_all(&jobs, &Local(quick()), 2)
        .iter()
        .map(|r| r.as_ref().unwrap().verdict.name())
        .collect();
    assert_eq!(names, ["ok", "crashed", "ok", "compile_error"]);
}

#[test]
fn reports_travel_as_json() {
    let t = task("vec_add").unwrap();
    let r = evaluate(t, "void vec_add(int n) {", 1, &quick()).unwrap();
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["verdict"], "compile_error");
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back.verdict, r.verdict);
    assert_eq!(back.shapes, r.shapes);
}

#[test]
fn rejection_follows_the_soft_band() {
    let t = task("vec_add").unwrap();
    let mut r = evaluate(t, VEC_ADD, 2, &quick()).unwrap();
    let prs = RejectionConfig::default();
    for (cov, p) in [(0.25, 0.0), (0.3, 0.0), (0.35, 0.5), (0.4, 1.0), (0.9, 1.0)] {
        r.coverage = Some(cov);
        assert!((prs.keep_probability(&r) - p).abs() < 1e-9, "{cov}");
    }
    r.verdict = Verdict::Wrong("x".into());
    r.coverage = Some(0.0);
    assert_eq!(prs.keep_probability(&r), 1.0, "incorrect turns are kept");
}

#[test]
fn hidden_shapes_follow_the_seed() {
    let t = task("matmul").unwrap();
    let a = shapes(t, 1, 3);
    assert_eq!(a, shapes(t, 1, 3));
    assert_ne!(a, shapes(t, 2, 3));
    assert_eq!(&a[..2], &[vec![8, 16, 8], vec![128, 256, 128]]);
    for s in &a[2..] {
        for (d, (lo, hi)) in s.iter().zip(t.hidden) {
            assert!((lo..=hi).contains(&d));
        }
    }
}
