//! Group filters and reward shaping applied between rollout and advantage estimation.

use crate::batch::RolloutBatch;
use crate::error::{Result, check_config};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// DAPO's soft overlong punishment (Yu et al. 2025, eq. 13):
/// 0 for |y| ≤ L_max − L_cache, (L_max − L_cache − |y|)/L_cache inside the cache window,
/// −1 beyond L_max. Added to the outcome reward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongPenalty {
    /// L_max, the maximum response length.
    pub max_len: f32,
    /// L_cache, the length of the soft-penalty window.
    pub cache_len: f32,
    /// Scale of the penalty (1 in the paper).
    #[serde(default = "one")]
    pub factor: f32,
}

fn one() -> f32 {
    1.0
}

impl OverlongPenalty {
    /// Checks the lengths.
    pub fn validate(&self) -> Result<()> {
        check_config(
            "overlong.max_len",
            self.max_len.into(),
            self.max_len > 0.0,
            "must be > 0",
        )?;
        check_config(
            "overlong.cache_len",
            self.cache_len.into(),
            self.cache_len > 0.0 && self.cache_len <= self.max_len,
            "must be in (0, max_len]",
        )
    }

    /// The penalty for response lengths `[batch]`.
    pub fn penalty(&self, lengths: Tensor<1>) -> Tensor<1> {
        let expected = self.max_len - self.cache_len;
        let soft = (lengths.neg().add_scalar(expected) / self.cache_len).clamp(-1.0, 0.0);
        soft * self.factor
    }

    /// Adds the penalty to the batch's rewards (non-finite rewards stay non-finite).
    pub fn apply(&self, batch: &mut RolloutBatch) -> Result<()> {
        self.validate()?;
        batch.rewards = batch.rewards.clone() + self.penalty(batch.lengths());
        Ok(())
    }
}

/// Zeroes the mask of samples flagged as truncated (DAPO §3.4 "overlong filtering"); returns how
/// many were masked as a `[1]` tensor.
pub fn mask_truncated(batch: &mut RolloutBatch) -> Tensor<1> {
    let [b, _] = batch.dims();
    match &batch.truncated {
        Some(t) => {
            let keep = t.clone().bool_not().float();
            batch.mask = batch.mask.clone() * keep.clone().reshape([b, 1]);
            keep.neg().add_scalar(1.0).sum()
        }
        None => Tensor::zeros([1], &batch.mask.device()),
    }
}

/// DAPO's dynamic sampling (Yu et al. 2025, eq. 11, "0 < |{o_i correct}| < G"): the indices of
/// samples whose group has a non-zero reward range over its valid samples. Groups with a single
/// valid sample and groups of all-invalid rewards are dropped too. Returns `(kept, dropped_groups)`.
///
/// This reads the per-sample keep flags to the host once, since which rows survive decides what
/// the trainer generates next.
pub fn dynamic_sampling_keep(batch: &RolloutBatch) -> (Vec<usize>, usize) {
    let valid = batch.reward_valid();
    let zero = batch.groups.zero_range(batch.clean_rewards(), valid);
    let flags: Vec<bool> = zero
        .try_into_vec_as::<bool>()
        .expect("reading keep flags back from the device");
    let mut dropped = std::collections::BTreeSet::new();
    let mut kept = Vec::new();
    for (i, (z, g)) in flags.iter().zip(batch.groups.ids()).enumerate() {
        if *z {
            dropped.insert(*g);
        } else {
            kept.push(i);
        }
    }
    (kept, dropped.len())
}
