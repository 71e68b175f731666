//! Multi-turn rollouts: the policy and an [`Environment`] take turns. Each turn generates a
//! response for every episode still running (one batched `generate` over their whole contexts,
//! one host read of the sampled ids and log-probs per turn), the environment answers, and its
//! observation is appended to the context. A trajectory is laid out as one row: the first
//! observation as the prompt, then the policy's turns and the observations as the response
//! region, where the loss mask is 1 on the policy's tokens and 0 on the observations (holes),
//! so the engine's estimators and the trainer use it unchanged.
//!
//! With a pretrained policy in its chat template the episode is a conversation: the first
//! observation is the user message, each turn an assistant message, each later observation a
//! user message ([`Policy::observation_after`]). Each turn re-reads its episodes' whole
//! contexts (no KV cache is kept between turns).

use crate::lm::Warmup;
use crate::lm::{Policy, Tok};
use anyhow::{Context, Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::chartok;
use ember_llm::{Llama, Message, SamplingConfig, generate};
use ember_tasks::env::{Environment, Episode};
use std::collections::BTreeMap;

/// A stretch of a trajectory's response region.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Token ids.
    pub ids: Vec<u32>,
    /// The sampler's log-probs of the ids (policy turns), or `None` (observations).
    pub log_probs: Option<Vec<f32>>,
}

/// The trajectories of one batch of episodes.
#[derive(Debug, Clone, Default)]
pub struct Trajectories {
    /// The first observation of each row, encoded (the prompt).
    pub prompts: Vec<Vec<u32>>,
    /// The response region of each row, in order: policy turn, observation, policy turn, …
    pub segments: Vec<Vec<Segment>>,
    /// Each row's reward per policy turn.
    pub turn_rewards: Vec<Vec<f32>>,
    /// Whether each turn enters the update ([`ember_tasks::env::Feedback::keep`]).
    pub turn_kept: Vec<Vec<bool>>,
    /// The environment's numbers of each turn ([`ember_tasks::env::Feedback::info`]).
    pub turn_info: Vec<Vec<BTreeMap<String, f64>>>,
    /// Each row's episode (the index of its seed; rows of one seed share it).
    pub group_ids: Vec<usize>,
    /// Each row's texts: the first observation, then the turns and observations.
    pub texts: Vec<Vec<String>>,
    /// True for rows whose episode the environment did not end (turn or context budget).
    pub unfinished: Vec<bool>,
    /// Seconds spent in the environment (reset and steps).
    pub env_seconds: f64,
}

impl Trajectories {
    /// Each row's reward: the sum of its turn rewards.
    pub fn rewards(&self) -> Vec<f32> {
        self.turn_rewards.iter().map(|r| r.iter().sum()).collect()
    }

    /// The turns' numbers under `prefix`: each environment number's mean over the turns that
    /// report it (`env/<key>`) and the mean over rows of its best turn (`env/<key>_best`: with
    /// the kernel gym, `env/correct_best` is the share of episodes correct at any turn), the
    /// mean best and last turn reward (sequential test-time scaling's best-of-turns, Dr.Kernel
    /// §6.3), and the turns the environment rejected.
    pub fn turn_metrics(&self, prefix: &str) -> BTreeMap<String, f64> {
        let mut sums: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
        for row in &self.turn_info {
            let mut best: BTreeMap<&str, f64> = BTreeMap::new();
            for info in row {
                for (k, v) in info {
                    let e = sums.entry(k.as_str()).or_default();
                    e.0 += v;
                    e.1 += 1.0;
                    let b = best.entry(k.as_str()).or_insert(f64::NEG_INFINITY);
                    *b = b.max(*v);
                }
            }
            for (k, b) in best {
                sums.entry(k).or_default().2 += b;
            }
        }
        let rows = self.turn_rewards.len().max(1) as f64;
        let mut m = BTreeMap::new();
        for (k, (sum, n, best)) in sums {
            m.insert(format!("{prefix}env/{k}"), sum / n.max(1.0));
            m.insert(format!("{prefix}env/{k}_best"), best / rows);
        }
        let pick = |f: &dyn Fn(&[f32]) -> Option<f32>| {
            self.turn_rewards
                .iter()
                .filter_map(|r| f(r))
                .map(f64::from)
                .sum::<f64>()
                / rows
        };
        let best = |r: &[f32]| r.iter().copied().reduce(f32::max);
        let kept = self.turn_kept.iter().flatten();
        m.insert(format!("{prefix}best_turn_reward"), pick(&best));
        m.insert(
            format!("{prefix}last_turn_reward"),
            pick(&|r| r.last().copied()),
        );
        m.insert(
            format!("{prefix}rejected_turns"),
            kept.filter(|k| !**k).count() as f64,
        );
        m
    }

