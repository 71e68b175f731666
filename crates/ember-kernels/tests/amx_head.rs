//! The fused LM head with the `amx` kernel chosen (a process of its own: the choice is
//! process-wide): its chunks' products round their inputs to bf16, so its values equal the
//! reference's on the rounded `h` and `W`, and its gradients the reference's within bf16's
//! rounding. Where the machine has no AMX tiles the head stays f32 and equals the reference.

use burn::tensor::{DType, Device, Distribution, Int, Tensor, TensorData, Tolerance};
use ember_kernels::{Kernel, amx_available, head_log_probs, head_log_probs_reference, set_kernels};

fn rounded(x: Tensor<2>) -> Tensor<2> {
    x.cast(DType::BF16).cast(DType::F32)
}

fn values(x: Tensor<1>) -> Vec<f32> {
    x.into_data().try_to_vec::<f32>().unwrap_or_default()
}

#[test]
fn the_head_under_amx_matches_the_reference_on_rounded_inputs() {
    let mut kernels = Kernel::DEFAULT.to_vec();
    kernels.push(Kernel::Amx);
    set_kernels(&kernels);
    let dev = Device::default();
    dev.seed(7);
    let (rows, vocab, d) = (96, 300, 40);
    let h0 = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), &dev);
    let w0 = Tensor::<2>::random([vocab, d], Distribution::Normal(0.0, 0.5), &dev);
    let t: Vec<i64> = (0..rows).map(|r| ((r * 37) % vocab) as i64).collect();
    let weights = Tensor::<1>::random([rows], Distribution::Uniform(-1.0, 1.0), &dev);
    let base = dev.clone().autodiff();
    let run = |fused: bool, h0: Tensor<2>, w0: Tensor<2>| {
        let h = Tensor::<2>::from_data(h0.to_data(), &base).require_grad();
        let w = Tensor::<2>::from_data(w0.to_data(), &base).require_grad();
        let targets = Tensor::<1, Int>::from_data(TensorData::from(t.as_slice()), &base);
        let (lp, ent) = match fused {
            true => head_log_probs(h.clone(), w.clone(), targets, 0.8),
            false => head_log_probs_reference(h.clone(), w.clone(), targets, 0.8),
        };
        let wts = Tensor::<1>::from_data(weights.to_data(), &base);
        let g = ((lp.clone() + ent.clone() * 0.3) * wts).sum().backward();
        let gh = h.grad(&g).unwrap().reshape([rows * d]);
        let gw = w.grad(&g).unwrap().reshape([vocab * d]);
        [lp.inner(), ent.inner(), gh, gw].map(values)
    };
    let fused = run(true, h0.clone(), w0.clone());
    let (h_ref, w_ref) = match amx_available() {
        true => (rounded(h0), rounded(w0)),
        false => (h0, w0),
    };
    let reference = run(false, h_ref, w_ref);
    for (i, (a, b)) in fused.iter().zip(&reference).enumerate() {
        // Values: only the sums' order differs. Gradients: the backward pass also rounds
        // ∂L/∂z to bf16 (8 bits of mantissa), so within 1 % of the largest gradient.
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
        let tol = if i < 2 || !amx_available() {
            1e-4
        } else {
            1e-2 * scale
        };
        TensorData::from(a.as_slice()).assert_approx_eq::<f32>(
            &TensorData::from(b.as_slice()),
            Tolerance::absolute(tol as f64),
        );
    }
}
