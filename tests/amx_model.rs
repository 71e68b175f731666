//! The model with the `amx` kernel chosen (a process of its own: the choice is process-wide):
//! its many-row products round their inputs to bf16 (`ember_kernels::amx_matmul`), so its logits
//! differ from the f32 model's by bf16's rounding and no more, tied head or not. Where the
//! machine has no AMX tiles the two are the same model. Weights kept as BF16 (packed once for
//! the tiles) serve every product under `amx`, decoding steps included, and none without it.

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_kernels::{Kernel, QuantKind};
use ember_llm::{Family, LlamaConfig};
use std::sync::Mutex;

/// The kernel choice is process-wide: one test at a time sets it.
static KERNELS: Mutex<()> = Mutex::new(());

/// The default kernels plus `amx`.
fn with_amx() -> Vec<Kernel> {
    let mut with = Kernel::DEFAULT.to_vec();
    with.push(Kernel::Amx);
    with
}

/// The largest difference between `a` and `b`, and the largest magnitude in `a`.
fn gap(a: &[f32], b: &[f32]) -> (f32, f32) {
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    (max_abs_diff(a, b), scale)
}

#[test]
fn amx_products_keep_the_logits_within_bf16_rounding() {
    let _one = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let d = dev();
    for tied in [true, false] {
        d.seed(3);
        let model = LlamaConfig::new(Family::Llama, 96, 128, 256, 2, 4, 2)
            .with_tie_embeddings(tied)
            .with_max_position_embeddings(64)
            .init(&d);
        // 8 × 32 positions: 256 rows, above `ember_kernels::AMX_ROWS`.
        let (b, t) = (8, 32);
        let v: Vec<i64> = (0..b * t).map(|i| ((i * 37 + 5) % 96) as i64).collect();
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(v, [b, t]), &d);
        let mask = Tensor::<2>::ones([b, t], &d);
        let logits = |kernels: &[Kernel]| {
            ember_kernels::set_kernels(kernels);
            vals(model.forward(tokens.clone(), mask.clone()))
        };
        let f32_logits = logits(&Kernel::DEFAULT);
        let amx_logits = logits(&with_amx());
        let (gap, scale) = gap(&f32_logits, &amx_logits);
        if ember_kernels::amx_available() {
            // bf16 keeps 8 bits of mantissa: a relative rounding of 2⁻⁹ per input, a few of
            // them compounded through two layers.
            assert!(gap > 0.0, "tied {tied}: the amx products changed nothing");
            assert!(
                gap < 3e-2 * scale,
                "tied {tied}: gap {gap} against logits up to {scale}"
            );
        } else {
            assert_eq!(
                gap, 0.0,
                "tied {tied}: without AMX the model is the f32 model"
            );
        }
    }
}

#[test]
fn bf16_weights_serve_decoding_under_amx_only() {
    let _one = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let d = dev();
    for tied in [true, false] {
        d.seed(5);
        let plain = LlamaConfig::new(Family::Llama, 96, 128, 256, 2, 4, 2)
            .with_tie_embeddings(tied)
            .with_max_position_embeddings(64)
            .init(&d)
            .quantized(QuantKind::Bf16)
            .unwrap();
        let kept = plain.clone();
        let plain = plain.without_blocks();
        // Batch 3: a 15-row prefill and 3-row steps, below `AMX_ROWS`: without the kept
        // weights every product is f32.
        ember_kernels::set_kernels(&Kernel::DEFAULT);
        let (f32_a, f32_b) = (
            decode_logits(&kept, 3, 5, &d),
            decode_logits(&plain, 3, 5, &d),
        );
        assert_eq!(
            gap(&f32_a, &f32_b).0,
            0.0,
            "tied {tied}: kept weights read without amx"
        );
        ember_kernels::set_kernels(&with_amx());
        let (amx, f32_plain) = (
            decode_logits(&kept, 3, 5, &d),
            decode_logits(&plain, 3, 5, &d),
        );
        let (gap, scale) = gap(&f32_plain, &amx);
        if ember_kernels::amx_available() {
            assert!(
                gap > 0.0,
                "tied {tied}: the kept bf16 weights were not read"
            );
            assert!(
                gap < 3e-2 * scale,
                "tied {tied}: gap {gap}, logits up to {scale}"
            );
        } else {
            assert_eq!(
                gap, 0.0,
                "tied {tied}: without AMX the model is the f32 model"
            );
        }
    }
    ember_kernels::set_kernels(&Kernel::DEFAULT);
}
