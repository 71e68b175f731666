//! CubeCL kernels (one source for wgpu, CUDA and every CubeCL runtime), f32: SwiGLU's gate and
//! its two gradients in one pass each (`swiglu.rs`), RMSNorm's forward (the output and each
//! row's `r`) and its input gradient in one pass over each row (`rms_norm.rs`), the rotary
//! embedding and its input gradient in one pass each (`rope.rs`). A row is one cube: its units
//! stride over the row's columns and sum through shared memory in a tree.
//! The references are the decomposed burn-op passes beside each extension; `tests/wgpu_smoke`
//! compares values and gradients on lavapipe.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{DType, Shape};
use burn_cubecl::{
    CubeBackend, kernel::into_contiguous, ops::numeric::empty_device_dtype, tensor::CubeTensor,
};
use cubecl::prelude::*;

/// Units a cube runs (elementwise kernels, and a row's units for the row kernels).
const UNITS: u32 = 256;
/// Cubes along the first grid axis: rows beyond it go to the second (grids are at most 65 535
/// cubes wide on every runtime).
const GRID_X: usize = 65_535;

/// `σ(g) = 1 / (1 + e^{−g})`.
#[cube]
fn sigmoid<F: Float>(g: F) -> F {
    F::new(1.0) / (F::new(1.0) + F::exp(-g))
}

/// `out = g · σ(g) · u`, one unit per element.
#[cube(launch)]
fn swiglu_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    out: &mut Tensor<F>,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i < out.len() {
        let g = gate[i];
        out[i] = g * sigmoid::<F>(g) * up[i];
    }
}

/// `∂g = dy · u · σ(g) · (1 + g (1 − σ(g)))`, `∂u = dy · g · σ(g)`, one unit per element.
#[cube(launch)]
fn swiglu_grad_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    dy: &Tensor<F>,
    dg: &mut Tensor<F>,
    du: &mut Tensor<F>,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i < dg.len() {
        let g = gate[i];
        let d = dy[i];
        let s = sigmoid::<F>(g);
        du[i] = d * g * s;
        dg[i] = d * up[i] * s * (F::new(1.0) + g * (F::new(1.0) - s));
    }
}

/// The cube's row (rows beyond the grid's first axis on its second).
#[cube]
fn row_of() -> usize {
    CUBE_POS_Y as usize * CUBE_COUNT_X as usize + CUBE_POS_X as usize
}

/// The sum of every unit's `part` over the cube, through the shared `sums` (one slot a unit;
/// the cube's size a power of two), as every unit sees it.
#[cube]
fn cube_sum<F: Float>(sums: &mut Shared<[F]>, part: F) -> F {
    let u = UNIT_POS_X as usize;
    sums[u] = part;
    sync_cube();
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if u < stride {
            let other = sums[u + stride];
            sums[u] += other;
        }
        sync_cube();
        stride /= 2;
    }
    let total = sums[0];
    sync_cube();
    total
}

/// `Σ_c a[base + c] · b[base + c]` over the row of `a`'s width starting at `base` (times `w[c]`
/// when `weighted`), the cube's units striding over the columns, as every unit sees it.
#[cube]
fn row_dot<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    w: &Tensor<F>,
    base: usize,
    #[comptime] units: usize,
    #[comptime] weighted: bool,
) -> F {
    let d = a.shape(1);
    let mut acc = F::new(0.0);
    let mut c = UNIT_POS_X as usize;
    while c < d {
        let mut v = a[base + c] * b[base + c];
        if weighted {
            v *= w[c];
        }
        acc += v;
        c += units;
    }
    let mut sums = Shared::new_slice(units);
    cube_sum::<F>(&mut sums, acc)
}

