//! Tinker's built-in losses over `[datums, positions]` tensors, each a **sum** over every
//! token of the request (Tinker's reduction, reported as `loss:sum`). PPO, CISPO and GSPO are
//! the engine's own per-token losses (`ember_engine::policy_loss`, one formula in one place)
//! with Tinker's absolute ratio bounds turned into the engine's ε; cross-entropy, importance
//! sampling and DRO are Tinker's own definitions (tinker-docs, "Loss functions").

use super::wire::{ConfigValue, LossConfigValue};
use burn::tensor::Tensor;
use ember_engine::{PolicyLossInput, PolicyLossKind, policy_loss};
use std::collections::HashMap;

/// The engine's bound on |log π − log q| (`ember_engine`'s `LOG_RATIO_CLAMP`).
const LOG_RATIO_CLAMP: f32 = 20.0;

/// A loss Tinker names, with its `loss_fn_config`.
#[derive(Debug, Clone, PartialEq)]
pub enum LossFn {
    /// `cross_entropy`: L = −Σ w·log π(y) (any real weights: `forward_backward_custom` sends
    /// −∂L/∂log π).
    CrossEntropy,
    /// `importance_sampling`: L = −Σ (π/q)·A, q the sampler's probability.
    ImportanceSampling,
    /// `ppo`: L = −Σ min(r·A, clip(r, lo, hi)·A) with absolute bounds lo, hi.
    Ppo { lo: f32, hi: f32 },
    /// `cispo`: L = −Σ sg(clip(r, lo, hi))·A·log π.
    Cispo { lo: f32, hi: f32 },
    /// `gspo`: the sequence ratio exp(mean log r) over `sequence_ratio_mask`, PPO-clipped per
    /// token with absolute bounds.
    Gspo { lo: f32, hi: f32 },
    /// `dro`: L = −Σ (A·log π − β/2·(log π − log q)²).
    Dro { beta: f32 },
}

impl LossFn {
    /// The loss named `name` with `config` (the SDK's `loss_fn_config_v2`); an unknown name or
    /// key is refused by name.
    pub fn parse(name: &str, config: &HashMap<String, LossConfigValue>) -> Result<Self, String> {
        let allowed: &[&str] = match name {
            "cross_entropy" | "importance_sampling" => &[],
            "ppo" | "cispo" | "gspo" => &["clip_low_threshold", "clip_high_threshold"],
            "dro" => &["beta"],
            "stable_reinforce" | "custom" => {
                return Err(format!(
                    "loss_fn `{name}` is not supported by this server (supported: \
                     cross_entropy, importance_sampling, ppo, cispo, gspo, dro; a custom loss \
                     runs client-side with forward_backward_custom)"
                ));
            }
            other => return Err(format!("unknown loss_fn `{other}`")),
        };
        let mut num = HashMap::new();
        for (k, v) in config {
            if !allowed.contains(&k.as_str()) {
                return Err(format!(
                    "loss_fn_config key `{k}` is not a setting of `{name}` (settings: {})",
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ));
            }
            match &v.value {
                Some(ConfigValue::Number(x)) if x.is_finite() => {
                    num.insert(k.as_str(), *x as f32);
                }
                _ => return Err(format!("loss_fn_config `{k}` must be a finite number")),
            }
        }
        let bounds = |lo: f32, hi: f32| -> Result<(f32, f32), String> {
            let lo = num.get("clip_low_threshold").copied().unwrap_or(lo);
            let hi = num.get("clip_high_threshold").copied().unwrap_or(hi);
            if !((0.0..=1.0).contains(&lo) && hi >= 1.0) {
                return Err(format!(
                    "clip thresholds must satisfy 0 <= clip_low_threshold <= 1 <= \
                     clip_high_threshold; got {lo} and {hi}"
                ));
            }
            Ok((lo, hi))
        };
        Ok(match name {
            "cross_entropy" => Self::CrossEntropy,
            "importance_sampling" => Self::ImportanceSampling,
            "ppo" => {
                let (lo, hi) = bounds(0.8, 1.2)?;
                if lo <= 0.0 {
                    return Err("ppo: clip_low_threshold must be > 0".into());
                }
                Self::Ppo { lo, hi }
            }
            "cispo" => {
                let (lo, hi) = bounds(0.0, 4.0)?;
                Self::Cispo { lo, hi }
            }
            "gspo" => {
                // The engine's GSPO defaults (Zheng et al. 2025: ε_l 3e-4, ε_h 4e-4).
                let (lo, hi) = bounds(1.0 - 3e-4, 1.0 + 4e-4)?;
                Self::Gspo { lo, hi }
            }
            _ => {
                let beta = num
                    .get("beta")
                    .copied()
                    .ok_or("dro needs loss_fn_config beta")?;
                if beta < 0.0 {
                    return Err(format!("dro: beta must be >= 0, got {beta}"));
                }
                Self::Dro { beta }
            }
        })
    }

