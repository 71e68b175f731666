//! The decoder: Llama/Qwen2 as Hugging Face's `modeling_llama.py` / `modeling_qwen2.py` define
//! them (RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU MLP).
//!
//! Field names follow the Hugging Face module tree (`layers.N.self_attn.q_proj`), so LoRA target
//! patterns and PEFT keys read the same as in Python.

use crate::cache::{CacheShape, KvCache};
use crate::config::LlamaConfig;
pub(crate) use crate::rope::apply_rope;
use crate::rope::rope_tables;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::kind::Autodiff;
use burn::tensor::{DType, Device, Int, Tensor};
use ember_kernels::{QuantMatrix, op};
use ember_molora::{MoLora, RouteCtx};

use ember_train::Precision;

pub(crate) use ember_kernels::op::like;

/// RMSNorm computed in f32 and returned in the input's dtype (HF `LlamaRMSNorm`;
/// `ember_kernels::op::rms_norm` chooses the kernel).
pub(crate) fn rms_norm<const D: usize>(n: &RmsNorm, x: Tensor<D>) -> Tensor<D> {
    op::rms_norm(x, n.gamma.val(), n.epsilon)
}

/// Qwen3's per-head RMSNorm over the last axis of `[b, t, heads, hd]`, in f32 (HF
/// `Qwen3Attention`: `q_norm(q_proj(x).view(..., head_dim))`); the identity without a norm.
pub(crate) fn head_norm(n: &Option<RmsNorm>, x: Tensor<4>) -> Tensor<4> {
    match n {
        None => x,
        Some(n) => rms_norm(n, x),
    }
}

/// Additive bias for masked attention scores (finite, so fully masked rows stay NaN-free).
pub(crate) const MASKED: f32 = -1e9;

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
    /// RMSNorm of each query head before RoPE (Qwen3).
    pub q_norm: Option<RmsNorm>,
    /// RMSNorm of each key head before RoPE (Qwen3).
    pub k_norm: Option<RmsNorm>,
    pub(crate) n_heads: usize,
    pub(crate) n_kv_heads: usize,
    pub(crate) head_dim: usize,
    /// W_q, W_k, W_v, W_o as quantized blocks for decoding steps (`crate::blocks`).
    #[module(skip)]
    pub(crate) blocks: [Option<QuantMatrix>; 4],
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
    /// Gate, up and down as quantized blocks for decoding steps (`crate::blocks`).
    #[module(skip)]
    pub(crate) blocks: [Option<QuantMatrix>; 3],
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
    /// RoPE inverse frequencies `[head_dim / 2]` and the cos/sin multiplier (`crate::rope`).
    #[module(skip)]
    pub(crate) rope: (Vec<f32>, f32),
    pub(crate) max_positions: usize,
    /// Precision of the products (not stored in checkpoints).
    #[module(skip)]
    pub(crate) precision: Precision,
    /// Use burn's fused attention op for multi-token passes (prefill, rescoring).
    #[module(skip)]
    pub(crate) fused_attention: bool,
    /// Score rows that share their prompt by running the prompt once (see `crate::shared`).
    #[module(skip)]
    pub(crate) shared_prefix: bool,
    /// Training passes checkpoint their layers (see `crate::checkpoint`).
    #[module(skip)]
    pub(crate) checkpoint_layers: bool,
    /// The output head as quantized blocks for decoding steps (`crate::blocks`).
    #[module(skip)]
    pub(crate) head_blocks: Option<QuantMatrix>,
}

