//! The LM policy kit: the policy as every LLM job uses it, built from a recipe (the tiny
//! character-level Llama or a pretrained checkpoint with LoRA), prompted (character vocabulary
//! or tokenizer with chat template), evaluated greedily or by sampling on held-out problems,
//! warmed up by supervised steps, stored in checkpoints and in `final/`.

use crate::lm::spec::{EvalSpec, Warmup};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::{Module, ParamGroup};
use burn::optim::GradientsParams;
use burn::store::ModuleRecord;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_engine::SplitMix64;
use ember_llm::chartok;
use ember_llm::{Llama, LlamaConfig, LoraSettings, Message, SamplingConfig, Tokenizer, generate};
use ember_run::checkpoint;
use ember_tasks::expand_path;
use ember_tasks::reward::check;
use ember_tasks::task::{Example, TaskSet};
use ember_train::OptimizerConfig;
use std::path::Path;

/// How text becomes tokens.
pub enum Tok {
    /// A tiny policy's vocabulary: the generated tasks' characters, or bytes.
    Char(chartok::Vocab),
    /// A real tokenizer with a prompt template and optional chat template.
    Real {
        /// The tokenizer.
        tok: Box<Tokenizer>,
        /// Wrap in the chat template.
        chat: bool,
        /// System message.
        system: Option<String>,
        /// User message with `{question}`.
        template: String,
    },
}

/// A policy being trained: the model on the autodiff device, its tokenizer and stop tokens.
pub struct Policy {
    /// The model.
    pub model: Llama,
    /// Its config.
    pub config: LlamaConfig,
    /// Its tokenizer.
    pub tok: Tok,
    /// Tokens that end a response.
    pub stop: Vec<u32>,
    /// LoRA settings when only adapters are trained.
    pub lora: Option<LoraSettings>,
}

impl Policy {
    /// The prompt's token ids; an error when prompt plus `max_new` exceeds the context.
    pub fn prompt_ids(&self, e: &Example, max_new: usize) -> Result<Vec<u32>> {
        self.prompt_ids_with(e, "", max_new)
    }

    /// [`Policy::prompt_ids`] with `extra` appended to the user message (the last one of a
    /// chat dataset's conversation): LANPO's feedback. A tiny policy reads no such text.
    pub fn prompt_ids_with(&self, e: &Example, extra: &str, max_new: usize) -> Result<Vec<u32>> {
        let ids = match &self.tok {
            Tok::Char(_) if !extra.is_empty() => {
                bail!("the tiny policy's vocabulary reads no feedback text: use [pretrained]")
            }
            Tok::Char(vocab) => {
                let mut ids = vec![chartok::BOS];
                ids.extend(vocab.encode(&e.prompt).map_err(|m| {
                    anyhow!(
                        "prompt {:?}: {m}; set `[model] vocab = \"bytes\"` for other text, or \
                         use [pretrained]",
                        e.prompt
                    )
                })?);
                ids
            }
            Tok::Real {
                tok,
                chat,
                system,
                template,
            } => {
                let user = template.replace("{question}", &e.question) + extra;
                let text = if *chat && extra.is_empty() {
                    render_chat(tok, system.as_deref(), &user, &e.messages)?
                } else if *chat {
                    let mut messages = e.messages.clone();
                    if let Some((_, content)) = messages.iter_mut().rev().find(|m| m.0 == "user") {
                        content.push_str(extra);
                    }
                    render_chat(tok, system.as_deref(), &user, &messages)?
                } else {
                    user
                };
                tok.encode(&text)?
            }
        };
        let ctx = self.config.max_position_embeddings;
        if ids.len().checked_add(max_new).is_none_or(|n| n > ctx) {
            bail!(
                "prompt of {} tokens plus rollout.max_new_tokens = {max_new} exceeds the model's \
                 context of {ctx} positions (prompt: {:?})",
                ids.len(),
                e.question.chars().take(80).collect::<String>()
            );
        }
        Ok(ids)
    }

    /// The tiny policy's vocabulary (`Chars` for a pretrained one, which has its tokenizer).
    pub fn vocab(&self) -> chartok::Vocab {
        match &self.tok {
            Tok::Char(v) => *v,
            Tok::Real { .. } => chartok::Vocab::Chars,
        }
    }