    /// Row `i`'s next turn: its reward, whether it enters the update, its numbers.
    fn record_turn(&mut self, i: usize, reward: f32, keep: bool, info: BTreeMap<String, f64>) {
        self.turn_rewards[i].push(reward);
        self.turn_kept[i].push(keep);
        self.turn_info[i].push(info);
    }

    /// Number of policy turns of each row.
    pub fn turns(&self) -> Vec<usize> {
        self.turn_rewards.iter().map(Vec::len).collect()
    }

    /// The rows as tensors: tokens and attention mask `[rows, prompt + region]` (prompts
    /// left-padded, regions right-padded, pad 0), and over the region `[rows, region]`: the
    /// loss mask (policy tokens), the sampler's log-probs (0 elsewhere) and each turn's reward on
    /// the turn's last token (for estimators that credit turns). Returns them with the region's
    /// width.
    pub fn tensors(&self, device: &Device) -> Result<TrajectoryTensors> {
        let rows = self.prompts.len();
        if rows == 0 {
            bail!("no trajectories");
        }
        let p = self.prompts.iter().map(Vec::len).max().unwrap_or(0);
        let region: Vec<usize> = self
            .segments
            .iter()
            .map(|s| s.iter().map(|g| g.ids.len()).sum())
            .collect();
        let r = region.iter().copied().max().unwrap_or(0).max(1);
        let w = p + r;
        let mut tokens = vec![0i64; rows * w];
        let mut attn = vec![0f32; rows * w];
        let (mut loss, mut lps, mut trew) = (
            vec![0f32; rows * r],
            vec![0f32; rows * r],
            vec![0f32; rows * r],
        );
        let mut turn_ids = vec![-1f32; rows * r];
        let mut keep = vec![1f32; rows * r];
        for i in 0..rows {
            let pr = &self.prompts[i];
            let off = p - pr.len();
            for (j, t) in pr.iter().enumerate() {
                tokens[i * w + off + j] = i64::from(*t);
                attn[i * w + off + j] = 1.0;
            }
            let mut col = 0usize;
            let mut turn = 0usize;
            for seg in &self.segments[i] {
                for (k, t) in seg.ids.iter().enumerate() {
                    tokens[i * w + p + col] = i64::from(*t);
                    attn[i * w + p + col] = 1.0;
                    if let Some(lp) = &seg.log_probs {
                        loss[i * r + col] = 1.0;
                        if self.turn_kept.get(i).and_then(|k| k.get(turn)) == Some(&false) {
                            keep[i * r + col] = 0.0;
                        }
                        turn_ids[i * r + col] = turn as f32;
                        lps[i * r + col] = lp.get(k).copied().unwrap_or(0.0);
                    }
                    col += 1;
                }
                if seg.log_probs.is_some() {
                    if col > 0 {
                        trew[i * r + col - 1] =
                            self.turn_rewards[i].get(turn).copied().unwrap_or(0.0);
                    }
                    turn += 1;
                }
            }
        }
        let t2 =
            |v: Vec<f32>, c: usize| Tensor::<2>::from_data(TensorData::new(v, [rows, c]), device);
        let update_mask = keep.contains(&0.0).then(|| t2(keep, r));
        Ok(TrajectoryTensors {
            tokens: Tensor::<2, Int>::from_data(TensorData::new(tokens, [rows, w]), device),
            attention: t2(attn, w),
            loss_mask: t2(loss, r),
            log_probs: t2(lps, r),
            turn_rewards: t2(trew, r),
            turn_ids: t2(turn_ids, r),
            update_mask,
            region: r,
        })
    }
}

