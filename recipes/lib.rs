//! Ember: pure-Rust policy-gradient post-training on burn.
//!
//! The root package holds the leaf of the workspace: one folder per recipe kind beside the
//! recipe files it runs, each with its schema, its job and its parts. A recipe's `kind` is one of
//! six, parsed by `kinds`; two more folders run LLM recipes of their own shape.
//!
//! - `llm`: `kind = "llm"` (the default): online RL of a language model, with its critic,
//!   rollouts from servers, the `max_staleness` pipeline, rollouts over the ranks of a
//!   multi-process run, a teacher, LANPO, replay, Reinforce-Ada, PLoP, and the jobs behind
//!   `ember train`, `eval`, `warmup`, `rollouts`, `value-mse`, `plop` and `bench-llm`.
//! - `offline`: LLM recipes with an `[offline]` table (DPO, IPO, SimPO, RPO, A-LoL, REINFORCE-LOO,
//!   SFT, TOPR, REC, OPMD, AsymRE) on a fixed dataset of scored responses.
//! - `agent`: `kind = "agent"`: multi-turn episodes against an environment, whole or SeeUPO turn
//!   by turn, and the tutoring environment whose student is a model.
//! - `molora`: `ember molora`: LoRA vs learned-router MoLoRA vs ReMix at equal activated adapter
//!   parameters.
//! - `flow`: `kind = "flow"`: a rectified-flow image model fine-tuned by Flow-GRPO/DDPO, LOOP and
//!   RAM on MNIST digits.
//! - `control`: `kind = "control"`: PPO and RARL on batched continuous-control environments, and
//!   training by gradients through the simulator (`[gradient]`).
//! - `programs`: `kind = "programs"`: Neural Symbolic Machines' programs for a symbolic computer,
//!   trained by REINFORCE, iterative maximum likelihood, augmented REINFORCE or MAPO.
//! - `unlearning`: `kind = "unlearning"`: fictitious facts learned, then forgotten by gradient
//!   ascent, RULE, ReRULE, a teacher ensemble or retraining, with forget and retain metrics.
//!
//! Beside the kinds:
//! - `lm`: the LM policy kit the language-model folders import (the policy and its tables, the RL
//!   step's parts, scoring, endpoints, the judge and the tutor's student).
//! - `common`: what every kind shares, importing none of them: device and precision, recipe
//!   parsing and the header, renamed keys, the run directory's set-up, the GPU kernel cache, and
//!   the root package's two audited `unsafe` calls (glibc's heap settings, subnormals flushed).
//! - `kinds`: the one parse of a recipe of any kind (`parse_any`, `AnyRecipe`).
//! - `gym`: the kernel gym's remote executor, the client of `ember gym serve` (the servers
//!   themselves are `crates/ember-serve`).
//!
//! The crates below hold the engine (`ember_engine`), the update (`ember_train`), the run kit
//! (`ember_run`), tasks, rewards and environments (`ember_tasks`), the models (`ember_llm`,
//! `ember_flow`, `ember_molora`, `ember_control`), models by Hub id (`ember_hub`) and the
//! multi-process world (`ember_dist`, `ember_collectives`). The CLI is `recipes/cli/`;
//! `recipes/lm-eval/` holds lm-eval-harness task files.

#[cfg(not(any(feature = "cpu", feature = "cuda", feature = "wgpu")))]
compile_error!(
    "Ember needs a compute backend: build with one of the cargo features `cpu` (the default), \
     `cuda` or `wgpu`, e.g. `cargo build --release --features cuda`."
);

pub mod agent;
pub mod common;
pub mod control;
pub mod flow;
pub mod gym;
pub mod kinds;
pub mod llm;
pub mod lm;
pub mod molora;
pub mod offline;
pub mod programs;
pub mod unlearning;
