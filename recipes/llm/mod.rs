//! LLM recipes: the LM policy kit every LLM job uses (`policy`: built from a recipe, prompted,
//! evaluated, warmed up, checkpointed, exported), the recipe's schema (`schema`), the RL step's
//! shared parts ([`step`]), the models asked beside the policy (teacher, judge, participants,
//! endpoints), rollouts from servers and pipelines, and the jobs (`jobs`).

pub mod adaptive;
pub mod critic;
pub mod endpoint;
pub mod jobs;
pub mod judge;
pub mod lanpo;
pub mod participant;
pub mod pipeline;
pub mod plop;
mod policy;
pub mod remote;
pub mod replay;
pub mod saved;
pub mod schema;
pub mod score;
pub mod step;
pub mod teacher;

pub(crate) use policy::render_chat;
pub use policy::{
    Policy, Tok, build_policy, build_policy_with, demonstrations, evaluate, evaluate_sampled,
    load_checkpoint, model_record, pass_at_k, policy_from_specs, read_reference, save_tiny,
    warm_up, write_final,
};
