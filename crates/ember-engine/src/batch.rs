//! The rollout batch: the one input struct every estimator, filter and loss reads.

use crate::error::{EngineError, Result, check_shape};
use crate::ops::Groups;
use burn::tensor::{Bool, Int, Tensor, TensorData};

/// A batch of `batch` trajectories of up to `steps` steps (tokens of an LLM response,
/// denoising steps of a flow model, routing decisions of a router), as sampled.
///
/// Required: `mask` `[batch, steps]` (1 for real steps), per-sample `rewards` `[batch]`
/// (non-finite values mark a failed reward: excluded from baselines, advantage 0, counted)
/// and `group_ids` (samples of the same prompt share an id). Everything else is optional and
/// added with the `with_*` builders, each of which checks its shape.
#[derive(Debug, Clone)]
pub struct RolloutBatch {
    /// `[batch, steps]` float mask, 1 on valid steps.
    pub mask: Tensor<2>,
    /// `[batch]` outcome reward per sample.
    pub rewards: Tensor<1>,
    /// Group membership (by prompt).
    pub groups: Groups,
    /// `[batch, steps]` per-step rewards added to the outcome reward (placed on the last step).
    pub token_rewards: Option<Tensor<2>>,
    /// `[batch, steps]` log-probs recorded by the sampler (`rollout`).
    pub rollout_log_probs: Option<Tensor<2>>,
    /// `[batch, steps]` log-probs recomputed by the trainer before the update (`old`).
    pub old_log_probs: Option<Tensor<2>>,
    /// `[batch, steps]` log-probs of the reference policy.
    pub ref_log_probs: Option<Tensor<2>>,
    /// `[batch, steps]` critic values (GAE).
    pub values: Option<Tensor<2>>,
    /// `[batch]` baseline reward per sample, e.g. the greedy rollout's reward for ReMax.
    pub baseline_rewards: Option<Tensor<1>>,
    /// `[batch]` true where the sample hit the length limit without finishing.
    pub truncated: Option<Tensor<1, Bool>>,
    /// `[batch, steps]` multi-turn episodes: the index of the policy turn each step belongs to
    /// (0, 1, …), −1 on steps outside the policy's turns (observations, padding); see
    /// [`RolloutBatch::with_turns`].
    pub turn_ids: Option<Tensor<2>>,
    /// `[batch]` mean and std of each row's group over every response drawn for its prompt, not
    /// only the rows in the batch (Reinforce-Ada's `global_stat_est`, see
    /// [`RolloutBatch::with_group_stats`]).
    pub group_stats: Option<(Tensor<1>, Tensor<1>)>,
    /// `[batch, dim]` a representation of each row's prompt (BASIS's kernel reads it; see
    /// [`RolloutBatch::with_features`]).
    pub features: Option<Tensor<2>>,
    /// `[batch, steps]` 1 on the steps that enter the update, where a rejection narrows the
    /// mask after the estimator has read it (see [`RolloutBatch::with_update_mask`]).
    pub update_mask: Option<Tensor<2>>,
    /// `[batch, parts]` the reward's terms before their weighted sum (correctness, format,
    /// each reward program's), for BNPO's advantage decomposition (see
    /// [`RolloutBatch::with_reward_parts`]).
    pub reward_parts: Option<Tensor<2>>,
}

/// The largest reward magnitude taken as a real reward. Beyond it a reward is invalid, like NaN
/// (masked out of baselines and the loss, and counted): f32 statistics of larger values
/// overflow (a group's squared deviations of 1e20 are already infinite) and would turn the whole
/// update into NaN.
pub const REWARD_LIMIT: f32 = 1e9;

/// Whether `r` counts as a reward: finite and within ±[`REWARD_LIMIT`]. The one rule of the
/// engine's masks, every job's logs and the datasets' checks.
pub fn is_valid_reward(r: f64) -> bool {
    r.is_finite() && r.abs() <= f64::from(REWARD_LIMIT)
}

/// Finite and within ±[`REWARD_LIMIT`] (NaN and ±∞ compare false).
fn sane(r: &Tensor<1>) -> Tensor<1, Bool> {
    r.clone().abs().lower_equal_elem(REWARD_LIMIT)
}

