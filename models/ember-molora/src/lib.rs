//! Mixture-of-LoRA layers: a frozen base projection plus N low-rank experts, k of which are active
//! per token (or per sequence), chosen by a router.
//!
//! Two routers:
//! - **learned** (the usual Mixture-of-LoRAs, e.g. MoLE/MixLoRA): softmax over the router's
//!   logits, the top-k kept and renormalised, trained end to end by backprop, with the optional
//!   Switch-Transformer load-balancing loss;
//! - **ReMix** (reinforcement routing): the routing weights are equal (1/k) and not learnable;
//!   the router is a stochastic policy that samples k experts without replacement from its
//!   softmax, trained by an RLOO policy gradient with −(supervised loss) as the reward, through
//!   the engine's estimators and losses ([`router_pg_loss`]). At inference it takes its top-k.
//!
//! The layer computes every expert densely (N is small) and weights them, so its cost does not
//! depend on which experts are active; "activated parameters" counts the k active experts.

use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Int, Tensor};
use ember_engine::{
    ActorInput, ActorLossConfig, AdvantageConfig, AdvantageKind, AggNorm, LossAgg, Metrics,
    PolicyLossInput, PolicyLossKind, RolloutBatch, actor_loss, compute_advantages,
};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};

/// Errors of the mixture layers.
#[derive(Debug, thiserror::Error)]
pub enum MixtureError {
    /// A setting is out of range.
    #[error("mixture.{field}: {reason}")]
    Config {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The engine refused the router batch.
    #[error(transparent)]
    Engine(#[from] ember_engine::EngineError),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, MixtureError>;

/// Which router.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RouterKind {
    /// Softmax top-k weights trained by backprop.
    Learned {
        /// Weight of the Switch load-balancing loss (0 = off).
        #[serde(default)]
        aux_coef: f32,
    },
    /// Equal weights over k experts sampled without replacement; router trained by RLOO.
    Remix {
        /// M: selections drawn per input (the RLOO group size).
        #[serde(default = "four")]
        selections: usize,
        /// Weight of the router's policy-gradient loss.
        #[serde(default = "one")]
        pg_coef: f32,
    },
}

fn four() -> usize {
    4
}
fn one() -> f32 {
    1.0
}

/// Routing decisions per token or per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    /// One decision per token.
    #[default]
    Token,
    /// One decision per sequence, from the mean of the layer input over the pooling mask
    /// ([`RouteCtx::pool_mask`], e.g. the prompt).
    Sequence,
}

/// Settings of the mixture layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixtureSettings {
    /// N experts per layer.
    pub experts: usize,
    /// k active experts.
    pub top_k: usize,
    /// Rank of each expert.
    pub rank: usize,
    /// α (each expert's update is scaled by α/r).
    #[serde(default = "alpha")]
    pub alpha: f64,
    /// The router.
    pub router: RouterKind,
    /// Per token or per sequence.
    #[serde(default)]
    pub granularity: Granularity,
}

fn alpha() -> f64 {
    16.0
}

impl MixtureSettings {
    /// Checks ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason: String| Err(MixtureError::Config { field, reason });
        if self.experts == 0 || self.rank == 0 {
            return bad("experts", "experts and rank must be >= 1".into());
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return bad(
                "top_k",
                format!("{} must be in 1..={} (experts)", self.top_k, self.experts),
            );
        }
        if let RouterKind::Remix { selections, .. } = self.router {
            if selections < 2 {
                return bad(
                    "router.selections",
                    format!("{selections} must be >= 2 (leave-one-out needs two)"),
                );
            }
            if self.top_k > 5 {
                return bad(
                    "top_k",
                    "ReMix's subset log-probability sums over k! orders; keep k <= 5".into(),
                );
            }
        }
        Ok(())
    }
}

/// What one mixture layer decided in a forward pass (all detached except `log_prob`).
#[derive(Debug, Clone)]
pub struct RouteRecord {
    /// `[b, s]` log-probability of the sampled k-subset (ReMix training only), with gradient
    /// to the router; `s` is the sequence length (token routing) or 1.
    pub log_prob: Option<Tensor<2>>,
    /// `[b, s, N]` router softmax (with gradient for the learned router's auxiliary loss).
    pub probs: Tensor<3>,
    /// `[b, s, N]` routing weights actually applied.
    pub weights: Tensor<3>,
    /// `[b, s, N]` k-hot selection.
    pub selected: Tensor<3>,
}

