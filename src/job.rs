//! The RL job: a policy (the tiny character-level Llama warmed up by supervised steps on
//! generated demonstrations, or a pretrained checkpoint with LoRA) trained on a task with
//! verifiable rewards, evaluated on a held-out split before and after; metrics, plots and
//! atomic checkpoints in a run directory, resumable after an interruption.

use crate::chartok;
use crate::checkpoint::{self, TrainState};
use crate::engine::*;
use crate::recipe::{Recipe, RewardSpec, expand_path};
use crate::reward::{ExternalReward, RewardItem, check, format_reward};
use crate::tasks::{Example, Rng};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::{Module, ParamGroup};
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, OptimizerRecord};
use burn::store::ModuleRecord;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::actor::LlmExperience;
use ember_llm::{
    Family, Llama, LlamaConfig, LoraSettings, Message, SamplingConfig, Tokenizer, generate,
};
use ember_train::{LrSchedule, UpdateConfig, update};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static STOP: AtomicBool = AtomicBool::new(false);

/// Asks a running job to stop after its current step and write a checkpoint (Ctrl-C).
pub fn request_stop() -> bool {
    STOP.swap(true, Ordering::SeqCst)
}

/// True once a stop was requested (Ctrl-C).
pub(crate) fn request_stop_seen() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// How to run a recipe.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// No progress output.
    pub quiet: bool,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Replace an existing run directory's logs.
    pub overwrite: bool,
    /// Stop (with a checkpoint) once this many RL steps are done, as Ctrl-C would.
    pub stop_after: Option<usize>,
}

/// What a run reports at the end.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Held-out accuracy after the warm-up.
    pub accuracy_before: f64,
    /// Held-out accuracy after RL.
    pub accuracy_after: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The run directory.
    pub out: PathBuf,
    /// RL steps done.
    pub steps_done: usize,
    /// Stopped early (Ctrl-C or `stop_after`) with a checkpoint to resume from.
    pub interrupted: bool,
}

pub(crate) fn model_config(m: &crate::recipe::ModelSpec) -> LlamaConfig {
    LlamaConfig::new(
        Family::Llama,
        chartok::vocab_size(),
        m.d_model,
        m.d_ff,
        m.layers,
        m.heads,
        m.kv_heads,
    )
    .with_max_position_embeddings(64)
    .with_rms_norm_eps(1e-5)
}