    /// A request of the run's own (LANPO's lesson request) as the user message of the
    /// recipe's chat template, without the prompt template.
    pub fn request_ids(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tok {
            Tok::Char(_) => {
                bail!("the tiny policy's vocabulary reads no requests: use [pretrained]")
            }
            Tok::Real {
                tok, chat, system, ..
            } => match chat {
                true => Ok(tok.encode(&render_chat(tok, system.as_deref(), text, &[])?)?),
                false => Ok(tok.encode(text)?),
            },
        }
    }

    /// `text`'s token ids without special tokens or a template.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tok {
            Tok::Char(vocab) => vocab.encode(text).map_err(|m| anyhow!("{text:?}: {m}")),
            Tok::Real { tok, .. } => Ok(tok.encode_with(text, false)?),
        }
    }

    /// Response text.
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.tok {
            Tok::Char(vocab) => vocab.decode(ids),
            Tok::Real { tok, .. } => tok.decode(ids, true).unwrap_or_default(),
        }
    }
}

/// The prompts of an evaluation set, checked against the context.
fn eval_prompts(policy: &Policy, eval: &[Example], max_new: usize) -> Result<Vec<Vec<u32>>> {
    eval.iter().map(|e| policy.prompt_ids(e, max_new)).collect()
}

/// Greedy held-out accuracy (the verifiable reward alone).
pub fn evaluate(policy: &Policy, eval: &[Example], max_new: usize, device: &Device) -> Result<f64> {
    let prompts = eval_prompts(policy, eval, max_new)?;
    // Chunks bound the memory of large models; the tiny policy takes the set at once.
    let chunk = if policy.lora.is_some() {
        32
    } else {
        eval.len().max(1)
    };
    let greedy = Greedy {
        max_new,
        stop: &policy.stop,
        chunk,
        decode: &|ids| policy.decode(ids),
    };
    greedy.accuracy(&policy.model, &prompts, eval, device)
}

/// Greedy decoding as the accuracy reads it.
struct Greedy<'a> {
    max_new: usize,
    stop: &'a [u32],
    /// Prompts generated at once.
    chunk: usize,
    decode: &'a dyn Fn(&[u32]) -> String,
}

impl Greedy<'_> {
    /// The share of `eval` whose greedy answer to its prompt (`prompts`, in order) checks.
    fn accuracy(
        &self,
        model: &Llama,
        prompts: &[Vec<u32>],
        eval: &[Example],
        device: &Device,
    ) -> Result<f64> {
        let model = model.valid();
        let cfg = SamplingConfig {
            temperature: 0.0,
            max_new_tokens: self.max_new,
            stop_tokens: self.stop.to_vec(),
            ..SamplingConfig::default()
        };
        let mut correct = 0f32;
        for (ps, es) in prompts.chunks(self.chunk).zip(eval.chunks(self.chunk)) {
            let g = generate(&model, ps, &cfg, device)?;
            correct += g
                .response_ids()
                .iter()
                .zip(es)
                .map(|(r, e)| check(&e.check, &(self.decode)(r), &e.answer))
                .sum::<f32>();
        }
        Ok(f64::from(correct) / eval.len().max(1) as f64)
    }
}

