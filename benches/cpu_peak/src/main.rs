//! The ceilings a CPU kernel can reach here: one core's f32 FMA and AVX512-BF16 `vdpbf16ps`
//! instruction rates (independent accumulator chains, so latency does not limit them), and
//! the gemm crate's f32 product, called directly on row-major buffers (no allocation per call),
//! on the shapes of SmolLM2-135M's projections and head. See `benches/README.md`.

use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    /// `n` rounds of `step` on `C` independent accumulators; returns their sum so nothing is
    /// elided.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn chains<const C: usize>(n: usize, step: impl Fn(__m512) -> __m512) -> f32 {
        let mut acc = [_mm512_setzero_ps(); C];
        for _ in 0..n {
            for x in acc.iter_mut() {
                *x = step(*x);
            }
        }
        let mut s = _mm512_setzero_ps();
        for x in acc {
            s = _mm512_add_ps(s, x);
        }
        _mm512_reduce_add_ps(s)
    }

    /// `n` rounds of `C` independent f32 FMAs on 16 lanes.
    #[target_feature(enable = "avx512f")]
    pub fn fma<const C: usize>(n: usize) -> f32 {
        let (a, b) = (_mm512_set1_ps(1.0001), _mm512_set1_ps(0.9999));
        chains::<C>(n, |x| _mm512_fmadd_ps(a, b, x))
    }

    /// `n` rounds of `C` independent `vdpbf16ps` (32 bf16 products summed pairwise into 16 f32
    /// lanes: 64 FLOP each).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub fn dpbf16<const C: usize>(n: usize) -> f32 {
        let a: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0001), _mm512_set1_ps(1.0001));
        let b: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.9999), _mm512_set1_ps(0.9999));
        chains::<C>(n, |x| _mm512_dpbf16_ps(x, a, b))
    }
}

/// Prints one core's FMA and (where the CPU has it) `vdpbf16ps` rates, 16 chains each.
#[cfg(target_arch = "x86_64")]
fn instruction_rates() {
    const CHAINS: usize = 16;
    let n = 20_000_000;
    let time = |f: &dyn Fn() -> f32| {
        let t = Instant::now();
        std::hint::black_box(f());
        (n * CHAINS) as f64 / t.elapsed().as_secs_f64()
    };
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above).
        let r = time(&|| unsafe { peak::fma::<CHAINS>(n) });
        println!(
            "one core, f32 FMA (zmm):   {:.2} G instr/s = {:6.1} GFLOP/s",
            r / 1e9,
            r * 32.0 / 1e9
        );
    }
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16") {
        // SAFETY: the CPU has AVX-512F and AVX512-BF16 (checked above).
        let r = time(&|| unsafe { peak::dpbf16::<CHAINS>(n) });
        println!(
            "one core, bf16 vdpbf16ps:  {:.2} G instr/s = {:6.1} GFLOP/s",
            r / 1e9,
            r * 64.0 / 1e9
        );
    } else {
        println!("one core, bf16 vdpbf16ps:  this CPU has no AVX512-BF16");
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn instruction_rates() {
    println!("instruction rates: x86-64 only");
}

/// Best of `reps` of the gemm crate's `C = A·B` (row-major, all cores) in GFLOP/s.
fn gemm_rate(m: usize, k: usize, n: usize, reps: usize) -> f64 {
    let a: Vec<f32> = (0..m * k)
        .map(|i| (i % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 997) as f32 / 997.0 - 0.5).collect();
    let mut c = vec![0.0f32; m * n];
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        // SAFETY: a is m×k, b is k×n and c is m×n, all row-major and live for the call.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(0),
            );
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (m * n * k) as f64 / best / 1e9
}

fn main() {
    instruction_rates();
    println!(
        "gemm crate, {} threads (row-major f32, output reused):",
        rayon::current_num_threads()
    );
    for (m, k, n) in [
        (1024, 576, 1536),
        (4096, 576, 1536),
        (4096, 1536, 576),
        (64, 576, 1536),
        (32, 576, 1536),
        (1024, 576, 49152),
    ] {
        let reps = ((2e11 / (2.0 * (m * n * k) as f64)) as usize).clamp(3, 200);
        println!(
            "  {m:5} x {k:4} x {n:5}: {:6.1} GFLOP/s",
            gemm_rate(m, k, n, reps)
        );
    }
}
