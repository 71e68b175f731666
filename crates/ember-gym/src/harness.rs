//! The C harness a candidate is linked with. Two processes: the harness (the reference, a
//! `static` function no candidate can call; the reference's outputs; the input copies; the
//! clock; everything it prints) and the kernel's process, forked for each shape, which runs the
//! candidate and nothing else: its standard output and error go to `/dev/null`, a seccomp filter
//! allows only memory, the two pipes, the clock and exit (anything else kills it: a kernel cannot
//! open a file, start a process or write a line of the harness's), and it dies with the harness.
//! The candidate's buffers are shared memory; the rest of the harness's memory is out of its
//! reach. Modes:
//! - `check d…`: reference and candidate on fresh inputs; the candidate's outputs start as NaN
//!   so untouched elements show, every buffer is followed by canaries, inputs are compared with
//!   their copies;
//! - `time d…`: both in CPU time, which the scheduler keeps and waiting for a core does not
//!   lengthen: the reference on the harness's thread clock less one empty reading, the
//!   candidate on the kernel's process's clock over its round trip less the least of an empty
//!   request; alternating which runs first, on fresh inputs every repetition (a cache of
//!   earlier results is useless), its outputs reset and checked after every repetition;
//!   medians, the interquartile range, the library's share (which the library routines measure
//!   inside the kernel's process and report on a descriptor it cannot move) and the overhead
//!   subtracted.
//!
//! Every line it prints is flushed at once.

use crate::task::Task;
use std::fmt::Write;

/// Nanoseconds of reference time the timing loop aims for (it runs 5 to 301 repetitions).
const TARGET_NS: f64 = 2.0e8;

/// The harness's C source for `task`.
pub fn source(task: &Task) -> String {
    let mut c = String::from(PRELUDE);
    for lib in task.library {
        let args = param_names(lib.params).join(", ");
        let _ = write!(
            c,
            "static inline __attribute__((always_inline)) void {n}_impl({p}) {{{b}}}\nvoid \
             {n}({p}) {{\n    double t0 = now_ns();\n    {n}_impl({args});\n    \
             lib_report(now_ns() - t0);\n}}\n",
            n = lib.name,
            p = lib.params,
            b = lib.body,
        );
    }
    // The reference calls the same library routines: it runs in the harness's process, where
    // their reports go nowhere (`lib_report`), so only the candidate's calls count, and the
    // kernel's process holds no unreported copy it could call instead.
    let _ = writeln!(
        c,
        "static {} {{{}}}\n{};\n",
        task.signature(&format!("ref_{}", task.entry)),
        task.reference,
        task.signature(task.entry)
    );
    c.push_str(&setup(task));
    c.push_str(&run_fns(task));
    let _ = write!(c, "{}", MAIN.replace("NDIMS", &task.dims.len().to_string()));
    c
}

/// The parameter names of a C parameter list.
fn param_names(params: &str) -> Vec<&str> {
    params
        .split(',')
        .filter_map(|p| p.rsplit([' ', '*']).next())
        .collect()
}

/// The buffers' tables and `lengths(d)`: each buffer's length at shape `d`.
fn setup(task: &Task) -> String {
    let nb = task.buffers.len();
    let list = |f: &dyn Fn(&crate::task::Buffer) -> String| {
        task.buffers.iter().map(f).collect::<Vec<_>>().join(", ")
    };
    let mut c = format!(
        "#define NB {nb}\nstatic long L[NB];\nstatic float *R[NB], *C[NB], *I[NB];\nstatic \
         const int OUT[NB] = {{{}}};\nstatic const float LO[NB] = {{{}}};\nstatic const char \
         *NAME[NB] = {{{}}};\n",
        list(&|b| if b.output { "1".into() } else { "0".into() }),
        list(&|b| if b.positive {
            "0.5f".into()
        } else {
            "-1.0f".into()
        }),
        list(&|b| format!("\"{}\"", b.name)),
    );
    c.push_str("static void lengths(const int *d) {\n");
    c.push_str(&dims(task));
    for (i, b) in task.buffers.iter().enumerate() {
        let _ = writeln!(c, "    L[{i}] = (long)({});", b.len);
    }
    c.push_str("}\n");
    c
}

/// `int <dim> = d[i];` for each dimension.
fn dims(task: &Task) -> String {
    task.dims
        .iter()
        .enumerate()
        .map(|(i, d)| format!("    int {d} = d[{i}]; (void){d};\n"))
        .collect()
}

