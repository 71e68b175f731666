//! LANPO's rollout and what a step leaves in the experience pool (`recipes/llm/lanpo.rs` has
//! the rules): each group's first samples are drawn from scratch, then its feedback samples
//! with a context that reflects on those attempts (and earlier ones) and shows lessons from
//! similar problems; the rewards then go into the pool, and the policy writes lessons about
//! the problems it solved.

use super::{Job, Row, Sampled, StepSamples};
use crate::llm::lanpo::{Attempt, Feedback, Lesson, clean_lesson, key, lesson_request, plan};
use crate::llm::pipeline::Draw;
use crate::llm::schema::UpdateContext;
use crate::lm::step::features_at;
use anyhow::{Context, Result};
use burn::module::Module;
use burn::tensor::{Device, Int, Tensor};
use ember_llm::{Generation, Llama, SamplingConfig, generate, left_pad};
use std::time::Instant;

/// The feedback samples' seed, apart from the samples drawn from scratch.
const FEEDBACK_SEED: u64 = 0x1a4b_0f5e_ed00_0001;

/// The policy's embedding of each prompt: its last hidden state at the prompt's last token.
fn embeddings(model: &Llama, prompts: &[Vec<u32>], device: &Device) -> Result<Vec<Vec<f32>>> {
    let (tokens, mask) = left_pad(prompts, device);
    let rows = prompts.len();
    let p = tokens.dims()[1];
    let seq = Tensor::cat(vec![tokens, Tensor::<2, Int>::zeros([rows, 1], device)], 1);
    let mask = Tensor::cat(vec![mask, Tensor::zeros([rows, 1], device)], 1);
    let h = features_at(model, seq, mask, p);
    let d = h.dims()[1];
    let flat: Vec<f32> = h
        .try_into_vec_as::<f32>()
        .map_err(|e| anyhow::anyhow!("reading the prompt embeddings: {e:?}"))?;
    Ok(flat.chunks(d.max(1)).map(<[f32]>::to_vec).collect())
}

