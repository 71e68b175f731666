//! Per-block activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear
//! Memory Cost", §3 and Algorithm 1 with one segment per layer; PyTorch's
//! `torch.utils.checkpoint`, which TRL's `gradient_checkpointing` applies per decoder layer): a
//! training forward runs the decoder layers outside autodiff and keeps each layer's input
//! alone; the loss's backward reaches the last layer's output, then each layer is run again from
//! its kept input, with autodiff, and back-propagates the gradient of its output, last layer
//! first. The gradients are those of the plain backward (the same operations, recomputed); the
//! memory a step holds for its layers is one `[rows, positions, d_model]` input each, plus one
//! layer's activations during its recomputation, for about one more forward pass of time.

use crate::model::{Block, Llama, Scoring};
use crate::shared::SharedRows;
use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Gradients, Int, Tensor};
use ember_molora::RouteCtx;
use ember_train::Recompute;
use std::sync::Arc;

/// Log-probs `[rows, n]` and, when asked, entropies.
type Scores = (Tensor<2>, Option<Tensor<2>>);

/// Layer `i` applied to a residual stream: the pass's own step with what it reads bound in.
type LayerStep = dyn Fn(usize, &Block, Tensor<3>) -> Tensor<3> + Send + Sync;

impl Llama {
    /// Whether a training pass of this model checkpoints its layers: asked for
    /// ([`with_checkpointing`](Self::with_checkpointing)), and no layer carries a
    /// Mixture-of-LoRA (whose routing state a recomputation would replay).
    pub(crate) fn checkpoints(&self) -> bool {
        self.checkpoint_layers && crate::mixture::mixtures(self).is_empty()
    }

    /// The last layer's output over `tokens` `[b, t]` with `mask`, its layers checkpointed, and
    /// what finishes the backward.
    pub(crate) fn checkpointed_hidden(
        &self,
        tokens: Tensor<2, Int>,
        mask: &Tensor<2>,
        adapters: bool,
    ) -> (Tensor<3>, Recompute) {
        let pass = self.plain_pass(mask);
        let step = move |i: usize, layer: &Block, h: Tensor<3>| {
            let pass = pass.matching(&h);
            layer.plain_step(i, h, &pass, &RouteCtx::plain(adapters), &mut None)
        };
        self.checkpointed(self.embed(tokens), Arc::new(step))
    }

    /// [`shared_hidden`](Self::shared_hidden) with its layers checkpointed, and what finishes
    /// the backward.
    pub(crate) fn checkpointed_shared(
        &self,
        s: &SharedRows,
        adapters: bool,
    ) -> ((Tensor<3>, Tensor<3>), Recompute) {
        let pass = self.shared_pass(s);
        let unsplit = pass.clone();
        let step = move |i: usize, layer: &Block, h: Tensor<3>| {
            let pass = pass.matching(&h);
            layer.shared_step(i, h, &pass, &RouteCtx::plain(adapters))
        };
        let (h, recompute) = self.checkpointed(self.shared_embed(s), Arc::new(step));
        (unsplit.unsplit(h), recompute)
    }

    /// [`last_log_probs`](Self::last_log_probs) of a training pass, its layers checkpointed,
    /// and what finishes the backward.
    pub(crate) fn checkpointed_last_log_probs(
        &self,
        tokens: Tensor<2, Int>,
        mask: &Tensor<2>,
        n: usize,
        how: Scoring,
    ) -> (Scores, Recompute) {
        let (h, recompute) = self.checkpointed_hidden(tokens.clone(), mask, how.adapters);
        (self.response_log_probs(h, tokens, n, how), recompute)
    }

    /// [`shared_log_probs`](Self::shared_log_probs) of a training pass, its layers
    /// checkpointed, and what finishes the backward.
    pub(crate) fn checkpointed_shared_log_probs(
        &self,
        s: &SharedRows,
        how: Scoring,
    ) -> (Scores, Recompute) {
        let ((hp, hr), recompute) = self.checkpointed_shared(s, how.adapters);
        (self.shared_scores(hp, hr, s, how), recompute)
    }

    /// Runs every layer over `embedded` outside autodiff, keeping each one's input; returns
    /// the last output as a leaf that requires its gradient, and the recomputation.
    fn checkpointed(&self, embedded: Tensor<3>, step: Arc<LayerStep>) -> (Tensor<3>, Recompute) {
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut h = embedded.clone().inner();
        for (i, layer) in self.layers.iter().enumerate() {
            inputs.push(h.clone());
            h = step(i, &layer.valid(), h);
        }
        let out = h.autodiff().require_grad();
        let tape = Tape {
            model: self.clone(),
            inputs,
            step,
            embedded,
            out: out.clone(),
        };
        (out, Recompute::new(move |grads| tape.finish(grads)))
    }
}

/// What a checkpointed forward leaves for its backward.
struct Tape {
    /// The model (its parameters' ids, and its layers to recompute).
    model: Llama,
    /// Each layer's input, outside autodiff.
    inputs: Vec<Tensor<3>>,
    step: Arc<LayerStep>,
    /// The embeddings' output (tracked when the embeddings train).
    embedded: Tensor<3>,
    /// The leaf the rest of the forward read.
    out: Tensor<3>,
}

impl Tape {
    /// Every parameter's gradient: those the loss's backward reached (`grads`: the head's and
    /// the final norm's), then each layer's from its recomputation, last first, then the
    /// embeddings'.
    fn finish(self, mut grads: Gradients) -> GradientsParams {
        let model = &self.model;
        let mut acc = GradientsAccumulator::<Llama>::new();
        let mut dy = self.out.grad_remove(&mut grads);
        acc.accumulate(model, GradientsParams::from_grads(grads, model));
        for (i, x) in self.inputs.into_iter().enumerate().rev() {
            let Some(g) = dy else {
                break;
            };
            let x = x.autodiff().require_grad();
            let y = (self.step)(i, &model.layers[i], x.clone());
            let mut grads = (y * g).sum().backward();
            dy = x.grad_remove(&mut grads);
            acc.accumulate(model, GradientsParams::from_grads(grads, model));
        }
        if let Some(g) = dy.filter(|_| self.embedded.is_tracked()) {
            let grads = (self.embedded * g).sum().backward();
            acc.accumulate(model, GradientsParams::from_grads(grads, model));
        }
        acc.grads()
    }
}