/// Routing context of one forward pass: whether adapters are on, whether ReMix routers sample,
/// and where the layers' decisions are recorded.
#[derive(Debug, Default)]
pub struct RouteCtx {
    /// Adapters and mixtures on (false: the frozen base model, the reference policy).
    pub adapters: bool,
    /// ReMix routers sample (training) instead of taking their top-k (inference).
    pub sample: bool,
    /// Keep a [`RouteRecord`] per mixture layer call.
    pub record: bool,
    /// `[b, t]` pooling mask for sequence routing (default: all positions).
    pub pool_mask: Option<Tensor<2>>,
    records: RefCell<Vec<RouteRecord>>,
    /// Sequence routing during cached decoding: the prefill's weights, replayed per call.
    replay: RefCell<Option<Vec<Tensor<3>>>>,
    cursor: Cell<usize>,
}

impl RouteCtx {
    /// Plain inference or scoring: top-k routing, nothing recorded.
    pub fn plain(adapters: bool) -> Self {
        Self {
            adapters,
            ..Self::default()
        }
    }

    /// Training: ReMix routers sample, decisions are recorded.
    pub fn training() -> Self {
        Self {
            adapters: true,
            sample: true,
            record: true,
            ..Self::default()
        }
    }

    /// Cached decoding: records the prefill's decisions (sequence routing pools over
    /// `prompt_mask`); call [`start_replay`](Self::start_replay) after the prefill.
    pub fn decoding(prompt_mask: Tensor<2>) -> Self {
        Self {
            adapters: true,
            record: true,
            pool_mask: Some(prompt_mask),
            ..Self::default()
        }
    }

    /// Sets the pooling mask of sequence routing.
    pub fn with_pool_mask(mut self, mask: Tensor<2>) -> Self {
        self.pool_mask = Some(mask);
        self
    }

    /// Records every layer's decisions.
    pub fn recording(mut self) -> Self {
        self.record = true;
        self
    }

    /// The records of the pass so far.
    pub fn take_records(&self) -> Vec<RouteRecord> {
        std::mem::take(&mut self.records.borrow_mut())
    }

    /// Turns recorded sequence-routing weights into a replay for the decode steps that follow.
    pub fn start_replay(&self) {
        let w: Vec<Tensor<3>> = self.take_records().into_iter().map(|r| r.weights).collect();
        *self.replay.borrow_mut() = Some(w);
    }

    /// Stops recording (decode steps of token routing need no records).
    pub fn stop_recording(&mut self) {
        self.record = false;
    }

    /// Called at the start of every forward pass (resets the replay cursor).
    pub fn begin_pass(&self) {
        self.cursor.set(0);
    }

    fn replayed(&self) -> Option<Tensor<3>> {
        let r = self.replay.borrow();
        let w = r.as_ref()?.get(self.cursor.get()).cloned();
        self.cursor.set(self.cursor.get() + 1);
        w
    }
}

/// A Mixture-of-LoRA adapter for one linear layer `d_in → d_out`; its output is added to the
/// frozen base projection's.
#[derive(Module, Debug)]
pub struct MoLora {
    /// Down factors `[N, d_in, r]`, A ~ N(0, 1/r).
    pub a: Param<Tensor<3>>,
    /// Up factors `[N, r, d_out]`, B = 0 (the model starts unchanged).
    pub b: Param<Tensor<3>>,
    /// Router `d_in → N` (no bias).
    pub router: Linear,
    top_k: usize,
    scale: f64,
    remix: bool,
    per_sequence: bool,
}

/// k-hot `[.., N]` from indices `[.., k]`.
fn k_hot(idx: Tensor<3, Int>, n: usize) -> Tensor<3> {
    let [b, s, _] = idx.dims();
    idx.one_hot::<4>(n).float().sum_dim(2).reshape([b, s, n])
}

/// log P(S) of the unordered k-subset `idx` `[b, s, k]` drawn without replacement from `probs`
/// `[b, s, N]` (sequential draws, as Gumbel-top-k samples them):
/// P(S) = Σ_{orders σ of S} Π_i p_{σ_i} / (1 − Σ_{j<i} p_{σ_j}) (Kool et al. 2019, eq. 1 summed
/// over orders).
pub fn subset_log_prob(probs: Tensor<3>, idx: Tensor<3, Int>) -> Tensor<2> {
    let [b, s, k] = idx.dims();
    let sel = probs.gather(2, idx);
    let cols: Vec<Tensor<2>> = (0..k)
        .map(|i| sel.clone().slice([0..b, 0..s, i..i + 1]).reshape([b, s]))
        .collect();
    let mut total: Option<Tensor<2>> = None;
    for order in permutations(k) {
        let mut term = cols[order[0]].clone();
        let mut used = cols[order[0]].clone();
        for &j in &order[1..] {
            term = term * cols[j].clone() / used.clone().neg().add_scalar(1.0).clamp_min(1e-12);
            used = used + cols[j].clone();
        }
        total = Some(match total {
            None => term,
            Some(t) => t + term,
        });
    }
    total
        .unwrap_or_else(|| Tensor::ones([b, s], &sel.device()))
        .clamp_min(1e-30)
        .log()
}

