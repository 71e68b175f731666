//! A class-conditional Diffusion Transformer (Peebles & Xie 2023, "Scalable Diffusion Models with
//! Transformers": patch embedding, adaLN-Zero blocks, §3.2) that predicts the rectified-flow
//! velocity of a single-channel square image.
//!
//! Images travel flat, `[batch, side²]`, values in [−1, 1]. The class embedding table has one
//! extra row, the null class ([`FlowDit::null_class`]), used for classifier-free guidance (Ho &
//! Salimans 2022): pretraining drops labels to it with probability `class_dropout`.

use crate::error::FlowError;
use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig};
use burn::tensor::activation::{gelu, silu, softmax};
use burn::tensor::{DType, Device, Distribution, FloatDType, Int, Tensor, TensorData};
use ember_train::Precision;

/// The DiT's sizes. The defaults (d 64, 4 blocks, patch 4 on 28×28) give ~0.2M parameters.
#[derive(Config, Debug, PartialEq)]
pub struct FlowDitConfig {
    /// Image side in pixels.
    #[config(default = 28)]
    pub image_size: usize,
    /// Patch side in pixels (must divide `image_size`).
    #[config(default = 4)]
    pub patch: usize,
    /// Width.
    #[config(default = 64)]
    pub d_model: usize,
    /// Transformer blocks.
    #[config(default = 4)]
    pub layers: usize,
    /// Attention heads (must divide `d_model`).
    #[config(default = 4)]
    pub heads: usize,
    /// MLP hidden width = `mlp_ratio · d_model`.
    #[config(default = 4)]
    pub mlp_ratio: usize,
    /// Number of classes (the null class is one more).
    #[config(default = 10)]
    pub num_classes: usize,
}

impl FlowDitConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> crate::error::Result<()> {
        let bad = |field: &'static str, reason: &str| {
            Err(FlowError::Config {
                field,
                reason: reason.to_string(),
            })
        };
        if self.patch == 0 || self.image_size == 0 || !self.image_size.is_multiple_of(self.patch) {
            return bad("model.patch", "must be >= 1 and divide image_size");
        }
        if self.heads == 0 || self.d_model == 0 || !self.d_model.is_multiple_of(self.heads) {
            return bad("model.heads", "must be >= 1 and divide d_model");
        }
        if self.layers == 0 || self.mlp_ratio == 0 || self.num_classes == 0 {
            return bad("model", "layers, mlp_ratio and num_classes must be >= 1");
        }
        Ok(())
    }

    /// Builds the model: weights ~ N(0, 0.02), adaLN modulations and the output projection zero
    /// (adaLN-Zero: every block starts as the identity and the model outputs 0).
    pub fn init(&self, device: &Device) -> crate::error::Result<FlowDit> {
        self.validate()?;
        let d = self.d_model;
        let p2 = self.patch * self.patch;
        let n = (self.image_size / self.patch).pow(2);
        let normal = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let lin = |i: usize, o: usize| {
            LinearConfig::new(i, o)
                .with_initializer(normal.clone())
                .init(device)
        };
        let zero = |i: usize, o: usize| {
            LinearConfig::new(i, o)
                .with_initializer(Initializer::Zeros)
                .init(device)
        };
        let blocks = (0..self.layers)
            .map(|_| DitBlock {
                modulation: zero(d, 6 * d),
                q_proj: lin(d, d),
                k_proj: lin(d, d),
                v_proj: lin(d, d),
                o_proj: lin(d, d),
                fc1: lin(d, self.mlp_ratio * d),
                fc2: lin(self.mlp_ratio * d, d),
            })
            .collect();
        Ok(FlowDit {
            patch_in: lin(p2, d),
            pos: Param::from_tensor(Tensor::random(
                [n, d],
                Distribution::Normal(0.0, 0.02),
                device,
            )),
            t_fc1: lin(FREQ_DIM, d),
            t_fc2: lin(d, d),
            class_emb: EmbeddingConfig::new(self.num_classes + 1, d)
                .with_initializer(normal)
                .init(device),
            blocks,
            final_mod: zero(d, 2 * d),
            patch_out: zero(d, p2),
            image_size: self.image_size,
            patch: self.patch,
            heads: self.heads,
            num_classes: self.num_classes,
            precision: Precision::F32,
        })
    }
}