/// [`Trajectories::tensors`].
#[derive(Debug, Clone)]
pub struct TrajectoryTensors {
    /// `[rows, prompt + region]` token ids.
    pub tokens: Tensor<2, Int>,
    /// `[rows, prompt + region]` attention mask (prompts, turns and observations).
    pub attention: Tensor<2>,
    /// `[rows, region]` 1 on the policy's tokens.
    pub loss_mask: Tensor<2>,
    /// `[rows, region]` the sampler's log-probs of the policy's tokens.
    pub log_probs: Tensor<2>,
    /// `[rows, region]` each turn's reward on its last token.
    pub turn_rewards: Tensor<2>,
    /// `[rows, region]` the policy turn of each token (0, 1, …), −1 on observations and padding.
    pub turn_ids: Tensor<2>,
    /// `[rows, region]` 0 on the tokens of turns the environment rejected, 1 elsewhere; `None`
    /// when it rejected none.
    pub update_mask: Option<Tensor<2>>,
    /// The region's width.
    pub region: usize,
}

impl Policy {
    /// An observation's token ids as plain text (appended to the context, no BOS).
    pub fn observation_ids(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tok {
            Tok::Char(vocab) => vocab.encode(text).map_err(|m| {
                anyhow::anyhow!(
                    "observation {text:?}: {m} (the tiny policy's vocabulary; `[model] vocab = \
                     \"bytes\"` takes any text)"
                )
            }),
            Tok::Real { tok, .. } => Ok(tok.encode(text)?),
        }
    }

    /// The ids appended after a policy turn (`turn`, its sampled ids) to hand observation
    /// `text` back to the policy. Without a chat template: the text itself. With one: the end
    /// of the assistant message (less the stop token the turn already ends with), the
    /// observation as a user message, and the assistant header: the difference between the
    /// template's rendering of the conversation before and after the observation, so any
    /// template that extends a conversation by appending works.
    pub fn observation_after(&self, turn: &[u32], text: &str) -> Result<Vec<u32>> {
        let Some((mut ids, rest)) = self.chat_continuation(text)? else {
            return self.observation_ids(text);
        };
        let ended = turn.last().is_some_and(|t| self.stop.contains(t));
        if ended && ids.first() == turn.last() {
            ids.remove(0);
        }
        ids.extend(rest);
        Ok(ids)
    }

    /// The token that ends a demonstrated turn: the chat template's end of an assistant message
    /// when it is a stop token (`<|im_end|>` in ChatML), else the first stop token.
    pub fn turn_end(&self) -> Result<Option<u32>> {
        if let Some((close, _)) = self.chat_continuation("")?
            && let Some(first) = close.first().filter(|t| self.stop.contains(t))
        {
            return Ok(Some(*first));
        }
        Ok(self.stop.first().copied())
    }

    /// In chat mode: the ids that close an assistant message, and those that add user message
    /// `text` and open the next assistant message.
    fn chat_continuation(&self, text: &str) -> Result<Option<(Vec<u32>, Vec<u32>)>> {
        let Tok::Real {
            tok, chat: true, ..
        } = &self.tok
        else {
            return Ok(None);
        };
        const MARK: &str = "\u{E000}";
        let before = [Message::new("user", "q"), Message::new("assistant", MARK)];
        let mut after = before.to_vec();
        after.push(Message::new("user", text));
        let a = tok.apply_chat_template(&before, false)?;
        let b = tok.apply_chat_template(&after, true)?;
        let (Some(rest), Some(at)) = (b.strip_prefix(a.as_str()), a.find(MARK)) else {
            bail!(
                "the chat template does not extend a conversation by appending to it; \
                 multi-turn episodes need one that does (e.g. ChatML)"
            );
        };
        Ok(Some((
            tok.encode(&a[at + MARK.len()..])?,
            tok.encode(rest)?,
        )))
    }

    /// The first observation as a prompt: BOS first for the tiny policy; a pretrained policy's
    /// `template` around it, in its chat template (with the system message) when `chat`.
    pub fn first_prompt(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tok {
            Tok::Char(_) => {
                let mut ids = vec![chartok::BOS];
                ids.extend(self.observation_ids(text)?);
                Ok(ids)
            }
            Tok::Real {
                tok,
                chat,
                system,
                template,
            } => {
                let user = template.replace("{question}", text);
                if !*chat {
                    return Ok(tok.encode(&user)?);
                }
                Ok(tok.encode(&crate::lm::render_chat(tok, system.as_deref(), &user, &[])?)?)
            }
        }
    }
}

