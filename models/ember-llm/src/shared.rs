//! Shared-prefix scoring: the rows of a batch that share their prompt (the n samples of a GRPO
//! group) run that prompt through the decoder once, and every response attends to the shared
//! prompt keys and values (the idea of Prefix Grouper, Liu et al. 2025, arXiv 2506.05433: the
//! shared prefix encoded once, each suffix attending to it; here the prompt and the suffixes
//! share each projection's product, and only attention is split). Under autodiff the prompt's
//! keys and values are gathered per row with `select`, whose backward sums the rows' gradients
//! into the one prompt: the same gradients as running the prompt in every row.

use crate::model::{
    Block, Llama, MASKED, Scoring, apply_rope, beside, head_norm, like, position_ids, proj,
    rms_norm,
};
use burn::tensor::{DType, Int, Tensor, TensorData};
use ember_molora::RouteCtx;

/// Rows whose prompt columns are grouped: `prompts` `[U, P]` distinct prompts (tokens and mask),
/// `owner` `[R]` the prompt of each row, `responses` `[R, N]` the rows' own columns.
pub(crate) struct SharedRows {
    pub(crate) prompt_tokens: Tensor<2, Int>,
    pub(crate) prompt_mask: Tensor<2>,
    pub(crate) owner: Tensor<1, Int>,
    pub(crate) tokens: Tensor<2, Int>,
    pub(crate) mask: Tensor<2>,
}

/// For each row the index of its prompt among the distinct prompts (in order of first use), and
/// the first row of each distinct prompt: rows are equal when their prompt tokens and prompt
/// mask are equal column for column (`tokens`, `mask` `[rows, p]`, row-major host copies).
pub(crate) fn group_prompts(tokens: &[i64], mask: &[f32], p: usize) -> (Vec<usize>, Vec<usize>) {
    let rows = tokens.len().checked_div(p).unwrap_or(0);
    let mut firsts: Vec<usize> = Vec::new();
    let mut owner = Vec::with_capacity(rows);
    let key = |r: usize| (&tokens[r * p..(r + 1) * p], &mask[r * p..(r + 1) * p]);
    for r in 0..rows {
        match firsts.iter().position(|f| key(*f) == key(r)) {
            Some(u) => owner.push(u),
            None => {
                owner.push(firsts.len());
                firsts.push(r);
            }
        }
    }
    (owner, firsts)
}

impl SharedRows {
    /// Splits `tokens`, `mask` `[rows, p + n]` after column `p` and groups the rows by their
    /// first `p` columns (one host read of those columns); `None` when no two rows share them.
    pub(crate) fn split(tokens: Tensor<2, Int>, mask: Tensor<2>, p: usize) -> Option<Self> {
        let [rows, t] = tokens.dims();
        if p == 0 || p >= t || rows < 2 {
            return None;
        }
        let pt = tokens.clone().slice([0..rows, 0..p]);
        let pm = mask.clone().slice([0..rows, 0..p]);
        let host_t = pt.clone().try_into_vec_as::<i64>().ok()?;
        let host_m = pm.clone().try_into_vec_as::<f32>().ok()?;
        let (owner, firsts) = group_prompts(&host_t, &host_m, p);
        if firsts.len() == rows {
            return None;
        }
        let device = tokens.device();
        let ids = |v: &[usize]| {
            let v: Vec<i64> = v.iter().map(|x| *x as i64).collect();
            let n = v.len();
            Tensor::<1, Int>::from_data(TensorData::new(v, [n]), &device)
        };
        let first = ids(&firsts);
        Some(Self {
            prompt_tokens: pt.select(0, first.clone()),
            prompt_mask: pm.select(0, first),
            owner: ids(&owner),
            tokens: tokens.slice([0..rows, p..t]),
            mask: mask.slice([0..rows, p..t]),
        })
    }
}