/// Width of the sinusoidal timestep features.
const FREQ_DIM: usize = 64;

/// One adaLN-Zero block: x += g₁·Attn(mod(LN(x); s₁, c₁)); x += g₂·MLP(mod(LN(x); s₂, c₂)),
/// (s, c, g) = Linear(SiLU(cond)) (DiT §3.2 "adaLN-Zero").
#[derive(Module, Debug)]
pub struct DitBlock {
    /// cond → 6d (shift, scale, gate for attention and MLP); zero at init.
    pub modulation: Linear,
    /// Query projection.
    pub q_proj: Linear,
    /// Key projection.
    pub k_proj: Linear,
    /// Value projection.
    pub v_proj: Linear,
    /// Output projection.
    pub o_proj: Linear,
    /// MLP in.
    pub fc1: Linear,
    /// MLP out.
    pub fc2: Linear,
}

/// The velocity model v_θ(x_t, t, y).
#[derive(Module, Debug)]
pub struct FlowDit {
    /// Patch (p² pixels) → d.
    pub patch_in: Linear,
    /// Learned position embedding `[patches, d]`.
    pub pos: Param<Tensor<2>>,
    /// Timestep MLP, first layer.
    pub t_fc1: Linear,
    /// Timestep MLP, second layer.
    pub t_fc2: Linear,
    /// Class embedding, `num_classes + 1` rows (the last is the null class).
    pub class_emb: Embedding,
    /// The blocks.
    pub blocks: Vec<DitBlock>,
    /// Final adaLN (shift, scale).
    pub final_mod: Linear,
    /// d → p² pixels; zero at init.
    pub patch_out: Linear,
    image_size: usize,
    patch: usize,
    heads: usize,
    num_classes: usize,
    /// Precision of the products (not stored in checkpoints; [`FlowDit::with_precision`]).
    #[module(skip)]
    precision: Precision,
}

/// How one forward pass runs: with the LoRA adapters or the frozen base weights alone, and in
/// which precision its products run.
#[derive(Debug, Clone, Copy)]
struct Pass {
    adapters: bool,
    precision: Precision,
}

impl Pass {
    /// a·b, under bf16 with both factors cast to bf16 and the product returned in f32
    /// (autocast: the softmax, norms, modulations and residual stream stay f32).
    fn matmul<const D: usize>(self, a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
        match self.precision {
            Precision::F32 => a.matmul(b),
            Precision::Bf16 => bf16(a).matmul(bf16(b)).cast(FloatDType::F32),
        }
    }
}

/// `x` in bf16 (no-op when it already is).
fn bf16<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if x.dtype() == DType::BF16 {
        x
    } else {
        x.cast(FloatDType::BF16)
    }
}

/// LayerNorm without affine parameters (ε = 1e-6), over the last dim.
fn norm(x: Tensor<3>) -> Tensor<3> {
    let mean = x.clone().mean_dim(2);
    let xc = x - mean;
    let var = xc.clone().powi_scalar(2).mean_dim(2);
    xc / (var + 1e-6).sqrt()
}

/// x·(1 + scale) + shift, with `[b, d]` modulations broadcast over patches.
fn modulate(x: Tensor<3>, shift: Tensor<2>, scale: Tensor<2>) -> Tensor<3> {
    x * (scale.unsqueeze_dim::<3>(1) + 1.0) + shift.unsqueeze_dim(1)
}

/// Applies `l` with its effective weight (LoRA adapter included) or the frozen base weight alone
/// (`adapters = false`: the reference model of a LoRA run without a second copy); under bf16
/// the input, weight and bias are cast to bf16 for the product and the result returned in f32.
fn lin<const D: usize>(l: &Linear, x: Tensor<D>, pass: Pass) -> Tensor<D> {
    match (pass.precision, pass.adapters) {
        (Precision::F32, true) => l.forward(x),
        (Precision::F32, false) => {
            burn::tensor::module::linear(x, l.weight.base(), l.bias.as_ref().map(|b| b.base()))
        }
        (Precision::Bf16, adapters) => {
            let (w, b) = if adapters {
                (l.weight.val(), l.bias.as_ref().map(|b| b.val()))
            } else {
                (l.weight.base(), l.bias.as_ref().map(|b| b.base()))
            };
            burn::tensor::module::linear(bf16(x), bf16(w), b.map(bf16)).cast(FloatDType::F32)
        }
    }
}