    /// The `loss_fn_inputs` it reads besides `target_tokens`.
    pub fn inputs(&self) -> &'static [&'static str] {
        match self {
            Self::CrossEntropy => &["weights"],
            _ => &["logprobs", "advantages"],
        }
    }
}

/// A micro-batch's per-token inputs, `[datums, positions]`, zero past each datum's end.
pub struct LossInputs {
    /// log π of the targets, with gradient.
    pub log_probs: Tensor<2>,
    /// 1 on each datum's positions.
    pub mask: Tensor<2>,
    /// The named inputs the loss reads ([`LossFn::inputs`]), and `sequence_ratio_mask` for
    /// GSPO when given.
    pub named: HashMap<String, Tensor<2>>,
}

impl LossInputs {
    fn get(&self, name: &str) -> Result<Tensor<2>, String> {
        self.named
            .get(name)
            .cloned()
            .ok_or_else(|| format!("loss_fn_inputs has no `{name}`"))
    }
}

/// The loss, summed over every position of every datum (a scalar tensor `[1]`).
pub fn total(loss: &LossFn, x: &LossInputs) -> Result<Tensor<1>, String> {
    let lp = x.log_probs.clone();
    let per_token = match *loss {
        LossFn::CrossEntropy => x.get("weights")?.mul(lp).neg(),
        LossFn::ImportanceSampling => {
            let q = x.get("logprobs")?;
            // The log-ratio clamped as the engine clamps it (±20), so a sentinel q at a position
            // with A = 0 gives 0, not ∞·0.
            (lp - q)
                .clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
                .exp()
                .mul(x.get("advantages")?)
                .neg()
        }
        LossFn::Dro { beta } => {
            let (q, a) = (x.get("logprobs")?, x.get("advantages")?);
            let d = lp.clone() - q;
            (lp.mul(a) - d.clone().mul(d).mul_scalar(beta / 2.0)).neg()
        }
        LossFn::Ppo { lo, hi } => return engine(ppo(lo, hi), x, x.mask.clone()),
        LossFn::Cispo { lo, hi } => {
            let kind = PolicyLossKind::Cispo {
                clip_low: 1.0 - lo,
                clip_high: hi - 1.0,
            };
            return engine(kind, x, x.mask.clone());
        }
        LossFn::Gspo { lo, hi } => {
            let kind = PolicyLossKind::Gspo {
                clip_low: 1.0 - lo,
                clip_high: hi - 1.0,
            };
            let mask = match x.named.get("sequence_ratio_mask") {
                Some(m) => m.clone().mul(x.mask.clone()),
                None => x.mask.clone(),
            };
            return engine(kind, x, mask);
        }
    };
    Ok(per_token.mul(x.mask.clone()).sum())
}

fn ppo(lo: f32, hi: f32) -> PolicyLossKind {
    PolicyLossKind::Ppo {
        clip_low: 1.0 - lo,
        clip_high: hi - 1.0,
        dual_clip: None,
    }
}

