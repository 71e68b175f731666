use super::*;
use burn::tensor::{Distribution, TensorData, Tolerance};

fn flat(x: Tensor<2>) -> Vec<f32> {
    x.into_data().try_to_vec::<f32>().unwrap_or_default()
}

fn close(a: Vec<f32>, b: Vec<f32>, tol: f32) {
    assert_eq!(a.len(), b.len());
    TensorData::from(a.as_slice())
        .assert_approx_eq::<f32>(&TensorData::from(b.as_slice()), Tolerance::absolute(tol));
}

/// The product the kernel should compute here: the bf16 reference where AMX runs, burn's f32
/// `matmul` where it does not.
fn expected(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    match amx_available() {
        true => amx_matmul_reference(a, b),
        false => a.matmul(b),
    }
}

/// Values and both gradients of `amx_matmul` for `[n, k] · [k, m]` under `Σ y ⊙ c` (so
/// `∂y = c`): against the rounded reference, whose gradients are the products of the rounded
/// `c` with the rounded inputs (`∂x = c · Wᵀ`, `∂W = xᵀ · c`, what the kernel's backward pass
/// computes).
fn check(n: usize, k: usize, m: usize, seed: u64) {
    let dev = Device::default();
    assert!(fused_on(&dev), "the tests need the CPU backend");
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let x0 = Tensor::<2>::random([n, k], Distribution::Normal(0.0, 1.0), &dev);
    let w0 = Tensor::<2>::random([k, m], Distribution::Normal(0.0, 0.5), &dev);
    let c0 = Tensor::<2>::random([n, m], Distribution::Uniform(-1.0, 1.0), &dev);
    let x = Tensor::<2>::from_data(x0.to_data(), &base).require_grad();
    let w = Tensor::<2>::from_data(w0.to_data(), &base).require_grad();
    let y = amx_matmul(x.clone(), w.clone());
    let loss = (y.clone() * Tensor::<2>::from_data(c0.to_data(), &base)).sum();
    let g = loss.backward();
    let (gx, gw) = (x.grad(&g).unwrap(), w.grad(&g).unwrap());
    let tol = 1e-5 * (k.max(n) as f32).sqrt() * 4.0;
    close(flat(y.inner()), flat(expected(x0.clone(), w0.clone())), tol);
    close(flat(gx), flat(expected(c0.clone(), w0.transpose())), tol);
    close(flat(gw), flat(expected(x0.transpose(), c0)), tol);
}

#[test]
fn amx_matmul_matches_the_rounded_reference_in_values_and_gradients() {
    // A training projection's shape (rows, widths of SmolLM2's), odd edges on every side, fewer
    // rows than one task takes (the columns split), one row.
    check(256, 576, 1536, 1);
    check(130, 97, 45, 2);
    check(33, 64, 300, 3);
    check(1, 5, 3, 4);
}

#[test]
fn the_reference_rounds_its_inputs_to_bf16() {
    // 1 + 2⁻⁸ rounds to 1 (ties to even) and 1 + 3·2⁻⁸ to 1 + 2⁻⁶: their product with 1 is
    // 1 and 1.015625, where the f32 product keeps every bit.
    let dev = Device::default();
    let x = Tensor::<2>::from_data([[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)]], &dev);
    let w = Tensor::<2>::from_data([[1.0, 0.0], [0.0, 1.0]], &dev);
    assert_eq!(flat(amx_matmul_reference(x, w)), vec![1.0, 1.015_625]);
}

#[test]
fn amx_is_not_among_the_default_kernels_but_can_be_named() {
    assert!(!Kernel::DEFAULT.contains(&Kernel::Amx));
    assert_eq!(parse_kernels("ember").unwrap(), Kernel::DEFAULT.to_vec());
    let mut with = Kernel::DEFAULT.to_vec();
    with.push(Kernel::Amx);
    assert_eq!(parse_kernels("ember,amx").unwrap(), with);
    assert_eq!(
        parse_kernels("amx, gemv").unwrap(),
        vec![Kernel::Amx, Kernel::Gemv]
    );
    let err = parse_kernels("ember,bf16").unwrap_err();
    assert!(
        err.contains("\"bf16\" is not a kernel") && err.contains("amx"),
        "{err}"
    );
}

/// `f32_matmul` gives burn's `matmul` bit for bit, values and both gradients (the same gemm
/// call), on a projection's shape, odd edges, one row, and transposed inputs.
#[test]
fn f32_matmul_equals_burns_product_bit_for_bit() {
    let dev = Device::default();
    assert!(fused_on(&dev), "the tests need the CPU backend");
    let base = dev.clone().autodiff();
    for (i, (n, k, m)) in [(256, 576, 1536), (130, 97, 45), (1, 5, 3)]
        .into_iter()
        .enumerate()
    {
        dev.seed(10 + i as u64);
        let x0 = Tensor::<2>::random([n, k], Distribution::Normal(0.0, 1.0), &dev);
        let w0 = Tensor::<2>::random([m, k], Distribution::Normal(0.0, 0.5), &dev);
        let c0 = Tensor::<2>::random([n, m], Distribution::Uniform(-1.0, 1.0), &dev);
        let run = |ours: bool| {
            let x = Tensor::<2>::from_data(x0.to_data(), &base).require_grad();
            let w = Tensor::<2>::from_data(w0.to_data(), &base).require_grad();
            // W as a `[out, in]` weight read transposed, as a model's head reads it.
            let y = match ours {
                true => f32_matmul(x.clone(), w.clone().transpose()),
                false => x.clone().matmul(w.clone().transpose()),
            };
            let loss = (y.clone() * Tensor::<2>::from_data(c0.to_data(), &base)).sum();
            let g = loss.backward();
            let (gx, gw) = (x.grad(&g).unwrap(), w.grad(&g).unwrap());
            (flat(y.inner()), flat(gx), flat(gw))
        };
        assert_eq!(run(true), run(false), "[{n}, {k}] · [{k}, {m}]");
    }
}