/// How text becomes tokens.
pub enum Tok {
    /// The character-level vocabulary of the generated tasks.
    Char,
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
        let ids = match &self.tok {
            Tok::Char => {
                let mut ids = vec![chartok::BOS];
                ids.extend(chartok::encode(&e.prompt).map_err(|m| {
                    anyhow!(
                        "prompt {:?}: {m}; the tiny [model] handles generated tasks only, use \
                         [pretrained] for text data",
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
                let user = template.replace("{question}", &e.question);
                let text = if *chat {
                    let mut msgs = Vec::new();
                    if let Some(s) = system {
                        msgs.push(Message::new("system", s));
                    }
                    msgs.push(Message::new("user", &user));
                    tok.apply_chat_template(&msgs, true)?
                } else {
                    user
                };
                tok.encode(&text)?
            }
        };
        let ctx = self.config.max_position_embeddings;
        if ids.len() + max_new > ctx {
            bail!(
                "prompt of {} tokens plus rollout.max_new_tokens = {max_new} exceeds the model's \
                 context of {ctx} positions (prompt: {:?})",
                ids.len(),
                e.question.chars().take(80).collect::<String>()
            );
        }
        Ok(ids)
    }

    /// Response text.
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.tok {
            Tok::Char => chartok::decode(ids),
            Tok::Real { tok, .. } => tok.decode(ids, true).unwrap_or_default(),
        }
    }
}

/// Greedy held-out accuracy (the verifiable reward alone).
pub fn evaluate(policy: &Policy, eval: &[Example], max_new: usize, device: &Device) -> Result<f64> {
    let model = policy.model.valid();
    let prompts = eval
        .iter()
        .map(|e| policy.prompt_ids(e, max_new))
        .collect::<Result<Vec<_>>>()?;
    let cfg = SamplingConfig {
        temperature: 0.0,
        max_new_tokens: max_new,
        stop_tokens: policy.stop.clone(),
        ..SamplingConfig::default()
    };
    let mut correct = 0f32;
    // Chunks bound the memory of large models; the tiny policy takes the set at once.
    let chunk = if policy.lora.is_some() {
        32
    } else {
        eval.len().max(1)
    };
    for (ps, es) in prompts.chunks(chunk).zip(eval.chunks(chunk)) {
        let g = generate(&model, ps, &cfg, device)?;
        correct += g
            .response_ids()
            .iter()
            .zip(es)
            .map(|(r, e)| check(&e.check, &policy.decode(r), &e.answer))
            .sum::<f32>();
    }
    Ok(f64::from(correct) / eval.len() as f64)
}

/// Teacher-forced demonstrations `<bos> prompt answer <eos>` in the character vocabulary:
/// tokens and mask `[b, t]`, and the mask of the answer tokens among the next-token targets
/// `[b, t − 1]`.
pub(crate) fn demonstrations(
    batch: &[Example],
    device: &Device,
) -> Result<(Tensor<2, Int>, Tensor<2>, Tensor<2>)> {
    let seqs: Vec<(Vec<u32>, usize)> = batch
        .iter()
        .map(|e| {
            let mut ids = vec![chartok::BOS];
            ids.extend(chartok::encode(&e.prompt).map_err(anyhow::Error::msg)?);
            let p = ids.len();
            ids.extend(chartok::encode(&e.answer).map_err(anyhow::Error::msg)?);
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
pub(crate) fn warm_up(
    mut model: Llama,
    w: &crate::recipe::Warmup,
    task: &crate::tasks::TaskSet,
    rng: &mut Rng,
    device: &Device,
) -> Result<Llama> {
    let mut optim: ModuleOptimizer = AdamWConfig::new().with_weight_decay(0.0).init();
    for _ in 0..w.steps {
        let batch = task.train(rng, w.batch);
        let (toks, mask, lm) = demonstrations(&batch, device)?;
        let (lp, _) = model.token_log_probs(toks, mask, 1.0, false, true);
        let loss = (lp * lm.clone()).sum().neg() / lm.sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(w.lr, model, grads);
    }
    Ok(model)
}

/// Appends metric rows to `metrics.jsonl` and rewrites `metrics.csv`.
pub(crate) struct MetricsLog {
    jsonl: std::fs::File,
    rows: Vec<BTreeMap<String, f64>>,
    dir: PathBuf,
}

impl MetricsLog {
    /// Starts `metrics.jsonl`; when resuming, keeps the rows up to step `keep_until` (rewritten
    /// atomically) and appends after them.
    pub(crate) fn open(dir: &Path, keep_until: Option<usize>) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        let mut rows = Vec::new();
        if let Some(last) = keep_until {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {} to resume", path.display()))?;
            // The kept lines are written back verbatim, not re-serialised from the parsed
            // values, so a resumed file holds the same bytes as an uninterrupted run's.
            let mut kept = String::new();
            for line in text.lines() {
                let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
                    .with_context(|| format!("parsing {}", path.display()))?;
                let row: BTreeMap<String, f64> = v
                    .into_iter()
                    .map(|(k, v)| (k, v.as_f64().unwrap_or(f64::NAN)))
                    .collect();
                if row.get("step").is_some_and(|s| *s <= last as f64) {
                    rows.push(row);
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
            checkpoint::write_atomic(&path, kept.as_bytes())?;
        }
        let jsonl = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        if keep_until.is_none() {
            jsonl.set_len(0)?;
        }
        Ok(Self {
            jsonl,
            rows,
            dir: dir.to_path_buf(),
        })
    }

    pub(crate) fn push(&mut self, row: BTreeMap<String, f64>) -> Result<()> {
        writeln!(self.jsonl, "{}", row_json(&row))?;
        self.jsonl.flush()?;
        self.rows.push(row);
        Ok(())
    }

    pub(crate) fn write_csv(&self) -> Result<()> {
        let mut keys: Vec<String> = self.rows.iter().flat_map(|r| r.keys().cloned()).collect();
        keys.sort();
        keys.dedup();
        let mut out = keys.join(",") + "\n";
        for r in &self.rows {
            let line: Vec<String> = keys
                .iter()
                .map(|k| r.get(k).map(|v| v.to_string()).unwrap_or_default())
                .collect();
            out += &(line.join(",") + "\n");
        }
        checkpoint::write_atomic(&self.dir.join("metrics.csv"), out.as_bytes())
    }

    fn write_plot(&self) -> Result<()> {
        self.write_curves("rollout/reward_mean", "eval/accuracy")
    }

    /// `curves.png` from two metric series (reward, accuracy).
    pub(crate) fn write_curves(&self, reward: &str, accuracy: &str) -> Result<()> {
        let series = |key: &str| -> Vec<(f64, f64)> {
            self.rows
                .iter()
                .filter_map(|r| Some((*r.get("step")?, *r.get(key)?)))
                .collect()
        };
        crate::plot::curves(
            &self.dir.join("curves.png"),
            &series(reward),
            &series(accuracy),
        )
    }
}

fn row_json(row: &BTreeMap<String, f64>) -> String {
    let json: serde_json::Map<String, serde_json::Value> = row
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::Number::from_f64(*v)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
            )
        })
        .collect();
    serde_json::Value::Object(json).to_string()
}

/// Loads the recipe's policy on `device` (the tiny model freshly initialised from the seed, or
/// the pretrained checkpoint with fresh adapters).
pub fn build_policy(r: &Recipe, device: &Device) -> Result<Policy> {
    build_policy_with(r, device, None)
}

/// [`build_policy`], with a pretrained policy's adapters read from a PEFT directory instead of
/// freshly initialised.
fn build_policy_with(r: &Recipe, device: &Device, peft: Option<&Path>) -> Result<Policy> {
    let (precision, note) =
        crate::device::resolve_precision(r.precision, crate::device::kind(&r.device)?);
    if let Some(note) = note {
        eprintln!("[{}] {note}", r.name);
    }
    let mut policy = build_policy_f32(r, device, peft)?;
    policy.model = policy
        .model
        .with_precision(precision)
        .with_fused_attention(r.fused_attention);
    Ok(policy)
}

fn build_policy_f32(r: &Recipe, device: &Device, peft: Option<&Path>) -> Result<Policy> {
    if let Some(m) = &r.model {
        device.seed(r.seed);
        let config = model_config(m);
        return Ok(Policy {
            model: config.init(device),
            config,
            tok: Tok::Char,
            stop: vec![chartok::EOS],
            lora: None,
        });
    }
    let p = r
        .pretrained
        .as_ref()
        .context("the recipe has no policy ([model] or [pretrained])")?;
    let path = expand_path(&p.path)?;
    let tok = crate::tokenizer_for(&path)?;
    let loaded = ember_llm::load(&path, device)
        .with_context(|| format!("loading pretrained.path {}", path.display()))?;
    device.seed(r.seed);
    let model = match peft {
        Some(dir) => ember_llm::load_peft(loaded.model, dir, device)?.0,
        None => ember_llm::apply_lora(loaded.model, &p.lora)?,
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
        lora: Some(p.lora.clone()),
    })
}

/// The parameters a checkpoint stores: all of the tiny model, the adapters of a LoRA policy.
fn model_record(policy: &Policy) -> ModuleRecord {
    if policy.lora.is_some() {
        policy
            .model
            .clone()
            .into_record_group(ParamGroup::from_predicate(".lora."))
    } else {
        policy.model.clone().into_record()
    }
}

fn load_model_record(policy: Policy, path: &Path) -> Result<Policy> {
    let rec = ModuleRecord::load(path)
        .map_err(|e| anyhow!("reading {}: {e}", path.display()))?
        .allow_partial(policy.lora.is_some());
    let model = policy
        .model
        .try_load_record(rec)
        .map_err(|e| anyhow!("applying {}: {e}", path.display()))?;
    Ok(Policy { model, ..policy })
}

/// Scores completions: the weighted sum of the recipe's reward terms, per row; adds the terms'
/// means to `row`.
struct Scorer<'a> {
    spec: &'a RewardSpec,
    external: Option<ExternalReward>,
}

/// The completions of one step, a row each.
struct Completions<'a> {
    /// The example each row answers.
    examples: &'a [&'a Example],
    /// Prompt index of each row.
    groups: &'a [usize],
    /// The question each row answers.
    prompts: &'a [String],
    /// Decoded responses.
    texts: &'a [String],
    /// Whether each response ended with a stop token.
    stopped: &'a [bool],
}