/// The attention biases of a shared pass: the prompts' own (causal over the prompt) `[U, 1, P,
/// P]`, and the responses' `[R, 1, N, P + N]` (the owner's prompt keys where its mask is 1, then
/// causal over the response where the response mask is 1): the unshared pass's bias, split.
fn biases(s: &SharedRows) -> (Tensor<4>, Tensor<4>) {
    let [u, p] = s.prompt_mask.dims();
    let [r, n] = s.mask.dims();
    let device = s.mask.device();
    let causal = |t: usize| {
        Tensor::<2>::ones([t, t], &device)
            .tril(0)
            .reshape([1, 1, t, t])
    };
    let allowed_p = causal(p) * s.prompt_mask.clone().reshape([u, 1, 1, p]);
    let keys_p = s
        .prompt_mask
        .clone()
        .select(0, s.owner.clone())
        .reshape([r, 1, 1, p])
        .expand([r, 1, n, p]);
    let keys_r = causal(n) * s.mask.clone().reshape([r, 1, 1, n]);
    let allowed_r = Tensor::cat(vec![keys_p, keys_r], 3);
    let bias = |a: Tensor<4>| (a.neg() + 1.0) * MASKED;
    (bias(allowed_p), bias(allowed_r))
}

/// Position ids of a shared pass: the prompts' (`cumsum(mask) − 1`) and the responses' (the
/// owner's prompt length plus the response's own count, minus one): the unshared row's ids.
fn positions(s: &SharedRows) -> (Tensor<2, Int>, Tensor<2, Int>) {
    let counts = s.prompt_mask.clone().sum_dim(1).select(0, s.owner.clone());
    let resp = (s.mask.clone().cumsum(1) + counts - 1.0)
        .clamp_min(0.0)
        .int();
    (position_ids(&s.prompt_mask), resp)
}

/// What every decoder layer of a shared pass reads besides its input: the shape `[U, P, R,
/// N]`, each row's prompt, the prompts' and responses' attention biases and rotary tables, and
/// whether burn's fused attention runs.
#[derive(Clone)]
pub(crate) struct SharedPass {
    shape: [usize; 4],
    owner: Tensor<1, Int>,
    bias: (Tensor<4>, Tensor<4>),
    rope_p: (Tensor<4>, Tensor<4>),
    rope_r: (Tensor<4>, Tensor<4>),
    fused: bool,
}

impl SharedPass {
    /// The same on `h`'s side of autodiff (a checkpointed pass runs its layers without it).
    pub(crate) fn matching(&self, h: &Tensor<3>) -> Self {
        let pair = |(a, b): &(Tensor<4>, Tensor<4>)| (beside(a.clone(), h), beside(b.clone(), h));
        Self {
            shape: self.shape,
            owner: beside(self.owner.clone(), h),
            bias: pair(&self.bias),
            rope_p: pair(&self.rope_p),
            rope_r: pair(&self.rope_r),
            fused: self.fused,
        }
    }

    /// The last layer's stream split into the prompts' `[U, P, d]` and the responses' `[R, N,
    /// d]`.
    pub(crate) fn unsplit(&self, h: Tensor<3>) -> (Tensor<3>, Tensor<3>) {
        let [u, p, r, n] = self.shape;
        let d = h.dims()[2];
        let prompts = h.clone().narrow(1, 0, u * p).reshape([u, p, d]);
        (prompts, h.narrow(1, u * p, r * n).reshape([r, n, d]))
    }
}