/// Applies `l` with its effective weight (LoRA adapter included) or, when `adapters` is false,
/// with the frozen base weight alone: the reference policy without a second copy of the model.
/// The product runs in the input's dtype (the weight is cast to it under mixed precision).
///
/// A LoRA adapter is applied factored, `x·W + s·(x·A)·B` (Hu et al. 2021, eq. 3), rather than
/// through burn's `Param::val()`, which would materialise `W + s·A·B` on every call and, under
/// autodiff, compute the full `[d_in, d_out]` gradient of the frozen weight before projecting it
/// onto A and B: the factored form costs two rank-r products and back-propagates only to A, B
/// and x.
///
/// `blocks`, the frozen base weight as quantized blocks, serves the base product of decoding
/// steps (`ember_kernels::op::reads_blocks`).
fn lin<const D: usize>(
    l: &Linear,
    blocks: Option<&QuantMatrix>,
    x: Tensor<D>,
    adapters: bool,
) -> Tensor<D> {
    let dt = x.dtype();
    let adapter = if adapters { l.weight.adapter() } else { None };
    let bias = l
        .bias
        .as_ref()
        .map(|b| like(if adapters { b.val() } else { b.base() }, dt));
    // Without an adapter, `base()` is the weight itself (trainable or not).
    let y = match blocks.filter(|q| op::reads_blocks(&x, q)) {
        Some(q) => crate::blocks::blocks_linear(x.clone(), q, bias),
        None => rows_linear(x.clone(), like(l.weight.base(), dt), bias),
    };
    match adapter {
        None => y,
        Some(ad) => {
            let low = rows_linear(x, like(ad.a.val(), dt), None);
            y + rows_linear(low, like(ad.b.val(), dt), None).mul_scalar(ad.scale)
        }
    }
}

/// `x·w (+ bias)` with x's leading dims folded into rows: one 2-D product `[rows, d_in]·[d_in,
/// d_out]` (`ember_kernels::op::linear` chooses the kernel), so that under autodiff w's
/// gradient is one `[d_in, rows]·[rows, d_out]` product. burn's `linear` keeps the batched form
/// when each batch's rows fill its tiles (e.g. 16 or 128 positions); w is then broadcast to
/// `[batch, d_in, d_out]` and its gradient is computed as `batch` separate products,
/// materialised at that size and summed over the batch.
fn rows_linear<const D: usize>(x: Tensor<D>, w: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<D> {
    let mut dims = x.dims();
    let d_in = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    dims[D - 1] = w.dims()[1];
    op::linear(x.reshape([rows, d_in]), w, bias).reshape(dims)
}

/// A projection (`blocks`: its weight as quantized blocks, if kept) plus its Mixture-of-LoRA,
/// if any (off with the adapters).
pub(crate) fn proj(
    l: &Linear,
    blocks: &Option<QuantMatrix>,
    mix: &Option<MoLora>,
    x: Tensor<3>,
    c: &RouteCtx,
) -> Tensor<3> {
    let blocks = blocks.as_ref();
    match mix {
        Some(m) if c.adapters => {
            let dt = x.dtype();
            lin(l, blocks, x.clone(), true) + like(m.forward(like(x, DType::F32), c), dt)
        }
        _ => lin(l, blocks, x, c.adapters),
    }
}

fn linear(d_in: usize, d_out: usize, bias: bool, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out).with_bias(bias).init(device)
}

impl LlamaConfig {
    /// A randomly initialised model (weights are normally loaded from a checkpoint).
    pub fn init(&self, device: &Device) -> Llama {
        let hd = self.head_dim();
        let head_norm = |d: usize| {
            RmsNormConfig::new(d)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let norm = || head_norm(self.d_model);
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
                    q_norm: self.qk_norm.then(|| head_norm(hd)),
                    k_norm: self.qk_norm.then(|| head_norm(hd)),
                    n_heads: self.n_heads,
                    n_kv_heads: self.n_kv_heads,
                    head_dim: hd,
                    blocks: Default::default(),
                },
                post_attention_layernorm: norm(),
                mlp: Mlp {
                    gate_proj: linear(self.d_model, self.d_ff, self.out_bias, device),
                    up_proj: linear(self.d_model, self.d_ff, self.out_bias, device),
                    down_proj: linear(self.d_ff, self.d_model, self.out_bias, device),
                    gate_mix: None,
                    up_mix: None,
                    down_mix: None,
                    blocks: Default::default(),
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
            rope: crate::rope::inv_freq(self.rope_theta, hd, self.rope_scaling.as_ref()),
            max_positions: self.max_position_embeddings,
            precision: Precision::F32,
            fused_attention: false,
            shared_prefix: true,
            checkpoint_layers: false,
            head_blocks: None,
        }
    }
}