impl DitBlock {
    fn forward(&self, x: Tensor<3>, cond: Tensor<2>, heads: usize, ad: Pass) -> Tensor<3> {
        let [b, n, d] = x.dims();
        let dh = d / heads;
        let m = lin(&self.modulation, silu(cond), ad).chunk(6, 1);
        let h = modulate(norm(x.clone()), m[0].clone(), m[1].clone());
        let split = |t: Tensor<3>| t.reshape([b, n, heads, dh]).swap_dims(1, 2);
        let q = split(lin(&self.q_proj, h.clone(), ad));
        let k = split(lin(&self.k_proj, h.clone(), ad));
        let v = split(lin(&self.v_proj, h, ad));
        let att = softmax(ad.matmul(q, k.swap_dims(2, 3)) / (dh as f64).sqrt(), 3);
        let o = ad.matmul(att, v).swap_dims(1, 2).reshape([b, n, d]);
        let x = x + lin(&self.o_proj, o, ad) * m[2].clone().unsqueeze_dim(1);
        let h = modulate(norm(x.clone()), m[3].clone(), m[4].clone());
        let h = lin(&self.fc2, gelu(lin(&self.fc1, h, ad)), ad);
        x + h * m[5].clone().unsqueeze_dim(1)
    }
}

/// Classifier-free guidance's weight w and whether its unconditional branch is detached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Guidance {
    /// w of v_u + w·(v_c − v_u); 1 is the conditional model alone.
    pub scale: f32,
    /// Stop the gradient through v_u (sg[v_u]).
    pub detach_uncond: bool,
}

impl FlowDit {
    /// This model with its products in `precision` (parameters stay f32).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The precision of the products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Pixels per image (`side²`).
    pub fn pixels(&self) -> usize {
        self.image_size * self.image_size
    }

    /// Image side.
    pub fn image_size(&self) -> usize {
        self.image_size
    }

    /// The label that means "no class" (classifier-free guidance's unconditional branch).
    pub fn null_class(&self) -> usize {
        self.num_classes
    }

    /// Number of real classes.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// Sinusoidal features of t ∈ [0, 1] scaled by 1000 (DiT `TimestepEmbedder`), `[b, 64]`.
    fn time_features(t: Tensor<1>) -> Tensor<2> {
        let half = FREQ_DIM / 2;
        let freqs: Vec<f32> = (0..half)
            .map(|i| (-(10000f32.ln()) * i as f32 / half as f32).exp())
            .collect();
        let freqs = Tensor::<1>::from_data(TensorData::new(freqs, [half]), &t.device());
        let args = (t * 1000.0).unsqueeze_dim::<2>(1) * freqs.unsqueeze_dim(0);
        Tensor::cat(vec![args.clone().cos(), args.sin()], 1)
    }

    /// v_θ(x, t, y) with LoRA adapters on.
    ///
    /// # Shapes
    /// `x [b, side²]`, `t [b]` (1 = noise, 0 = data), `labels [b]` → `[b, side²]`.
    pub fn forward(&self, x: Tensor<2>, t: Tensor<1>, labels: Tensor<1, Int>) -> Tensor<2> {
        self.forward_with(x, t, labels, true)
    }

    /// [`forward`](Self::forward), with adapters on or off (off: the frozen base model).
    pub fn forward_with(
        &self,
        x: Tensor<2>,
        t: Tensor<1>,
        labels: Tensor<1, Int>,
        adapters: bool,
    ) -> Tensor<2> {
        let [b, pixels] = x.dims();
        assert_eq!(pixels, self.pixels(), "FlowDit: x must be [batch, side²]");
        assert_eq!(t.dims(), [b], "FlowDit: t must be [batch]");
        assert_eq!(labels.dims(), [b], "FlowDit: labels must be [batch]");
        let p = self.patch;
        let g = self.image_size / p;
        let ad = Pass {
            adapters,
            precision: self.precision,
        };
        // [b, side²] → [b, g, p, g, p] → [b, g, g, p, p] → [b, g², p²]
        let patches = x
            .reshape([b, g, p, g, p])
            .swap_dims(2, 3)
            .reshape([b, g * g, p * p]);
        let mut h = lin(&self.patch_in, patches, ad) + self.pos.val().unsqueeze_dim(0);
        let temb = lin(
            &self.t_fc2,
            silu(lin(&self.t_fc1, Self::time_features(t), ad)),
            ad,
        );
        let [_, d] = temb.dims();
        let cemb = self
            .class_emb
            .forward(labels.unsqueeze_dim(1))
            .reshape([b, d]);
        let cond = temb + cemb;
        for block in &self.blocks {
            h = block.forward(h, cond.clone(), self.heads, ad);
        }
        let m = lin(&self.final_mod, silu(cond), ad).chunk(2, 1);
        let h = modulate(norm(h), m[0].clone(), m[1].clone());
        lin(&self.patch_out, h, ad)
            .reshape([b, g, g, p, p])
            .swap_dims(2, 3)
            .reshape([b, pixels])
    }

