//! The product with blocked weights on the CPU backend (`quant.rs`): each task takes a range of
//! output rows; for each row it widens each block's codes to f32 in registers, scales them
//! (`q·d + m`) and multiplies them into the running sums of up to four input rows at once, so
//! a weight is read from memory once a call whatever the batch. AVX-512 and AVX2 through
//! pulp's safe intrinsics (chosen at run time), portable loops elsewhere.

use crate::cpu::{T, dense, elems, is_f32, simd, tensor};
use crate::quant::{BLOCK, FusedQuantLinear, QuantKind, QuantMatrix, reference};
use burn::backend::TensorMetadata;
use burn::tensor::Shape;
#[cfg(target_arch = "x86_64")]
use pulp::x86::{V3, V4};
#[cfg(target_arch = "x86_64")]
use pulp::{Simd, cast, f32x8, f32x16, i8x16, u8x16};
use rayon::prelude::*;

impl FusedQuantLinear for burn::backend::Flex {
    /// `x · Wᵀ` for `x` `[n, cols]` → `[n, rows]`: f32 through [`products`] (`BF16` on AMX
    /// tiles, `ember_amx::matmul_packed`), other dtypes and a CPU without the tiles through the
    /// dequantized reference.
    fn quant_linear(x: T, w: QuantMatrix) -> T {
        if !is_f32(&x) {
            return reference::<Self>(x, &w);
        }
        let n = x.shape()[0];
        let x = dense(x);
        let y = match w.packed() {
            Some(p) => {
                let a = ember_amx::Matrix::row_major(elems(&x), n, w.shape().1);
                match ember_amx::matmul_packed(a, p) {
                    Ok(y) => y,
                    Err(_) => return reference::<Self>(x, &w),
                }
            }
            None => products(elems(&x), &w, Isa::Widest),
        };
        tensor(y, Shape::new([n, w.shape().0]))
    }
}

/// The instruction sets [`products`] may use (the narrower ones for the tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Isa {
    /// The widest the CPU has: AVX-512, else AVX2, else the portable loops.
    Widest,
    /// AVX2 if the CPU has it, else the portable loops.
    Avx2,
    /// The portable loops.
    Portable,
}

/// `xs · Wᵀ`, `xs` `[n, cols]` row-major → `[n, rows]` (blocked formats; `BF16`'s product is
/// `ember_amx::matmul_packed`).
pub(crate) fn products(xs: &[f32], w: &QuantMatrix, isa: Isa) -> Vec<f32> {
    let (rows, cols) = w.shape();
    let n = xs.len() / cols.max(1);
    // Outputs transposed, `[rows, n]`, so that each task writes one contiguous range.
    let mut yt = vec![0f32; rows * n];
    let chunk = rows_per_task(rows, cols);
    yt.par_chunks_mut((chunk * n).max(1))
        .enumerate()
        .for_each(|(task, out)| {
            let task = Task {
                w,
                first: task * chunk,
                xs,
                cols,
            };
            #[cfg(target_arch = "x86_64")]
            {
                let v4 = V4::try_new().filter(|_| isa == Isa::Widest);
                if let Some(v4) = v4 {
                    return v4.vectorize(
                        #[inline(always)]
                        || task.run(v4, out),
                    );
                }
                let v3 = V3::try_new().filter(|_| isa != Isa::Portable);
                if let Some(v3) = v3 {
                    return v3.vectorize(
                        #[inline(always)]
                        || task.run(v3, out),
                    );
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = isa;
            simd(
                #[inline(always)]
                || task.run(Portable, out),
            )
        });
    let mut y = vec![0f32; n * rows];
    for (o, col) in yt.chunks_exact(n.max(1)).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * rows + o] = *v;
        }
    }
    y
}

/// Output rows of one matrix up to which a product runs on the calling thread: waking the
/// pool's threads costs more than a decoding step's smaller products take.
const SERIAL_WEIGHTS: usize = 1 << 20;

/// Output rows a task takes: all of them for a small matrix, else about `SERIAL_WEIGHTS / 4`
/// weights a task.
fn rows_per_task(rows: usize, cols: usize) -> usize {
    match rows.saturating_mul(cols) <= SERIAL_WEIGHTS {
        true => rows.max(1),
        false => (SERIAL_WEIGHTS / 4 / cols.max(1)).max(1),
    }
}

/// One task: output rows `first..` of `w` against every input row.
struct Task<'a> {
    w: &'a QuantMatrix,
    first: usize,
    /// The inputs `[n, cols]`.
    xs: &'a [f32],
    cols: usize,
}

