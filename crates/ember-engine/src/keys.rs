//! The metric keys more than one place writes or reads (verl's `area/name` spelling): one
//! spelling each, so a job, the engine, the trainer and the live view cannot drift apart.
//! Keys one place alone writes stay literal there.

/// Held-out accuracy (every job with an evaluation).
pub const EVAL_ACCURACY: &str = "eval/accuracy";
/// Held-out success rate of an environment's episodes.
pub const EVAL_SUCCESS: &str = "eval/success";
/// The actor's loss over the step's valid tokens.
pub const ACTOR_LOSS: &str = "actor/loss";
/// The policy-gradient term of the actor's loss.
pub const ACTOR_PG_LOSS: &str = "actor/pg_loss";
/// The KL term of the actor's loss.
pub const ACTOR_KL_LOSS: &str = "actor/kl_loss";
/// The share of tokens whose ratio was clipped.
pub const ACTOR_CLIPFRAC: &str = "actor/clipfrac";
/// The largest importance ratio of the step.
pub const ACTOR_RATIO_MAX: &str = "actor/ratio_max";
/// The smallest importance ratio of the step.
pub const ACTOR_RATIO_MIN: &str = "actor/ratio_min";
/// The importance ratio's mean over valid tokens.
pub const ACTOR_RATIO_MEAN: &str = "actor/ratio_mean";
/// The importance ratio's standard deviation over valid tokens.
pub const ACTOR_RATIO_STD: &str = "actor/ratio_std";
/// The valid tokens the ratio's statistics pool.
pub const ACTOR_RATIO_COUNT: &str = "actor/ratio_count";
/// The mean truncated importance weight.
pub const ACTOR_IS_WEIGHT_MEAN: &str = "actor/is_weight_mean";
/// The actor's learning rate at the step.
pub const ACTOR_LR: &str = "actor/lr";
/// The actor's gradient norm before clipping.
pub const ACTOR_GRAD_NORM: &str = "actor/grad_norm";
/// Optimizer steps skipped (a non-finite gradient).
pub const ACTOR_SKIPPED_STEPS: &str = "actor/skipped_steps";
/// The critic's value loss.
pub const CRITIC_VF_LOSS: &str = "critic/vf_loss";
/// The mean reward of the step's rollouts.
pub const ROLLOUT_REWARD_MEAN: &str = "rollout/reward_mean";
/// The mean return of the step's episodes.
pub const ROLLOUT_RETURN_MEAN: &str = "rollout/return_mean";
/// Seconds of the step, end to end.
pub const PERF_STEP_S: &str = "perf/step_s";
/// Tokens generated per second in the step.
pub const PERF_TOKENS_PER_S: &str = "perf/tokens_per_s";