/// pass@k of a problem with `c` correct among `n` samples, unbiased (Chen et al. 2021, "Evaluating
/// Large Language Models Trained on Code", eq. 1): 1 − C(n−c, k)/C(n, k), as the product
/// 1 − Π_{i=n−c+1}^{n} (1 − k/i) of their numerically stable form.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if n < k || c == 0 {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    1.0 - (n - c + 1..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// Sampled held-out evaluation: `spec.samples` responses per problem at `spec.temperature`
/// (seeded by `seed`): `eval/mean@n` and `eval/pass@k` for k = 1, 2, 4, …, and n.
pub fn evaluate_sampled(
    policy: &Policy,
    eval: &[Example],
    max_new: usize,
    spec: &EvalSpec,
    seed: u64,
    device: &Device,
) -> Result<Vec<(String, f64)>> {
    let (n, temperature) = (spec.samples, spec.temperature);
    let model = policy.model.valid();
    let prompts = eval_prompts(policy, eval, max_new)?;
    let cfg = SamplingConfig {
        temperature,
        max_new_tokens: max_new,
        n,
        seed,
        stop_tokens: policy.stop.clone(),
        ..SamplingConfig::default()
    };
    let chunk = (if policy.lora.is_some() { 32 } else { 256 } / n).max(1);
    let mut correct = Vec::with_capacity(eval.len());
    for (ps, es) in prompts.chunks(chunk).zip(eval.chunks(chunk)) {
        let g = generate(&model, ps, &cfg, device)?;
        let mut per = vec![0usize; es.len()];
        for (r, gi) in g.response_ids().iter().zip(&g.group_ids) {
            let e = &es[*gi];
            if check(&e.check, &policy.decode(r), &e.answer) > 0.5 {
                per[*gi] += 1;
            }
        }
        correct.extend(per);
    }
    let m = correct.len().max(1) as f64;
    let mut out = vec![(
        format!("eval/mean@{n}"),
        correct.iter().sum::<usize>() as f64 / (m * n as f64),
    )];
    let mut ks: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2))
        .take_while(|k| *k < n)
        .collect();
    ks.push(n);
    for k in ks {
        let p = correct.iter().map(|c| pass_at_k(n, *c, k)).sum::<f64>() / m;
        out.push((format!("eval/pass@{k}"), p));
    }
    Ok(out)
}

/// Teacher-forced demonstrations `<bos> prompt answer <eos>` in a tiny policy's vocabulary:
/// tokens and mask `[b, t]`, and the mask of the answer tokens among the next-token targets
/// `[b, t − 1]`.
pub fn demonstrations(
    vocab: chartok::Vocab,
    batch: &[Example],
    device: &Device,
) -> Result<(Tensor<2, Int>, Tensor<2>, Tensor<2>)> {
    let seqs: Vec<(Vec<u32>, usize)> = batch
        .iter()
        .map(|e| {
            let mut ids = vec![chartok::BOS];
            ids.extend(vocab.encode(&e.prompt).map_err(anyhow::Error::msg)?);
            let p = ids.len();
            ids.extend(vocab.encode(&e.answer).map_err(anyhow::Error::msg)?);
            ids.push(chartok::EOS);
            Ok((ids, p))
        })
        .collect::<Result<_>>()?;
    let t = seqs.iter().map(|(s, _)| s.len()).max().unwrap_or(2);
    let b = seqs.len();
    let (mut toks, mut mask, mut lm) = (
        vec![0i64; b * t],
        vec![0f32; b * t],
        vec![0f32; b * (t - 1)],
    );
    for (i, (s, p)) in seqs.iter().enumerate() {
        for (j, id) in s.iter().enumerate() {
            toks[i * t + j] = i64::from(*id);
            mask[i * t + j] = 1.0;
            if j >= *p {
                lm[i * (t - 1) + j - 1] = 1.0;
            }
        }
    }
    Ok((
        Tensor::from_data(TensorData::new(toks, [b, t]), device),
        Tensor::from_data(TensorData::new(mask, [b, t]), device),
        Tensor::from_data(TensorData::new(lm, [b, t - 1]), device),
    ))
}

/// Supervised steps on demonstrations `prompt answer <eos>`: −mean log π of the answer tokens.
/// Returns the model and the steps it took (fewer than `w.steps` where `until_accuracy` stopped
/// it).
pub fn warm_up(
    mut model: Llama,
    vocab: chartok::Vocab,
    w: &Warmup,
    task: &TaskSet,
    rng: &mut SplitMix64,
    device: &Device,
) -> Result<(Llama, usize)> {
    let mut optim = OptimizerConfig::default().init();
    // The stopping rule's problems: drawn once, from a stream of their own, so the batches are
    // those of a warm-up without the rule.
    let probe = w
        .until_accuracy
        .map(|_| task.train(&mut SplitMix64(rng.0 ^ 0x5741_524d_5550), 200));
    for step in 0..w.steps {
        ember_run::check_stop("the warm-up", step, w.steps)?;
        if let (Some(goal), Some(probe)) = (w.until_accuracy, &probe)
            && step > 0
            && step % w.check_every == 0
        {
            let a = greedy_accuracy(&model, vocab, probe, device)?;
            log::debug!("warm-up step {step}: training accuracy {a:.3}");
            if a >= goal {
                return Ok((model, step));
            }
        }
        let batch = task.train(rng, w.batch);
        let (toks, mask, lm) = demonstrations(vocab, &batch, device)?;
        let (lp, _) = model.token_log_probs(toks, mask, 1.0, false, true);
        let loss = (lp * lm.clone()).sum().neg() / lm.sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(w.lr, model, grads).0;
    }
    Ok((model, w.steps))
}