impl Task<'_> {
    /// Fills `out` (`[rows of this task, n]`) through `k`'s block products.
    #[inline(always)]
    fn run<K: BlockDot>(&self, k: K, out: &mut [f32]) {
        let Some(kind) = Blocked::of(self.w.kind()) else {
            return;
        };
        let n = self.xs.len() / self.cols.max(1);
        let inputs: Vec<&[[f32; BLOCK]]> = self
            .xs
            .chunks_exact(self.cols.max(1))
            .map(|x| x.as_chunks::<BLOCK>().0)
            .collect();
        for (i, y) in out.chunks_mut(n.max(1)).enumerate() {
            let (scales, codes) = self.w.row(self.first + i);
            let row = BlockRow {
                kind,
                scales,
                codes,
            };
            for (yg, xg) in y.chunks_mut(GROUP).zip(inputs.chunks(GROUP)) {
                match xg {
                    [a, b, c, d] => yg.copy_from_slice(&k.dots(&row, [a, b, c, d])),
                    [a, b, c] => yg.copy_from_slice(&k.dots(&row, [a, b, c])),
                    [a, b] => yg.copy_from_slice(&k.dots(&row, [a, b])),
                    [a] => yg.copy_from_slice(&k.dots(&row, [a])),
                    _ => {}
                }
            }
        }
    }
}

/// Input rows multiplied with one decoded block at a time.
const GROUP: usize = 4;

/// The formats made of blocks (`BF16` is held packed for the tiles instead).
#[derive(Clone, Copy)]
enum Blocked {
    Q4_1,
    Q8_0,
}

impl Blocked {
    /// `kind` if it is made of blocks.
    fn of(kind: QuantKind) -> Option<Self> {
        match kind {
            QuantKind::Q4_1 => Some(Self::Q4_1),
            QuantKind::Q8_0 => Some(Self::Q8_0),
            QuantKind::Bf16 => None,
        }
    }

    /// f32 scales a block holds.
    fn scales(self) -> usize {
        match self {
            Self::Q4_1 => 2,
            Self::Q8_0 => 1,
        }
    }
}

/// One weight row's blocks.
struct BlockRow<'a> {
    kind: Blocked,
    scales: &'a [f32],
    codes: &'a [u8],
}

/// The dot products of one blocked weight row with `R` input rows, for one instruction set.
trait BlockDot: Copy {
    fn dots<const R: usize>(self, row: &BlockRow, x: [&&[[f32; BLOCK]]; R]) -> [f32; R];
}

/// Any CPU: the weights decoded block by block (ggml's `dequantize_row_q4_1`: `q·d + m`, low
/// nibbles then high; `dequantize_row_q8_0`: `q·d`), then sixteen running sums a row.
#[derive(Clone, Copy)]
struct Portable;

impl BlockDot for Portable {
    #[inline(always)]
    fn dots<const R: usize>(self, row: &BlockRow, x: [&&[[f32; BLOCK]]; R]) -> [f32; R] {
        let nb = row.scales.len() / row.kind.scales();
        let mut w = [0f32; BLOCK];
        let mut acc = [[0f32; 16]; R];
        for (b, xb) in (0..nb).map(|b| (b, x.map(|x| &x[b]))) {
            row.decode(b, &mut w);
            for (acc, xb) in acc.iter_mut().zip(xb) {
                for (j, a) in acc.iter_mut().enumerate() {
                    *a += w[j] * xb[j] + w[j + 16] * xb[j + 16];
                }
            }
        }
        std::array::from_fn(|r| acc[r].iter().sum())
    }
}

impl BlockRow<'_> {
    /// Block `b`'s weights.
    #[inline(always)]
    fn decode(&self, b: usize, w: &mut [f32; BLOCK]) {
        match self.kind {
            Blocked::Q4_1 => {
                let (d, m) = (self.scales[2 * b], self.scales[2 * b + 1]);
                let q = &self.codes[16 * b..16 * b + 16];
                for j in 0..16 {
                    w[j] = f32::from(q[j] & 0x0F) * d + m;
                    w[j + 16] = f32::from(q[j] >> 4) * d + m;
                }
            }
            Blocked::Q8_0 => {
                let d = self.scales[b];
                let q = &self.codes[BLOCK * b..BLOCK * b + BLOCK];
                for j in 0..BLOCK {
                    w[j] = f32::from(q[j] as i8) * d;
                }
            }
        }
    }
}