/// The engine's per-token loss `kind` with the sampler's log-probs as log π_old (its `mask`
/// the positions a sequence ratio averages over: GSPO's `sequence_ratio_mask`), summed over
/// every position of every datum.
fn engine(kind: PolicyLossKind, x: &LossInputs, mask: Tensor<2>) -> Result<Tensor<1>, String> {
    let input = PolicyLossInput {
        log_probs: x.log_probs.clone(),
        old_log_probs: x.get("logprobs")?,
        advantages: x.get("advantages")?,
        mask,
        ref_log_probs: None,
    };
    let out = policy_loss(&kind, &input).map_err(|e| e.to_string())?;
    Ok(out.per_step.mul(x.mask.clone()).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    fn t(v: &[f32], dev: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [1, v.len()]), dev)
    }

    fn cfg(pairs: &[(&str, f64)]) -> HashMap<String, LossConfigValue> {
        pairs
            .iter()
            .map(|(k, v)| {
                let value = Some(ConfigValue::Number(*v));
                (k.to_string(), LossConfigValue { value })
            })
            .collect()
    }

    /// Hand-worked sums on three tokens (the last masked out): lp = (−1, −2, −3),
    /// q = (−1.5, −1.5, 0), A = (2, −1, 5), w = (1, −0.5, 9).
    #[test]
    fn each_loss_equals_its_hand_worked_sum() {
        let dev = Device::flex();
        let inputs = LossInputs {
            log_probs: t(&[-1.0, -2.0, -3.0], &dev),
            mask: t(&[1.0, 1.0, 0.0], &dev),
            named: HashMap::from([
                ("weights".to_string(), t(&[1.0, -0.5, 9.0], &dev)),
                ("logprobs".to_string(), t(&[-1.5, -1.5, 0.0], &dev)),
                ("advantages".to_string(), t(&[2.0, -1.0, 5.0], &dev)),
            ]),
        };
        let sum = |l: LossFn| total(&l, &inputs).unwrap().into_scalar::<f32>();
        let (r1, r2) = (0.5f32.exp(), (-0.5f32).exp());
        // −(1·−1 + −0.5·−2) = 0.
        assert!((sum(LossFn::CrossEntropy) - 0.0).abs() < 1e-6);
        // −(r1·2 + r2·−1).
        let is = -(2.0 * r1 - r2);
        assert!((sum(LossFn::ImportanceSampling) - is).abs() < 1e-5);
        // PPO 0.8/1.2: token 1 (A > 0) clipped to 1.2·2; token 2 (A < 0, r2 = 0.607 < 0.8):
        // min(−r2, −0.8) = −0.8.
        let ppo = -(1.2 * 2.0 - 0.8);
        assert!((sum(LossFn::parse("ppo", &cfg(&[])).unwrap()) - ppo).abs() < 1e-5);
        // CISPO 0/4: no clipping here: −(r1·2·−1 + r2·−1·−2).
        let cispo = -(-r1 * 2.0 + r2 * 2.0);
        assert!((sum(LossFn::parse("cispo", &cfg(&[])).unwrap()) - cispo).abs() < 1e-5);
        // DRO β = 0.5: −Σ (A·lp − 0.25·(lp − q)²) = −((−2 − 0.0625) + (2 − 0.0625)).
        let dro = -((-2.0 - 0.0625) + (2.0 - 0.0625));
        let l = LossFn::parse("dro", &cfg(&[("beta", 0.5)])).unwrap();
        assert!((sum(l) - dro).abs() < 1e-5);
    }

    #[test]
    fn unknown_losses_and_settings_are_refused_by_name() {
        let e = LossFn::parse("dpo", &cfg(&[])).unwrap_err();
        assert!(e.contains("unknown loss_fn `dpo`"), "{e}");
        let e = LossFn::parse("ppo", &cfg(&[("beta", 1.0)])).unwrap_err();
        assert!(e.contains("`beta` is not a setting of `ppo`"), "{e}");
        let e = LossFn::parse("ppo", &cfg(&[("clip_low_threshold", 1.5)])).unwrap_err();
        assert!(e.contains("clip thresholds"), "{e}");
        assert!(LossFn::parse("stable_reinforce", &cfg(&[])).is_err());
        assert!(
            LossFn::parse("dro", &cfg(&[]))
                .unwrap_err()
                .contains("beta")
        );
    }
}