/// A tiny policy's greedy accuracy on `problems`, each answer given its length and an end token.
fn greedy_accuracy(
    model: &Llama,
    vocab: chartok::Vocab,
    problems: &[Example],
    device: &Device,
) -> Result<f64> {
    let prompts: Vec<Vec<u32>> = problems
        .iter()
        .map(|e| {
            let ids = vocab
                .encode(&e.prompt)
                .map_err(|m| anyhow!("prompt {:?}: {m}", e.prompt))?;
            Ok([vec![chartok::BOS], ids].concat())
        })
        .collect::<Result<_>>()?;
    let greedy = Greedy {
        max_new: problems
            .iter()
            .map(|e| e.answer.chars().count())
            .max()
            .unwrap_or(0)
            + 1,
        stop: &[chartok::EOS],
        chunk: problems.len().max(1),
        decode: &|ids| vocab.decode(ids),
    };
    greedy.accuracy(model, &prompts, problems, device)
}

/// The policy of a `[model]` (the tiny policy, initialised from `seed`) or `[pretrained]` table
/// (with fresh adapters, or those of the PEFT directory `peft`), in f32.
pub fn policy_from_specs(
    model: Option<&crate::lm::ModelSpec>,
    pretrained: Option<&crate::lm::PretrainedSpec>,
    seed: u64,
    device: &Device,
    peft: Option<&Path>,
) -> Result<Policy> {
    if let Some(m) = model {
        device.seed(seed);
        let config = m.llama_config();
        return Ok(Policy {
            model: config.init(device),
            config,
            tok: Tok::Char(m.vocab),
            stop: vec![chartok::EOS],
            lora: None,
        });
    }
    let p = pretrained.context("the recipe has no policy ([model] or [pretrained])")?;
    let path = ember_hub::resolve(&expand_path(&p.path)?).context("pretrained.path")?;
    let mut tok = ember_llm::Tokenizer::for_checkpoint(&path)?;
    tok.template_kwargs = p.chat_template_kwargs.clone();
    let loaded = ember_llm::load(&path, device)
        .with_context(|| format!("loading pretrained.path {}", path.display()))?;
    device.seed(seed);
    let base = bf16_base(loaded.model);
    let model = match peft {
        Some(dir) => ember_llm::load_peft(base, dir, device)?.0,
        None => ember_llm::apply_lora(base, &p.lora.settings()?)?,
    };
    let mut stop = loaded.eos_ids.clone();
    stop.extend(tok.eos_ids.iter().copied());
    stop.sort_unstable();
    stop.dedup();
    if stop.is_empty() {
        bail!(
            "{} declares no end-of-sequence token; responses could not end",
            path.display()
        );
    }
    Ok(Policy {
        model,
        config: loaded.config,
        tok: Tok::Real {
            tok: Box::new(tok),
            chat: p.chat,
            system: p.system.clone(),
            template: p.template.clone(),
        },
        stop,
        lora: Some(p.lora.settings()?),
    })
}

/// The frozen base of an adapter policy, kept also as `BF16` weights packed for AMX tiles where
/// bf16 products were chosen (`--kernels ember,amx`) and the CPU has the tiles: rollouts and
/// scoring then read the packed copy instead of packing every weight at every product
/// (`models/ember-llm/src/blocks.rs`). Its f32 weights become their bf16 values, which every
/// product under `amx` rounds them to anyway. Elsewhere, or for widths off the 32-grid, the
/// base as it is.
fn bf16_base(base: Llama) -> Llama {
    use ember_kernels::QuantKind;
    if !ember_kernels::bf16_products() {
        return base;
    }
    // A clone shares the weights' storage; `quantized` replaces them, so this copies nothing.
    base.clone().quantized(QuantKind::Bf16).unwrap_or(base)
}

