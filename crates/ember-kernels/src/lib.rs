//! Ember's own kernels, added to burn through its backend extension (`#[backend_extension]`):
//! each keeps its decomposed burn-op reference beside it and a test comparing values and
//! gradients with it.
//!
//! - [`head_log_probs`]: the LM head's chosen-token log-probability and entropy, the
//!   `[rows, vocab]` logits never held whole, forward or backward (`head.rs`).
//!
//! The fused kernels run on the CPU backend (`flex`), with and without autodiff; [`fused_on`]
//! says whether a device has them, and callers take the reference elsewhere.

// Without a backend selected, the generated dispatch takes the arguments without using them.
#![cfg_attr(not(feature = "flex"), allow(unused_variables))]

mod head;

use burn::backend::Dispatch;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor};
pub use head::FusedHead;

/// The fused kernels are used (default), or the decomposed burn-op references everywhere
/// (`ember --kernels burn`, or `EMBER_KERNELS=burn`).
static ENABLED: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(UNSET);
const UNSET: u8 = 2;

/// Chooses the fused kernels (`true`) or the burn-op references for the whole process.
pub fn set_enabled(on: bool) {
    ENABLED.store(u8::from(on), std::sync::atomic::Ordering::Relaxed);
}

/// Whether the fused kernels are chosen: [`set_enabled`], else `EMBER_KERNELS` (`burn` turns
/// them off), else yes.
pub fn enabled() -> bool {
    match ENABLED.load(std::sync::atomic::Ordering::Relaxed) {
        UNSET => {
            let on = std::env::var("EMBER_KERNELS").map_or(true, |v| v.trim() != "burn");
            set_enabled(on);
            on
        }
        v => v == 1,
    }
}

/// Vocabulary columns of one chunk of the fused head for `rows` rows: the chunk's logits stay
/// under 2²² elements (16 MiB of f32), at least 256 columns wide.
pub fn head_chunk(rows: usize) -> usize {
    ((1usize << 22) / rows.max(1)).max(256)
}

/// The fused kernels run on `device` (the CPU backend, with or without autodiff).
pub fn fused_on(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    {
        matches!(
            device.clone().inner().as_dispatch(),
            burn::backend::DispatchDevice::Flex(_)
        )
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = device;
        false
    }
}

/// The log-probability of each row's target token under `softmax(h Wᵀ / temperature)` and that
/// distribution's entropy, fused: no `[rows, vocab]` tensor is held, in the forward pass or for
/// the backward pass, which recomputes the logits chunk by chunk (`head.rs`). Differentiable in
/// `h` and `w`. Runs where [`fused_on`] says so.
///
/// # Shapes
/// `h` `[rows, d]`, `w` `[vocab, d]`, `targets` `[rows]` → (`[rows]`, `[rows]`).
pub fn head_log_probs(
    h: Tensor<2>,
    w: Tensor<2>,
    targets: Tensor<1, Int>,
    temperature: f32,
) -> (Tensor<1>, Tensor<1>) {
    let [rows, d] = h.dims();
    let [vocab, dw] = w.dims();
    assert_eq!(
        d, dw,
        "head_log_probs: h is [{rows}, {d}], w is [{vocab}, {dw}]"
    );
    assert_eq!(
        targets.dims(),
        [rows],
        "head_log_probs: targets for {rows} rows"
    );
    let out = Tensor::<2>::from_dispatch(<Dispatch as FusedHead>::head_log_prob_entropy(
        h.into_dispatch(),
        w.into_dispatch(),
        targets.into_dispatch(),
        1.0 / temperature,
        head_chunk(rows),
    ));
    let lp = out.clone().slice([0..rows, 0..1]).reshape([rows]);
    (lp, out.slice([0..rows, 1..2]).reshape([rows]))
}

/// The decomposed reference of [`head_log_probs`]: the whole logits, `log_softmax`, a gather and
/// `−Σ p log p` (what `models/ember-llm`'s `chosen_log_probs` computes).
///
/// # Shapes
/// As [`head_log_probs`].
pub fn head_log_probs_reference(
    h: Tensor<2>,
    w: Tensor<2>,
    targets: Tensor<1, Int>,
    temperature: f32,
) -> (Tensor<1>, Tensor<1>) {
    let [rows, _] = h.dims();
    let logp = log_softmax(h.matmul(w.transpose()) / temperature, 1);
    let lp = logp
        .clone()
        .gather(1, targets.reshape([rows, 1]))
        .reshape([rows]);
    let ent = (logp.clone().exp() * logp).sum_dim(1).reshape([rows]).neg();
    (lp, ent)
}

#[cfg(test)]
mod tests;
