//! The decoder: Llama/Qwen2 as Hugging Face's `modeling_llama.py` / `modeling_qwen2.py` define
//! them (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU MLP).
//!
//! Field names follow the Hugging Face module tree (`layers.N.self_attn.q_proj`), so LoRA target
//! patterns and PEFT keys read the same as in Python.

use crate::cache::KvCache;
use crate::config::LlamaConfig;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{log_softmax, silu, softmax};
use burn::tensor::module::linear as linear_op;
use burn::tensor::{DType, Device, FloatDType, Int, Tensor, TensorData};
use ember_molora::{MoLora, RouteCtx};
use serde::{Deserialize, Serialize};

/// The precision of the model's matrix products.
///
/// `Bf16` is automatic mixed precision in the manner of PyTorch's `torch.autocast`: parameters
/// (and so gradients and optimizer state) stay f32, each projection casts its weight and input
/// to bf16 for the product, and the numerically sensitive steps run in f32: RMSNorm (as HF's
/// `LlamaRMSNorm` upcasts), the attention softmax, the logits and everything after them
/// (log-softmax, sampling, losses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 throughout (the default, and the only choice on the CPU and wgpu backends' f32
    /// kernels).
    #[default]
    F32,
    /// bf16 products with f32 parameters, normalisation, softmax and logits.
    Bf16,
}

impl Precision {
    /// The dtype of activations between projections.
    pub fn activation_dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
        }
    }
}

/// `x` in dtype `dt` (no-op when it already is).
fn like<const D: usize>(x: Tensor<D>, dt: DType) -> Tensor<D> {
    if x.dtype() == dt {
        x
    } else {
        x.cast(FloatDType::from(dt))
    }
}

/// RMSNorm computed in f32 and returned in the input's dtype (HF `LlamaRMSNorm`).
fn rms_norm(n: &RmsNorm, x: Tensor<3>) -> Tensor<3> {
    let dt = x.dtype();
    like(n.forward(like(x, DType::F32)), dt)
}

/// Additive bias for masked attention scores (finite, so fully masked rows stay NaN-free).
const MASKED: f32 = -1e9;

/// Grouped-query self-attention.
#[derive(Module, Debug)]
pub struct Attention {
    /// W_q.
    pub q_proj: Linear,
    /// W_k.
    pub k_proj: Linear,
    /// W_v.
    pub v_proj: Linear,
    /// W_o.
    pub o_proj: Linear,
    /// Mixture-of-LoRA on W_q (see `ember_molora`), added to the projection.
    pub q_mix: Option<MoLora>,
    /// Mixture on W_k.
    pub k_mix: Option<MoLora>,
    /// Mixture on W_v.
    pub v_mix: Option<MoLora>,
    /// Mixture on W_o.
    pub o_mix: Option<MoLora>,
    pub(crate) n_heads: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
}

/// SwiGLU MLP: down(silu(gate(x)) · up(x)).
#[derive(Module, Debug)]
pub struct Mlp {
    /// Gate projection.
    pub gate_proj: Linear,
    /// Up projection.
    pub up_proj: Linear,
    /// Down projection.
    pub down_proj: Linear,
    /// Mixture on the gate projection.
    pub gate_mix: Option<MoLora>,
    /// Mixture on the up projection.
    pub up_mix: Option<MoLora>,
    /// Mixture on the down projection.
    pub down_mix: Option<MoLora>,
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct Block {
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Attention.
    pub self_attn: Attention,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm,
    /// MLP.
    pub mlp: Mlp,
}

/// The decoder-only language model.
#[derive(Module, Debug)]
pub struct Llama {
    /// Token embeddings `[vocab, d_model]`.
    pub embed_tokens: Embedding,
    /// Decoder layers.
    pub layers: Vec<Block>,
    /// Final norm.
    pub norm: RmsNorm,
    /// Output head `[d_model, vocab]`; `None` when tied to the embeddings.
    pub lm_head: Option<Linear>,
    pub(crate) rope_theta: f64,
    pub(crate) max_positions: usize,
    /// Precision of the products (not stored in checkpoints).
    #[module(skip)]
    pub(crate) precision: Precision,
    /// Use burn's fused attention op for multi-token passes (prefill, rescoring).
    #[module(skip)]
    pub(crate) fused_attention: bool,
}

/// Applies `l` with its effective weight (LoRA adapter included) or, when `adapters` is false,
/// with the frozen base weight alone: the reference policy without a second copy of the model.
/// The product runs in the input's dtype (the weight is cast to it under mixed precision).
fn lin<const D: usize>(l: &Linear, x: Tensor<D>, adapters: bool) -> Tensor<D> {
    let dt = x.dtype();
    if dt == DType::F32 {
        return if adapters {
            l.forward(x)
        } else {
            linear_op(x, l.weight.base(), l.bias.as_ref().map(|b| b.base()))
        };
    }
    let (w, b) = if adapters {
        (l.weight.val(), l.bias.as_ref().map(|b| b.val()))
    } else {
        (l.weight.base(), l.bias.as_ref().map(|b| b.base()))
    };
    linear_op(x, like(w, dt), b.map(|b| like(b, dt)))
}

/// A projection plus its Mixture-of-LoRA, if any (off with the adapters).
fn proj(l: &Linear, mix: &Option<MoLora>, x: Tensor<3>, c: &RouteCtx) -> Tensor<3> {
    match mix {
        Some(m) if c.adapters => {
            let dt = x.dtype();
            lin(l, x.clone(), true) + like(m.forward(like(x, DType::F32), c), dt)
        }
        _ => lin(l, x, c.adapters),
    }
}

fn linear(d_in: usize, d_out: usize, bias: bool, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out).with_bias(bias).init(device)
}

