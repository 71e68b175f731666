//! The f32 product through the gemm crate, called exactly as burn flex's 2-D `matmul` calls it
//! (same crate and version, same strides, `alpha = 0`, `beta = 1`, all cores from 192³
//! multiply-adds up), so that its sums are burn's bit for bit. The checks live with the public
//! [`crate::matmul_f32`]; this module holds the one `unsafe` call.

/// Multiply-adds from which burn flex splits a product over the cores (its
/// `PARALLEL_THRESHOLD`).
const PARALLEL_FROM: usize = 192 * 192 * 192;

/// A strided operand: element `(r, c)` at `data[r·row + c·col]`.
pub(crate) struct Strided<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) row: isize,
    pub(crate) col: isize,
}

/// `c = a · b` for `a` `m × k`, `b` `k × n`, `c` row-major `m × n`.
///
/// The caller guarantees that every element `r·row + c·col` of each operand (`r`, `c` within
/// its shape) lies within its `data`, that `c` holds `m·n` elements, and that `m`, `n`, `k` are
/// at least 1 and fit in `isize`.
pub(crate) fn product([m, k, n]: [usize; 3], a: Strided<'_>, b: Strided<'_>, c: &mut [f32]) {
    assert!(
        c.len() >= m * n && m * n * k > 0,
        "gemm: the caller's checks"
    );
    let parallelism = match m.saturating_mul(n).saturating_mul(k) >= PARALLEL_FROM {
        true => gemm::Parallelism::Rayon(0),
        false => gemm::Parallelism::None,
    };
    // SAFETY: the caller guarantees (see above) that every element the product reads lies
    // within `a.data` and `b.data`, and `c` holds the `m·n` elements written at `i·n + j`; the
    // slices outlive the call and `c` is borrowed mutably, so nothing aliases it. The gemm crate
    // writes `dst` without reading it when `read_dst` is false.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.data.as_ptr(),
            a.col,
            a.row,
            b.data.as_ptr(),
            b.col,
            b.row,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}
