//! Subnormal floats flushed to zero on the CPU (the x86-64 MXCSR's FTZ and DAZ bits).
//!
//! A float below 2⁻¹²⁶ in magnitude (f32) is subnormal; most x86 cores compute with one through
//! a microcode assist that costs tens to hundreds of cycles per instruction. Training makes
//! them: a softmax's probabilities underflow (exp of −90 is 8·10⁻⁴⁰), and the gradients that
//! flow through those probabilities stay subnormal through the backward's matrix products.
//! On the 2-core Xeon (Intel, AVX-512 and AMX, 2026-12-06), the main job's warm-up took 121.8 s
//! with subnormals and 22.5 s without (`ember train recipes/arithmetic-cpu.toml`; the run 225 s
//! against 49 s), and PPO's actor backward 0.3–0.5 s against 0.04 s, every logged value equal
//! to the bit: what was subnormal only ever mattered as zero.
//!
//! [`flush_to_zero`] sets FTZ (a subnormal result is written as 0) and DAZ (a subnormal input
//! is read as 0) in the calling thread; a thread started afterwards inherits them (Linux copies
//! the creating thread's floating-point state on `clone`), so calling it first in `main` covers
//! burn's rayon pool, the rollout worker and every other thread. TensorFlow and XLA run their
//! CPU kernels the same way; PyTorch leaves it to `torch.set_flush_denormal(True)`.
//! `EMBER_SUBNORMALS=keep` leaves the IEEE default (gradual underflow), for comparing a result
//! with a reference to the last bit.

/// The environment variable that keeps subnormals (`EMBER_SUBNORMALS=keep`).
pub const ENV: &str = "EMBER_SUBNORMALS";

/// What [`flush_to_zero`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subnormals {
    /// FTZ and DAZ set: subnormal inputs and results are zero.
    Flushed,
    /// Left alone: `EMBER_SUBNORMALS=keep`.
    Kept,
    /// Not x86-64: the target's default.
    Unsupported,
}

impl std::fmt::Display for Subnormals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flushed => write!(
                f,
                "subnormal floats flushed to zero ({ENV}=keep keeps them)"
            ),
            Self::Kept => write!(f, "subnormal floats kept ({ENV}=keep)"),
            Self::Unsupported => write!(f, "subnormal floats: the target's default"),
        }
    }
}

/// Flushes subnormal floats to zero in this thread and the threads it starts afterwards (module
/// docs), unless `EMBER_SUBNORMALS=keep`. Call first in `main`, before any thread starts.
pub fn flush_to_zero() -> Subnormals {
    if std::env::var(ENV).is_ok_and(|v| v == "keep") {
        return Subnormals::Kept;
    }
    set()
}

/// The MXCSR bits: FTZ (15) and DAZ (6) (Intel SDM vol. 1, §10.2.3).
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn set() -> Subnormals {
    let mut csr: u32 = 0;
    // SAFETY: `stmxcsr` stores this thread's 32-bit MXCSR through a pointer to a local `u32`,
    // `ldmxcsr` loads it back from one; no other memory is touched and the stack is not used.
    // Setting FTZ/DAZ changes how later float instructions round results below 2⁻¹²⁶ (to 0), not
    // what any safe code may assume about memory.
    unsafe {
        std::arch::asm!("stmxcsr [{p}]", p = in(reg) &raw mut csr, options(nostack, preserves_flags));
        csr |= FTZ_DAZ;
        std::arch::asm!("ldmxcsr [{p}]", p = in(reg) &raw const csr, options(nostack, preserves_flags, readonly));
    }
    Subnormals::Flushed
}

#[cfg(not(target_arch = "x86_64"))]
fn set() -> Subnormals {
    Subnormals::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hint::black_box;

    /// The smallest normal f32 halved is subnormal (2⁻¹²⁷) with the IEEE default, 0 once
    /// flushed, in this thread and in a thread it starts; a thread started before keeps them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn flushed_in_this_thread_and_the_threads_it_starts() {
        let half_min = || black_box(f32::MIN_POSITIVE) * black_box(0.5f32);
        std::thread::spawn(move || {
            assert_eq!(half_min(), f32::from_bits(1 << 22));
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let before = std::thread::spawn(move || {
                rx.recv().unwrap();
                half_min()
            });
            assert_eq!(set(), Subnormals::Flushed);
            assert_eq!(half_min(), 0.0);
            // DAZ: a subnormal input reads as zero.
            assert_eq!(black_box(f32::from_bits(1)) * black_box(2.0f32), 0.0);
            assert_eq!(std::thread::spawn(half_min).join().unwrap(), 0.0);
            tx.send(()).unwrap();
            assert_eq!(before.join().unwrap(), f32::from_bits(1 << 22));
        })
        .join()
        .unwrap();
    }
}
