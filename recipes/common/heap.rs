//! glibc heap settings for a process that allocates one tensor per op.
//!
//! Every op of burn's CPU backend returns a freshly allocated tensor, so a training step
//! allocates and frees the same few hundred buffers again and again. With glibc's defaults the
//! memory freed at the top of a heap is handed back to the kernel (`brk`/`madvise`) as soon as
//! it exceeds the trim threshold, and the next op faults the same pages in and has the kernel
//! zero them again: in the main job (`ember train recipes/arithmetic-cpu.toml`) a third of the
//! process's time was kernel time, mostly page faults (`benches/README.md`).
//!
//! [`keep_freed_memory`] sets three of glibc's documented `mallopt(3)` parameters:
//! - `M_TOP_PAD` = 256 MiB: memory added at the top of each heap when it grows (and kept when a
//!   thread's heap shrinks), so the buffers of one step are reused by the next;
//! - `M_MMAP_THRESHOLD` = 32 MiB (glibc's largest): setting any parameter switches off glibc's
//!   dynamic threshold, which would otherwise have risen to this value, and without it every
//!   buffer above 128 KiB would be mapped and unmapped per op;
//! - `M_TRIM_THRESHOLD` = −1 (heaps are never trimmed): a training step's activations are
//!   freed at the end of each micro-batch and step, and glibc handed the top of the heap back
//!   (`brk`) whenever it exceeded the top pad, so the next micro-batch faulted the same pages in
//!   again and the kernel zeroed them (in the SmolLM2 GRPO step of `benches/grpo_step.sh`, a
//!   tenth of the update's time was the kernel's `clear_page`).
//!
//! The cost: the process keeps its high-water mark of heap memory until it exits, as a GPU
//! framework's caching allocator does (the peak itself does not change).
//! A `GLIBC_TUNABLES` that sets any `glibc.malloc.` tunable, or `EMBER_HEAP=default`, leaves
//! glibc's settings alone.

/// The environment variable that turns the tuning off (`EMBER_HEAP=default`).
pub const ENV: &str = "EMBER_HEAP";
/// Bytes of padding kept at the top of each heap (`M_TOP_PAD`).
pub const TOP_PAD: usize = 256 << 20;
/// Allocations at or above this size are mapped individually (`M_MMAP_THRESHOLD`).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// `M_TRIM_THRESHOLD`: −1 turns trimming off (mallopt(3)).
pub const TRIM_THRESHOLD: i32 = -1;

/// What [`keep_freed_memory`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapTuning {
    /// All three parameters set.
    Applied,
    /// Left alone: the user set `GLIBC_TUNABLES` (malloc tunables) or `EMBER_HEAP=default`.
    UserSettings,
    /// glibc refused a parameter (it returns 0); the defaults stay for that one.
    Refused,
    /// Not a glibc target: nothing to set.
    Unsupported,
}

impl std::fmt::Display for HeapTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeapTuning::Applied => write!(
                f,
                "glibc malloc keeps freed memory (top pad {} MiB, mmap threshold {} MiB, no \
                 trimming; {ENV}=default for glibc's defaults)",
                TOP_PAD >> 20,
                MMAP_THRESHOLD >> 20
            ),
            HeapTuning::UserSettings => {
                write!(f, "glibc malloc: your settings (GLIBC_TUNABLES or {ENV})")
            }
            HeapTuning::Refused => write!(f, "glibc malloc: mallopt refused; glibc's defaults"),
            HeapTuning::Unsupported => write!(f, "not glibc: the system allocator's defaults"),
        }
    }
}

/// Whether the environment asks to leave the heap alone.
fn user_settings(tunables: Option<&str>, ember_heap: Option<&str>) -> bool {
    tunables.is_some_and(|t| t.contains("glibc.malloc.")) || ember_heap == Some("default")
}

/// Sets glibc's heap to keep freed memory for reuse (module docs). Call early in `main`,
/// before the work starts; later calls return the first call's outcome and change nothing.
pub fn keep_freed_memory() -> HeapTuning {
    static DONE: std::sync::OnceLock<HeapTuning> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        let tunables = std::env::var("GLIBC_TUNABLES").ok();
        let ember = std::env::var(ENV).ok();
        if user_settings(tunables.as_deref(), ember.as_deref()) {
            HeapTuning::UserSettings
        } else {
            set()
        }
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set() -> HeapTuning {
    let as_int = |v: usize| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    // SAFETY: `mallopt` takes two integers, touches only glibc's allocator state under its own
    // lock and is documented as callable at any time (mallopt(3)); no pointer is passed.
    let ok = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, as_int(MMAP_THRESHOLD)) == 1
            && libc::mallopt(libc::M_TOP_PAD, as_int(TOP_PAD)) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    };
    if ok {
        HeapTuning::Applied
    } else {
        HeapTuning::Refused
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set() -> HeapTuning {
    HeapTuning::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_settings_win() {
        assert!(!user_settings(None, None));
        assert!(!user_settings(Some("glibc.pthread.rseq=0"), None));
        assert!(user_settings(Some("glibc.malloc.top_pad=0"), None));
        assert!(user_settings(None, Some("default")));
        assert!(!user_settings(None, Some("tuned")));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_the_three_parameters() {
        // glibc refuses an M_MMAP_THRESHOLD above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
        assert_eq!(set(), HeapTuning::Applied);
    }
}