impl Scorer<'_> {
    fn score(
        &mut self,
        step: usize,
        c: &Completions,
        row: &mut BTreeMap<String, f64>,
    ) -> Result<Vec<f32>> {
        let Completions {
            examples,
            groups,
            prompts,
            texts,
            stopped,
        } = *c;
        let n = texts.len().max(1) as f64;
        let correct: Vec<f32> = examples
            .iter()
            .zip(texts)
            .map(|(e, t)| check(&e.check, t, &e.answer))
            .collect();
        row.insert(
            "reward/correct_mean".into(),
            correct.iter().map(|x| f64::from(*x)).sum::<f64>() / n,
        );
        let mut rewards: Vec<f32> = correct.iter().map(|c| self.spec.correct * c).collect();
        if self.spec.format != 0.0 {
            let f: Vec<f32> = texts
                .iter()
                .zip(stopped)
                .map(|(t, s)| format_reward(t, *s))
                .collect();
            row.insert(
                "reward/format_mean".into(),
                f.iter().map(|x| f64::from(*x)).sum::<f64>() / n,
            );
            for (r, v) in rewards.iter_mut().zip(f) {
                *r += self.spec.format * v;
            }
        }
        if let (Some(ext), Some(spec)) = (self.external.as_mut(), &self.spec.external) {
            let items: Vec<RewardItem> = (0..texts.len())
                .map(|i| RewardItem {
                    prompt: &prompts[i],
                    completion: &texts[i],
                    answer: &examples[i].answer,
                    group: groups[i],
                })
                .collect();
            let v = ext.score(step, &items)?;
            let finite: Vec<f64> = v
                .iter()
                .filter(|x| x.is_finite())
                .map(|x| f64::from(*x))
                .collect();
            row.insert(
                "reward/external_mean".into(),
                finite.iter().sum::<f64>() / finite.len().max(1) as f64,
            );
            for (r, x) in rewards.iter_mut().zip(v) {
                *r += spec.weight * x;
            }
        }
        Ok(rewards)
    }
}

