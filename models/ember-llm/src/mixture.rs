//! Mixture-of-LoRA on the decoder's projections: attach `ember_molora` layers to the targeted
//! linear layers (the base model frozen), and collect their routing records.

use crate::error::{LlmError, Result};
use crate::lora::TARGETS;
use crate::model::Llama;
use burn::module::Module;
use burn::tensor::Device;
use ember_molora::{MixtureSettings, MoLora};

/// Freezes every base parameter and attaches a fresh mixture to each targeted projection.
pub fn apply_mixture(
    model: Llama,
    settings: &MixtureSettings,
    targets: &[String],
    device: &Device,
) -> Result<Llama> {
    settings
        .validate()
        .map_err(|e| LlmError::Input(e.to_string()))?;
    if targets.is_empty() {
        return Err(LlmError::Config {
            field: "mixture.targets",
            reason: "name at least one module".into(),
        });
    }
    for t in targets {
        if !TARGETS.contains(&t.as_str()) {
            return Err(LlmError::Config {
                field: "mixture.targets",
                reason: format!("unknown module `{t}` (valid: {})", TARGETS.join(", ")),
            });
        }
    }
    let mut model = model.no_grad();
    let on = |name: &str| targets.iter().any(|t| t == name);
    let mk = |w: &burn::nn::Linear| -> MoLora {
        let [d_in, d_out] = w.weight.dims();
        settings.init(d_in, d_out, device)
    };
    for l in &mut model.layers {
        let a = &mut l.self_attn;
        if on("q_proj") {
            a.q_mix = Some(mk(&a.q_proj));
        }
        if on("k_proj") {
            a.k_mix = Some(mk(&a.k_proj));
        }
        if on("v_proj") {
            a.v_mix = Some(mk(&a.v_proj));
        }
        if on("o_proj") {
            a.o_mix = Some(mk(&a.o_proj));
        }
        let m = &mut l.mlp;
        if on("gate_proj") {
            m.gate_mix = Some(mk(&m.gate_proj));
        }
        if on("up_proj") {
            m.up_mix = Some(mk(&m.up_proj));
        }
        if on("down_proj") {
            m.down_mix = Some(mk(&m.down_proj));
        }
    }
    Ok(model)
}

/// Every attached mixture, in forward order (the order of their routing records).
pub fn mixtures(model: &Llama) -> Vec<&MoLora> {
    let mut out = Vec::new();
    for l in &model.layers {
        let a = &l.self_attn;
        let m = &l.mlp;
        for x in [
            &a.q_mix,
            &a.k_mix,
            &a.v_mix,
            &a.o_mix,
            &m.gate_mix,
            &m.up_mix,
            &m.down_mix,
        ]
        .into_iter()
        .flatten()
        {
            out.push(x);
        }
    }
    out
}