/// All orders of `0..k`.
pub fn permutations(k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in permutations(k - 1) {
        for pos in 0..=p.len() {
            let mut q = p.clone();
            q.insert(pos, k - 1);
            out.push(q);
        }
    }
    out
}

impl MixtureSettings {
    /// A fresh mixture for a `d_in → d_out` layer.
    pub fn init(&self, d_in: usize, d_out: usize, device: &Device) -> MoLora {
        let (n, r) = (self.experts, self.rank);
        let a = Tensor::<3>::random(
            [n, d_in, r],
            Distribution::Normal(0.0, (1.0 / r as f64).sqrt()),
            device,
        );
        MoLora {
            a: Param::from_tensor(a),
            b: Param::from_tensor(Tensor::zeros([n, r, d_out], device)),
            router: LinearConfig::new(d_in, n).with_bias(false).init(device),
            top_k: self.top_k,
            scale: self.alpha / r as f64,
            remix: matches!(self.router, RouterKind::Remix { .. }),
            per_sequence: self.granularity == Granularity::Sequence,
        }
    }
}

impl MoLora {
    /// N.
    pub fn experts(&self) -> usize {
        self.a.dims()[0]
    }

    /// Parameters of the k experts one token activates (the router not counted).
    pub fn activated_params(&self) -> usize {
        let [_, d_in, r] = self.a.dims();
        let d_out = self.b.dims()[2];
        self.top_k * r * (d_in + d_out)
    }

    /// Parameters of the router.
    pub fn router_params(&self) -> usize {
        self.a.dims()[1] * self.experts()
    }

    fn route(&self, x: &Tensor<3>, ctx: &RouteCtx) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let n = self.experts();
        let k = self.top_k;
        if self.per_sequence
            && let Some(w) = ctx.replayed()
        {
            return w;
        }
        let input = if self.remix {
            x.clone().detach()
        } else {
            x.clone()
        };
        let input = if self.per_sequence {
            let m = ctx
                .pool_mask
                .clone()
                .filter(|m| m.dims() == [b, t])
                .unwrap_or_else(|| Tensor::ones([b, t], &x.device()));
            let m3 = m.clone().reshape([b, t, 1]);
            (input * m3.clone()).sum_dim(1) / m3.sum_dim(1).clamp_min(1.0)
        } else {
            input
        };
        let logits = self.router.forward(input);
        let s = logits.dims()[1];
        let probs = softmax(logits.clone(), 2);
        let (weights, selected, log_prob) = if self.remix {
            let scores = if ctx.sample {
                let u =
                    Tensor::<3>::random([b, s, n], Distribution::Uniform(1e-10, 1.0), &x.device());
                logits.detach() - u.log().neg().log()
            } else {
                logits.detach()
            };
            let (_, idx) = scores.topk_with_indices(k, 2);
            let sel = k_hot(idx.clone(), n);
            let lp = ctx.sample.then(|| subset_log_prob(probs.clone(), idx));
            (sel.clone() / k as f32, sel, lp)
        } else {
            let (_, idx) = probs.clone().detach().topk_with_indices(k, 2);
            let sel = k_hot(idx, n);
            let w = probs.clone() * sel.clone();
            let w = w.clone() / w.sum_dim(2).clamp_min(1e-12);
            (w, sel, None)
        };
        if ctx.record {
            ctx.records.borrow_mut().push(RouteRecord {
                log_prob,
                probs,
                weights: weights.clone().detach(),
                selected,
            });
        }
        weights
    }

    /// The mixture's contribution `Σ_e w_e · x A_e B_e · α/r`, `[b, t, d_out]`.
    pub fn forward(&self, x: Tensor<3>, ctx: &RouteCtx) -> Tensor<3> {
        let [b, t, d] = x.dims();
        let [n, _, r] = self.a.dims();
        let d_out = self.b.dims()[2];
        let w = self.route(&x, ctx);
        let s = w.dims()[1];
        let w = if s == t { w } else { w.expand([b, t, n]) };
        let a = self.a.val().swap_dims(0, 1).reshape([d, n * r]);
        let xa = x.reshape([b * t, d]).matmul(a).reshape([b * t, n, r]);
        let xa = (xa * w.reshape([b * t, n, 1])).reshape([b * t, n * r]);
        let out = xa.matmul(self.b.val().reshape([n * r, d_out]));
        out.reshape([b, t, d_out]) * self.scale
    }
}