impl Block {
    /// Layer `i` of a shared pass over the stream `h` `[1, U·P + R·N, d_model]`: every
    /// projection over prompts and responses at once, the prompts attending to themselves and
    /// each response to its owner's prompt keys and values, then its own.
    pub(crate) fn shared_step(
        &self,
        i: usize,
        h: Tensor<3>,
        pass: &SharedPass,
        ctx: &RouteCtx,
    ) -> Tensor<3> {
        let [u, p, r, n] = pass.shape;
        let split = |x: Tensor<3>, heads: usize, hd: usize| {
            let ph = x.clone().narrow(1, 0, u * p).reshape([u, p, heads, hd]);
            let rh = x.narrow(1, u * p, r * n).reshape([r, n, heads, hd]);
            (ph.swap_dims(1, 2), rh.swap_dims(1, 2))
        };
        let a = &self.self_attn;
        let (hq, kv, hd) = (a.n_heads, a.n_kv_heads, a.head_dim);
        let x = rms_norm(&self.input_layernorm, h.clone());
        // Qwen3's per-head norms act on the last axis (the head's), kept by the split.
        let norm = |n: &Option<_>, (p, r)| (head_norm(n, p), head_norm(n, r));
        let project = |l, b, m, heads| split(proj(l, b, m, x.clone(), ctx), heads, hd);
        let (qp, qr) = norm(&a.q_norm, project(&a.q_proj, &a.blocks[0], &a.q_mix, hq));
        let (kp, kr) = norm(&a.k_norm, project(&a.k_proj, &a.blocks[1], &a.k_mix, kv));
        let (vp, vr) = project(&a.v_proj, &a.blocks[2], &a.v_mix, kv);
        let rope = |t, (cos, sin): &(Tensor<4>, Tensor<4>)| apply_rope(t, cos, sin);
        let (qp, kp) = (rope(qp, &pass.rope_p), rope(kp, &pass.rope_p));
        let (qr, kr) = (rope(qr, &pass.rope_r), rope(kr, &pass.rope_r));
        let keys = Tensor::cat(vec![kp.clone().select(0, pass.owner.clone()), kr], 2);
        let values = Tensor::cat(vec![vp.clone().select(0, pass.owner.clone()), vr], 2);
        let (bias_p, bias_r) = pass.bias.clone();
        let heads_p = a.heads(qp, kp, vp, bias_p, pass.fused && p > 1);
        let heads_r = a.heads(qr, keys, values, bias_r, pass.fused && n > 1);
        let heads = Tensor::cat(
            vec![
                heads_p.reshape([1, u * p, hq * hd]),
                heads_r.reshape([1, r * n, hq * hd]),
            ],
            1,
        );
        let h = h + a.output(heads, ctx);
        let x = rms_norm(&self.post_attention_layernorm, h.clone());
        h + self.mlp.forward(x, ctx, i, &mut None)
    }
}

/// The hidden states that predict the `N` response tokens of each row of `s`, from a shared
/// pass's outputs `(prompts, responses)`: the owner prompt's last position, then the row's first
/// `N − 1` positions (`[R, N, d_model]`).
pub(crate) fn predictors(hp: Tensor<3>, hr: Tensor<3>, s: &SharedRows) -> Tensor<3> {
    let [u, p, d] = hp.dims();
    let [r, n, _] = hr.dims();
    let last = hp.slice([0..u, p - 1..p, 0..d]).select(0, s.owner.clone());
    if n == 1 {
        return last;
    }
    Tensor::cat(vec![last, hr.slice([0..r, 0..n - 1, 0..d])], 1)
}

impl Llama {
    /// Whether this model can score with [`SharedRows`]: sharing is on and no layer carries a
    /// Mixture-of-LoRA (whose routing is per sequence).
    pub(crate) fn can_share(&self) -> bool {
        self.shared_prefix && crate::mixture::mixtures(self).is_empty()
    }