/// Which episodes a rollout plays and how it samples their turns.
pub struct Plays<'a> {
    /// The environment's seeds.
    pub seeds: &'a [u64],
    /// Episodes per seed (rows grouped by seed).
    pub samples: usize,
    /// Policy turns at most per episode.
    pub max_turns: usize,
    /// Each turn's sampling (its `n` is ignored: one response per running episode per turn).
    pub sc: &'a SamplingConfig,
}

/// Plays the episodes of `plays` to their end, or to `max_turns` policy turns, or until a
/// context would exceed the model's.
pub fn rollout(
    policy: &Policy,
    sampler: &Llama,
    env: &mut dyn Environment,
    plays: Plays<'_>,
    device: &Device,
) -> Result<Trajectories> {
    let (seeds, samples, sc) = (plays.seeds, plays.samples.max(1), plays.sc);
    let rows = seeds.len() * samples;
    let episodes: Vec<Episode> = (0..rows)
        .map(|id| Episode {
            id,
            seed: seeds[id / samples],
        })
        .collect();
    let t0 = std::time::Instant::now();
    let first = env.reset(&episodes).context("starting the episodes")?;
    let mut env_seconds = t0.elapsed().as_secs_f64();
    if first.len() != rows {
        bail!("the environment started {} of {rows} episodes", first.len());
    }
    let mut t = Trajectories {
        prompts: first
            .iter()
            .map(|o| policy.first_prompt(o))
            .collect::<Result<_>>()?,
        segments: vec![Vec::new(); rows],
        turn_rewards: vec![Vec::new(); rows],
        turn_kept: vec![Vec::new(); rows],
        turn_info: vec![Vec::new(); rows],
        group_ids: (0..rows).map(|i| i / samples).collect(),
        texts: first.iter().map(|o| vec![o.clone()]).collect(),
        unfinished: vec![true; rows],
        env_seconds: 0.0,
    };
    let ctx = policy.config.max_position_embeddings;
    let mut running: Vec<usize> = (0..rows).collect();
    for turn in 0..plays.max_turns {
        // Episodes whose context has no room for another full turn stop here (unfinished).
        running.retain(|&i| context_len(&t, i) + sc.max_new_tokens <= ctx);
        if running.is_empty() {
            break;
        }
        let contexts: Vec<Vec<u32>> = running.iter().map(|&i| context(&t, i)).collect();
        let cfg = SamplingConfig {
            n: 1,
            seed: sc.seed ^ ((turn as u64 + 1) << 32),
            ..sc.clone()
        };
        let g = generate(sampler, &contexts, &cfg, device)?;
        let ids = g.response_ids();
        let new = g.tokens.dims()[1];
        let lp: Vec<f32> = g
            .log_probs
            .clone()
            .try_into_vec_as::<f32>()
            .unwrap_or_default();
        let mut actions = Vec::with_capacity(running.len());
        for (k, &i) in running.iter().enumerate() {
            let lps = lp
                .get(k * new..k * new + ids[k].len())
                .unwrap_or(&[])
                .to_vec();
            t.segments[i].push(Segment {
                ids: ids[k].clone(),
                log_probs: Some(lps),
            });
            let text = policy.decode(&ids[k]);
            t.texts[i].push(text.clone());
            actions.push((i, text));
        }
        let t0 = std::time::Instant::now();
        let feedback = env.step(&actions).context("stepping the episodes")?;
        env_seconds += t0.elapsed().as_secs_f64();
        if feedback.len() != actions.len() {
            bail!(
                "the environment answered {} of {} turns",
                feedback.len(),
                actions.len()
            );
        }
        let mut next = Vec::with_capacity(running.len());
        for (&i, mut f) in running.iter().zip(feedback) {
            t.record_turn(i, f.reward, f.keep, std::mem::take(&mut f.info));
            if f.done {
                t.unfinished[i] = false;
                // What the environment said at the end is kept for the transcript only.
                if !f.observation.is_empty() {
                    t.texts[i].push(f.observation);
                }
                continue;
            }
            // An observation that no further turn reads (the turn budget is spent, or it and
            // another turn would not fit the context) ends the episode unfinished, unappended.
            if turn + 1 >= plays.max_turns {
                continue;
            }
            let turn_ids = t.segments[i].last().map_or(&[][..], |s| s.ids.as_slice());
            let obs = policy.observation_after(turn_ids, &f.observation)?;
            let fits = context_len(&t, i)
                .checked_add(obs.len())
                .and_then(|n| n.checked_add(sc.max_new_tokens))
                .is_some_and(|n| n <= ctx);
            if !fits {
                continue;
            }
            t.texts[i].push(f.observation);
            t.segments[i].push(Segment {
                ids: obs,
                log_probs: None,
            });
            next.push(i);
        }
        running = next;
    }
    t.env_seconds = env_seconds;
    Ok(t)
}

