//! The LM policy kit that every language-model recipe kind imports (LLM, agent, offline,
//! MoLoRA): the policy (`policy`: built from its tables, prompted, evaluated, warmed up,
//! checkpointed, exported), its tables (`spec`: `[model]`, `[pretrained]`, `[warmup]`,
//! `[eval]`; `reward`: `[reward]`), the RL step's shared parts ([`step`]), the reward of a
//! step's completions ([`score`]), and the models asked beside the policy: a judge ([`judge`]),
//! a conversation partner ([`participant`]), each behind an OpenAI-compatible [`endpoint`] or
//! loaded in process.

pub mod endpoint;
pub mod judge;
pub mod participant;
mod policy;
pub mod reward;
pub mod score;
pub mod spec;
pub mod step;

pub(crate) use policy::render_chat;
pub use policy::{
    Policy, Tok, demonstrations, evaluate, evaluate_sampled, load_checkpoint, model_record,
    pass_at_k, policy_from_specs, save_tiny, warm_up, write_final,
};
pub use reward::RewardSpec;
pub use spec::{
    EvalSpec, LoraSpec, ModelSpec, PolicyChoice, PretrainedSpec, Targets, TrainLoop, TrainSpec,
    Warmup, choose_policy,
};