/// `run_ref(d)` and `run_cand(d)`: one call of each on its own buffers.
fn run_fns(task: &Task) -> String {
    let args = |side: &str| {
        let mut a: Vec<String> = (0..task.buffers.len())
            .map(|i| format!("{side}[{i}]"))
            .collect();
        a.extend(task.dims.iter().map(|d| d.to_string()));
        a.join(", ")
    };
    format!(
        "static void run_ref(const int *d) {{\n{dims}    ref_{e}({r});\n}}\nstatic void \
         run_cand(const int *d) {{\n{dims}    {e}({c});\n}}\n",
        dims = dims(task),
        e = task.entry,
        r = args("R"),
        c = args("C"),
    )
}

const PRELUDE: &str = r#"#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#define PAD 64
#define CANARY 12345.5f
static uint64_t rs;
static double tol_abs, tol_rel;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}
static float frand(void) {
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / 16777216.0);
}
/* Each library call's time goes to the harness at once, through a pipe of its own whose write
   end the kernel's process holds on a descriptor fixed in the code (LIB_FD): its filter allows
   no dup or close, and the code and the GOT are read-only, so nothing it changes in its memory
   (the harness's globals included) can make the library's share smaller. In the harness's own
   process LIB_FD is not open and a report goes nowhere (the reference's calls); in the kernel's
   a report the full pipe cannot take ends the process rather than being lost. */
static int lib_fd[2];
static void lib_report(double dt) {
    if (write(LIB_FD, &dt, 8) != 8 && errno == EAGAIN) syscall(SYS_exit_group, 5);
}
static void fail(const char *what) {
    printf("harness %s\n", what);
    fflush(stdout);
    exit(3);
}
/* A private buffer, or one shared with the kernel's process (the candidate's). */
static float *fresh(long n, int shared) {
    size_t bytes = sizeof(float) * (size_t)(n + PAD);
    float *p = shared ? mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)
                      : malloc(bytes);
    if (!p || p == MAP_FAILED) fail("out-of-memory");
    for (long j = n; j < n + PAD; j++) p[j] = CANARY;
    return p;
}
"#;

const MAIN: &str = r#"
static void reset_out(int b) {
    for (long j = 0; j < L[b]; j++) C[b][j] = NAN;
}
/* Fresh inputs for the reference and in the copy (the candidate's come with its request). */
static void fill(void) {
    for (int b = 0; b < NB; b++) {
        if (OUT[b]) continue;
        for (long j = 0; j < L[b]; j++) {
            float v = LO[b] + 2.0f * (LO[b] < 0.0f ? 1.0f : 0.5f) * frand();
            R[b][j] = v; I[b][j] = v;
        }
    }
}
/* The candidate's inputs from the copy and its outputs reset, just before its request: a
   process that watches its buffers has nothing to start on earlier. */
static void load(void) {
    for (int b = 0; b < NB; b++) {
        if (OUT[b]) reset_out(b);
        else memcpy(C[b], I[b], sizeof(float) * (size_t)L[b]);
    }
}
/* Right after an answer, 64 random output elements of each buffer; those still NaN are looked
   at again 2 ms later: one written meanwhile means the process answered before it finished
   (-1). Elements that stay NaN are left to the comparison (skipped work). */
static int probe(void) {
    long idx[NB][64];
    int nan = 0;
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < 64; i++) {
            idx[b][i] = -1;
            if (!OUT[b] || L[b] == 0) continue;
            long j = (long)(frand() * (float)L[b]);
            if (j >= L[b]) j = L[b] - 1;
            if (isnan(C[b][j]) && !isnan(R[b][j])) { idx[b][i] = j; nan = 1; }
        }
    }
    if (!nan) return 0;
    struct timespec pause = {0, 2000000};
    nanosleep(&pause, 0);
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 64; i++)
            if (idx[b][i] >= 0 && !isnan(C[b][idx[b][i]])) return -1;
    return 0;
}
static pid_t child;
static clockid_t child_clock;
/* A CPU-time clock in ns (-1 when it cannot be read). The scheduler keeps these: a process can
   neither forge its own nor lengthen another's, and time spent waiting for a core counts in
   neither, so a loaded machine slows the reference and the candidate alike. */