/// RMSNorm of each row of `x` `[rows, d]`: `r = 1/√(Σx²/d + ε)`, `y = x · r · γ`.
#[cube(launch)]
fn rms_norm_kernel<F: Float>(
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    y: &mut Tensor<F>,
    r: &mut Tensor<F>,
    eps: f32,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = row_of();
    let d = x.shape(1);
    if row >= x.shape(0) {
        terminate!();
    }
    let base = row * d;
    let ms = row_dot::<F>(x, x, gamma, base, units, false) / F::cast_from(d);
    let rr = F::new(1.0) / F::sqrt(ms + F::cast_from(eps));
    let mut k = UNIT_POS_X as usize;
    while k < d {
        y[base + k] = x[base + k] * rr * gamma[k];
        k += units;
    }
    if UNIT_POS_X == 0 {
        r[row] = rr;
    }
}

/// RMSNorm's input gradient per row: with `gy = dy ∘ γ`, `∂x = r · gy − x · r³ · Σ(x ∘ gy) / d`.
#[cube(launch)]
fn rms_norm_dx_kernel<F: Float>(
    x: &Tensor<F>,
    gamma: &Tensor<F>,
    r: &Tensor<F>,
    dy: &Tensor<F>,
    dx: &mut Tensor<F>,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = row_of();
    let d = x.shape(1);
    if row >= x.shape(0) {
        terminate!();
    }
    let base = row * d;
    let rr = r[row];
    let scale = rr * rr * rr * row_dot::<F>(x, dy, gamma, base, units, true) / F::cast_from(d);
    let mut k = UNIT_POS_X as usize;
    while k < d {
        dx[base + k] = rr * dy[base + k] * gamma[k] - x[base + k] * scale;
        k += units;
    }
}

/// Rotary embedding (rotate-half) of `x` `[b, heads, t, d]` (read through its strides: the
/// model's heads are a transposed view) with the contiguous tables `cos`, `sin` `[b, 1, t, d]`
/// (`sin` signed: `[−sin, sin]`) into the contiguous `y`, one unit per element, `j` the column
/// half a row away: forward `y[i] = x[i]·cos[i] + x[j]·sin[i]`; backward (`x` the output's
/// gradient) `y[i] = x[i]·cos[i] + x[j]·sin[j]`.
#[cube(launch)]
fn rope_kernel<F: Float>(
    x: &Tensor<F>,
    cos: &Tensor<F>,
    sin: &Tensor<F>,
    y: &mut Tensor<F>,
    #[comptime] backward: bool,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i < y.len() {
        let heads = y.shape(1);
        let t = y.shape(2);
        let d = y.shape(3);
        let col = i % d;
        let pos = (i / d) % t;
        let head = (i / (d * t)) % heads;
        let seq = i / (d * t * heads);
        let table = (seq * t + pos) * d;
        let partner = (col + d / 2) % d;
        let row = seq * x.stride(0) + head * x.stride(1) + pos * x.stride(2);
        let own = x[row + col * x.stride(3)];
        let other = x[row + partner * x.stride(3)];
        if backward {
            y[i] = own * cos[table + col] + other * sin[table + partner];
        } else {
            y[i] = own * cos[table + col] + other * sin[table + col];
        }
    }
}

/// Whether every tensor is f32 (the kernels' one dtype; others take the references).
pub(crate) fn all_f32(ts: &[&CubeTensor]) -> bool {
    ts.iter().all(|t| t.dtype == DType::F32)
}

