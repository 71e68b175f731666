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

/// Best of `reps` of the gemm crate's `C = A·B` (all cores) in GFLOP/s, each operand row-major
/// unless `ta`/`tb`/`tc` say it is stored transposed (as a backward pass's `xᵀ·dy` and `dy·Wᵀ`
/// read them).
fn gemm_rate(m: usize, k: usize, n: usize, (ta, tb, tc): (bool, bool, bool), reps: usize) -> f64 {
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
                if tc { m as isize } else { 1 },
                if tc { 1 } else { n as isize },
                false,
                a.as_ptr(),
                if ta { m as isize } else { 1 },
                if ta { 1 } else { k as isize },
                b.as_ptr(),
                if tb { k as isize } else { 1 },
                if tb { 1 } else { n as isize },
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

/// A product's sizes and which operands are stored transposed.
type Shape = (usize, usize, usize, (bool, bool, bool));

/// `M,K,N[,tA][,tB][,tC]` arguments (e.g. `1024,576,192` or `576,1024,1536,tA`), or the default
/// shapes when there are none.
fn shapes() -> Vec<Shape> {
    let given: Vec<_> = std::env::args()
        .skip(1)
        .filter_map(|a| {
            let d: Vec<usize> = a.split(',').filter_map(|x| x.parse().ok()).collect();
            let t = (a.contains("tA"), a.contains("tB"), a.contains("tC"));
            (d.len() == 3).then(|| (d[0], d[1], d[2], t))
        })
        .collect();
    if !given.is_empty() {
        return given;
    }
    let plain = (false, false, false);
    vec![
        (1024, 576, 1536, plain),
        (4096, 576, 1536, plain),
        (4096, 1536, 576, plain),
        (64, 576, 1536, plain),
        (32, 576, 1536, plain),
        (1024, 576, 49152, plain),
    ]
}

fn main() {
    if std::env::args().len() == 1 {
        instruction_rates();
    }
    println!(
        "gemm crate, {} threads (row-major f32, output reused):",
        rayon::current_num_threads()
    );
    for (m, k, n, t) in shapes() {
        let reps = ((2e11 / (2.0 * (m * n * k) as f64)) as usize).clamp(3, 200);
        println!(
            "  {m:5} x {k:4} x {n:5}{}{}{}: {:6.1} GFLOP/s",
            if t.0 { " Aᵀ" } else { "" },
            if t.1 { " Bᵀ" } else { "" },
            if t.2 { " Cᵀ" } else { "" },
            gemm_rate(m, k, n, t, reps)
        );
    }
}