static double cpu_ns(clockid_t id) {
    struct timespec t;
    if (clock_gettime(id, &t)) return -1;
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}
/* The kernel's process's time on a CPU so far, in ns (-1 when the kernel does not say). */
static double runtime_ns(void) {
    return cpu_ns(child_clock);
}
static void setup(const int *d) {
    lengths(d);
    for (int b = 0; b < NB; b++) { R[b] = fresh(L[b], 0); C[b] = fresh(L[b], 1); I[b] = fresh(L[b], 0); }
    fill();
}
static void release(void) {
    for (int b = 0; b < NB; b++) {
        free(R[b]); free(I[b]);
        munmap(C[b], sizeof(float) * (size_t)(L[b] + PAD));
    }
}

/* The kernel's process: no output, a system-call filter (memory, the two pipes, the clock,
   exit), killed with the harness. It runs the candidate when asked and answers each request
   with 'd' and the library's nanoseconds of that call. */
static int cmd_fd[2], rep_fd[2];
static void sandbox(void) {
#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#endif
#ifdef ARCH
#define ALLOW(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* mmap only without PROT_EXEC: no code of its own making */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        ALLOW(SYS_read), ALLOW(SYS_write), ALLOW(SYS_exit), ALLOW(SYS_exit_group),
        ALLOW(SYS_brk), ALLOW(SYS_munmap), ALLOW(SYS_mremap),
        ALLOW(SYS_madvise), ALLOW(SYS_rt_sigreturn), ALLOW(SYS_clock_gettime),
        ALLOW(SYS_futex), ALLOW(SYS_getrandom),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = { (unsigned short)(sizeof(f) / sizeof(f[0])), f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        syscall(SYS_exit_group, 4);
#endif
}
static void serve(const int *d) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int null = open("/dev/null", O_WRONLY);
    if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) syscall(SYS_exit_group, 4);
    close(null); close(cmd_fd[1]); close(rep_fd[0]); close(lib_fd[0]);
    if (dup2(lib_fd[1], LIB_FD) != LIB_FD) syscall(SYS_exit_group, 4);
    close(lib_fd[1]);
    sandbox();
    for (;;) {
        char c;
        if (read(cmd_fd[0], &c, 1) != 1) syscall(SYS_exit_group, 0);
        if (c == 'q') { (void)!write(rep_fd[1], "q", 1); syscall(SYS_exit_group, 0); }
        double t0 = now_ns(), call = 0.0;
        if (c == 'c') { run_cand(d); call = now_ns() - t0; }
        char msg[9] = {'d'};
        memcpy(msg + 1, &call, 8);
        if (write(rep_fd[1], msg, 9) != 9) syscall(SYS_exit_group, 0);
    }
}
static void spawn(const int *d) {
    fflush(stdout);
    if (pipe(cmd_fd) || pipe(rep_fd) || pipe2(lib_fd, O_NONBLOCK)) fail("pipe");
    fcntl(lib_fd[1], F_SETPIPE_SZ, 1 << 20);
    child = fork();
    if (child < 0) fail("fork");
    if (child == 0) serve(d);
    if (clock_getcpuclockid(child, &child_clock)) fail("cpu-clock");
    close(cmd_fd[0]); close(rep_fd[1]); close(lib_fd[1]);
}
/* Why the kernel's process ended ("exit N" or "signal N"). */
static void ended(char *why, size_t n) {
    int st = 0;
    close(cmd_fd[1]); close(rep_fd[0]); close(lib_fd[0]);
    waitpid(child, &st, 0);
    if (WIFSIGNALED(st)) snprintf(why, n, "signal %d", WTERMSIG(st));
    else snprintf(why, n, "exit %d", WEXITSTATUS(st));
}
/* The library's time reported since the request began, into `sum`: finite, non-negative
   8-byte values only (anything else is a kernel writing into the pipe: -1). */
static char lib_part[8];
static size_t lib_got;
static int drain(double *sum) {
    for (;;) {
        ssize_t k = read(lib_fd[0], lib_part + lib_got, 8 - lib_got);
        if (k <= 0) return 0;
        lib_got += (size_t)k;
        if (lib_got < 8) continue;
        double v;
        memcpy(&v, lib_part, 8);
        lib_got = 0;
        if (!(v >= 0.0 && v < 1e15)) return -1;
        *sum += v;
    }
}
/* Kills the kernel's process that broke the protocol; -1. */
static double broke(const char *what, char *why, size_t n) {
    char w[16];
    snprintf(why, n, "%s", what);
    kill(child, SIGKILL);
    ended(w, sizeof w);
    return -1;
}
/* One request: its round trip in ns, the library's ns (`lib[0]`, from the library's pipe,
   drained while waiting so it never fills), the call's as the kernel's process measured it
   (`lib[1]`) and the kernel's process's CPU time over the round trip (`lib[2]`), or -1 when
   the process is gone (`why` says how) or broke the protocol. */
