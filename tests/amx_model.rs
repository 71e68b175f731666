//! The model with the `amx` kernel chosen (a process of its own: the choice is process-wide):
//! its many-row products round their inputs to bf16 (`ember_kernels::amx_matmul`), so its logits
//! differ from the f32 model's by bf16's rounding and no more, tied head or not. Where the
//! machine has no AMX tiles the two are the same model.

mod common;

use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use ember_kernels::Kernel;
use ember_llm::{Family, LlamaConfig};

#[test]
fn amx_products_keep_the_logits_within_bf16_rounding() {
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
        let mut with = Kernel::DEFAULT.to_vec();
        with.push(Kernel::Amx);
        let amx_logits = logits(&with);
        let scale = f32_logits.iter().fold(0f32, |m, x| m.max(x.abs()));
        let gap = f32_logits
            .iter()
            .zip(&amx_logits)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
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