impl RolloutBatch {
    /// A batch from its mask, rewards and group ids.
    ///
    /// # Errors
    /// [`EngineError::EmptyBatch`] for zero rows or steps; [`EngineError::ShapeMismatch`] when
    /// `rewards` or `group_ids` disagree with the mask's batch size.
    pub fn new(mask: Tensor<2>, rewards: Tensor<1>, group_ids: &[usize]) -> Result<Self> {
        let [batch, steps] = mask.dims();
        if batch == 0 || steps == 0 {
            return Err(EngineError::EmptyBatch("mask"));
        }
        check_shape("rewards", rewards.dims(), [batch])?;
        check_shape("group_ids", [group_ids.len()], [batch])?;
        let groups = Groups::new(group_ids, &mask.device());
        Ok(Self {
            mask,
            rewards,
            groups,
            token_rewards: None,
            rollout_log_probs: None,
            old_log_probs: None,
            ref_log_probs: None,
            values: None,
            baseline_rewards: None,
            truncated: None,
            turn_ids: None,
            group_stats: None,
            features: None,
            update_mask: None,
            reward_parts: None,
        })
    }

    /// `[batch, steps]` of the batch.
    pub fn dims(&self) -> [usize; 2] {
        self.mask.dims()
    }

    fn check2(&self, name: &'static str, t: &Tensor<2>) -> Result<()> {
        check_shape(name, t.dims(), self.dims())
    }

    /// Adds per-step rewards (`[batch, steps]`; non-finite entries count as 0). Every estimator
    /// honours them: REINFORCE++ and GAE at their steps (GAE ignores those on masked steps, as
    /// verl does), the outcome-level estimators (GRPO, RLOO, …) through the sequence reward
    /// R + Σ_t r_t (verl's `token_level_rewards.sum(-1)`).
    pub fn with_token_rewards(mut self, t: Tensor<2>) -> Result<Self> {
        self.check2("token_rewards", &t)?;
        self.token_rewards = Some(t);
        Ok(self)
    }

    /// Adds the turn structure of multi-turn episodes (turn-level estimators such as TRLOO read
    /// it): the policy turn of each step, −1 outside the policy's turns.
    pub fn with_turns(mut self, turn_ids: Tensor<2>) -> Result<Self> {
        self.check2("turn_ids", &turn_ids)?;
        self.turn_ids = Some(turn_ids);
        Ok(self)
    }

    /// Narrows the steps that enter the update without changing what the estimator reads:
    /// baselines and leave-one-out groups are those of the whole mask, and the advantages and
    /// the loss mask are then multiplied by `keep`. KernelGYM's profiling-based rejection
    /// sampling drops turns this way (Dr.Kernel eq. 9; the reference zeroes the turn's
    /// `response_mask` while TRLOO groups by the unchanged `loss_mask`).
    pub fn with_update_mask(mut self, keep: Tensor<2>) -> Result<Self> {
        self.check2("update_mask", &keep)?;
        self.update_mask = Some(keep);
        Ok(self)
    }

    /// Adds per-row group statistics over a larger pool than the batch (`[batch]` each): GRPO
    /// and Dr.GRPO then centre (and scale) each reward by its row's `mean` (and `std`) instead
    /// of its group's in the batch (Reinforce-Ada's `global_stat_est`: the statistics of every
    /// response drawn for the prompt, of which the batch keeps a balanced few).
    ///
    /// # Errors
    /// Shape mismatch with the batch.
    pub fn with_group_stats(mut self, mean: Tensor<1>, std: Tensor<1>) -> Result<Self> {
        let b = [self.dims()[0]];
        check_shape("group_stats.mean", mean.dims(), b)?;
        check_shape("group_stats.std", std.dims(), b)?;
        self.group_stats = Some((mean, std));
        Ok(self)
    }

    /// Adds per-row prompt representations `[batch, dim]` (BASIS shares rewards between rows
    /// whose representations are close).
    ///
    /// # Errors
    /// A row count other than the batch's, or zero columns.
    pub fn with_features(mut self, t: Tensor<2>) -> Result<Self> {
        let [rows, dim] = t.dims();
        check_shape("features", [rows], [self.dims()[0]])?;
        if dim == 0 {
            return Err(EngineError::EmptyBatch("features"));
        }
        self.features = Some(t);
        Ok(self)
    }

    /// Adds the reward's terms `[batch, parts]`, each row's values before their weighted sum,
    /// for BNPO's advantage decomposition (a non-finite value marks that part's reward failed,
    /// as in `rewards`).
    ///
    /// # Errors
    /// A row count other than the batch's, or zero columns.
    pub fn with_reward_parts(mut self, t: Tensor<2>) -> Result<Self> {
        let [rows, parts] = t.dims();
        check_shape("reward_parts", [rows], [self.dims()[0]])?;
        if parts == 0 {
            return Err(EngineError::EmptyBatch("reward_parts"));
        }
        self.reward_parts = Some(t);
        Ok(self)
    }

    /// Adds the sampler's log-probs.
    pub fn with_rollout_log_probs(mut self, t: Tensor<2>) -> Result<Self> {
        self.check2("rollout_log_probs", &t)?;
        self.rollout_log_probs = Some(t);
        Ok(self)
    }