pub(crate) fn say(quiet: bool, s: &str) {
    if !quiet {
        eprintln!("{s}");
    }
}

/// Refuses to clobber a directory that holds an earlier run.
fn check_out_dir(out: &Path, opts: &RunOptions) -> Result<()> {
    let ckpts = out.join("checkpoints");
    if opts.resume {
        if checkpoint::latest(&ckpts)?.is_none() {
            bail!(
                "--resume: {} holds no checkpoint to resume from",
                out.display()
            );
        }
        return Ok(());
    }
    if out.join("metrics.jsonl").exists() && !opts.overwrite {
        bail!(
            "{} already holds a run (metrics.jsonl); pass --resume to continue it, --overwrite to \
             replace it, or --out <dir> for a new one",
            out.display()
        );
    }
    if opts.overwrite && ckpts.exists() {
        std::fs::remove_dir_all(&ckpts).with_context(|| format!("removing {}", ckpts.display()))?;
    }
    Ok(())
}

/// A run directory opened for writing.
pub(crate) struct RunDir {
    /// `out/checkpoints`.
    pub ckpt_root: PathBuf,
    /// The checkpoint to resume from (`--resume`).
    pub resume_from: Option<PathBuf>,
    /// Its state.
    pub resumed: Option<TrainState>,
}

/// Checks `out` (no clobbering without `--resume`/`--overwrite`), creates it, finds the
/// checkpoint to resume from and checks that the recipe (`resolved`, its TOML) is unchanged;
/// writes `recipe.resolved.toml` for a new run.
pub(crate) fn open_run_dir(out: &Path, opts: &RunOptions, resolved: &str) -> Result<RunDir> {
    check_out_dir(out, opts)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let ckpt_root = out.join("checkpoints");
    let resume_from = if opts.resume {
        checkpoint::latest(&ckpt_root)?
    } else {
        None
    };
    let resumed: Option<TrainState> = match &resume_from {
        Some(d) => {
            let st = checkpoint::read_state(d)?;
            if st.recipe != resolved {
                bail!(
                    "--resume: the recipe differs from the one {} was started with (see {}); \
                     resume with the same recipe and --set values",
                    out.display(),
                    out.join("recipe.resolved.toml").display()
                );
            }
            Some(st)
        }
        None => None,
    };
    if resumed.is_none() {
        checkpoint::write_atomic(&out.join("recipe.resolved.toml"), resolved.as_bytes())?;
    }
    Ok(RunDir {
        ckpt_root,
        resume_from,
        resumed,
    })
}

/// Runs the recipe, writing into `out`.
/// The update schedule of a recipe's RL phase.
pub(crate) fn update_config(r: &Recipe, loss: ActorLossConfig) -> UpdateConfig {
    UpdateConfig {
        epochs: r.train.epochs,
        mini_batches: r.train.mini_batches,
        micro_batch_rows: r.train.micro_batch_rows,
        loss,
    }
}

/// The RL phase's AdamW (no weight decay; gradient-norm clipping when `train.grad_clip` > 0).
pub(crate) fn optimizer(r: &Recipe) -> ModuleOptimizer {
    let mut adamw = AdamWConfig::new().with_weight_decay(0.0);
    if r.train.grad_clip > 0.0 {
        adamw = adamw.with_grad_clipping(Some(burn::grad_clipping::GradientClippingConfig::Norm(
            r.train.grad_clip,
        )));
    }
    adamw.init()
}