impl Attention {
    fn project(
        &self,
        x: Tensor<3>,
        (cos, sin): &(Tensor<4>, Tensor<4>),
        c: &RouteCtx,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, t, _] = x.dims();
        let hd = self.head_dim;
        let q = head_norm(
            &self.q_norm,
            proj(&self.q_proj, &self.blocks[0], &self.q_mix, x.clone(), c).reshape([
                b,
                t,
                self.n_heads,
                hd,
            ]),
        )
        .swap_dims(1, 2);
        let k = head_norm(
            &self.k_norm,
            proj(&self.k_proj, &self.blocks[1], &self.k_mix, x.clone(), c).reshape([
                b,
                t,
                self.n_kv_heads,
                hd,
            ]),
        )
        .swap_dims(1, 2);
        let v = proj(&self.v_proj, &self.blocks[2], &self.v_mix, x, c)
            .reshape([b, t, self.n_kv_heads, hd])
            .swap_dims(1, 2);
        (apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    }

    /// W_o over the heads' outputs `[b, t, heads·hd]` ([`heads`](Self::heads)).
    pub(crate) fn output(&self, heads: Tensor<3>, c: &RouteCtx) -> Tensor<3> {
        proj(&self.o_proj, &self.blocks[3], &self.o_mix, heads, c)
    }

    /// softmax(q kᵀ/√d + bias) v over `k`, `v` `[b, kv_heads, keys, hd]`, bias `[b, 1, t, keys]`:
    /// the heads' outputs `[b, t, heads·hd]` before W_o. `ember_kernels::op::attention` chooses
    /// the kernel; `fused` runs burn's `attention` op where Ember's does not run (a fused kernel
    /// where the backend has one; the same formula decomposed elsewhere and under autodiff),
    /// otherwise explicit products and softmax, which every backend runs for every shape.
    pub(crate) fn heads(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        bias: Tensor<4>,
        fused: bool,
    ) -> Tensor<3> {
        let [b, h, t, hd] = q.dims();
        op::attention(q, k, v, bias, fused)
            .swap_dims(1, 2)
            .reshape([b, t, h * hd])
    }
}

/// What every decoder layer of an unshared pass reads besides its input: the rotary tables
/// (cos, sin), the attention bias `[b, 1, t, t]` (causal and padding), and whether burn's fused
/// attention runs.
#[derive(Clone)]
pub(crate) struct PlainPass {
    rope: (Tensor<4>, Tensor<4>),
    bias: Tensor<4>,
    fused: bool,
}

impl PlainPass {
    /// The same on `h`'s side of autodiff (a checkpointed pass runs its layers without it).
    pub(crate) fn matching(&self, h: &Tensor<3>) -> Self {
        let side = |t: &Tensor<4>| beside(t.clone(), h);
        Self {
            rope: (side(&self.rope.0), side(&self.rope.1)),
            bias: side(&self.bias),
            fused: self.fused,
        }
    }
}

/// `t` on `h`'s side of autodiff: a checkpointed pass runs its layers outside it and recomputes
/// them inside, with the same inputs.
pub(crate) fn beside<const D: usize, K: Autodiff>(t: Tensor<D, K>, h: &Tensor<3>) -> Tensor<D, K> {
    match h.is_autodiff() {
        true => t.autodiff(),
        false => t.inner(),
    }
}

