//! Matrix products on Intel AMX tiles: `A·B` with both inputs rounded to bf16 (round to nearest
//! even) and every sum kept in f32 (`TDPBF16PS`, Intel SDM vol. 2, "Intel AMX instructions").
//!
//! Why this crate holds `unsafe`: AMX instructions can be reached only through inline assembly
//! (Rust's AMX intrinsics are unstable), and Linux hands a process the tiles' state only after an
//! `arch_prctl` call. Both live in `tiles.rs`, whose one kernel checks the addresses it will touch
//! before it runs; everything else here (the packing into tile layouts, the split over the
//! cores) is safe code. The crate also holds the f32 product through the gemm crate
//! ([`matmul_f32`], `gemm.rs`: one `unsafe` call, its views checked first), whose output burn
//! takes without the copy burn flex's own `matmul` makes.
//!
//! Layouts. `A` (`m × k`) is packed in panels of 32 rows; a panel holds, for each step of 32
//! along `k`, its two 16 × 32 tiles (rows 0–15, then 16–31), row-major. `B` (`k × n`) is packed
//! in panels of 32 columns; a panel holds, for each step of 32 along `k`, its two tiles (columns
//! 0–15, then 16–31) in the pair-interleaved layout `TDPBF16PS` reads: tile row `p`, column `j`,
//! element `e` is `B[2p + e][j]`. Rows, columns and steps past the matrix are zeros. A `B` that
//! many products share (a frozen weight) can be packed once ([`PackedB`], [`matmul_packed`]).
//!
//! Here: the strided views (`Matrix`: a transpose is a view), the packing in vectorised passes
//! (pulp's run-time dispatch), the output split over rayon's pool by blocks of rows (of columns
//! for few rows), and `available` (the CPU's AMX-BF16 and Linux's grant of the tile state).
//! `tiles` holds `cpuid`, `arch_prctl` and the micro-kernel; `gemm` the f32 product. The tests
//! compare every layout with an f64 product of the rounded (for `matmul_f32`, unrounded) inputs.

mod gemm;
mod tiles;

use rayon::prelude::*;
use tiles::TILE;

/// A strided view of an f32 matrix: element `(r, c)` is `data[offset + r·row_stride +
/// c·col_stride]` (a transposed matrix is a view with its strides swapped).
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    /// The elements the view reads.
    pub data: &'a [f32],
    /// The index of element `(0, 0)`.
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements between consecutive rows.
    pub row_stride: usize,
    /// Elements between consecutive columns.
    pub col_stride: usize,
}

impl<'a> Matrix<'a> {
    /// A row-major `rows × cols` matrix held whole in `data`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            offset: 0,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The same elements read as the transpose.
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Whether every element of the view lies within `data`.
    fn in_bounds(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let last = (self.rows - 1)
            .checked_mul(self.row_stride)
            .zip((self.cols - 1).checked_mul(self.col_stride))
            .and_then(|(r, c)| r.checked_add(c))
            .and_then(|i| i.checked_add(self.offset));
        last.is_some_and(|i| i < self.data.len())
    }
}

/// Why [`matmul`] did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmxError {
    /// The CPU lacks AMX-BF16 or the operating system did not grant the tile state.
    #[error("AMX bf16 tiles are not available to this process")]
    Unavailable,
    /// `A`'s columns differ from `B`'s rows.
    #[error("matmul: A is {0} × {1}, B is {2} × {3}")]
    Shapes(usize, usize, usize, usize),
    /// A view reaches past its data.
    #[error("matmul: a view reaches past the end of its {0} elements")]
    OutOfBounds(usize),
}

/// Whether [`matmul`] runs on this machine: the CPU has AMX-BF16 and the operating system
/// granted the tile state.
pub fn available() -> bool {
    tiles::granted()
}

/// Rows of `A` one task takes (four panels): its packed rows stay in the second-level cache
/// while the task walks `B`'s panels.
const TASK_ROWS: usize = 128;

/// `A·B`, row-major `m × n`, with `A` and `B` rounded to bf16 and the sums kept in f32.
///
/// # Errors
/// AMX unavailable ([`available`]), `A`'s columns differing from `B`'s rows, or a view that
/// reaches past its data.
pub fn matmul(a: Matrix<'_>, b: Matrix<'_>) -> Result<Vec<f32>, AmxError> {
    if !b.in_bounds() {
        return Err(AmxError::OutOfBounds(b.data.len()));
    }
    let mut c = output(&a, b.rows, b.cols)?;
    if !c.is_empty() && a.cols > 0 {
        let steps = a.cols.div_ceil(32);
        let (pa, pb) = rayon::join(|| pack_a(&a, steps), || pack_b(&b, steps));
        multiply(
            Panels {
                a: &pa,
                b: &pb,
                steps,
            },
            [a.rows, b.cols],
            &mut c,
        );
    }
    Ok(c)
}