pub fn train(r: &Recipe, out: &Path, opts: &RunOptions) -> Result<Summary> {
    let start = Instant::now();
    let quiet = opts.quiet;
    let resolved = toml::to_string_pretty(r)?;
    let RunDir {
        ckpt_root,
        resume_from,
        resumed,
    } = open_run_dir(out, opts, &resolved)?;
    let task = r.task.build()?;
    let eval = task.held_out_set(r.seed, r.task.eval_size);
    if eval.is_empty() {
        bail!("the task's held-out split is empty");
    }
    let base = crate::device::device(&r.device)?;
    let ad = base.clone().autodiff();
    let mut scorer = Scorer {
        spec: &r.reward,
        external: r
            .reward
            .external
            .as_ref()
            .map(ExternalReward::spawn)
            .transpose()?,
    };
    let max_new = r.rollout.max_new_tokens;
    let mut rng = Rng(r.seed);

    let mut policy = build_policy(r, &ad)?;
    for e in eval.iter().take(1) {
        policy.prompt_ids(e, max_new)?;
    }
    let reference_path = out.join("reference.bpk");
    let (accuracy_before, mut accuracy_after, first_step) = match (&resumed, &resume_from) {
        (Some(st), Some(dir)) => {
            policy = load_model_record(policy, &dir.join(checkpoint::MODEL))?;
            rng = Rng(st.rng);
            say(
                quiet,
                &format!(
                    "[{}] resuming from {} (step {})",
                    r.name,
                    dir.display(),
                    st.step
                ),
            );
            (st.accuracy_before, st.accuracy_after, st.step)
        }
        _ => {
            if let (Some(w), None) = (&r.warmup, &policy.lora) {
                let t0 = Instant::now();
                policy.model = warm_up(policy.model, w, &task, &mut rng, &ad)?;
                say(
                    quiet,
                    &format!(
                        "[{}] warm-up: {} steps in {:.1} s",
                        r.name,
                        w.steps,
                        t0.elapsed().as_secs_f64()
                    ),
                );
            }
            if r.train.kl_coef > 0.0 && policy.lora.is_none() {
                policy
                    .model
                    .clone()
                    .into_record()
                    .save(&reference_path)
                    .map_err(|e| anyhow!("writing {}: {e}", reference_path.display()))?;
            }
            let a = evaluate(&policy, &eval, max_new, &base)?;
            (a, a, 0)
        }
    };
    say(
        quiet,
        &format!(
            "[{}] held-out accuracy at the start: {accuracy_before:.3}",
            r.name
        ),
    );

    let (adv_cfg, loss, dynamic) = r.algorithm_parts();
    let upd = update_config(r, loss);
    let needs_greedy = matches!(adv_cfg.kind, AdvantageKind::Remax);
    // The reference policy: the warm-started tiny model, or the pretrained model with adapters
    // off.
    let reference: Option<Llama> = if r.train.kl_coef > 0.0 && policy.lora.is_none() {
        let rec = ModuleRecord::load(&reference_path)
            .map_err(|e| anyhow!("reading {}: {e}", reference_path.display()))?;
        let m = model_config(r.model.as_ref().context("tiny model")?)
            .init(&ad)
            .try_load_record(rec)
            .map_err(|e| anyhow!("applying {}: {e}", reference_path.display()))?
            .with_precision(policy.model.precision())
            .with_fused_attention(r.fused_attention);
        Some(m.valid())
    } else {
        None
    };
    let mut optim = optimizer(r);
    if let Some(dir) = &resume_from {
        let p = dir.join(checkpoint::OPTIM);
        let rec = OptimizerRecord::load(&p).map_err(|e| anyhow!("reading {}: {e}", p.display()))?;
        optim = optim.load_record(rec);
    }
    let schedule = LrSchedule {
        lr: r.train.lr,
        warmup_steps: r.train.warmup_steps,
        total_steps: r.train.steps,
        min_ratio: r.train.min_lr_ratio,
    };
    let mut log = MetricsLog::open(out, resumed.as_ref().map(|s| s.step))?;
    if resumed.is_none() {
        let mut row0 = BTreeMap::new();
        row0.insert("step".to_string(), 0.0);
        row0.insert("eval/accuracy".to_string(), accuracy_before);
        log.push(row0)?;
    }
    let save_ckpt = |policy: &Policy, optim: &ModuleOptimizer, step: usize, rng: u64, acc: f64| {
        let state = TrainState {
            step,
            rng,
            accuracy_before,
            accuracy_after: acc,
            recipe: resolved.clone(),
        };
        checkpoint::save(&ckpt_root, step, r.train.keep_checkpoints, |d| {
            checkpoint::write_records(d, model_record(policy), optim, &state)
        })
    };
    let tty = std::io::stderr().is_terminal();
    let n = r.rollout.samples_per_prompt;
    let mut steps_done = first_step;
    let mut interrupted = false;
    for step in first_step..r.train.steps {
        let t_step = Instant::now();
        let examples = task.train(&mut rng, r.rollout.prompts_per_step);
        let prompts = examples
            .iter()
            .map(|e| policy.prompt_ids(e, max_new))
            .collect::<Result<Vec<_>>>()?;
        let sampler = policy.model.valid();
        let sc = SamplingConfig {
            temperature: r.rollout.temperature,
            max_new_tokens: max_new,
            n,
            seed: rng.next_u64(),
            stop_tokens: policy.stop.clone(),
            prompt_bucket: r.rollout.shape_bucket,
            ..SamplingConfig::default()
        };
        let g = generate(&sampler, &prompts, &sc, &base)?.padded(r.rollout.shape_bucket);
        let responses = g.response_ids();
        // Phase wall times as verl logs them (`timing_s/*`); `response_ids` above already
        // waited for the device.
        let mut timing = vec![("timing_s/gen", t_step.elapsed().as_secs_f64())];
        let texts: Vec<String> = responses.iter().map(|r| policy.decode(r)).collect();
        let row_examples: Vec<&Example> = g.group_ids.iter().map(|gi| &examples[*gi]).collect();
        let prompt_texts: Vec<String> = g
            .group_ids
            .iter()
            .map(|gi| examples[*gi].question.clone())
            .collect();
        let stopped: Vec<bool> = g.truncated.iter().map(|t| !t).collect();
        let mut row = BTreeMap::new();
        let completions = Completions {
            examples: &row_examples,
            groups: &g.group_ids,
            prompts: &prompt_texts,
            texts: &texts,
            stopped: &stopped,
        };
        let rewards = scorer.score(step + 1, &completions, &mut row)?;
        let (seq, seq_mask) = g.sequences();
        let response_len = g.tokens.dims()[1];
        let exp = LlmExperience {
            tokens: seq.clone().to_device(&ad),
            mask: seq_mask.clone().to_device(&ad),
            response_len,
            temperature: sc.temperature.max(1e-6),
            adapters: true,
        };
        let mut batch = RolloutBatch::new(
            g.mask.clone().to_device(&ad),
            Tensor::from_floats(rewards.as_slice(), &ad),
            &g.group_ids,
        )?
        .with_rollout_log_probs(g.log_probs.clone().to_device(&ad))?;
        if let Some(o) = &r.reward.overlong {
            o.apply(&mut batch)?;
        }
        let host_exp = LlmExperience {
            tokens: seq.clone(),
            mask: seq_mask.clone(),
            ..exp.clone()
        };
        let t_ref = Instant::now();
        if r.train.recompute_old_log_probs {
            batch = batch.with_old_log_probs(host_exp.score_all(&sampler).to_device(&ad))?;
        }
        if r.train.kl_coef > 0.0 {
            let ref_lp = match &reference {
                Some(reference) => host_exp.score_all(reference),
                None => LlmExperience {
                    adapters: false,
                    ..host_exp.clone()
                }
                .score_all(&sampler),
            };
            batch = batch.with_ref_log_probs(ref_lp.to_device(&ad))?;
        }
        if r.train.recompute_old_log_probs || r.train.kl_coef > 0.0 {
            let _ = base.sync();
            timing.push(("timing_s/ref", t_ref.elapsed().as_secs_f64()));
        }
        if needs_greedy {
            let greedy = SamplingConfig {
                temperature: 0.0,
                n: 1,
                ..sc.clone()
            };
            let gg = generate(&sampler, &prompts, &greedy, &base)?;
            let gtexts: Vec<String> = gg.response_ids().iter().map(|r| policy.decode(r)).collect();
            let gex: Vec<&Example> = examples.iter().collect();
            let gstop: Vec<bool> = gg.truncated.iter().map(|t| !t).collect();
            let gprompts: Vec<String> = examples.iter().map(|e| e.question.clone()).collect();
            let mut scratch = BTreeMap::new();
            let gids: Vec<usize> = (0..gex.len()).collect();
            let greedy_completions = Completions {
                examples: &gex,
                groups: &gids,
                prompts: &gprompts,
                texts: &gtexts,
                stopped: &gstop,
            };
            let base_r = scorer.score(step + 1, &greedy_completions, &mut scratch)?;
            let per_row: Vec<f32> = g.group_ids.iter().map(|gi| base_r[*gi]).collect();
            batch = batch.with_baseline_rewards(Tensor::from_floats(per_row.as_slice(), &ad))?;
        }
        let mut kept_rows: Vec<usize> = (0..batch.dims()[0]).collect();
        let mut dropped_groups = 0;
        if dynamic {
            let (kept, dropped) = dynamic_sampling_keep(&batch);
            dropped_groups = dropped;
            kept_rows = kept;
        }
        row.insert("step".to_string(), (step + 1) as f64);
        let finite: Vec<f64> = rewards
            .iter()
            .filter(|x| x.is_finite())
            .map(|x| f64::from(*x))
            .collect();
        row.insert(
            "rollout/reward_mean".to_string(),
            finite.iter().sum::<f64>() / finite.len().max(1) as f64,
        );
        row.insert(
            "rollout/invalid_rewards".to_string(),
            (rewards.len() - finite.len()) as f64,
        );
        let lengths: Vec<usize> = responses.iter().map(Vec::len).collect();
        row.insert(
            "rollout/response_length".to_string(),
            lengths.iter().sum::<usize>() as f64 / lengths.len() as f64,
        );
        row.insert(
            "rollout/truncated_fraction".to_string(),
            g.truncated.iter().filter(|t| **t).count() as f64 / g.truncated.len().max(1) as f64,
        );
        row.insert("rollout/dropped_groups".to_string(), dropped_groups as f64);
        let lr = schedule.at(step);
        row.insert("actor/lr".to_string(), lr);
        if !kept_rows.is_empty() {
            let (batch, exp) = if kept_rows.len() < batch.dims()[0] {
                let idx: Vec<i64> = kept_rows.iter().map(|x| *x as i64).collect();
                let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [kept_rows.len()]), &ad);
                let e = LlmExperience {
                    tokens: exp.tokens.clone().select(0, idx.clone()),
                    mask: exp.mask.clone().select(0, idx),
                    ..exp.clone()
                };
                (batch.select(&kept_rows)?, e)
            } else {
                (batch, exp)
            };
            let adv = compute_advantages(&adv_cfg, &batch, step)?;
            for (k, v) in adv.metrics.to_host() {
                row.insert(k, v);
            }
            let mut order_rng = Rng(rng.next_u64());
            let t_update = Instant::now();
            let (m, stats) = update(
                policy.model,
                &mut optim,
                &exp,
                &batch,
                &adv,
                &upd,
                lr,
                r.train.kl_coef,
                &mut |n| order_rng.permutation(n),
            )?;
            policy.model = m;
            row.extend(stats.metrics);
            let _ = ad.sync();
            timing.push(("timing_s/update_actor", t_update.elapsed().as_secs_f64()));
        }
        let secs = t_step.elapsed().as_secs_f64();
        let tokens: usize = lengths.iter().sum();
        row.insert("perf/step_s".to_string(), secs);
        row.insert("perf/tokens_per_s".to_string(), tokens as f64 / secs);
        row.extend(timing.into_iter().map(|(k, v)| (k.to_string(), v)));
        if (step + 1) % r.train.eval_every == 0 || step + 1 == r.train.steps {
            let t_eval = Instant::now();
            accuracy_after = evaluate(&policy, &eval, max_new, &base)?;
            row.insert("eval/accuracy".to_string(), accuracy_after);
            row.insert("timing_s/eval".to_string(), t_eval.elapsed().as_secs_f64());
        }
        steps_done = step + 1;
        progress(quiet, tty, r, steps_done, &row, accuracy_after);
        log.push(row)?;
        let stop = STOP.load(Ordering::SeqCst) || opts.stop_after == Some(steps_done);
        let periodic =
            r.train.checkpoint_every > 0 && steps_done.is_multiple_of(r.train.checkpoint_every);
        if stop || periodic || steps_done == r.train.steps {
            let d = save_ckpt(&policy, &optim, steps_done, rng.0, accuracy_after)?;
            if stop && steps_done < r.train.steps {
                if tty && !quiet {
                    eprintln!();
                }
                say(
                    quiet,
                    &format!(
                        "[{}] stopped after step {steps_done}; checkpoint {}; continue with \
                         `ember train <recipe> --out {} --resume` (same --set values)",
                        r.name,
                        d.display(),
                        out.display()
                    ),
                );
                interrupted = true;
                break;
            }
        }
    }
    if tty && !quiet && !interrupted {
        eprintln!();
    }
    log.write_csv()?;
    log.write_plot()?;
    if !interrupted {
        write_final(&policy, r, out)?;
    }
    let summary = Summary {
        accuracy_before,
        accuracy_after,
        seconds: start.elapsed().as_secs_f64(),
        out: out.to_path_buf(),
        steps_done,
        interrupted,
    };
    let json = serde_json::json!({
        "name": r.name, "algorithm": r.algorithm.name(), "seed": r.seed,
        "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
        "seconds": summary.seconds, "steps_done": steps_done, "interrupted": interrupted,
    });
    checkpoint::write_atomic(
        &out.join("summary.json"),
        serde_json::to_string_pretty(&json)?.as_bytes(),
    )?;
    if !interrupted {
        say(
            quiet,
            &format!(
                "[{}] held-out accuracy {:.3} -> {:.3} in {:.0} s; run directory {}",
                r.name,
                accuracy_before,
                accuracy_after,
                summary.seconds,
                out.display()
            ),
        );
    }
    Ok(summary)
}