impl Block {
    /// Layer `i` of an unshared pass over the residual stream `h` `[b, t, d_model]`: attention
    /// then the MLP, each pre-normed and added back; `visit` is shown each projection's input.
    pub(crate) fn plain_step(
        &self,
        i: usize,
        h: Tensor<3>,
        pass: &PlainPass,
        ctx: &RouteCtx,
        visit: &mut Option<Visit<'_>>,
    ) -> Tensor<3> {
        let a = &self.self_attn;
        let x = rms_norm(&self.input_layernorm, h.clone());
        if let Some(f) = visit.as_mut() {
            for (j, l) in [&a.q_proj, &a.k_proj, &a.v_proj].into_iter().enumerate() {
                f(i, j, l, &x);
            }
        }
        let (q, k, v) = a.project(x, &pass.rope, ctx);
        let heads = a.heads(q, k, v, pass.bias.clone(), pass.fused);
        if let Some(f) = visit.as_mut() {
            f(i, 3, &a.o_proj, &heads);
        }
        let h = h + a.output(heads, ctx);
        let x = rms_norm(&self.post_attention_layernorm, h.clone());
        h + self.mlp.forward(x, ctx, i, visit)
    }
}

impl Mlp {
    /// down(silu(gate(x)) · up(x)), showing `visit` the inputs of gate, up (x) and down.
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        c: &RouteCtx,
        layer: usize,
        visit: &mut Option<Visit<'_>>,
    ) -> Tensor<3> {
        if let Some(f) = visit.as_mut() {
            f(layer, 4, &self.gate_proj, &x);
            f(layer, 5, &self.up_proj, &x);
        }
        let gate = proj(
            &self.gate_proj,
            &self.blocks[0],
            &self.gate_mix,
            x.clone(),
            c,
        );
        let up = proj(&self.up_proj, &self.blocks[1], &self.up_mix, x, c);
        let act = op::swiglu(gate, up);
        if let Some(f) = visit.as_mut() {
            f(layer, 6, &self.down_proj, &act);
        }
        proj(&self.down_proj, &self.blocks[2], &self.down_mix, act, c)
    }
}