    /// Adds the recomputed old log-probs.
    pub fn with_old_log_probs(mut self, t: Tensor<2>) -> Result<Self> {
        self.check2("old_log_probs", &t)?;
        self.old_log_probs = Some(t);
        Ok(self)
    }

    /// Adds the reference policy's log-probs.
    pub fn with_ref_log_probs(mut self, t: Tensor<2>) -> Result<Self> {
        self.check2("ref_log_probs", &t)?;
        self.ref_log_probs = Some(t);
        Ok(self)
    }

    /// Adds critic values.
    pub fn with_values(mut self, t: Tensor<2>) -> Result<Self> {
        self.check2("values", &t)?;
        self.values = Some(t);
        Ok(self)
    }

    /// Adds per-sample baseline rewards (ReMax).
    pub fn with_baseline_rewards(mut self, t: Tensor<1>) -> Result<Self> {
        check_shape("baseline_rewards", t.dims(), [self.dims()[0]])?;
        self.baseline_rewards = Some(t);
        Ok(self)
    }

    /// Adds truncation flags.
    pub fn with_truncated(mut self, t: Tensor<1, Bool>) -> Result<Self> {
        check_shape("truncated", t.dims(), [self.dims()[0]])?;
        self.truncated = Some(t);
        Ok(self)
    }

    /// `[batch]` float: 1 where the outcome reward (and baseline reward, if any) is valid:
    /// finite and at most [`REWARD_LIMIT`] in magnitude.
    pub fn reward_valid(&self) -> Tensor<1> {
        let mut valid = sane(&self.rewards);
        if let Some(b) = &self.baseline_rewards {
            valid = valid.bool_and(sane(b));
        }
        valid.float()
    }

    /// `[batch]` rewards with invalid entries (see [`RolloutBatch::reward_valid`]) replaced by 0.
    pub fn clean_rewards(&self) -> Tensor<1> {
        let invalid = sane(&self.rewards).bool_not();
        self.rewards.clone().mask_fill(invalid, 0.0)
    }

    /// `[batch]` number of valid steps per sample.
    pub fn lengths(&self) -> Tensor<1> {
        let [batch, _] = self.dims();
        self.mask.clone().sum_dim(1).reshape([batch])
    }

    /// The rows at `indices` (in that order), e.g. those kept by dynamic sampling.
    ///
    /// # Errors
    /// [`EngineError::EmptyBatch`] when `indices` is empty; [`EngineError::ShapeMismatch`] when an
    /// index is out of range.
    pub fn select(&self, indices: &[usize]) -> Result<Self> {
        let [b, _] = self.dims();
        if indices.is_empty() {
            return Err(EngineError::EmptyBatch("indices"));
        }
        if let Some(&bad) = indices.iter().find(|&&i| i >= b) {
            return Err(EngineError::ShapeMismatch {
                name: "indices",
                actual: vec![bad],
                expected: vec![b],
            });
        }
        let device = self.mask.device();
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [indices.len()]), &device);
        let rows2 = |t: &Tensor<2>| t.clone().select(0, idx.clone());
        let rows1 = |t: &Tensor<1>| t.clone().select(0, idx.clone());
        let ids: Vec<usize> = indices.iter().map(|&i| self.groups.ids()[i]).collect();
        Ok(Self {
            mask: rows2(&self.mask),
            rewards: rows1(&self.rewards),
            groups: Groups::new(&ids, &device),
            token_rewards: self.token_rewards.as_ref().map(rows2),
            rollout_log_probs: self.rollout_log_probs.as_ref().map(rows2),
            old_log_probs: self.old_log_probs.as_ref().map(rows2),
            ref_log_probs: self.ref_log_probs.as_ref().map(rows2),
            values: self.values.as_ref().map(rows2),
            baseline_rewards: self.baseline_rewards.as_ref().map(rows1),
            truncated: self
                .truncated
                .as_ref()
                .map(|t| t.clone().int().select(0, idx.clone()).equal_elem(1)),
            turn_ids: self.turn_ids.as_ref().map(rows2),
            group_stats: self.group_stats.as_ref().map(|(m, s)| (rows1(m), rows1(s))),
            features: self.features.as_ref().map(rows2),
            update_mask: self.update_mask.as_ref().map(rows2),
            reward_parts: self.reward_parts.as_ref().map(rows2),
        })
    }

    /// The old log-probs: recomputed ones if present, else the sampler's.
    pub fn behaviour_log_probs(&self) -> Option<&Tensor<2>> {
        self.old_log_probs
            .as_ref()
            .or(self.rollout_log_probs.as_ref())
    }
}