impl LlamaConfig {
    /// A randomly initialised model (weights are normally loaded from a checkpoint).
    pub fn init(&self, device: &Device) -> Llama {
        let hd = self.head_dim();
        let norm = || {
            RmsNormConfig::new(self.d_model)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let layers = (0..self.n_layers)
            .map(|_| Block {
                input_layernorm: norm(),
                self_attn: Attention {
                    q_proj: linear(self.d_model, self.n_heads * hd, self.qkv_bias, device),
                    k_proj: linear(self.d_model, self.n_kv_heads * hd, self.qkv_bias, device),
                    v_proj: linear(self.d_model, self.n_kv_heads * hd, self.qkv_bias, device),
                    o_proj: linear(self.n_heads * hd, self.d_model, self.out_bias, device),
                    q_mix: None,
                    k_mix: None,
                    v_mix: None,
                    o_mix: None,
                    n_heads: self.n_heads,
                    n_kv_heads: self.n_kv_heads,
                    head_dim: hd,
                },
                post_attention_layernorm: norm(),
                mlp: Mlp {
                    gate_proj: linear(self.d_model, self.d_ff, self.out_bias, device),
                    up_proj: linear(self.d_model, self.d_ff, self.out_bias, device),
                    down_proj: linear(self.d_ff, self.d_model, self.out_bias, device),
                    gate_mix: None,
                    up_mix: None,
                    down_mix: None,
                },
            })
            .collect();
        Llama {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, self.d_model)
                .with_initializer(burn::nn::Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                })
                .init(device),
            layers,
            norm: norm(),
            lm_head: (!self.tie_embeddings)
                .then(|| linear(self.d_model, self.vocab_size, false, device)),
            rope_theta: self.rope_theta,
            max_positions: self.max_position_embeddings,
            precision: Precision::F32,
            fused_attention: false,
        }
    }
}

/// cos/sin tables `[batch, 1, seq, head_dim]` for positions `[batch, seq]` (rotate-half layout:
/// the frequencies repeated twice, HF `LlamaRotaryEmbedding`).
fn rope_tables(positions: Tensor<2, Int>, head_dim: usize, theta: f64) -> (Tensor<4>, Tensor<4>) {
    let [b, t] = positions.dims();
    let device = positions.device();
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32)
        .collect();
    let inv = Tensor::<1>::from_data(TensorData::new(inv, [half]), &device).reshape([1, 1, half]);
    let freqs = positions.float().reshape([b, t, 1]) * inv;
    let emb = Tensor::cat(vec![freqs.clone(), freqs], 2).reshape([b, 1, t, head_dim]);
    (emb.clone().cos(), emb.sin())
}

/// x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁] (HF `apply_rotary_pos_emb`).
fn apply_rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let [b, h, t, d] = x.dims();
    let x1 = x.clone().slice([0..b, 0..h, 0..t, 0..d / 2]);
    let x2 = x.clone().slice([0..b, 0..h, 0..t, d / 2..d]);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos.clone() + rotated * sin.clone()
}