impl Job<'_> {
    /// The step's rollout with feedback: the samples from scratch, the contexts, the feedback
    /// samples, one group per problem (its samples from scratch first).
    pub(super) fn sample_with_feedback(
        &mut self,
        step: usize,
        row: &mut Row,
    ) -> Result<(Sampled, Generation)> {
        let r = self.r;
        let Draw {
            examples,
            prompts,
            sc,
            ..
        } = self.draw(step, step)?;
        let lanpo = self
            .lanpo
            .as_mut()
            .context("a LANPO rollout needs [lanpo]")?;
        let (policy, base) = (&self.policy, &self.base);
        let n = sc.n;
        let m = lanpo.spec.feedback(n);
        let sampler = policy.model.valid();
        let scratch = SamplingConfig {
            n: n - m,
            ..sc.clone()
        };
        let g1 = generate(&sampler, &prompts, &scratch, base)?;
        let fresh: Vec<Vec<String>> = g1
            .response_ids()
            .chunks(n - m)
            .map(|c| c.iter().map(|ids| policy.decode(ids)).collect())
            .collect();
        let embs = embeddings(&sampler, &prompts, base)?;
        let keys: Vec<String> = examples.iter().map(key).collect();
        let problems: Vec<(&str, _, &[f32])> = (keys.iter().zip(&examples).zip(&embs))
            .map(|((k, e), v)| (k.as_str(), e, v.as_slice()))
            .collect();
        let contexts = plan(&lanpo.pool, &lanpo.spec, &problems, &fresh, m);
        let mut overflow = 0usize;
        let mut prompts2 = Vec::with_capacity(contexts.len());
        for (i, f) in contexts.iter().enumerate() {
            let e = &examples[i / m];
            match policy.prompt_ids_with(e, &f.text, r.rollout.max_new_tokens) {
                Ok(ids) => prompts2.push(ids),
                Err(_) => {
                    overflow += 1;
                    prompts2.push(prompts[i / m].clone());
                }
            }
        }
        let with_feedback = SamplingConfig {
            n: 1,
            seed: sc.seed ^ FEEDBACK_SEED,
            ..sc.clone()
        };
        let mut g2 = generate(&sampler, &prompts2, &with_feedback, base)?;
        if lanpo.spec.update_context == UpdateContext::Removed {
            let plain: Vec<Vec<u32>> = (0..prompts2.len())
                .map(|i| prompts[i / m].clone())
                .collect();
            (g2.prompt_tokens, g2.prompt_mask) = left_pad(&plain, base);
        }
        feedback_metrics(row, &contexts, overflow);
        let b = examples.len();
        let g = interleave(g1, g2, b, (n - m, m));
        let per_row = (0..b)
            .flat_map(|i| {
                let f = &contexts[i * m..(i + 1) * m];
                std::iter::repeat_n(None, n - m).chain(f.iter().cloned().map(Some))
            })
            .collect();
        lanpo.pending = Some((keys.into_iter().zip(embs).collect(), per_row));
        let sampled = Sampled {
            examples,
            prompts,
            sampler,
            sc,
            scored: None,
            pool_stats: None,
        };
        Ok((sampled, g))
    }

    /// The step's rewards into the pool, the lessons the policy writes about the problems it
    /// solved, the rewards of the two kinds of samples, and each shown sample's feedback.
    pub(super) fn learn_from_step(
        &mut self,
        step: usize,
        samples: StepSamples<'_>,
        shown: &mut [serde_json::Map<String, serde_json::Value>],
        row: &mut Row,
    ) -> Result<()> {
        let StepSamples {
            examples,
            texts,
            rewards,
        } = samples;
        let Some(lanpo) = self.lanpo.as_mut() else {
            return Ok(());
        };
        let (problems, per_row) = lanpo.pending.take().context("the step's LANPO rollout")?;
        let n = per_row.len() / problems.len().max(1);
        let mean = |fb: bool| {
            let v: Vec<f64> = (per_row.iter().zip(rewards))
                .filter(|(f, _)| f.is_some() == fb)
                .map(|(_, r)| f64::from(*r))
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        row.insert("lanpo/reward_scratch".into(), mean(false));
        row.insert("lanpo/reward_feedback".into(), mean(true));
        // The step's changes go to a copy, committed at the end: a step that fails here leaves
        // the pool as the last completed step did, which is what its checkpoint holds.
        let mut pool = lanpo.pool.clone();
        let mut solved = Vec::new();
        for (i, (k, emb)) in problems.iter().enumerate() {
            pool.observe(emb);
            let rows = i * n..(i + 1) * n;
            let attempts = rows.clone().map(|j| Attempt {
                text: texts[j].clone(),
                reward: rewards[j],
            });
            pool.record(k, attempts.collect(), step + 1, &lanpo.spec);
            let best = rows.max_by(|a, b| rewards[*a].total_cmp(&rewards[*b]));
            if let Some(j) = best.filter(|j| rewards[*j] > 0.0) {
                solved.push((i, j));
            }
        }
        for (s, f) in shown.iter_mut().zip(&per_row) {
            if let Some(f) = f {
                s.insert("feedback".into(), f.text.clone().into());
            }
        }
        let (p, l) = pool.sizes();
        row.insert("lanpo/pool_problems".into(), p as f64);
        row.insert("lanpo/pool_lessons".into(), l as f64);
        if !lanpo.spec.abstraction || lanpo.spec.lessons_per_step == 0 || solved.is_empty() {
            row.insert("lanpo/lessons_written".into(), 0.0);
            lanpo.pool = pool;
            return Ok(());
        }
        solved.sort_by(|a, b| rewards[b.1].total_cmp(&rewards[a.1]));
        solved.truncate(lanpo.spec.lessons_per_step);
        let t = Instant::now();
        let requests = solved
            .iter()
            .map(|(i, j)| {
                let e = &examples[*i];
                self.policy
                    .request_ids(&lesson_request(&e.question, &texts[*j]))
            })
            .collect::<Result<Vec<_>>>()?;
        let greedy = SamplingConfig {
            temperature: 0.0,
            max_new_tokens: lanpo.spec.lesson_max_tokens,
            stop_tokens: self.policy.stop.clone(),
            ..SamplingConfig::default()
        };
        let g = generate(&self.policy.model.valid(), &requests, &greedy, &self.base)?;
        let mut written = 0;
        for ((i, j), ids) in solved.iter().zip(g.response_ids()) {
            let e = &examples[*i];
            let sources = [e.question.as_str(), texts[*j].as_str(), e.answer.as_str()];
            if let Some(text) = clean_lesson(&self.policy.decode(&ids), &sources) {
                let (source, embedding) = problems[*i].clone();
                let lesson = Lesson {
                    source,
                    text,
                    embedding,
                };
                pool.add_lesson(lesson, lanpo.spec.lessons_kept);
                written += 1;
            }
        }
        row.insert("lanpo/lessons_written".into(), f64::from(written));
        row.insert("lanpo/pool_lessons".into(), pool.sizes().1 as f64);
        lanpo.pool = pool;
        ember_run::Timings::record(row, "lanpo_lessons", t.elapsed().as_secs_f64());
        Ok(())
    }
}

/// The step's feedback metrics: the share of feedback samples that reflect on an attempt,
/// lessons shown per sample, their mean similarity, and contexts too long for the model.
fn feedback_metrics(row: &mut Row, contexts: &[Feedback], overflow: usize) {
    let k = contexts.len().max(1) as f64;
    let reflected = contexts.iter().filter(|f| f.reflected).count() as f64;
    let lessons: usize = contexts.iter().map(|f| f.lessons).sum();
    let with: Vec<f64> = (contexts.iter())
        .filter(|f| f.lessons > 0)
        .map(|f| f.similarity)
        .collect();
    let sim = with.iter().sum::<f64>() / with.len().max(1) as f64;
    row.insert("lanpo/reflected".into(), reflected / k);
    row.insert("lanpo/lessons_shown".into(), lessons as f64 / k);
    row.insert("lanpo/lesson_similarity".into(), sim);
    row.insert("lanpo/context_overflow".into(), overflow as f64);
}

/// `g1` (`n1` samples per problem) and `g2` (`m` per problem) as one generation of `b` groups,
/// each problem's samples together (from scratch first).
fn interleave(g1: Generation, g2: Generation, b: usize, (n1, m): (usize, usize)) -> Generation {
    let all = Generation::stack(
        vec![(g1, (0..b * n1).collect()), (g2, (0..b * m).collect())],
        vec![0; b * (n1 + m)],
    );
    let order: Vec<usize> = (0..b)
        .flat_map(|i| (i * n1..(i + 1) * n1).chain((b * n1 + i * m)..(b * n1 + (i + 1) * m)))
        .collect();
    let groups = (0..b)
        .flat_map(|i| std::iter::repeat_n(i, n1 + m))
        .collect();
    Generation::stack(vec![(all, order)], groups)
}
