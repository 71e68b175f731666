//! `op`'s choice: each op gives exactly what the kernel it chose gives (the fused kernel where
//! it runs, the reference elsewhere), whatever the process's `--kernels` choice is.

use super::*;
use burn::tensor::{DType, Distribution, FloatDType};

fn same<const D: usize>(a: Tensor<D>, b: Tensor<D>) {
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(a.into_data(), b.into_data());
}

#[test]
fn each_op_is_its_kernel_where_it_runs_and_its_reference_elsewhere() {
    let dev = Device::default();
    dev.seed(7);
    let x = Tensor::<3>::random([2, 5, 24], Distribution::Normal(0.0, 1.0), &dev);
    let g = Tensor::<1>::random([24], Distribution::Normal(1.0, 0.1), &dev);
    let y = Tensor::<3>::random([2, 5, 24], Distribution::Normal(0.0, 1.0), &dev);
    let norm = match op::runs(Kernel::RmsNorm, &dev) {
        true => rms_norm(x.clone(), g.clone(), 1e-5),
        false => rms_norm_reference(x.clone(), g.clone(), 1e-5),
    };
    same(op::rms_norm(x.clone(), g.clone(), 1e-5), norm);
    let gate = match op::runs(Kernel::Swiglu, &dev) {
        true => swiglu(x.clone(), y.clone()),
        false => swiglu_reference(x.clone(), y.clone()),
    };
    same(op::swiglu(x.clone(), y.clone()), gate);
    // A bf16 input takes the reference (computed in f32) and keeps its dtype.
    let half = x.clone().cast(FloatDType::BF16);
    let want = rms_norm_reference(half.clone().cast(FloatDType::F32), g.clone(), 1e-5)
        .cast(FloatDType::BF16);
    let got = op::rms_norm(half, g, 1e-5);
    assert_eq!(got.dtype(), DType::BF16);
    same(got, want);
    // Products: two rows (gemv's), 70 rows (f32_matmul's or AMX's), burn's `linear` with the
    // kernels that would take them off.
    let w = Tensor::<2>::random([24, 9], Distribution::Normal(0.0, 1.0), &dev);
    for rows in [2, 70] {
        let a = Tensor::<2>::random([rows, 24], Distribution::Normal(0.0, 1.0), &dev);
        let want = if rows <= GEMV_ROWS && op::runs(Kernel::Gemv, &dev) {
            gemv(a.clone(), w.clone())
        } else if rows >= AMX_ROWS && bf16_products() {
            amx_matmul(a.clone(), w.clone())
        } else if op::runs(Kernel::Matmul, &dev) {
            f32_matmul(a.clone(), w.clone())
        } else {
            burn::tensor::module::linear(a.clone(), w.clone(), None)
        };
        same(op::linear(a, w.clone(), None), want);
    }
}

/// Attention: Ember's kernel where it runs; the decomposed form (GQA without copies, scores
/// and softmax in f32) equals the kernel's reference elsewhere.
#[test]
fn attention_takes_the_kernel_or_the_decomposed_form() {
    let dev = Device::default();
    dev.seed(11);
    let q = Tensor::<4>::random([1, 4, 3, 8], Distribution::Normal(0.0, 1.0), &dev);
    let k = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
    let v = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
    let bias = Tensor::<4>::zeros([1, 1, 3, 5], &dev);
    let got = op::attention(q.clone(), k.clone(), v.clone(), bias.clone(), false);
    let want = match op::runs(Kernel::Attention, &dev) {
        true => attention(q.clone(), k.clone(), v.clone(), bias.clone()),
        false => attention_reference(q.clone(), k.clone(), v.clone(), bias.clone()),
    };
    got.into_data()
        .assert_approx_eq::<f32>(&want.into_data(), burn::tensor::Tolerance::absolute(1e-5));
}
