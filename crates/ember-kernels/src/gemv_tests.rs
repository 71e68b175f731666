use super::*;
use burn::tensor::{Distribution, TensorData, Tolerance};

fn device() -> Device {
    let d = Device::default();
    assert!(
        fused_on(&d),
        "the tests need the CPU backend (the `flex` feature)"
    );
    d
}

fn flat(x: Tensor<2>) -> Vec<f32> {
    x.into_data().try_to_vec::<f32>().unwrap_or_default()
}

fn close(a: Vec<f32>, b: Vec<f32>, tol: f32) {
    assert_eq!(a.len(), b.len());
    TensorData::from(a.as_slice())
        .assert_approx_eq::<f32>(&TensorData::from(b.as_slice()), Tolerance::absolute(tol));
}

/// Values and both gradients against burn's `matmul` for `[n, k] · [k, m]`, under a loss that
/// weights every output differently.
fn check(n: usize, k: usize, m: usize, seed: u64) {
    let dev = device();
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let x0 = Tensor::<2>::random([n, k], Distribution::Normal(0.0, 1.0), &dev);
    let w0 = Tensor::<2>::random([k, m], Distribution::Normal(0.0, 0.5), &dev);
    let c0 = Tensor::<2>::random([n, m], Distribution::Uniform(-1.0, 1.0), &dev);
    let run = |fused: bool| {
        let x = Tensor::<2>::from_data(x0.to_data(), &base).require_grad();
        let w = Tensor::<2>::from_data(w0.to_data(), &base).require_grad();
        let y = match fused {
            true => gemv(x.clone(), w.clone()),
            false => gemv_reference(x.clone(), w.clone()),
        };
        let loss = (y.clone() * Tensor::<2>::from_data(c0.to_data(), &base)).sum();
        let g = loss.backward();
        let (gx, gw) = (x.grad(&g).unwrap(), w.grad(&g).unwrap());
        (flat(y.inner()), flat(gx), flat(gw))
    };
    let (a, b) = (run(true), run(false));
    let tol = 1e-4 * (k as f32).sqrt();
    close(a.0, b.0, tol);
    close(a.1, b.1, tol);
    close(a.2, b.2, tol);
}

#[test]
fn gemv_matches_matmul_in_values_and_gradients() {
    // Below 2¹⁶ weights (burn's product), odd widths.
    check(1, 37, 50, 1);
    check(3, 5, 17, 2);
    // Split over the cores: a decoding step's projection, and widths that are not multiples
    // of 16.
    check(1, 576, 1536, 3);
    check(5, 300, 1001, 4);
    // Several tiles per task (8 rows: 1024 running sums a row), and more rows than GEMV_ROWS.
    check(8, 20, 4000, 5);
    check(13, 70, 1200, 6);
}

#[test]
fn gemv_by_hand_and_without_autodiff() {
    let dev = device();
    let x = Tensor::<2>::from_data(TensorData::new(vec![1f32, 2., -1., 0.5], [2, 2]), &dev);
    let w = Tensor::<2>::from_data(
        TensorData::new(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]),
        &dev,
    );
    // [1, 2]·W = [9, 12, 15]; [−1, 0.5]·W = [1, 0.5, 0].
    close(flat(gemv(x, w)), vec![9., 12., 15., 1., 0.5, 0.], 0.0);
}

#[test]
fn gemv_reads_a_transposed_weight_as_it_lies() {
    let dev = device();
    dev.seed(7);
    let x = Tensor::<2>::random([2, 300], Distribution::Normal(0.0, 1.0), &dev);
    // A `[m, k]` matrix transposed: a strided view, which the reference reads without a copy.
    let wt = Tensor::<2>::random([400, 300], Distribution::Normal(0.0, 1.0), &dev);
    let (a, b) = (
        gemv(x.clone(), wt.clone().transpose()),
        gemv_reference(x, wt.transpose()),
    );
    close(flat(a), flat(b), 1e-3);
}

#[test]
fn gemv_of_empty_inputs_is_empty_or_zero() {
    let dev = device();
    let x = Tensor::<2>::zeros([0, 4], &dev);
    let w = Tensor::<2>::ones([4, 3], &dev);
    assert_eq!(gemv(x, w).dims(), [0, 3]);
    let x = Tensor::<2>::ones([2, 0], &dev);
    let w = Tensor::<2>::ones([0, 3], &dev);
    close(flat(gemv(x, w)), vec![0.; 6], 0.0);
}

#[test]
fn the_split_product_matches_a_plain_loop_on_small_and_odd_shapes() {
    // `products` itself, below the size `gemv` hands it: one block of rows per core, summed.
    for (n, k, m) in [(1usize, 1usize, 1usize), (3, 5, 17), (2, 7, 33), (4, 3, 1)] {
        let xs: Vec<f32> = (0..n * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..k * m)
            .map(|i| ((i * 5) % 11) as f32 * 0.25 - 1.0)
            .collect();
        let mut want = vec![0f32; n * m];
        for r in 0..n {
            for j in 0..m {
                want[r * m + j] = (0..k).map(|i| xs[r * k + i] * w[i * m + j]).sum();
            }
        }
        close(crate::cpu_gemv::products(&xs, &w, [n, k, m]), want, 1e-5);
    }
}

#[test]
fn on_workers_runs_on_a_pool_worker_and_nests() {
    assert_eq!(
        rayon::current_thread_index(),
        None,
        "the test thread is not a worker"
    );
    let (index, inner) = on_workers(|| {
        (
            rayon::current_thread_index(),
            on_workers(rayon::current_thread_index),
        )
    });
    assert!(index.is_some(), "the closure ran on a worker of the pool");
    assert_eq!(inner, index, "a nested call stays on the same worker");
    assert_eq!(on_workers(|| 6 * 7), 42);
}