fn context_len(t: &Trajectories, i: usize) -> usize {
    t.prompts[i].len() + t.segments[i].iter().map(|s| s.ids.len()).sum::<usize>()
}

fn context(t: &Trajectories, i: usize) -> Vec<u32> {
    let mut c = t.prompts[i].clone();
    for s in &t.segments[i] {
        c.extend(&s.ids);
    }
    c
}

/// The environment's demonstrations of `seeds` as trajectories (turns end with the stop
/// token), for a supervised warm-up.
pub fn demonstrations(
    policy: &Policy,
    env: &dyn Environment,
    seeds: &[u64],
    rng: &mut ember_engine::SplitMix64,
) -> Result<Trajectories> {
    let mut t = Trajectories::default();
    let end = policy.turn_end()?;
    for (i, seed) in seeds.iter().enumerate() {
        let Some(texts) = env.demonstration(*seed, rng) else {
            bail!("this environment has no demonstrations for a warm-up; remove [warmup]");
        };
        let Some((first, rest)) = texts.split_first() else {
            bail!("an empty demonstration");
        };
        t.prompts.push(policy.first_prompt(first)?);
        let mut segments: Vec<Segment> = Vec::with_capacity(rest.len());
        let mut turns = 0usize;
        for (k, text) in rest.iter().enumerate() {
            if k % 2 == 0 {
                let mut ids = policy.observation_ids(text)?;
                ids.extend(end);
                turns += 1;
                segments.push(Segment {
                    log_probs: Some(vec![0.0; ids.len()]),
                    ids,
                });
            } else {
                let turn = segments.last().map_or(&[][..], |s| s.ids.as_slice());
                segments.push(Segment {
                    ids: policy.observation_after(turn, text)?,
                    log_probs: None,
                });
            }
        }
        t.segments.push(segments);
        t.turn_rewards.push(vec![0.0; turns]);
        t.turn_kept.push(vec![true; turns]);
        t.turn_info.push(vec![BTreeMap::new(); turns]);
        t.group_ids.push(i);
        t.texts.push(texts);
        t.unfinished.push(false);
    }
    Ok(t)
}

/// Supervised warm-up on the environment's demonstrations (`[warmup]`): `steps` AdamW steps at
/// `lr` on −mean log π of the demonstrated turns' tokens (observations are context only),
/// `batch` episodes each.
pub fn warm_up(
    mut policy: Policy,
    env: &dyn Environment,
    w: &Warmup,
    rng: &mut ember_engine::SplitMix64,
    device: &Device,
) -> Result<Policy> {
    let (steps, batch, lr) = (w.steps, w.batch, w.lr);
    use burn::optim::GradientsParams;
    use ember_train::Actor;
    let mut optim = ember_train::OptimizerConfig::default().init();
    for step in 0..steps {
        ember_run::check_stop("the warm-up", step, steps)?;
        let seeds = ember_tasks::env::EpisodeSource::train(rng, batch);
        let t = demonstrations(&policy, env, &seeds, rng)?;
        let x = t.tensors(device)?;
        let exp = ember_llm::actor::LlmExperience {
            tokens: x.tokens,
            mask: x.attention,
            response_len: x.region,
            temperature: 1.0,
            adapters: true,
        };
        let rows: Vec<usize> = (0..seeds.len()).collect();
        let lp = policy.model.score(&exp, &rows, false).log_probs;
        let loss = (lp * x.loss_mask.clone()).sum().neg() / x.loss_mask.sum().clamp_min(1.0);
        let grads = GradientsParams::from_grads(loss.backward(), &policy.model);
        policy.model = optim.step(lr, policy.model, grads).0;
    }
    Ok(policy)
}