/// A callback shown each projection with its input `[batch, seq, d_in]`: the layer, the
/// projection's index in [`crate::lora::TARGETS`] (q, k, v, o, gate, up, down), the projection.
pub type Visit<'a> = &'a mut dyn FnMut(usize, usize, &Linear, &Tensor<3>);

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

    /// This model with its training passes checkpointed per layer (`[train]
    /// checkpoint_activations`; `crate::checkpoint`): each layer's input kept alone and the
    /// layer recomputed in the backward pass. No-grad passes are unchanged.
    pub fn with_checkpointing(mut self, on: bool) -> Self {
        self.checkpoint_layers = on;
        self
    }

    /// Whether training passes checkpoint their layers.
    pub fn checkpointing(&self) -> bool {
        self.checkpoint_layers
    }

    /// This model with burn's fused `attention` op for passes of more than one query token
    /// (prefill, rescoring, training); single-token decode steps keep the explicit path, which
    /// every backend runs (burn 0.22's fused CUDA kernel has no tile size for one query token).
    pub fn with_fused_attention(mut self, fused: bool) -> Self {
        self.fused_attention = fused;
        self
    }

    /// This model scoring rows that share their prompt columns with one pass over each distinct
    /// prompt (on by default; off: every row runs its own prompt, the reference computation).
    pub fn with_shared_prefix(mut self, shared: bool) -> Self {
        self.shared_prefix = shared;
        self
    }

    /// Whether scoring shares the prompt columns of rows with equal prompts.
    pub fn shared_prefix(&self) -> bool {
        self.shared_prefix
    }

    /// Whether multi-token passes use the fused attention op.
    pub fn fused_attention(&self) -> bool {
        self.fused_attention
    }

    /// Longest supported sequence.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The sizes of a KV cache for this model.
    pub fn cache_shape(&self) -> CacheShape {
        let (kv_heads, head_dim) = self.kv_shape();
        CacheShape {
            layers: self.n_layers(),
            kv_heads,
            head_dim,
            dtype: self.precision().activation_dtype(),
        }
    }

    /// `(key/value heads, head dimension)` of the attention layers.
    pub fn kv_shape(&self) -> (usize, usize) {
        self.layers
            .first()
            .map_or((1, 1), |l| (l.self_attn.n_kv_heads, l.self_attn.head_dim))
    }

    /// The output head's weight (the embeddings when tied).
    fn head_weight(&self) -> Tensor<2> {
        match &self.lm_head {
            Some(head) => head.weight.base(),
            None => self.embed_tokens.weight.base(),
        }
    }

    /// The head's weight for the fused head (`ember_kernels::head_log_probs`), or None where the
    /// decomposed head runs: `ember_kernels::op::head_runs` says it does not run here, or the
    /// head carries an adapter.
    fn fused_head_weight(&self, h: &Tensor<3>, adapters: bool) -> Option<Tensor<2>> {
        // A linear head stores `[d_model, vocab]`, the tied embeddings `[vocab, d_model]`.
        let (weight, linear) = match &self.lm_head {
            Some(head) => (&head.weight, true),
            None => (&self.embed_tokens.weight, false),
        };
        let w = weight.base();
        let usable = op::head_runs(h, w.dtype()) && !(adapters && weight.adapter().is_some());
        usable.then(|| if linear { w.transpose() } else { w })
    }

    /// The tied head's quantized blocks where a decoding step reads them: kept, not under an
    /// embedding adapter, and `ember_kernels::op::reads_blocks` says so.
    fn tied_blocks(&self, h: &Tensor<3>, ad: bool) -> Option<&QuantMatrix> {
        let adapter = ad && self.embed_tokens.weight.adapter().is_some();
        let tied = self.lm_head.is_none() && !adapter;
        self.head_blocks
            .as_ref()
            .filter(|q| tied && op::reads_blocks(h, q))
    }

    /// Final norm and output head; the logits are always f32.
    pub(crate) fn head(&self, h: Tensor<3>, ad: bool) -> Tensor<3> {
        let h = rms_norm(&self.norm, h);
        let logits = match (&self.lm_head, self.tied_blocks(&h, ad)) {
            (Some(head), _) => lin(head, self.head_blocks.as_ref(), h, ad),
            (None, Some(q)) => crate::blocks::blocks_linear(h, q, None),
            (None, None) => {
                let [b, t, d] = h.dims();
                let w = if ad {
                    self.embed_tokens.weight.val()
                } else {
                    self.embed_tokens.weight.base()
                };
                let v = w.dims()[0];
                let w = like(w, h.dtype());
                let h = h.reshape([b * t, d]);
                op::logits(h, w).reshape([b, t, v])
            }
        };
        like(logits, DType::F32)
    }

    /// Token embeddings in the activation dtype.
    pub(crate) fn embed(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
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
        let h = self.hidden_routed(tokens, mask, ctx);
        self.head(h, ctx.adapters)
    }

    /// RoPE cos/sin tables for `positions`, in the activations' dtype: built once per pass and
    /// shared by every layer.
    pub(crate) fn rope(&self, positions: Tensor<2, Int>) -> (Tensor<4>, Tensor<4>) {
        let (cos, sin) = rope_tables(positions, &self.rope.0, self.rope.1);
        let dt = self.precision.activation_dtype();
        (like(cos, dt), like(sin, dt))
    }

    /// The last layer's output `[batch, seq, d_model]` (before the final norm and the head).
    pub(crate) fn hidden_routed(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        ctx: &RouteCtx,
    ) -> Tensor<3> {
        self.layers_pass(tokens, mask, ctx, None)
    }

    /// Runs the base model (adapters off) over `tokens` `[batch, seq]` with `mask`, showing
    /// `visit(layer, projection, linear, input)` every projection's input `[batch, seq, d_in]`,
    /// layer by layer, projections in [`crate::lora::TARGETS`]' order (PLoP's scores,
    /// `crate::plop`).
    pub fn visit_projection_inputs(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        visit: Visit<'_>,
    ) {
        self.layers_pass(tokens, mask, &RouteCtx::plain(false), Some(visit));
    }

    /// The decoder layers over `tokens` (the last layer's output), showing `visit` each
    /// projection's input when given.
    fn layers_pass(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        ctx: &RouteCtx,
        mut visit: Option<Visit<'_>>,
    ) -> Tensor<3> {
        ctx.begin_pass();
        let pass = self.plain_pass(&mask);
        let mut h = self.embed(tokens);
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.plain_step(i, h, &pass, ctx, &mut visit);
        }
        h
    }

    /// What every layer of an unshared pass over `mask` `[batch, t]` reads besides its input.
    pub(crate) fn plain_pass(&self, mask: &Tensor<2>) -> PlainPass {
        let [b, t] = mask.dims();
        let device = mask.device();
        let causal = Tensor::<2>::ones([t, t], &device)
            .tril(0)
            .reshape([1, 1, t, t]);
        let allowed = causal * mask.clone().reshape([b, 1, 1, t]);
        PlainPass {
            rope: self.rope(position_ids(mask)),
            bias: (allowed.neg() + 1.0) * MASKED,
            fused: self.fused_attention && t > 1,
        }
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
        // On a worker of the CPU backend's pool, so that the step's parallel products split
        // between this thread and the others (`ember_kernels::on_workers`).
        ember_kernels::on_workers(|| {
            self.forward_cached_routed(tokens, mask, cache, &RouteCtx::plain(true))
        })
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
        let h = self.cached_hidden(tokens, mask, cache, ctx);
        let [b, t, d] = h.dims();
        let last = h.slice([0..b, t - 1..t, 0..d]);
        let logits = self.head(last, true);
        let v = logits.dims()[2];
        logits.reshape([b, v])
    }

    /// [`forward_cached`](Self::forward_cached) returning the logits of every one of the `t`
    /// positions, `[batch, t, vocab]`: a long sequence scored chunk by chunk, each chunk
    /// attending to the keys the earlier ones left in `cache` (`ember serve`'s `echo`).
    ///
    /// # Panics
    /// When the cache has no room for `t` more positions (callers size it first).
    pub fn forward_cached_all(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        cache: &mut KvCache,
    ) -> Tensor<3> {
        let h = self.cached_hidden(tokens, mask, cache, &RouteCtx::plain(true));
        self.head(h, true)
    }

    /// The final hidden states `[batch, t, d_model]` of `tokens` after the cache's positions,
    /// whose keys and values are appended to `cache`.
    fn cached_hidden(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        cache: &mut KvCache,
        ctx: &RouteCtx,
    ) -> Tensor<3> {
        ctx.begin_pass();
        let t = tokens.dims()[1];
        let start = cache.len();
        let rope = self.rope(cache.positions_for(&mask));
        cache.append_mask(mask);
        // Keys past the ones written are masked for every row: attention reads the filled
        // prefix of the cache's buffers (views, not copies), not their whole capacity.
        let filled = start + t;
        let bias = cache.attention_bias(start, t);
        let [b, _, _, cap] = bias.dims();
        let bias = bias.slice([0..b, 0..1, 0..t, 0..filled.min(cap)]);
        let prefix = |x: Tensor<4>| {
            let [b, kv, _, hd] = x.dims();
            x.slice([0..b, 0..kv, 0..filled.min(cap), 0..hd])
        };
        let mut h = self.embed(tokens);
        for (i, layer) in self.layers.iter().enumerate() {
            let x = rms_norm(&layer.input_layernorm, h.clone());
            let (q, k, v) = layer.self_attn.project(x, &rope, ctx);
            let (k_all, v_all) = cache.write(i, start, k, v);
            let fused = self.fused_attention && t > 1;
            let heads = layer
                .self_attn
                .heads(q, prefix(k_all), prefix(v_all), bias.clone(), fused);
            h = h + layer.self_attn.output(heads, ctx);
            let x = rms_norm(&layer.post_attention_layernorm, h.clone());
            h = h + layer.mlp.forward(x, ctx, i, &mut None);
        }
        cache.advance(t);
        h
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
        let t = tokens.dims()[1];
        let how = Scoring {
            temperature,
            entropy: with_entropy,
            adapters,
        };
        self.last_log_probs(tokens, mask, t - 1, how)
    }

    /// [`token_log_probs`](Self::token_log_probs) of the last `n` tokens only (a response after
    /// its prompt): the final norm, the output head and the softmax run on those `n` positions
    /// alone, not on the whole sequence.
    ///
    /// # Shapes
    /// `tokens`, `mask` `[batch, seq]`, `1 <= n < seq`; returns `[batch, n]` for the tokens
    /// `seq − n .. seq`.
    pub fn last_log_probs(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        n: usize,
        how: Scoring,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let t = tokens.dims()[1];
        assert!(
            n >= 1 && n < t,
            "last_log_probs: n = {n} for sequences of {t}"
        );
        let adapters = how.adapters;
        let h = self.hidden_routed(tokens.clone(), mask, &RouteCtx::plain(adapters));
        self.response_log_probs(h, tokens, n, how)
    }

    /// Log-probs of `targets` where position s of `tokens` predicts `targets[s]` (Tinker's
    /// alignment: a target need not be the next input token), and optionally the entropies.
    ///
    /// # Shapes
    /// `tokens`, `mask`, `targets` `[batch, seq]`; returns `[batch, seq]`.
    pub fn target_log_probs(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        targets: Tensor<2, Int>,
        how: Scoring,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        assert_eq!(tokens.dims(), targets.dims(), "target_log_probs: shapes");
        let h = self.hidden_routed(tokens, mask, &RouteCtx::plain(how.adapters));
        self.head_log_probs(h, targets, how.temperature, how.entropy, how.adapters)
    }

    /// The log-probs (and entropies) of the last `n` of `tokens` `[b, t]` from the last layer's
    /// output `h` `[b, t, d_model]`: the final norm and the head on the positions before them.
    pub(crate) fn response_log_probs(
        &self,
        h: Tensor<3>,
        tokens: Tensor<2, Int>,
        n: usize,
        how: Scoring,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let [b, t, d] = h.dims();
        let h = h.slice([0..b, t - 1 - n..t - 1, 0..d]);
        let targets = tokens.slice([0..b, t - n..t]);
        self.head_log_probs(h, targets, how.temperature, how.entropy, how.adapters)
    }

    /// The final norm, the output head and [`chosen_log_probs`] over hidden states `h`
    /// `[batch, n, d_model]` that predict `targets` `[batch, n]`.
    pub(crate) fn head_log_probs(
        &self,
        h: Tensor<3>,
        targets: Tensor<2, Int>,
        temperature: f32,
        with_entropy: bool,
        adapters: bool,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let [b, n, d] = h.dims();
        let rows = b * n;
        if let Some(w) = self.fused_head_weight(&h, adapters) {
            // The fused head: no `[rows, vocab]` logits held, forward or for backward.
            let h = rms_norm(&self.norm, h).reshape([rows, d]);
            let (lp, ent) =
                ember_kernels::head_log_probs(h, w, targets.reshape([rows]), temperature);
            return (
                lp.reshape([b, n]),
                with_entropy.then(|| ent.reshape([b, n])),
            );
        }
        let h = h.reshape([1, rows, d]);
        let targets = targets.reshape([1, rows]);
        // With a frozen head (no-grad scoring, LoRA training) the head and the softmax run over
        // row chunks whose logits stay under LOGITS_CHUNK elements: only one chunk's
        // `[rows, vocab]` temporaries live at a time in no-grad scoring, and each chunk's
        // buffers are small enough for the allocator to reuse instead of mapping (and the
        // kernel zeroing) fresh pages for every vocabulary-wide tensor. A trainable head takes
        // one chunk: each chunk would add a whole `[vocab, d_model]` weight gradient.
        let per = if self.head_weight().is_require_grad() {
            rows
        } else {
            (LOGITS_CHUNK / self.vocab_size().max(1)).clamp(1, rows)
        };
        let (mut lps, mut ents) = (Vec::new(), Vec::new());
        for start in (0..rows).step_by(per) {
            let end = (start + per).min(rows);
            let logits = self.head(h.clone().slice([0..1, start..end, 0..d]), adapters);
            let (lp, ent) = chosen_log_probs(
                logits,
                targets.clone().slice([0..1, start..end]),
                temperature,
                with_entropy,
            );
            lps.push(lp);
            ents.extend(ent);
        }
        let entropy = with_entropy.then(|| Tensor::cat(ents, 1).reshape([b, n]));
        (Tensor::cat(lps, 1).reshape([b, n]), entropy)
    }
}