/// Effective number of experts exp(H(ū)) of the mean routing distribution ū over `mask`ed
/// positions, with `weights` `[b, s, N]` and `mask` `[b, s]`; and the usage counts of each
/// expert (how many routing slots picked it). Host values, for logging.
pub fn balance(weights: &Tensor<3>, selected: &Tensor<3>, mask: &Tensor<2>) -> (f64, Vec<f64>) {
    let [b, s, n] = weights.dims();
    let m = mask.clone().reshape([b, s, 1]);
    let mean = (weights.clone() * m.clone())
        .sum_dim(1)
        .sum_dim(0)
        .reshape([n])
        / m.clone().sum().clamp_min(1e-12).reshape([1]);
    let usage = (selected.clone() * m).sum_dim(1).sum_dim(0).reshape([n]);
    let mean: Vec<f64> = mean.try_into_vec_as::<f64>().unwrap_or_default();
    let h: f64 = mean.iter().filter(|p| **p > 0.0).map(|p| -p * p.ln()).sum();
    (h.exp(), usage.try_into_vec_as::<f64>().unwrap_or_default())
}

/// The Switch-Transformer load-balancing loss N · Σ_e f_e · P_e (Fedus et al. 2021, eq. 4),
/// f_e the fraction of routing slots given to e, P_e the mean router probability, over `mask`.
pub fn load_balance_loss(rec: &RouteRecord, mask: &Tensor<2>) -> Tensor<1> {
    let [b, s, n] = rec.probs.dims();
    let m = if mask.dims() == [b, s] {
        mask.clone()
    } else {
        Tensor::ones([b, s], &rec.probs.device())
    };
    let m3 = m.clone().reshape([b, s, 1]);
    let count = m.sum().clamp_min(1e-12);
    let k = rec
        .selected
        .clone()
        .sum_dim(2)
        .max()
        .reshape([1])
        .clamp_min(1.0);
    let f = (rec.selected.clone() * m3.clone())
        .sum_dim(1)
        .sum_dim(0)
        .reshape([n])
        / (count.clone() * k).reshape([1]);
    let p = (rec.probs.clone() * m3).sum_dim(1).sum_dim(0).reshape([n]) / count.reshape([1]);
    (f.detach() * p).sum() * n as f32
}

/// ReMix's router objective through the engine: the `rows = inputs × M` rows of a training
/// pass, grouped by input (`group_ids`), each with reward −loss (`losses`, `[rows]`, no
/// gradient needed); the log-probabilities of the sampled subsets of every mixture layer and
/// routing step are the policy's steps. RLOO advantages and the vanilla policy gradient,
/// summed over steps and averaged over rows (`seq-mean-token-sum`), whose gradient is the
/// score-function estimate of ∇ E[−loss] (Ahmadian et al. 2024, eq. 5).
pub fn router_pg_loss(
    records: &[RouteRecord],
    step_mask: &Tensor<2>,
    losses: Tensor<1>,
    group_ids: &[usize],
) -> Result<(Tensor<1>, Metrics)> {
    let lps: Vec<Tensor<2>> = records.iter().filter_map(|r| r.log_prob.clone()).collect();
    let [rows, t] = step_mask.dims();
    if lps.is_empty() {
        return Err(MixtureError::Config {
            field: "router",
            reason: "no sampled routing decisions recorded (is the router ReMix, and did the \
                     pass sample?)"
                .into(),
        });
    }
    let masks: Vec<Tensor<2>> = lps
        .iter()
        .map(|lp| {
            if lp.dims()[1] == t {
                step_mask.clone()
            } else {
                step_mask
                    .clone()
                    .sum_dim(1)
                    .greater_elem(0.0)
                    .float()
                    .reshape([rows, 1])
            }
        })
        .collect();
    let log_probs = Tensor::cat(lps, 1);
    let mask = Tensor::cat(masks, 1);
    let batch = RolloutBatch::new(mask.clone(), losses.detach().neg(), group_ids)?;
    let adv = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &batch, 0)?;
    let config = ActorLossConfig {
        policy: PolicyLossKind::Vanilla,
        agg: LossAgg::SeqMeanTokenSum,
        ..ActorLossConfig::default()
    };
    let input = ActorInput {
        policy: PolicyLossInput {
            old_log_probs: log_probs.clone().detach(),
            log_probs,
            advantages: adv.advantages,
            mask: adv.mask.clone(),
            ref_log_probs: None,
        },
        entropy: None,
        rollout_log_probs: None,
        kl: None,
    };
    let (loss, mut metrics) = actor_loss(&config, &input, AggNorm::of_mask(&adv.mask))?;
    metrics.extend(adv.metrics);
    Ok((loss, metrics))
}