    /// The last layer's outputs of a shared pass: the prompts' `[U, P, d_model]` and the
    /// responses' `[R, N, d_model]`, equal to the unshared pass's at the same positions.
    pub(crate) fn shared_hidden(&self, s: &SharedRows, adapters: bool) -> (Tensor<3>, Tensor<3>) {
        let ctx = RouteCtx::plain(adapters);
        let pass = self.shared_pass(s);
        let mut h = self.shared_embed(s);
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.shared_step(i, h, &pass, &ctx);
        }
        pass.unsplit(h)
    }

    /// The residual stream of prompts and responses as one `[1, U·P + R·N, d]` tensor: every
    /// projection runs once over both.
    pub(crate) fn shared_embed(&self, s: &SharedRows) -> Tensor<3> {
        let [u, p] = s.prompt_tokens.dims();
        let [r, n] = s.tokens.dims();
        let hp = self.embed(s.prompt_tokens.clone());
        let d = hp.dims()[2];
        Tensor::cat(
            vec![
                hp.reshape([1, u * p, d]),
                self.embed(s.tokens.clone()).reshape([1, r * n, d]),
            ],
            1,
        )
    }

    /// What every layer of a shared pass over `s` reads besides its input.
    pub(crate) fn shared_pass(&self, s: &SharedRows) -> SharedPass {
        let [u, p] = s.prompt_tokens.dims();
        let [r, n] = s.tokens.dims();
        let (bias_p, bias_r) = biases(s);
        let (pos_p, pos_r) = positions(s);
        SharedPass {
            shape: [u, p, r, n],
            owner: s.owner.clone(),
            bias: (bias_p, bias_r),
            rope_p: self.rope(pos_p),
            rope_r: self.rope(pos_r),
            fused: self.fused_attention,
        }
    }

    /// The hidden states that predict the `N` response tokens of each row: the owner prompt's
    /// last position, then the row's first `N − 1` positions (`[R, N, d_model]`).
    pub(crate) fn shared_predictors(&self, s: &SharedRows, adapters: bool) -> Tensor<3> {
        let (hp, hr) = self.shared_hidden(s, adapters);
        predictors(hp, hr, s)
    }

    /// The final-normed hidden states (f32) that predict the response tokens of shared rows:
    /// what [`last_hidden`](Self::last_hidden) gives for the rows unsplit.
    pub(crate) fn shared_last_hidden(&self, s: &SharedRows, adapters: bool) -> Tensor<3> {
        like(
            rms_norm(&self.norm, self.shared_predictors(s, adapters)),
            DType::F32,
        )
    }

    /// Log-probs (and entropies) of the response tokens of shared rows: what
    /// [`last_log_probs`](Self::last_log_probs) gives for the rows unsplit.
    pub(crate) fn shared_log_probs(
        &self,
        s: &SharedRows,
        how: Scoring,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let (hp, hr) = self.shared_hidden(s, how.adapters);
        self.shared_scores(hp, hr, s, how)
    }

    /// [`token_log_probs`](Self::token_log_probs) of rows whose first `p` columns hold a prompt
    /// (left-padded) that several rows share: each distinct prompt runs through the decoder
    /// once (the rows' log-probs of their prompt tokens are their prompt's, of their own tokens
    /// from the shared pass), equal to the unshared pass to float rounding. Runs unshared when
    /// no two rows share their prompt columns or sharing is off.
    ///
    /// # Shapes
    /// `tokens`, `mask` `[rows, p + n]` with `1 <= p`, `n >= 1`; returns `[rows, p + n − 1]`
    /// for the tokens `1..p + n`.
    pub fn shared_token_log_probs(
        &self,
        tokens: Tensor<2, Int>,
        mask: Tensor<2>,
        p: usize,
        how: Scoring,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let t = tokens.dims()[1];
        let split = (self.can_share() && p >= 1 && p < t)
            .then(|| SharedRows::split(tokens.clone(), mask.clone(), p))
            .flatten();
        let Some(s) = split else {
            return self.token_log_probs(tokens, mask, how.temperature, how.entropy, how.adapters);
        };
        let (hp, hr) = self.shared_hidden(&s, how.adapters);
        let (resp, resp_h) = self.shared_scores(hp.clone(), hr, &s, how);
        if p == 1 {
            return (resp, resp_h);
        }
        let [u, _, d] = hp.dims();
        let h = hp.slice([0..u, 0..p - 1, 0..d]);
        let targets = s.prompt_tokens.clone().slice([0..u, 1..p]);
        let (lp, ent) = self.head_log_probs(h, targets, how.temperature, how.entropy, how.adapters);
        let own = |x: Tensor<2>| x.select(0, s.owner.clone());
        let lp = Tensor::cat(vec![own(lp), resp], 1);
        let ent = ent
            .zip(resp_h)
            .map(|(a, b)| Tensor::cat(vec![own(a), b], 1));
        (lp, ent)
    }

    /// [`shared_log_probs`](Self::shared_log_probs) from a shared pass's outputs `hp`, `hr`.
    pub(crate) fn shared_scores(
        &self,
        hp: Tensor<3>,
        hr: Tensor<3>,
        s: &SharedRows,
        how: Scoring,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let h = predictors(hp, hr, s);
        self.head_log_probs(
            h,
            s.tokens.clone(),
            how.temperature,
            how.entropy,
            how.adapters,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::group_prompts;

    #[test]
    fn rows_group_by_tokens_and_mask() {
        // Rows 0 and 2 equal; row 1 has the same tokens with another mask; row 3 equals row 1.
        let t = [5, 6, 5, 6, 5, 6, 5, 6];
        let m = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0];
        assert_eq!(group_prompts(&t, &m, 2), (vec![0, 1, 0, 1], vec![0, 1]));
        assert_eq!(group_prompts(&[], &[], 0), (vec![], vec![]));
    }
}