/// `user`, or a chat dataset's conversation `messages` as it is, in `tok`'s chat template with
/// the assistant header; the recipe's `system` message goes first unless the conversation has
/// its own.
pub(crate) fn render_chat(
    tok: &Tokenizer,
    system: Option<&str>,
    user: &str,
    messages: &[(String, String)],
) -> Result<String> {
    let mut msgs = Vec::new();
    let own_system = messages.iter().any(|(r, _)| r == "system");
    if let (Some(s), false) = (system, own_system) {
        msgs.push(Message::new("system", s));
    }
    if messages.is_empty() {
        msgs.push(Message::new("user", user));
    } else {
        msgs.extend(messages.iter().map(|(r, c)| Message::new(r, c)));
    }
    Ok(tok.apply_chat_template(&msgs, true)?)
}

/// The parameters a checkpoint stores: all of the tiny model, the adapters of a LoRA policy.
pub fn model_record(policy: &Policy) -> ModuleRecord {
    if policy.lora.is_some() {
        policy
            .model
            .clone()
            .into_record_group(ParamGroup::from_predicate(".lora."))
    } else {
        policy.model.clone().into_record()
    }
}

/// `policy` with the parameters stored in checkpoint `dir` (all of the tiny model, the adapters
/// of a LoRA policy).
pub fn load_checkpoint(policy: Policy, dir: &Path) -> Result<Policy> {
    let rec = checkpoint::read_model(dir, policy.lora.is_some())?;
    let model = policy
        .model
        .try_load_record(rec)
        .map_err(|e| anyhow!("applying {}: {e}", dir.join(checkpoint::MODEL).display()))?;
    Ok(Policy { model, ..policy })
}

/// The tiny model as a complete Hugging Face directory in `dir`: safetensors, `config.json`
/// and the character vocabulary as `tokenizer.json` (so `ember serve` can serve it).
pub fn save_tiny(policy: &Policy, dir: &Path) -> Result<()> {
    ember_llm::save_hf(&policy.model.valid(), &policy.config, &policy.stop, dir)?;
    policy
        .vocab()
        .write_hf_tokenizer(dir)
        .with_context(|| format!("writing {}", dir.display()))
}

/// `final/`: the tiny model as Hugging Face safetensors, or the LoRA adapter in PEFT layout.
pub fn write_final(
    policy: &Policy,
    pretrained: Option<&crate::lm::PretrainedSpec>,
    out: &Path,
) -> Result<()> {
    let final_dir = out.join("final");
    let tmp = out.join(".final.tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    match (&policy.lora, pretrained) {
        (Some(settings), Some(p)) => {
            let name = Path::new(&p.path)
                .file_stem()
                .map_or("base".into(), |s| s.to_string_lossy().to_string());
            ember_llm::save_peft(&policy.model.valid(), settings, &name, &tmp)?;
        }
        _ => save_tiny(policy, &tmp)?,
    }
    ember_train::manifest::publish(&tmp, &final_dir)
        .with_context(|| format!("writing {}", final_dir.display()))
}

#[cfg(test)]
mod tests {
    use super::pass_at_k;

    /// By hand: n = 5, c = 2, k = 2: 1 − C(3,2)/C(5,2) = 1 − 3/10; k = 1 is c/n; all wrong is 0,
    /// fewer wrong than k is 1.
    #[test]
    fn pass_at_k_by_hand() {
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        assert!((pass_at_k(10, 3, 1) - 0.3).abs() < 1e-12);
        assert!((pass_at_k(8, 3, 4) - (1.0 - 5.0 / 70.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 0, 2), 0.0);
        assert_eq!(pass_at_k(4, 3, 2), 1.0);
        assert_eq!(pass_at_k(4, 4, 4), 1.0);
    }
}