impl Llama {
    /// The final-normed hidden states (f32) at the positions that predict the last `n` tokens,
    /// `seq − 1 − n .. seq − 1`: what a value head reads for the states before each response
    /// token (verl's critic takes `values[:, -n - 1:-1]` of its per-position outputs).
    ///
    /// # Shapes
    /// `tokens`, `mask` `[batch, seq]`, `1 <= n < seq` → `[batch, n, d_model]`.
    pub fn last_hidden(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        n: usize,
        adapters: bool,
    ) -> Tensor<3> {
        let [b, t] = tokens.dims();
        assert!(n >= 1 && n < t, "last_hidden: n = {n} for sequences of {t}");
        let h = self.hidden_routed(tokens, mask, &RouteCtx::plain(adapters));
        let d = h.dims()[2];
        let h = rms_norm(&self.norm, h.slice([0..b, t - 1 - n..t - 1, 0..d]));
        like(h, DType::F32)
    }
}

/// Logit elements per chunk of [`Llama::last_log_probs`] (16 MiB of f32, under glibc's largest
/// mmap threshold of 32 MiB).
const LOGITS_CHUNK: usize = 1 << 22;

/// How tokens are scored: the softmax's temperature, whether the entropy is returned beside
/// the log-probs, and whether the LoRA adapters are on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scoring {
    /// The softmax's temperature (the sampler's).
    pub temperature: f32,
    /// Return each position's entropy too.
    pub entropy: bool,
    /// The LoRA adapters on (off: the base model).
    pub adapters: bool,
}