/// An empty tensor of `shape` on `like`'s device, in its dtype.
fn empty(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

/// One unit per element of `n`: the cube count and size.
fn elementwise(n: usize) -> (CubeCount, CubeDim) {
    let cubes = n.div_ceil(UNITS as usize).max(1);
    let (x, y) = (cubes.min(GRID_X), cubes.div_ceil(GRID_X));
    (
        CubeCount::Static(x as u32, y as u32, 1),
        CubeDim::new_1d(UNITS),
    )
}

/// One cube per row of `rows`, and a power of two of units for rows of `d` columns (32 to
/// [`UNITS`]).
fn per_row(rows: usize, d: usize) -> (CubeCount, CubeDim, usize) {
    let units = d.next_power_of_two().clamp(32, UNITS as usize);
    let (x, y) = (rows.clamp(1, GRID_X), rows.div_ceil(GRID_X).max(1));
    (
        CubeCount::Static(x as u32, y as u32, 1),
        CubeDim::new_1d(units as u32),
        units,
    )
}

/// `silu(gate) · up` (f32, one shape).
pub(crate) fn swiglu(gate: CubeTensor, up: CubeTensor) -> CubeTensor {
    let (gate, up) = (into_contiguous(gate), into_contiguous(up));
    let out = empty(&gate, gate.shape());
    let (count, dim) = elementwise(gate.shape().num_elements());
    let dt = dtype_to_storage_type(gate.dtype);
    swiglu_kernel::launch(
        &gate.client.clone(),
        count,
        dim,
        gate.into_tensor_arg(),
        up.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        dt,
    );
    out
}

/// `(∂gate, ∂up)` of [`swiglu`] from the output's gradient `dy`.
pub(crate) fn swiglu_grad(
    gate: CubeTensor,
    up: CubeTensor,
    dy: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let [gate, up, dy] = [gate, up, dy].map(into_contiguous);
    let (dg, du) = (empty(&gate, gate.shape()), empty(&gate, gate.shape()));
    let (count, dim) = elementwise(gate.shape().num_elements());
    let dt = dtype_to_storage_type(gate.dtype);
    swiglu_grad_kernel::launch(
        &gate.client.clone(),
        count,
        dim,
        gate.into_tensor_arg(),
        up.into_tensor_arg(),
        dy.into_tensor_arg(),
        dg.clone().into_tensor_arg(),
        du.clone().into_tensor_arg(),
        dt,
    );
    (dg, du)
}

/// `(y, r)`: RMSNorm of `x` `[rows, d]` with `γ` `[d]`, and each row's `r` `[rows, 1]`.
pub(crate) fn rms_norm(x: CubeTensor, gamma: CubeTensor, eps: f32) -> (CubeTensor, CubeTensor) {
    let (x, gamma) = (into_contiguous(x), into_contiguous(gamma));
    let [rows, d] = [x.shape()[0], x.shape()[1]];
    let (y, r) = (empty(&x, x.shape()), empty(&x, Shape::new([rows, 1])));
    let (count, dim, units) = per_row(rows, d);
    let dt = dtype_to_storage_type(x.dtype);
    rms_norm_kernel::launch(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        gamma.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        r.clone().into_tensor_arg(),
        eps,
        units,
        dt,
    );
    (y, r)
}

/// `(∂x, ∂γ)` of [`rms_norm`] from the output's gradient `dy` and the saved `r`: `∂x` by the
/// row kernel, `∂γ = Σ_rows dy ∘ x · r` by burn's CubeCL ops (a sum over rows).
pub(crate) fn rms_norm_grad(
    x: CubeTensor,
    gamma: CubeTensor,
    r: CubeTensor,
    dy: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let [x, gamma, r, dy] = [x, gamma, r, dy].map(into_contiguous);
    let [rows, d] = [x.shape()[0], x.shape()[1]];
    let dx = empty(&x, x.shape());
    let (count, dim, units) = per_row(rows, d);
    rms_norm_dx_kernel::launch(
        &x.client.clone(),
        count,
        dim,
        x.clone().into_tensor_arg(),
        gamma.into_tensor_arg(),
        r.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        units,
        dtype_to_storage_type(x.dtype),
    );
    type C = CubeBackend;
    let dgamma = C::float_sum_dim(C::float_mul(C::float_mul(dy, x), r), 0);
    (dx, C::float_reshape(dgamma, Shape::new([d])))
}

/// The rotary embedding of `x` `[b, heads, t, d]` with the tables `[b, 1, t, d]`, or with
/// `backward` the gradient of its input from the output's gradient `x`.
pub(crate) fn rope(x: CubeTensor, cos: CubeTensor, sin: CubeTensor, backward: bool) -> CubeTensor {
    let (cos, sin) = (into_contiguous(cos), into_contiguous(sin));
    let y = empty(&x, x.shape());
    let (count, dim) = elementwise(x.shape().num_elements());
    let dt = dtype_to_storage_type(x.dtype);
    rope_kernel::launch(
        &x.client.clone(),
        count,
        dim,
        x.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        backward,
        dt,
    );
    y
}