/// `final/`: the tiny model as Hugging Face safetensors, or the LoRA adapter in PEFT layout.
fn write_final(policy: &Policy, r: &Recipe, out: &Path) -> Result<()> {
    let final_dir = out.join("final");
    let tmp = out.join(".final.tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    match (&policy.lora, &r.pretrained) {
        (Some(settings), Some(p)) => {
            let name = Path::new(&p.path)
                .file_stem()
                .map_or("base".into(), |s| s.to_string_lossy().to_string());
            ember_llm::save_peft(&policy.model.valid(), settings, &name, &tmp)?;
        }
        _ => {
            ember_llm::save_hf(&policy.model.valid(), &policy.config, &policy.stop, &tmp)?;
        }
    }
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir)?;
    }
    std::fs::rename(&tmp, &final_dir)?;
    Ok(())
}

/// One progress line: a bar redrawn in place on a terminal, a line per step otherwise.
fn progress(
    quiet: bool,
    tty: bool,
    r: &Recipe,
    done: usize,
    row: &BTreeMap<String, f64>,
    acc: f64,
) {
    if quiet {
        return;
    }
    let total = r.train.steps.max(1);
    let stats = format!(
        "reward {:.3} acc {:.3} kl {:.4} {:.0} tok/s",
        row.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
        acc,
        row.get("actor/approx_kl").copied().unwrap_or(0.0),
        row.get("perf/tokens_per_s").copied().unwrap_or(0.0),
    );
    if tty {
        let width = 24;
        let fill = done * width / total;
        eprint!(
            "\r[{}] {:>5}/{total} [{}{}] {stats}\x1b[K",
            r.name,
            done,
            "#".repeat(fill),
            "-".repeat(width - fill)
        );
    } else {
        eprintln!("[{}] step {done:>4}/{total} {stats}", r.name);
    }
}