/// `A·B` in f32, row-major `m × n`, its sums in the order burn flex's `matmul` takes (the same
/// gemm crate call, `gemm.rs`), into a `Vec` burn takes as it is: burn flex allocates its
/// product's output with `vec![0u8; n]` and copies it once into a 16-byte-aligned buffer
/// (`FlexTensor::empty`), a pass over the whole output before the product starts.
///
/// # Errors
/// `A`'s columns differing from `B`'s rows, or a view that reaches past its data (or whose
/// strides do not fit in `isize`).
pub fn matmul_f32(a: Matrix<'_>, b: Matrix<'_>) -> Result<Vec<f32>, AmxError> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if k != b.rows {
        return Err(AmxError::Shapes(m, k, b.rows, n));
    }
    for v in [&a, &b] {
        if !v.in_bounds() {
            return Err(AmxError::OutOfBounds(v.data.len()));
        }
    }
    let mut c = vec![0f32; m.checked_mul(n).ok_or(AmxError::OutOfBounds(0))?];
    if c.is_empty() || k == 0 {
        return Ok(c);
    }
    let (sa, sb) = (strided(&a)?, strided(&b)?);
    if isize::try_from(m.max(n).max(k)).is_err() {
        return Err(AmxError::OutOfBounds(0));
    }
    gemm::product([m, k, n], sa, sb, &mut c);
    Ok(c)
}

/// `v` as the gemm call reads it: its elements from `(0, 0)` on and its strides as `isize`.
fn strided<'a>(v: &Matrix<'a>) -> Result<gemm::Strided<'a>, AmxError> {
    let s = |x: usize| isize::try_from(x).map_err(|_| AmxError::OutOfBounds(v.data.len()));
    Ok(gemm::Strided {
        data: &v.data[v.offset..],
        row: s(v.row_stride)?,
        col: s(v.col_stride)?,
    })
}

/// The zeroed `m × n` output of `A` times a `k × n` `B`, after checking that the shapes agree,
/// that `A` lies within its data and, where there is work, that AMX is available.
fn output(a: &Matrix<'_>, k: usize, n: usize) -> Result<Vec<f32>, AmxError> {
    if a.cols != k {
        return Err(AmxError::Shapes(a.rows, a.cols, k, n));
    }
    if !a.in_bounds() {
        return Err(AmxError::OutOfBounds(a.data.len()));
    }
    let c = vec![0f32; a.rows.checked_mul(n).ok_or(AmxError::OutOfBounds(0))?];
    if !c.is_empty() && k > 0 && !available() {
        return Err(AmxError::Unavailable);
    }
    Ok(c)
}

/// `A` and `B` packed into panels of 32 (the crate's layouts), `steps` tile pairs per panel.
#[derive(Clone, Copy)]
struct Panels<'a> {
    a: &'a [u16],
    b: &'a [u32],
    steps: usize,
}

/// `c` (`m × n`, zeroed) = the product of the packed `panels`: by blocks of rows over the cores
/// where there are enough rows, else by blocks of columns.
fn multiply(panels: Panels<'_>, [m, n]: [usize; 2], c: &mut [f32]) {
    let row_tasks = m.div_ceil(TASK_ROWS);
    if row_tasks >= rayon::current_num_threads() {
        c.par_chunks_mut(TASK_ROWS * n)
            .enumerate()
            .for_each(|(t, rows)| products(panels, t * TASK_ROWS, n, rows, 0..n));
    } else {
        columns_split(panels, [m, n], c);
    }
}

/// `B` (`k × n`) rounded to bf16 and packed once into the tiles' layout (the crate's `B`
/// layout), for [`matmul_packed`] to read again and again: a frozen weight that every decoding
/// step multiplies, packed once instead of at every product.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedB {
    rows: usize,
    cols: usize,
    data: Vec<u32>,
}

