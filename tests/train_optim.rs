//! The optimizer's gradient clipping and norm (ember_train::Optimizer) against hand-computed
//! AdamW steps.

use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use ember_train::{ClipMode, OptimizerConfig, StepReport};

#[derive(Module, Debug)]
struct Two {
    a: Param<Tensor<1>>,
    b: Param<Tensor<2>>,
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap_or_default()
}

/// One step of AdamW with ε = 1 (so that the step depends on the gradient's size) on the
/// loss 3·a₀ + 4·b₀₁, whose gradients are a: [3, 0], b: [[0, 4]] (global norm 5).
fn one_step(clip: f32, mode: ClipMode, scale: f32) -> (Vec<f32>, Vec<f32>, StepReport) {
    let device = Device::default().autodiff();
    let m = Two {
        a: Param::from_tensor(Tensor::from_floats([0.0, 0.0], &device)),
        b: Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![0.0f32, 0.0], [1, 2]),
            &device,
        )),
    };
    let ca = Tensor::<1>::from_floats([3.0 * scale, 0.0], &device);
    let cb = Tensor::<2>::from_data(TensorData::new(vec![0.0f32, 4.0], [1, 2]), &device);
    let loss = (m.a.val() * ca).sum() + (m.b.val() * cb).sum();
    let grads = GradientsParams::from_grads(loss.backward(), &m);
    let mut optim = OptimizerConfig::default()
        .with_epsilon(1.0)
        .with_grad_clip(clip)
        .with_clip_mode(mode)
        .init();
    let (m, report) = optim.step(0.1, m, grads);
    (values(m.a.val()), values(m.b.val()), report)
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

/// By hand: AdamW's first step is −lr·g/(|g| + ε) per element. Global clip at 1 scales
/// every gradient by 1/(5 + 1e-6): a₀ → 0.6, b₀₁ → 0.8, so the steps are −0.1·0.6/1.6 and
/// −0.1·0.8/1.8. Per-parameter clip at 1 makes each gradient 1: −0.1·1/2 for both. No clip:
/// −0.1·3/4 and −0.1·4/5.
#[test]
fn global_norm_clip_matches_the_hand_computed_step() {
    let c = 1.0 / (5.0 + 1e-6);
    let (a, b, report) = one_step(1.0, ClipMode::Global, 1.0);
    assert!((report.grad_norm - 5.0).abs() < 1e-6, "{report:?}");
    assert!(report.applied);
    close(&a, &[-0.1 * 3.0 * c / (3.0 * c + 1.0), 0.0]);
    close(&b, &[0.0, -0.1 * 4.0 * c / (4.0 * c + 1.0)]);

    let (a, b, report) = one_step(1.0, ClipMode::PerParameter, 1.0);
    assert!(
        (report.grad_norm - 5.0).abs() < 1e-6,
        "the norm is measured before clipping"
    );
    close(&a, &[-0.05, 0.0]);
    close(&b, &[0.0, -0.05]);

    let (a, b, _) = one_step(0.0, ClipMode::Global, 1.0);
    close(&a, &[-0.075, 0.0]);
    close(&b, &[0.0, -0.08]);

    // A bound above the norm leaves the gradients alone.
    let (a, _, _) = one_step(10.0, ClipMode::Global, 1.0);
    close(&a, &[-0.075, 0.0]);
}

/// A non-finite gradient norm skips the step: weights unchanged, `applied` false.
#[test]
fn a_non_finite_gradient_skips_the_step() {
    let (a, b, report) = one_step(1.0, ClipMode::Global, f32::INFINITY);
    assert!(!report.applied);
    assert!(!report.grad_norm.is_finite());
    close(&a, &[0.0, 0.0]);
    close(&b, &[0.0, 0.0]);
}