static double request(char c, double *lib, char *why, size_t n) {
    if (c == 'c') load();
    double sum = 0.0;
    int bad = 0;
    lib_got = 0;
    double c0 = runtime_ns();
    double t0 = now_ns();
    if (write(cmd_fd[1], &c, 1) != 1) { ended(why, n); return -1; }
    char msg[9];
    size_t got = 0;
    while (got < 9) {
        struct pollfd p[2] = {{rep_fd[0], POLLIN, 0}, {lib_fd[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) { if (errno == EINTR) continue; ended(why, n); return -1; }
        if ((p[1].revents & POLLIN) && drain(&sum) < 0) bad = 1;
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t k = read(rep_fd[0], msg + got, 9 - got);
        if (k <= 0) { ended(why, n); return -1; }
        got += (size_t)k;
    }
    double t = now_ns() - t0;
    lib[2] = runtime_ns() - c0;
    if (c0 < 0 || !(lib[2] >= 0.0)) return broke("ended after answering", why, n);
    if (c == 'c' && probe() != 0) return broke("answered before it finished", why, n);
    if (drain(&sum) < 0 || lib_got) bad = 1;
    if (msg[0] != 'd' || bad) return broke("answered out of turn", why, n);
    lib[0] = sum;
    memcpy(&lib[1], msg + 1, 8);
    return t;
}
/* Ends the kernel's process: it must answer 'q' and nothing else. */
static int finish(char *why, size_t n) {
    char c = 'q', got[2];
    ssize_t k = write(cmd_fd[1], &c, 1) == 1 ? read(rep_fd[0], got, 2) : -1;
    int clean = k == 1 && got[0] == 'q' && read(rep_fd[0], got, 1) == 0;
    if (!clean) kill(child, SIGKILL);
    ended(why, n);
    if (!clean) snprintf(why, n, "answered out of turn");
    return clean;
}

/* 0 when the candidate's buffers agree with the reference's; else prints why. */
static int quiet;
static int compare(const char *what, int s) {
    double worst = 0.0;
    for (int b = 0; b < NB; b++) {
        for (long j = L[b]; j < L[b] + PAD; j++)
            if (C[b][j] != CANARY) { printf("%s %d bounds %s %ld\n", what, s, NAME[b], j - L[b]); return 1; }
        for (long j = 0; j < L[b]; j++) {
            if (!OUT[b]) {
                if (memcmp(&C[b][j], &I[b][j], sizeof(float)) != 0) { printf("%s %d input %s %ld\n", what, s, NAME[b], j); return 1; }
                continue;
            }
            float got = C[b][j], want = R[b][j];
            if (isnan(got) && !isnan(want)) { printf("%s %d untouched %s %ld\n", what, s, NAME[b], j); return 1; }
            double err = fabs((double)got - (double)want);
            if (!(err <= tol_abs + tol_rel * fabs((double)want))) {
                printf("%s %d wrong %s %ld %.9g %.9g\n", what, s, NAME[b], j, got, want); return 1;
            }
            if (err > worst) worst = err;
        }
    }
    if (!quiet) printf("%s %d ok %.3g\n", what, s, worst);
    return 0;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* The kernel's process is forked before the reference runs, so it never holds a result. */
static void check(const int *d, int s) {
    char why[64];
    double lib[3];
    setup(d);
    spawn(d);
    run_ref(d);
    if (request('c', lib, why, sizeof why) < 0) printf("check %d died %s\n", s, why);
    else {
        int bad = compare("check", s);
        if (!finish(why, sizeof why) && !bad) printf("check %d died %s\n", s, why);
    }
    fflush(stdout);
    release();
}
/* The least of 21 CPU-time readings of nothing: what one reading of `id` adds. */
static double clock_cost(clockid_t id) {
    double least = 1e30;
    for (int i = 0; i < 21; i++) {
        double a = cpu_ns(id), b = cpu_ns(id);
        if (b - a < least) least = b - a;
    }
    return least;
}
/* The reference timed here and the candidate from here, both in CPU time (the harness's thread
   for the reference, the kernel's process over its round trip for the candidate), each less
   its least empty measure; each repetition on fresh inputs, the candidate's outputs reset and
   checked, the order alternating. */
static void timing(const int *d, int s) {
    char why[64];
    double lib[3] = {0.0, 0.0, 0.0}, lib_total = 0.0, own = 0.0, overhead = 1e30;
    setup(d);
    spawn(d);
    /* The kernel's process holds a copy of the generator: later inputs it cannot predict. */
    uint64_t bits;
    if (getrandom(&bits, sizeof bits, 0) == (ssize_t)sizeof bits) rs ^= bits;
    for (int i = 0; i < 21; i++) {
        double t = request('n', lib, why, sizeof why);
        if (t < 0) { printf("timed %d died %s\n", s, why); fflush(stdout); release(); return; }
        if (lib[2] < overhead) overhead = lib[2];
    }
    double ref_cost = clock_cost(CLOCK_THREAD_CPUTIME_ID);
    run_ref(d);
    double t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    run_ref(d);
    double est = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
    int reps = est > 0 ? (int)(TARGET_NS / est) : 301;
    if (reps < 5) reps = 5;
    if (reps > 301) reps = 301;
    double *tr = malloc(sizeof(double) * reps), *tc = malloc(sizeof(double) * reps);
    if (!tr || !tc) fail("out-of-memory");
    for (int r = 0; r < reps; r++) {
        fill();
        for (int side = 0; side < 2; side++) {
            if ((side == 0) == (r % 2 == 0)) {
                double t = request('c', lib, why, sizeof why);
                if (t < 0) { printf("timed %d died %s\n", s, why); fflush(stdout); release(); return; }
                tc[r] = lib[2] - overhead > 1.0 ? lib[2] - overhead : 1.0;
                lib_total += lib[0];
                /* The call's own measure, unless it claims more than the round trip. */
                own += lib[1] > 0.0 && lib[1] < t ? lib[1] : t;
            } else {
                double before = runtime_ns();
                t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
                run_ref(d);
                double t = cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0 - ref_cost;
                tr[r] = t > 1.0 ? t : 1.0;
                double after = runtime_ns();
                if (before >= 0 && after - before > 20000.0 + 0.25 * tr[r]) {
                    printf("timed %d died worked outside its call\n", s);
                    kill(child, SIGKILL); ended(why, sizeof why); fflush(stdout); release(); return;
                }
            }
        }
        quiet = 1;
        int bad = compare("timed", s);
        quiet = 0;
        if (bad) { kill(child, SIGKILL); ended(why, sizeof why); fflush(stdout); release(); return; }
    }
    if (!finish(why, sizeof why)) { printf("timed %d died %s\n", s, why); fflush(stdout); release(); return; }
    qsort(tr, reps, sizeof(double), cmp_double);
    qsort(tc, reps, sizeof(double), cmp_double);
    double share = own > 0 ? lib_total / own : 0.0;
    printf("time %d %.1f %.1f %.6f %.6f %d %.1f\n", s, tr[reps / 2], tc[reps / 2],
           share > 1.0 ? 1.0 : share, (tc[(3 * reps) / 4] - tc[reps / 4]) / tc[reps / 2], reps, overhead);
    fflush(stdout);
    free(tr); free(tc);
    release();
}
/* argv: seed atol rtol, then `check d…` / `time d…` groups of NDIMS numbers each. */
int main(int argc, char **argv) {
    if (argc < 4) return 2;
    /* Killed with the process that started it (a server that exits at a second signal). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    /* One core for the harness and every kernel's process (which inherit it): the reference and
       the candidate find their inputs in the same caches, and a request wakes the same core. */
    int cpu = sched_getcpu();
    if (cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    rs = strtoull(argv[1], 0, 10);
    tol_abs = strtod(argv[2], 0);
    tol_rel = strtod(argv[3], 0);
    int s = 0;
    for (int a = 4; a + NDIMS < argc; a += NDIMS + 1, s++) {
        int d[NDIMS];
        for (int i = 0; i < NDIMS; i++) d[i] = atoi(argv[a + 1 + i]);
        if (strcmp(argv[a], "check") == 0) check(d, s);
        else timing(d, s);
    }
    printf("done\n");
    return 0;
}
"#;

/// The timing target and the descriptor of the library's reports (the highest the sandbox's
/// file limit allows, far above those the harness opens) as the harness's `#define`s.
pub(crate) fn defines() -> String {
    let fd = crate::sandbox::MAX_FILES - 1;
    format!("#define TARGET_NS {TARGET_NS:?}\n#define LIB_FD {fd}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_names_are_the_last_words() {
        assert_eq!(
            param_names("const float *a, float *c, int m"),
            vec!["a", "c", "m"]
        );
    }
}