impl PackedB {
    /// `b` rounded to bf16 and packed (no AMX needed: packing is ordinary code).
    ///
    /// # Errors
    /// A view that reaches past its data, or a size that overflows.
    pub fn new(b: Matrix<'_>) -> Result<Self, AmxError> {
        if !b.in_bounds() {
            return Err(AmxError::OutOfBounds(b.data.len()));
        }
        b.cols
            .div_ceil(32)
            .checked_mul(b.rows.div_ceil(32))
            .and_then(|n| n.checked_mul(TILE))
            .ok_or(AmxError::OutOfBounds(b.data.len()))?;
        let empty = b.rows == 0 || b.cols == 0;
        Ok(Self {
            rows: b.rows,
            cols: b.cols,
            data: match empty {
                true => Vec::new(),
                false => pack_b(&b, b.rows.div_ceil(32)),
            },
        })
    }

    /// Rows (`k`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (`n`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// The matrix as held (the bf16 values, widened), row-major `k × n`.
    pub fn unpack(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        let panel = self.rows.div_ceil(32) * TILE;
        for (p, src) in self.data.chunks_exact(panel.max(1)).enumerate() {
            for (t, tile) in src.chunks_exact(TILE / 2).enumerate() {
                let (r0, c0) = (t / 2 * 32, p * 32 + t % 2 * 16);
                for (pr, pairs) in tile.chunks_exact(16).enumerate() {
                    for (j, &pair) in pairs.iter().enumerate() {
                        let (r, c) = (r0 + 2 * pr, c0 + j);
                        for (e, bits) in [(0, pair & 0xffff), (1, pair >> 16)] {
                            if r + e < self.rows && c < self.cols {
                                out[(r + e) * self.cols + c] = f32::from_bits(bits << 16);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Element `(r, c)` as held (the bf16 value, widened), or `None` outside the matrix.
    pub fn get(&self, r: usize, c: usize) -> Option<f32> {
        if r >= self.rows || c >= self.cols {
            return None;
        }
        let panel = self.rows.div_ceil(32) * TILE;
        let pair = self.data[c / 32 * panel + b_index(r, c % 32)];
        let bits = if r.is_multiple_of(2) {
            pair & 0xffff
        } else {
            pair >> 16
        };
        Some(f32::from_bits(bits << 16))
    }
}

/// `A·B` with `B` packed beforehand ([`PackedB`]), row-major `m × n`; `A` is rounded to bf16
/// and the sums kept in f32, as in [`matmul`], whose result this equals.
///
/// # Errors
/// As [`matmul`].
pub fn matmul_packed(a: Matrix<'_>, b: &PackedB) -> Result<Vec<f32>, AmxError> {
    let mut c = output(&a, b.rows, b.cols)?;
    if !c.is_empty() && a.cols > 0 {
        let steps = a.cols.div_ceil(32);
        let pa = pack_a(&a, steps);
        let panels = Panels {
            a: &pa,
            b: &b.data,
            steps,
        };
        multiply(panels, [a.rows, b.cols], &mut c);
    }
    Ok(c)
}

/// `A·B` for few rows: the columns split over the cores, each task writing its own block, then
/// copied into `c` (`m · n` copies, small beside the `m · n · k` multiply-adds).
fn columns_split(panels: Panels<'_>, [m, n]: [usize; 2], c: &mut [f32]) {
    let column_panels = n.div_ceil(32);
    let per = column_panels
        .div_ceil(rayon::current_num_threads().max(1))
        .max(1);
    let parts: Vec<(usize, Vec<f32>)> = (0..column_panels.div_ceil(per))
        .into_par_iter()
        .map(|t| {
            let cols = t * per * 32..((t + 1) * per * 32).min(n);
            let mut out = vec![0f32; m * cols.len()];
            for r0 in (0..m).step_by(TASK_ROWS) {
                let rows = &mut out[r0 * cols.len()..(r0 + TASK_ROWS).min(m) * cols.len()];
                products(panels, r0, cols.len(), rows, cols.clone());
            }
            (cols.start, out)
        })
        .collect();
    for (c0, part) in parts {
        let w = part.len() / m;
        for (row, src) in c.chunks_exact_mut(n).zip(part.chunks_exact(w)) {
            row[c0..c0 + w].copy_from_slice(src);
        }
    }
}

/// Rows `r0 ..` of `A·B` (as many as `out` holds, `width` to a row) for `B`'s columns `cols`,
/// which `out`'s rows hold from their first element: `B`'s panels in the outer loop, so each
/// stays in the first-level cache while the task's row panels pass under it.
fn products(
    Panels {
        a: pa,
        b: pb,
        steps,
    }: Panels<'_>,
    r0: usize,
    width: usize,
    out: &mut [f32],
    cols: std::ops::Range<usize>,
) {
    let panel = steps * 2 * TILE;
    let rows = out.len() / width;
    let mut edge = [0f32; 32 * 32];
    let full = rows / 32;
    for j0 in cols.clone().step_by(32) {
        let b = &pb[j0 / 32 * panel / 2..][..panel / 2];
        let w = 32.min(cols.end - j0);
        let a = &pa[r0 / 32 * panel..];
        let at = j0 - cols.start;
        let done = if w == 32 && full > 0 {
            tiles::blocks(a, b, steps, full, &mut out[at..], width);
            full * 32
        } else {
            0
        };
        for i0 in (done..rows).step_by(32) {
            let h = 32.min(rows - i0);
            tiles::blocks(&a[i0 / 32 * panel..], b, steps, 1, &mut edge, 32);
            for r in 0..h {
                out[at + (i0 + r) * width..][..w].copy_from_slice(&edge[r * 32..][..w]);
            }
        }
    }
}

/// `x` rounded to the nearest bf16, ties to even (a NaN stays a NaN).
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        ((b >> 16) as u16) | 0x40
    } else {
        rounded
    }
}

/// Runs `f` compiled for the widest vectors the CPU has (`pulp`'s runtime dispatch); `f` must
/// be a closure marked `#[inline(always)]`.
#[inline(always)]
fn simd<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}

/// `A` in panels of 32 rows (the crate's layout), `steps` tile pairs per panel.
fn pack_a(a: &Matrix<'_>, steps: usize) -> Vec<u16> {
    let panel = steps * 2 * TILE;
    let mut out = vec![0u16; a.rows.div_ceil(32) * panel];
    out.par_chunks_mut(panel).enumerate().for_each(|(p, dst)| {
        let rows = p * 32..(p * 32 + 32).min(a.rows);
        simd(
            #[inline(always)]
            || match (a.col_stride, a.row_stride) {
                (1, _) => pack_a_rows(a, rows, dst),
                (_, 1) => pack_a_cols(a, rows, dst),
                _ => pack_a_any(a, rows, dst),
            },
        )
    });
    out
}

/// [`pack_a`]'s panel of `rows` when each row lies contiguous: 32 conversions a step.
#[inline(always)]
fn pack_a_rows(a: &Matrix<'_>, rows: std::ops::Range<usize>, dst: &mut [u16]) {
    for (r, row) in rows.clone().enumerate() {
        let src = &a.data[a.offset + row * a.row_stride..][..a.cols];
        for (s, chunk) in src.chunks(32).enumerate() {
            let d = &mut dst[(s * 2 + r / 16) * TILE + (r % 16) * 32..][..32];
            for (x, &v) in d.iter_mut().zip(chunk) {
                *x = bf16_bits(v);
            }
        }
    }
}

/// [`pack_a`]'s panel of `rows` when each column lies contiguous (a transposed matrix): a step's
/// 32 columns are converted where they lie (32 contiguous elements each), then transposed into
/// the tiles' rows.
#[inline(always)]
fn pack_a_cols(a: &Matrix<'_>, rows: std::ops::Range<usize>, dst: &mut [u16]) {
    let mut block = [[0u16; 32]; 32];
    for s in 0..a.cols.div_ceil(32) {
        let cols = s * 32..(s * 32 + 32).min(a.cols);
        for (c, b) in cols.clone().zip(block.iter_mut()) {
            let src = &a.data[a.offset + c * a.col_stride + rows.start..][..rows.len()];
            convert(src, b);
        }
        for r in 0..rows.len() {
            let d = &mut dst[(s * 2 + r / 16) * TILE + (r % 16) * 32..][..cols.len()];
            for (x, b) in d.iter_mut().zip(&block) {
                *x = b[r];
            }
        }
    }
}

/// `src` rounded to bf16 into `dst`'s first elements.
#[inline(always)]
fn convert(src: &[f32], dst: &mut [u16]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = bf16_bits(v);
    }
}

/// [`pack_a`]'s panel of `rows` for any strides.
#[inline(always)]
fn pack_a_any(a: &Matrix<'_>, rows: std::ops::Range<usize>, dst: &mut [u16]) {
    for (r, row) in rows.enumerate() {
        for c in 0..a.cols {
            let v = a.data[a.offset + row * a.row_stride + c * a.col_stride];
            dst[(c / 32 * 2 + r / 16) * TILE + (r % 16) * 32 + c % 32] = bf16_bits(v);
        }
    }
}

/// `B` in panels of 32 columns (the crate's pair-interleaved layout), `steps` tile pairs per
/// panel; each `u32` holds one pair, its first element in the low half.
fn pack_b(b: &Matrix<'_>, steps: usize) -> Vec<u32> {
    let panel = steps * TILE;
    let mut out = vec![0u32; b.cols.div_ceil(32) * panel];
    out.par_chunks_mut(panel).enumerate().for_each(|(p, dst)| {
        let cols = p * 32..(p * 32 + 32).min(b.cols);
        simd(
            #[inline(always)]
            || match (b.col_stride, b.row_stride) {
                (1, _) => pack_b_rows(b, cols, dst),
                (_, 1) => pack_b_cols(b, cols, dst),
                _ => pack_b_any(b, cols, dst),
            },
        )
    });
    out
}

/// Where the pair holding `B[kk][j]` of a panel goes (in `u32`s): step, pair of rows, column.
#[inline(always)]
fn b_index(kk: usize, j: usize) -> usize {
    (kk / 32 * 2 + j / 16) * (TILE / 2) + (kk % 32) / 2 * 16 + j % 16
}

/// Two bf16 as one pair: `lo` in the low half.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) as u32 | (bf16_bits(hi) as u32) << 16
}

/// [`pack_b`]'s panel of `cols` when each row lies contiguous: two rows at a time.
#[inline(always)]
fn pack_b_rows(b: &Matrix<'_>, cols: std::ops::Range<usize>, dst: &mut [u32]) {
    let row = |kk: usize| &b.data[b.offset + kk * b.row_stride + cols.start..][..cols.len()];
    let zeros = [0f32; 32];
    for kk in (0..b.rows).step_by(2) {
        let r0 = row(kk);
        let r1 = if kk + 1 < b.rows {
            row(kk + 1)
        } else {
            &zeros[..cols.len()]
        };
        for half in 0..cols.len().div_ceil(16) {
            let j = half * 16..(half * 16 + 16).min(cols.len());
            let d = &mut dst[b_index(kk, half * 16)..][..j.len()];
            for ((x, &lo), &hi) in d.iter_mut().zip(&r0[j.clone()]).zip(&r1[j]) {
                *x = pair(lo, hi);
            }
        }
    }
}

/// [`pack_b`]'s panel of `cols` when each column lies contiguous (a transposed matrix): a step
/// of each column is converted where it lies (its 32 elements are the tile's 16 pairs for that
/// column), then the pairs are transposed into the tiles' rows.
#[inline(always)]
fn pack_b_cols(b: &Matrix<'_>, cols: std::ops::Range<usize>, dst: &mut [u32]) {
    let mut block = [[0u16; 32]; 32];
    for s in 0..b.rows.div_ceil(32) {
        let ks = s * 32..(s * 32 + 32).min(b.rows);
        for (col, blk) in cols.clone().zip(block.iter_mut()) {
            blk.fill(0);
            convert(
                &b.data[b.offset + col * b.col_stride + ks.start..][..ks.len()],
                blk,
            );
        }
        for half in 0..cols.len().div_ceil(16) {
            let tile = &mut dst[(s * 2 + half) * (TILE / 2)..][..TILE / 2];
            let j = half * 16..(half * 16 + 16).min(cols.len());
            for (p, row) in tile.chunks_exact_mut(16).enumerate() {
                for (x, blk) in row.iter_mut().zip(&block[j.clone()]) {
                    *x = blk[2 * p] as u32 | (blk[2 * p + 1] as u32) << 16;
                }
            }
        }
    }
}

/// [`pack_b`]'s panel of `cols` for any strides.
#[inline(always)]
fn pack_b_any(b: &Matrix<'_>, cols: std::ops::Range<usize>, dst: &mut [u32]) {
    let at = |kk: usize, col: usize| b.data[b.offset + kk * b.row_stride + col * b.col_stride];
    for (j, col) in cols.enumerate() {
        for kk in (0..b.rows).step_by(2) {
            let hi = if kk + 1 < b.rows {
                at(kk + 1, col)
            } else {
                0.0
            };
            dst[b_index(kk, j)] = pair(at(kk, col), hi);
        }
    }
}

#[cfg(test)]
mod tests;
