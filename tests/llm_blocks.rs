//! Decoding steps that read the weights as quantized blocks (`ember_kernels::QuantMatrix`,
//! `models/ember-llm/src/blocks.rs`) compute the model the f32 weights compute: GQA, biases,
//! tied and untied heads, Q4_1, Q8_0 and BF16, batches on both sides of the block-row limit.

mod common;

use common::*;
use ember_kernels::QuantKind;
use ember_llm::{Family, LlamaConfig, LoraSettings, apply_lora, merge};

fn config(family: Family, tied: bool) -> LlamaConfig {
    LlamaConfig::new(family, 96, 64, 96, 2, 4, 2)
        .with_qkv_bias(family == Family::Qwen2)
        .with_out_bias(family == Family::Llama && !tied)
        .with_tie_embeddings(tied)
        .with_max_position_embeddings(64)
}

#[test]
fn decoding_from_blocks_computes_the_f32_model() {
    let d = dev();
    for (family, tied) in [
        (Family::Llama, true),
        (Family::Llama, false),
        (Family::Qwen2, false),
    ] {
        // BF16 is read only under the `amx` kernel (tests/amx_model.rs): here the f32 weights.
        for kind in [QuantKind::Q4_1, QuantKind::Q8_0, QuantKind::Bf16] {
            d.seed(7);
            let model = config(family, tied).init(&d).quantized(kind).unwrap();
            assert!(model.block_bytes() > 0);
            let plain = model.clone().without_blocks();
            assert_eq!(plain.block_bytes(), 0);
            // Batch 3 reads the blocks; 20 rows are above `BLOCK_ROWS` and read the f32 weights.
            for batch in [1, 3, 20] {
                let (a, b) = (
                    decode_logits(&model, batch, 5, &d),
                    decode_logits(&plain, batch, 5, &d),
                );
                let worst = max_abs_diff(&a, &b);
                assert!(
                    worst < 1e-4,
                    "{family:?} tied {tied} {kind:?} batch {batch}: {worst}"
                );
            }
        }
    }
}

#[test]
fn quantizing_sets_the_f32_weights_to_the_blocks() {
    let d = dev();
    d.seed(3);
    let model = config(Family::Llama, true).init(&d);
    let q = model.clone().quantized(QuantKind::Q4_1).unwrap();
    let w0 = vals(model.layers[0].mlp.up_proj.weight.val());
    let w1 = vals(q.layers[0].mlp.up_proj.weight.val());
    // Quantized: changed, by at most half a 4-bit step of a block's range.
    let worst = max_abs_diff(&w0, &w1);
    assert!(worst > 0.0 && worst < 0.05, "{worst}");
    // A second quantization finds the weights already on the grid.
    let again = q.clone().quantized(QuantKind::Q4_1).unwrap();
    let w2 = vals(again.layers[0].mlp.up_proj.weight.val());
    let drift = max_abs_diff(&w1, &w2);
    assert!(drift < 1e-6, "{drift}");
}

#[test]
fn merging_adapters_drops_the_blocks_and_adapters_refuse_quantizing() {
    let d = dev();
    d.seed(5);
    let model = config(Family::Llama, true)
        .init(&d)
        .quantized(QuantKind::Q8_0)
        .unwrap();
    let with_lora = apply_lora(model, &LoraSettings::default()).unwrap();
    assert!(
        with_lora.block_bytes() > 0,
        "adapters keep the frozen base's blocks"
    );
    let err = with_lora.clone().quantized(QuantKind::Q8_0).unwrap_err();
    assert!(err.to_string().contains("adapter"), "{err}");
    assert_eq!(merge(with_lora).block_bytes(), 0);
}

#[test]
fn widths_off_the_block_grid_are_refused_by_name() {
    let d = dev();
    let model = LlamaConfig::new(Family::Llama, 40, 48, 64, 1, 2, 2).init(&d);
    let err = model.quantized(QuantKind::Q4_1).unwrap_err().to_string();
    assert!(
        err.contains("layer 0 q_proj") && err.contains("multiple of 32"),
        "{err}"
    );
}
