//! SeeUPO's turn-by-turn sequential update (Hu et al. 2026, "SeeUPO: Sequence-Level Agentic-RL
//! with Convergence Guarantees", arXiv 2602.06554, §4; reference: modelscope/AgentEvolver,
//! branch `seeupo`, `ba_ray_trainer.py`: `get_agent_update_order`, `update_ratios` and the
//! `sequential_update` loop).
//!
//! A multi-turn episode is read as a sequence of single-turn bandits, one "agent" per turn
//! index. The policy is updated once per turn index, in reverse execution order (last turn
//! first: backward induction), each update seeing only that turn's tokens. As in HAPPO-style
//! sequential multi-agent updates, the advantage of a turn is weighted by the accumulated
//! importance ratio M of the turns already updated in this step:
//! M ← clip(M · clip(s_k, 1−ε_l, 1+ε_h), 1−ε_l, 1+ε_h), where s_k = exp(mean over turn k's tokens
//! of log π_new − log π_old) is turn k's sequence-level (geometric-mean) ratio between the
//! policy after and before turn k's update (log clamped to ±10). The job loop lives in
//! `ember-train` (`sequential_update`); this module holds the tensors' part.

use crate::error::{Result, check_config};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

fn f02() -> f32 {
    0.2
}

/// In which order turn indices are updated (the reference's `update_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOrder {
    /// Last turn first (SeeUPO).
    #[default]
    Reverse,
    /// First turn first (the paper's ablation).
    Forward,
}

/// SeeUPO's schedule: one update per turn index, in `order`, advantages weighted by the
/// accumulated clipped ratio of the turns already updated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnUpdates {
    /// Update order.
    #[serde(default)]
    pub order: TurnOrder,
    /// ε_l of the ratio clip (`adv_clip_ratio_low`).
    #[serde(default = "f02")]
    pub ratio_clip_low: f32,
    /// ε_h of the ratio clip (`adv_clip_ratio_high`).
    #[serde(default = "f02")]
    pub ratio_clip_high: f32,
}

impl Default for TurnUpdates {
    fn default() -> Self {
        Self {
            order: TurnOrder::Reverse,
            ratio_clip_low: 0.2,
            ratio_clip_high: 0.2,
        }
    }
}

impl TurnUpdates {
    /// Checks the clip range.
    pub fn validate(&self) -> Result<()> {
        check_config(
            "turn_updates.ratio_clip_low",
            self.ratio_clip_low.into(),
            (0.0..1.0).contains(&self.ratio_clip_low),
            "must be in [0, 1)",
        )?;
        check_config(
            "turn_updates.ratio_clip_high",
            self.ratio_clip_high.into(),
            self.ratio_clip_high >= 0.0 && self.ratio_clip_high.is_finite(),
            "must be >= 0",
        )
    }

    /// The turn indices `0..turns` in update order.
    pub fn order(&self, turns: usize) -> Vec<usize> {
        match self.order {
            TurnOrder::Reverse => (0..turns).rev().collect(),
            TurnOrder::Forward => (0..turns).collect(),
        }
    }

    /// The accumulated ratio after turn k's update (reference `update_ratios`): `prev` (None
    /// before the first update) times turn k's clipped sequence-level ratio, clipped again.
    /// `old` and `new` are `[batch, steps]` log-probs before and after the update, `turn_mask`
    /// selects turn k's steps; a row without steps in turn k has ratio 1. Returns `[batch]`.
    pub fn accumulate(
        &self,
        prev: Option<Tensor<1>>,
        old: &Tensor<2>,
        new: &Tensor<2>,
        turn_mask: &Tensor<2>,
    ) -> Tensor<1> {
        let [b, _] = turn_mask.dims();
        let (lo, hi) = (1.0 - self.ratio_clip_low, 1.0 + self.ratio_clip_high);
        let len = turn_mask.clone().sum_dim(1).reshape([b]).clamp_min(1.0);
        let diff = (new.clone() - old.clone()) * turn_mask.clone();
        // A masked step's log-prob may be -inf (an observation token): zero it before summing.
        let diff = diff.clone().mask_fill(diff.is_nan(), 0.0);
        let log_s = (diff.sum_dim(1).reshape([b]) / len).clamp(-10.0, 10.0);
        let s = log_s.exp().clamp(lo, hi);
        match prev {
            Some(m) => (m * s).clamp(lo, hi),
            None => s,
        }
        .detach()
    }
}

/// The number of turns in `turn_ids` (max id + 1; 0 when no step belongs to a turn): one host
/// read.
pub fn turn_count(turn_ids: &Tensor<2>) -> usize {
    let max = turn_ids.clone().max().into_scalar::<f32>();
    if max.is_finite() && max >= 0.0 {
        (max as usize).saturating_add(1)
    } else {
        0
    }
}

/// `mask` restricted to the steps of turn `k`.
pub fn turn_mask(mask: &Tensor<2>, turn_ids: &Tensor<2>, k: usize) -> Tensor<2> {
    mask.clone() * turn_ids.clone().equal_elem(k as f32).float()
}

#[cfg(test)]
mod tests {
    //! Tensor cases (a backend is needed) are in the root package's `tests/engine_golden.rs`.
    use super::*;

    /// Reverse is last turn first; forward the execution order.
    #[test]
    fn orders() {
        let r = TurnUpdates::default();
        assert_eq!(r.order(3), vec![2, 1, 0]);
        let f = TurnUpdates {
            order: TurnOrder::Forward,
            ..r
        };
        assert_eq!(f.order(3), vec![0, 1, 2]);
        assert!(r.order(0).is_empty());
    }

    /// ε_l must be in [0, 1).
    #[test]
    fn validates() {
        let bad = TurnUpdates {
            ratio_clip_low: 1.0,
            ..TurnUpdates::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("ratio_clip_low")
        );
        assert!(TurnUpdates::default().validate().is_ok());
    }
}