impl Attention {
    fn project(
        &self,
        x: Tensor<3>,
        positions: Tensor<2, Int>,
        theta: f64,
        c: &RouteCtx,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, t, _] = x.dims();
        let hd = self.head_dim;
        let q = proj(&self.q_proj, &self.q_mix, x.clone(), c)
            .reshape([b, t, self.n_heads, hd])
            .swap_dims(1, 2);
        let k = proj(&self.k_proj, &self.k_mix, x.clone(), c)
            .reshape([b, t, self.n_kv_heads, hd])
            .swap_dims(1, 2);
        let v = proj(&self.v_proj, &self.v_mix, x, c)
            .reshape([b, t, self.n_kv_heads, hd])
            .swap_dims(1, 2);
        let (cos, sin) = rope_tables(positions, hd, theta);
        let dt = q.dtype();
        let (cos, sin) = (like(cos, dt), like(sin, dt));
        (apply_rope(q, &cos, &sin), apply_rope(k, &cos, &sin), v)
    }

    /// softmax(q kᵀ/√d + bias) v over `k`, `v` `[b, kv_heads, keys, hd]`; bias `[b, 1, t, keys]`.
    /// `fused` runs burn's `attention` op (a fused kernel where the backend has one; the same
    /// formula decomposed elsewhere and under autodiff); otherwise explicit products and softmax,
    /// which every backend runs for every shape, one query token included.
    fn attend(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        bias: Tensor<4>,
        c: &RouteCtx,
        fused: bool,
    ) -> Tensor<3> {
        let [b, h, t, hd] = q.dims();
        let [_, kv, keys, _] = k.dims();
        let groups = h / kv;
        let repeat = |x: Tensor<4>| {
            if groups == 1 {
                x
            } else {
                x.reshape([b, kv, 1, keys, hd])
                    .expand([b, kv, groups, keys, hd])
                    .reshape([b, h, keys, hd])
            }
        };
        let dt = q.dtype();
        if fused {
            let keys_all = repeat(k);
            let bias = like(bias, dt).expand([b, h, t, keys]);
            let out = burn::tensor::module::attention(
                q,
                keys_all,
                repeat(v),
                None,
                Some(bias),
                Default::default(),
            )
            .swap_dims(1, 2)
            .reshape([b, t, h * hd]);
            return proj(&self.o_proj, &self.o_mix, out, c);
        }
        // Scores, mask and softmax in f32; the products in the activations' dtype.
        let scores = like(q.matmul(repeat(k).swap_dims(2, 3)), DType::F32)
            * (1.0 / (hd as f32).sqrt())
            + bias;
        let probs = like(softmax(scores, 3), dt);
        let out = probs
            .matmul(repeat(v))
            .swap_dims(1, 2)
            .reshape([b, t, h * hd]);
        proj(&self.o_proj, &self.o_mix, out, c)
    }
}

impl Mlp {
    fn forward(&self, x: Tensor<3>, c: &RouteCtx) -> Tensor<3> {
        proj(
            &self.down_proj,
            &self.down_mix,
            silu(proj(&self.gate_proj, &self.gate_mix, x.clone(), c))
                * proj(&self.up_proj, &self.up_mix, x, c),
            c,
        )
    }
}

/// Position ids under left padding: cumsum(mask) − 1, 0 on padding (HF `generate`).
pub fn position_ids(mask: &Tensor<2>) -> Tensor<2, Int> {
    (mask.clone().cumsum(1) - 1.0).clamp_min(0.0).int()
}

