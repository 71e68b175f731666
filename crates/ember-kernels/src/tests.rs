use super::*;
use burn::tensor::{Distribution, TensorData, Tolerance};

fn device() -> Device {
    // The CPU backend: the tests of this crate run where the fused kernels do.
    let d = Device::default();
    assert!(
        fused_on(&d),
        "the tests need the CPU backend (the `flex` feature)"
    );
    d
}

fn close(a: Tensor<1>, b: Tensor<1>, tol: f64) {
    a.into_data()
        .assert_approx_eq::<f32>(&b.into_data(), Tolerance::absolute(tol));
}

/// Values and gradients (of `h` and `w`) against the reference, on odd shapes: vocabulary
/// chunks of uneven width, targets at chunk edges, a temperature, a loss weighting both
/// outputs.
fn check(rows: usize, vocab: usize, d: usize, chunk: usize, temperature: f32, seed: u64) {
    let dev = device();
    dev.seed(seed);
    let base = dev.clone().autodiff();
    let h0 = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.5), &dev);
    let w0 = Tensor::<2>::random([vocab, d], Distribution::Normal(0.0, 1.0), &dev);
    let t: Vec<i64> = (0..rows)
        .map(|r| ((r * 7 + chunk - 1) % vocab) as i64)
        .collect();
    let weights = Tensor::<1>::random([rows], Distribution::Uniform(-1.0, 1.0), &dev);
    let run = |fused: bool| {
        let h = Tensor::<2>::from_data(h0.to_data(), &base).require_grad();
        let w = Tensor::<2>::from_data(w0.to_data(), &base).require_grad();
        let targets = Tensor::<1, Int>::from_data(TensorData::from(t.as_slice()), &base);
        let (lp, ent) = match fused {
            true => {
                let out =
                    Tensor::<2>::from_dispatch(<Dispatch as FusedHead>::head_log_prob_entropy(
                        h.clone().into_dispatch(),
                        w.clone().into_dispatch(),
                        targets.into_dispatch(),
                        1.0 / temperature,
                        chunk,
                    ));
                let lp = out.clone().slice([0..rows, 0..1]).reshape([rows]);
                (lp, out.slice([0..rows, 1..2]).reshape([rows]))
            }
            false => head_log_probs_reference(h.clone(), w.clone(), targets, temperature),
        };
        let wts = Tensor::<1>::from_data(weights.to_data(), &base);
        let loss = (lp.clone() * wts.clone()).sum() + (ent.clone() * wts * 0.3).sum();
        let g = loss.backward();
        let gh = h.grad(&g).unwrap().reshape([rows * d]);
        let gw = w.grad(&g).unwrap().reshape([vocab * d]);
        (lp.inner(), ent.inner(), gh, gw)
    };
    let (a, b) = (run(true), run(false));
    close(a.0, b.0, 2e-4);
    close(a.1, b.1, 2e-4);
    close(a.2, b.2, 2e-4);
    close(a.3, b.3, 2e-4);
}

#[test]
fn fused_head_matches_the_reference_in_values_and_gradients() {
    check(7, 37, 5, 8, 0.7, 1);
    check(16, 64, 8, 64, 1.0, 2);
    check(3, 50, 4, 1000, 1.3, 3);
    check(9, 33, 6, 1, 1.0, 4);
}

#[test]
fn fused_head_without_autodiff_equals_the_autodiff_forward() {
    let dev = device();
    dev.seed(5);
    let h = Tensor::<2>::random([11, 6], Distribution::Normal(0.0, 2.0), &dev);
    let w = Tensor::<2>::random([29, 6], Distribution::Normal(0.0, 2.0), &dev);
    let t = Tensor::<1, Int>::from_data(
        TensorData::from([0i64, 28, 5, 6, 7, 13, 14, 27, 1, 2, 3]),
        &dev,
    );
    let (lp, ent) = head_log_probs(h.clone(), w.clone(), t.clone(), 0.9);
    let (lr, er) = head_log_probs_reference(h, w, t, 0.9);
    close(lp.clone(), lr, 1e-4);
    close(ent.clone(), er, 1e-4);
    // A distribution's entropy is between 0 and log(vocab); log-probabilities are below 0.
    let e: Vec<f32> = ent.into_data().try_to_vec::<f32>().unwrap();
    assert!(
        e.iter().all(|x| *x >= 0.0 && *x <= (29f32).ln() + 1e-4),
        "{e:?}"
    );
    let l: Vec<f32> = lp.into_data().try_to_vec::<f32>().unwrap();
    assert!(l.iter().all(|x| *x <= 1e-6), "{l:?}");
}

#[test]
fn head_chunks_keep_the_logits_small() {
    assert_eq!(head_chunk(16384), 256);
    assert_eq!(head_chunk(64), 65536);
    assert_eq!(head_chunk(0), 1 << 22);
}