/// log softmax(z/T)_y = (z_y − m)/T − log Σ_v exp((z_v − m)/T) with m = max z (detached: the
/// shift cancels in value and gradient), and the entropy H = log S − Σ_v e_v·s_v / S with
/// s = (z − m)/T, e = exp(s), S = Σ e: the chosen token's log-prob and the entropy without
/// materialising the `[batch, n, vocab]` log-softmax (HF/verl `logprobs_from_logits` computes
/// the same as `gather(logits) − logsumexp(logits)`).
///
/// # Shapes
/// `logits` `[batch, n, vocab]`, `targets` `[batch, n]` → `[batch, n]` each.
pub fn chosen_log_probs(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    temperature: f32,
    with_entropy: bool,
) -> (Tensor<2>, Option<Tensor<2>>) {
    let [b, n, _] = logits.dims();
    let m = logits.clone().detach().max_dim(2);
    let mut shifted = logits - m;
    if temperature != 1.0 {
        shifted = shifted.mul_scalar(1.0 / temperature);
    }
    let e = shifted.clone().exp();
    let sum = e.clone().sum_dim(2);
    let log_sum = sum.clone().log();
    let picked = shifted.clone().gather(2, targets.reshape([b, n, 1])) - log_sum.clone();
    let entropy = with_entropy.then(|| (log_sum - (e * shifted).sum_dim(2) / sum).reshape([b, n]));
    (picked.reshape([b, n]), entropy)
}