impl Llama {
    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.embed_tokens.weight.dims()[0]
    }

    /// This model with its products in `precision` (parameters stay as they are).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The precision of the products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// This model with burn's fused `attention` op for passes of more than one query token
    /// (prefill, rescoring, training); single-token decode steps keep the explicit path, which
    /// every backend runs (burn 0.22's fused CUDA kernel has no tile size for one query token).
    pub fn with_fused_attention(mut self, fused: bool) -> Self {
        self.fused_attention = fused;
        self
    }

    /// Whether multi-token passes use the fused attention op.
    pub fn fused_attention(&self) -> bool {
        self.fused_attention
    }

    /// Longest supported sequence.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// (kv heads, head dim) of the attention layers.
    pub fn kv_shape(&self) -> (usize, usize) {
        self.layers
            .first()
            .map_or((1, 1), |l| (l.self_attn.n_kv_heads, l.self_attn.head_dim))
    }

    /// Final norm and output head; the logits are always f32.
    fn head(&self, h: Tensor<3>, ad: bool) -> Tensor<3> {
        let h = rms_norm(&self.norm, h);
        let logits = match &self.lm_head {
            Some(head) => lin(head, h, ad),
            None => {
                let [b, t, d] = h.dims();
                let w = if ad {
                    self.embed_tokens.weight.val()
                } else {
                    self.embed_tokens.weight.base()
                };
                let v = w.dims()[0];
                let w = like(w, h.dtype());
                h.reshape([b * t, d])
                    .matmul(w.transpose())
                    .reshape([b, t, v])
            }
        };
        like(logits, DType::F32)
    }

    /// Token embeddings in the activation dtype.
    fn embed(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        like(
            self.embed_tokens.forward(tokens),
            self.precision.activation_dtype(),
        )
    }

    /// Full-sequence forward for training and rescoring.
    ///
    /// # Shapes
    /// `tokens` `[batch, seq]`, `mask` `[batch, seq]` (1 on real tokens, left or right padding)
    /// → logits `[batch, seq, vocab]`. Attention is causal and skips padded keys; position ids
    /// count real tokens only.
    pub fn forward(&self, tokens: Tensor<2, Int>, mask: Tensor<2>) -> Tensor<3> {
        self.forward_with(tokens, mask, true)
    }

    /// [`forward`](Self::forward) with LoRA adapters on, or off (`adapters = false`: the frozen
    /// base model, used as the KL reference).
    pub fn forward_with(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        adapters: bool,
    ) -> Tensor<3> {
        self.forward_routed(tokens, mask, &RouteCtx::plain(adapters))
    }

    /// [`forward_with`](Self::forward_with) under a routing context: Mixture-of-LoRA layers
    /// sample or take their top-k as `ctx` says, and record their decisions in it.
    pub fn forward_routed(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        ctx: &RouteCtx,
    ) -> Tensor<3> {
        ctx.begin_pass();
        let ad = ctx.adapters;
        let [b, t] = tokens.dims();
        let positions = position_ids(&mask);
        let device = mask.device();
        let causal = Tensor::<2>::ones([t, t], &device)
            .tril(0)
            .reshape([1, 1, t, t]);
        let allowed = causal * mask.reshape([b, 1, 1, t]);
        let bias = (allowed.neg() + 1.0) * MASKED;
        let mut h = self.embed(tokens);
        for layer in &self.layers {
            let x = rms_norm(&layer.input_layernorm, h.clone());
            let (q, k, v) = layer
                .self_attn
                .project(x, positions.clone(), self.rope_theta, ctx);
            h = h + layer.self_attn.attend(
                q,
                k,
                v,
                bias.clone(),
                ctx,
                self.fused_attention && t > 1,
            );
            h = h.clone()
                + layer
                    .mlp
                    .forward(rms_norm(&layer.post_attention_layernorm, h), ctx);
        }
        self.head(h, ad)
    }

    /// Runs `tokens` `[batch, t]` (with `mask` `[batch, t]`) through the model, appending their
    /// keys and values to `cache`, and returns the logits of the last position `[batch, vocab]`.
    /// Used for the prompt (prefill) and for each decoded token (t = 1).
    ///
    /// # Panics
    /// When the cache has no room for `t` more positions (callers size it first).
    pub fn forward_cached(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        cache: &mut KvCache,
    ) -> Tensor<2> {
        self.forward_cached_routed(tokens, mask, cache, &RouteCtx::plain(true))
    }

    /// [`forward_cached`](Self::forward_cached) under a routing context (sequence routing
    /// records its decisions at the prefill and replays them while decoding).
    pub fn forward_cached_routed(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        cache: &mut KvCache,
        ctx: &RouteCtx,
    ) -> Tensor<2> {
        ctx.begin_pass();
        let [b, t] = tokens.dims();
        let start = cache.len();
        let positions = cache.positions_for(&mask);
        cache.append_mask(mask);
        let bias = cache.attention_bias(start, t);
        let mut h = self.embed(tokens);
        for (i, layer) in self.layers.iter().enumerate() {
            let x = rms_norm(&layer.input_layernorm, h.clone());
            let (q, k, v) = layer
                .self_attn
                .project(x, positions.clone(), self.rope_theta, ctx);
            let (k_all, v_all) = cache.write(i, start, k, v);
            h = h + layer.self_attn.attend(
                q,
                k_all,
                v_all,
                bias.clone(),
                ctx,
                self.fused_attention && t > 1,
            );
            h = h.clone()
                + layer
                    .mlp
                    .forward(rms_norm(&layer.post_attention_layernorm, h), ctx);
        }
        cache.advance(t);
        let [_, _, d] = h.dims();
        let last = h.slice([0..b, t - 1..t, 0..d]);
        let logits = self.head(last, true);
        let v = logits.dims()[2];
        logits.reshape([b, v])
    }

    /// Log-probs of `targets` under the model, and optionally the full-distribution entropy, at
    /// temperature `temperature`: logits at position s predict token s + 1.
    ///
    /// # Shapes
    /// `tokens`, `mask` `[batch, seq]`; returns `[batch, seq − 1]` for the tokens 1..seq.
    /// `adapters = false` scores under the frozen base model (the KL reference of LoRA runs).
    pub fn token_log_probs(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        temperature: f32,
        with_entropy: bool,
        adapters: bool,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let [b, t] = tokens.dims();
        let logits = self.forward_with(tokens.clone(), mask, adapters);
        let v = logits.dims()[2];
        let logits = logits.slice([0..b, 0..t - 1, 0..v]) / temperature;
        let lp = log_softmax(logits, 2);
        let targets = tokens.slice([0..b, 1..t]).reshape([b, t - 1, 1]);
        let picked = lp.clone().gather(2, targets).reshape([b, t - 1]);
        let entropy =
            with_entropy.then(|| (lp.clone().exp() * lp).sum_dim(2).neg().reshape([b, t - 1]));
        (picked, entropy)
    }
}
