//! The Hugging Face tensor layout of a Llama/Qwen2/Qwen3 model, stated once. The module structure is
//! [`crate::LlamaConfig::init`]'s; [`visit`] walks its parameters under their Hugging Face names,
//! and loading (`load::build_model`) and export (`load::save_hf`) are two visitors over it.

use crate::error::Result;
use crate::model::Llama;
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;

/// What is done with each parameter of the layout.
pub(crate) trait Visitor {
    /// A vector: a norm's weight or a bias.
    fn vector(&mut self, name: &str, p: &mut Param<Tensor<1>>) -> Result<()>;
    /// A matrix. `transposed`: a linear layer's weight, which burn stores `[d_in, d_out]` and
    /// Hugging Face `[d_out, d_in]`; the embedding is `[vocab, d_model]` in both.
    fn matrix(&mut self, name: &str, p: &mut Param<Tensor<2>>, transposed: bool) -> Result<()>;
}

/// Visits every parameter of `model` (the base weights; LoRA and mixture adapters are not part
/// of the layout) in Hugging Face order and naming.
pub(crate) fn visit(model: &mut Llama, v: &mut dyn Visitor) -> Result<()> {
    v.matrix(
        "model.embed_tokens.weight",
        &mut model.embed_tokens.weight,
        false,
    )?;
    for (i, l) in model.layers.iter_mut().enumerate() {
        let p = format!("model.layers.{i}");
        v.vector(
            &format!("{p}.input_layernorm.weight"),
            &mut l.input_layernorm.gamma,
        )?;
        v.vector(
            &format!("{p}.post_attention_layernorm.weight"),
            &mut l.post_attention_layernorm.gamma,
        )?;
        let a = &mut l.self_attn;
        for (n, lin) in [
            ("q_proj", &mut a.q_proj),
            ("k_proj", &mut a.k_proj),
            ("v_proj", &mut a.v_proj),
            ("o_proj", &mut a.o_proj),
        ] {
            linear(v, &format!("{p}.self_attn.{n}"), lin)?;
        }
        for (n, norm) in [("q_norm", &mut a.q_norm), ("k_norm", &mut a.k_norm)] {
            if let Some(norm) = norm {
                v.vector(&format!("{p}.self_attn.{n}.weight"), &mut norm.gamma)?;
            }
        }
        let m = &mut l.mlp;
        for (n, lin) in [
            ("gate_proj", &mut m.gate_proj),
            ("up_proj", &mut m.up_proj),
            ("down_proj", &mut m.down_proj),
        ] {
            linear(v, &format!("{p}.mlp.{n}"), lin)?;
        }
    }
    v.vector("model.norm.weight", &mut model.norm.gamma)?;
    if let Some(head) = &mut model.lm_head {
        linear(v, "lm_head", head)?;
    }
    Ok(())
}

fn linear(v: &mut dyn Visitor, prefix: &str, l: &mut Linear) -> Result<()> {
    v.matrix(&format!("{prefix}.weight"), &mut l.weight, true)?;
    if let Some(b) = &mut l.bias {
        v.vector(&format!("{prefix}.bias"), b)?;
    }
    Ok(())
}

/// `[rows, cols]` row-major data transposed to `[cols, rows]`.
pub(crate) fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}