/// AVX-512: sixteen lanes. A block's codes are widened to 32-bit lanes, converted to f32,
/// scaled (`q·d + m`) and multiplied into the running sums with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
impl BlockDot for V4 {
    #[inline(always)]
    fn dots<const R: usize>(self, row: &BlockRow, x: [&&[[f32; BLOCK]]; R]) -> [f32; R] {
        let s = self;
        let mut acc = [s.splat_f32s(0.0); R];
        let fifteen = s.splat_u32s(15);
        let mut fma = |b: usize, lo: f32x16, hi: f32x16| {
            for r in 0..R {
                let [x0, x1]: [f32x16; 2] = cast(x[r][b]);
                acc[r] = s.mul_add_f32s(lo, x0, acc[r]);
                acc[r] = s.mul_add_f32s(hi, x1, acc[r]);
            }
        };
        match row.kind {
            Blocked::Q4_1 => {
                let (sc, _) = row.scales.as_chunks::<2>();
                let (qs, _) = row.codes.as_chunks::<16>();
                for (b, ([d, m], q)) in sc.iter().zip(qs).enumerate() {
                    let q = s.convert_u8x16_to_u32x16(cast::<[u8; 16], u8x16>(*q));
                    let lo = s.convert_i32x16_to_f32x16(cast(s.and_u32s(q, fifteen)));
                    let hi = s.convert_i32x16_to_f32x16(cast(s.shr_const_u32x16::<4>(q)));
                    let (d, m) = (s.splat_f32s(*d), s.splat_f32s(*m));
                    fma(b, s.mul_add_f32s(lo, d, m), s.mul_add_f32s(hi, d, m));
                }
            }
            Blocked::Q8_0 => {
                let (qs, _) = row.codes.as_chunks::<BLOCK>();
                for (b, (d, q)) in row.scales.iter().zip(qs).enumerate() {
                    let [q0, q1]: [i8x16; 2] = cast(*q);
                    let d = s.splat_f32s(*d);
                    let lo = s.convert_i32x16_to_f32x16(s.convert_i8x16_to_i32x16(q0));
                    let hi = s.convert_i32x16_to_f32x16(s.convert_i8x16_to_i32x16(q1));
                    fma(b, s.mul_f32s(lo, d), s.mul_f32s(hi, d));
                }
            }
        }
        std::array::from_fn(|r| s.reduce_sum_f32s(acc[r]))
    }
}

/// AVX2: eight lanes, as [`V4`]'s.
#[cfg(target_arch = "x86_64")]
impl BlockDot for V3 {
    #[inline(always)]
    fn dots<const R: usize>(self, row: &BlockRow, x: [&&[[f32; BLOCK]]; R]) -> [f32; R] {
        let s = self;
        let mut acc = [s.splat_f32s(0.0); R];
        let fifteen = s.splat_u32s(15);
        // Eight bytes into the low half of a 16-byte vector (what the widening reads).
        let low8 = |q: &[u8]| {
            let mut v = [0u8; 16];
            v[..8].copy_from_slice(&q[..8]);
            cast::<[u8; 16], u8x16>(v)
        };
        let mut fma = |b: usize, w: [f32x8; 4]| {
            for r in 0..R {
                let xs: [f32x8; 4] = cast(x[r][b]);
                for k in 0..4 {
                    acc[r] = s.mul_add_f32s(w[k], xs[k], acc[r]);
                }
            }
        };
        match row.kind {
            Blocked::Q4_1 => {
                let (sc, _) = row.scales.as_chunks::<2>();
                let (qs, _) = row.codes.as_chunks::<16>();
                for (b, ([d, m], q)) in sc.iter().zip(qs).enumerate() {
                    let (d, m) = (s.splat_f32s(*d), s.splat_f32s(*m));
                    let [a, c] = [&q[..8], &q[8..]].map(|h| s.convert_u8x16_to_u32x8(low8(h)));
                    let f = |v| s.mul_add_f32s(s.convert_i32x8_to_f32x8(cast(v)), d, m);
                    let lo = |v| f(s.and_u32s(v, fifteen));
                    let hi = |v| f(s.shr_const_u32x8::<4>(v));
                    fma(b, [lo(a), lo(c), hi(a), hi(c)]);
                }
            }
            Blocked::Q8_0 => {
                let (qs, _) = row.codes.as_chunks::<BLOCK>();
                for (b, (d, q)) in row.scales.iter().zip(qs).enumerate() {
                    let d = s.splat_f32s(*d);
                    let w = std::array::from_fn(|k| {
                        let v = cast::<u8x16, i8x16>(low8(&q[8 * k..8 * k + 8]));
                        s.mul_f32s(s.convert_i32x8_to_f32x8(s.convert_i8x16_to_i32x8(v)), d)
                    });
                    fma(b, w);
                }
            }
        }
        std::array::from_fn(|r| s.reduce_sum_f32s(acc[r]))
    }
}