    /// Classifier-free-guided velocity v_u + w·(v_c − v_u) (Ho & Salimans 2022, eq. 6); w = 1 is
    /// the plain conditional model (one forward).
    pub fn guided(
        &self,
        x: Tensor<2>,
        t: Tensor<1>,
        labels: Tensor<1, Int>,
        guidance: f32,
        adapters: bool,
    ) -> Tensor<2> {
        let guidance = Guidance {
            scale: guidance,
            detach_uncond: false,
        };
        self.guided_with(x, t, labels, guidance, adapters)
    }

    /// [`guided`](Self::guided), with the unconditional branch v_u optionally detached: the
    /// gradient of w·v_c + (1 − w)·sg[v_u] flows through the conditional branch alone (an
    /// option; flow_grpo's training step keeps the gradient of both branches).
    pub fn guided_with(
        &self,
        x: Tensor<2>,
        t: Tensor<1>,
        labels: Tensor<1, Int>,
        guidance: Guidance,
        adapters: bool,
    ) -> Tensor<2> {
        let Guidance {
            scale: guidance,
            detach_uncond,
        } = guidance;
        if guidance == 1.0 {
            return self.forward_with(x, t, labels, adapters);
        }
        let [b, _] = x.dims();
        let null = Tensor::<1, Int>::full([b], self.null_class() as i64, &x.device());
        let v = self.forward_with(
            Tensor::cat(vec![x.clone(), x], 0),
            Tensor::cat(vec![t.clone(), t], 0),
            Tensor::cat(vec![labels, null], 0),
            adapters,
        );
        let vc = v.clone().narrow(0, 0, b);
        let vu = v.narrow(0, b, b);
        let vu = if detach_uncond { vu.detach() } else { vu };
        vu.clone() + (vc - vu) * guidance
    }

    /// (burn parameter path) of every linear layer a LoRA may target, by short name
    /// (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `fc1`, `fc2`, `modulation`).
    pub fn lora_paths(&self, targets: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..self.blocks.len() {
            for t in targets {
                out.push(format!("blocks.{i}.{t}.weight"));
            }
        }
        out
    }
}

/// Names [`FlowDit::lora_paths`] accepts.
pub const LORA_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "fc1",
    "fc2",
    "modulation",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_zero_and_patchify_roundtrips() {
        let device = Device::flex();
        let cfg = FlowDitConfig::new()
            .with_d_model(16)
            .with_layers(1)
            .with_heads(2);
        let m = cfg.init(&device).unwrap();
        let x = Tensor::<2>::random([3, 784], Distribution::Normal(0.0, 1.0), &device);
        let t = Tensor::<1>::from_floats([0.1, 0.5, 0.9], &device);
        let y = Tensor::<1, Int>::from_ints([0, 3, 10], &device);
        let v = m.forward(x.clone(), t, y);
        assert_eq!(v.dims(), [3, 784]);
        assert_eq!(v.abs().max().into_scalar::<f32>(), 0.0);
        // Patchify then its inverse is the identity.
        let p = x
            .clone()
            .reshape([3, 7, 4, 7, 4])
            .swap_dims(2, 3)
            .reshape([3, 49, 16]);
        let back = p.reshape([3, 7, 7, 4, 4]).swap_dims(2, 3).reshape([3, 784]);
        assert_eq!((back - x).abs().max().into_scalar::<f32>(), 0.0);
    }

    #[test]
    fn bad_sizes_are_named() {
        let e = FlowDitConfig::new()
            .with_patch(5)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.patch"), "{e}");
        let e = FlowDitConfig::new()
            .with_heads(3)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.heads"), "{e}");
    }
}
