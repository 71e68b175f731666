//! The LLM job's rollout under Reinforce-Ada (Xiong et al. 2025): rounds drawn and scored
//! until each prompt's pool is balanced, instead of the pipeline's one draw.

use super::{Job, Sampled};
use crate::llm::adaptive::{AdaScoring, ada_rollout};
use crate::llm::pipeline::Draw;
use crate::lm::step::SamplerRef;
use anyhow::{Context, Result};
use burn::module::Module;
use ember_llm::Generation;
use ember_run::Row;

impl Job<'_> {
    /// Reinforce-Ada's rollout: rounds drawn and scored until each prompt's pool is balanced.
    pub(super) fn sample_in_rounds(
        &mut self,
        step: usize,
        row: &mut Row,
    ) -> Result<(Sampled, Generation)> {
        let r = self.r;
        let ada = self.parts.adaptive.context("rounds need Reinforce-Ada")?;
        let Draw {
            examples,
            prompts,
            sc,
            ..
        } = self.draw(step, step)?;
        let sampler = self.policy.model.valid();
        let policy = &self.policy;
        let a = ada_rollout(
            &ada,
            r.rollout.samples_per_prompt,
            &prompts,
            &examples,
            SamplerRef::new(&sampler, &sc, &self.base),
            AdaScoring {
                scorer: &mut self.scorer,
                step: step + 1,
                row,
                decode: &|ids| policy.decode(ids),
            },
        )?;
        row.insert("rollout/ada_rounds".into(), a.rounds as f64);
        row.insert("rollout/ada_samples_drawn".into(), a.drawn as f64);
        row.insert("rollout/ada_unfinished_prompts".into(), a.unfinished as f64);
        row.insert("rollout/tokens_drawn".into(), a.tokens_drawn as f64);
        row.insert("rollout/ada_reward_mean_drawn".into(), a.reward_mean_drawn);
        let pool_stats = ada.global_stats.then_some((a.pool_mean, a.pool_std));
        let sampled = Sampled {
            examples,
            prompts,
            sampler,
            sc,
            scored: Some(a.rewards),
            pool_stats,
        };
        Ok((sampled, a.generation))
    }
}