/// `ember eval`: greedy held-out accuracy of a run's final model (or of a checkpoint).
pub fn evaluate_run(
    run: &Path,
    checkpoint_dir: Option<&Path>,
    eval_size: Option<usize>,
) -> Result<f64> {
    let rp = run.join("recipe.resolved.toml");
    let text = std::fs::read_to_string(&rp).with_context(|| format!("reading {}", rp.display()))?;
    let mut r = crate::recipe::parse(&text, &[])?;
    if let Some(n) = eval_size {
        r.task.eval_size = n;
    }
    let task = r.task.build()?;
    let eval = task.held_out_set(r.seed, r.task.eval_size);
    let base = crate::device::device(&r.device)?;
    let final_dir = run.join("final");
    let policy = match checkpoint_dir {
        Some(d) => load_model_record(build_policy(&r, &base)?, &d.join(checkpoint::MODEL))?,
        None if !final_dir.exists() => bail!(
            "{} has no final/ model (did the run finish?); pass --checkpoint <dir>",
            run.display()
        ),
        None if r.pretrained.is_some() => build_policy_with(&r, &base, Some(&final_dir))?,
        None => Policy {
            model: ember_llm::load(&final_dir, &base)?.model,
            ..build_policy(&r, &base)?
        },
    };
    evaluate(&policy, &eval, r.rollout.max_new_tokens, &base)
}
