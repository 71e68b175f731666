//! A teacher (`[teacher]`): another model of the student's vocabulary that scores every token
//! the student samples. Loaded in process (a Hugging Face directory, such as a tiny run's
//! `final/`, or a GGUF file; frozen, on the run's device) or behind an OpenAI-compatible
//! endpoint (its prompt log-probs through `echo`). Its role is on-policy distillation's
//! per-token reward, or the reference of the KL loss term.

use super::schema::{TeacherRole, TeacherSpec};
use crate::lm::Policy;
use crate::lm::endpoint::{Endpoint, choices};
use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::{Device, Tensor, TensorData};
use ember_engine::RolloutBatch;
use ember_llm::actor::LlmExperience;
use ember_llm::{Llama, Tokenizer};
use serde_json::json;
use std::collections::BTreeMap;

/// On-policy distillation's per-token reward (Agarwal et al. 2024, GKD, eq. 4: the negative
/// per-token reverse-KL estimate d_t = log π_teacher(y_t) − log π_student(y_t)), centred by its
/// mean over the batch's valid steps as tinker-cookbook's `incorporate_kl_penalty` does:
/// β·(d_t − mean d) on valid steps, 0 elsewhere.
pub fn distillation_rewards(
    teacher: Tensor<2>,
    student: Tensor<2>,
    mask: Tensor<2>,
    coef: f32,
) -> Tensor<2> {
    let d = (teacher - student) * mask.clone();
    let mean = d.clone().sum() / mask.clone().sum().clamp_min(1.0);
    (d - mean.unsqueeze::<2>()) * mask * coef
}

/// Where the teacher's log-probs come from.
enum Source {
    Local(Box<Llama>),
    Endpoint(Endpoint),
}

/// A loaded (or connected) teacher, its vocabulary checked against the student's.
pub struct Teacher {
    spec: TeacherSpec,
    source: Source,
}

/// Rows per `echo` request.
const CHUNK: usize = 64;

impl Teacher {
    /// The teacher of a validated spec, on `device` or at its endpoint; an error when its
    /// vocabulary is not the student's (`probe`: a text both tokenize, for an endpoint).
    pub fn new(spec: &TeacherSpec, device: &Device, student: &Policy, probe: &str) -> Result<Self> {
        let source = match (&spec.path, &spec.base_url, &spec.model) {
            (Some(path), _, _) => {
                let path =
                    ember_hub::resolve(&ember_tasks::expand_path(path)?).context("teacher.path")?;
                let what = || format!("teacher.path {}", path.display());
                let loaded = ember_llm::load(&path, device).with_context(what)?;
                let tok = Tokenizer::for_checkpoint(&path).with_context(what)?;
                same_vocabulary(student, &loaded.model, &tok).with_context(what)?;
                Source::Local(Box::new(loaded.model))
            }
            (None, Some(url), Some(model)) => {
                let e = Endpoint::connect(
                    "teacher",
                    url,
                    model,
                    spec.api_key_env.as_deref(),
                    spec.request_timeout_s,
                    spec.request_retries,
                )?;
                same_tokens(&e, student, probe).context("teacher.base_url")?;
                Source::Endpoint(e)
            }
            _ => bail!("[teacher]: give path, or base_url and model"),
        };
        Ok(Self {
            spec: spec.clone(),
            source,
        })
    }

    /// The teacher's role.
    pub fn role(&self) -> TeacherRole {
        self.spec.role
    }

    /// `[rows, response_len]` the teacher's log-probs of each row's response tokens at
    /// temperature 1 (the teacher as it is), 0 on steps past a response; on `exp`'s device.
    pub fn log_probs(&self, exp: &LlmExperience) -> Result<Tensor<2>> {
        match &self.source {
            Source::Local(m) => {
                let at_one = LlmExperience {
                    temperature: 1.0,
                    adapters: true,
                    ..exp.clone()
                };
                Ok(at_one.score_all(m))
            }
            Source::Endpoint(e) => echoed_log_probs(e, exp),
        }
    }

    /// `batch` with the teacher's part: per-token rewards (added to any already there) or the
    /// KL reference; `teacher/*` metrics into `row`.
    pub fn apply(
        &self,
        mut batch: RolloutBatch,
        exp: &LlmExperience,
        ad: &Device,
        row: &mut BTreeMap<String, f64>,
    ) -> Result<RolloutBatch> {
        let lp_t = self.log_probs(exp)?.to_device(ad);
        let student = batch
            .behaviour_log_probs()
            .cloned()
            .context("the teacher needs the student's log-probs")?;
        let mask = batch.mask.clone();
        // One host read: the valid steps, Σ (log π_S − log π_T) and Σ log π_T over them.
        let sums = Tensor::cat(
            vec![
                mask.clone().sum(),
                ((student.clone() - lp_t.clone()) * mask.clone()).sum(),
                (lp_t.clone() * mask.clone()).sum(),
            ],
            0,
        );
        let s = sums
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| anyhow!("reading the teacher's metrics: {e:?}"))?;
        let n = f64::from(s[0]).max(1.0);
        row.insert("teacher/reverse_kl".into(), f64::from(s[1]) / n);
        row.insert("teacher/log_prob_mean".into(), f64::from(s[2]) / n);
        match self.spec.role {
            TeacherRole::Reward => {
                let r = distillation_rewards(lp_t, student, mask, self.spec.coef);
                let r = match batch.token_rewards.take() {
                    Some(t) => t + r,
                    None => r,
                };
                Ok(batch.with_token_rewards(r)?)
            }
            TeacherRole::Kl => Ok(batch.with_ref_log_probs(lp_t)?),
        }
    }
}

/// The teacher scores the student's token ids: it must hold every id the student can emit, and
/// each id must read as the same text in both tokenizers.
fn same_vocabulary(student: &Policy, teacher: &Llama, tok: &Tokenizer) -> Result<()> {
    let n = student.model.vocab_size();
    if teacher.vocab_size() < n {
        bail!(
            "the teacher's vocabulary has {} tokens, fewer than the student's {n}: they must share \
             one tokenizer",
            teacher.vocab_size()
        );
    }
    for id in 0..n.min(tok.vocab_size()) as u32 {
        let (s, t) = (
            student.decode(&[id]),
            tok.decode(&[id], true).unwrap_or_default(),
        );
        if s != t {
            bail!(
                "token {id} is {s:?} to the student and {t:?} to the teacher: they must share one \
                 tokenizer"
            );
        }
    }
    Ok(())
}

/// An endpoint teacher tokenizes `probe` as the student does (its `/tokenize` route, which
/// `ember serve` and vLLM answer).
fn same_tokens(e: &Endpoint, student: &Policy, probe: &str) -> Result<()> {
    let ours = student.encode_plain(probe)?;
    let body = json!({"model": e.model, "prompt": probe, "add_special_tokens": false});
    let v = e.call("/tokenize", Some(&body))?;
    let theirs: Option<Vec<u32>> = v["tokens"].as_array().and_then(|a| {
        a.iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect()
    });
    match theirs {
        Some(t) if t == ours => Ok(()),
        Some(t) => bail!(
            "the teacher tokenizes {probe:?} as {t:?}, the student as {ours:?}: they must share \
             one tokenizer"
        ),
        None => bail!("the teacher's /tokenize answer has no token list"),
    }
}

/// Each row's tokens (prompt and response, padding dropped) and its response length, read from
/// the device once.
fn rows_of(exp: &LlmExperience) -> Result<Vec<(Vec<u32>, usize)>> {
    let [rows, width] = exp.tokens.dims();
    let p = width - exp.response_len;
    let read = |e| anyhow!("reading the rollout's tokens: {e:?}");
    let ids = exp
        .tokens
        .to_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .map_err(read)?;
    let mask = exp.mask.to_data().try_to_vec::<f32>().map_err(read)?;
    let mut out = Vec::with_capacity(rows);
    for i in 0..rows {
        let (m, t) = (
            &mask[i * width..(i + 1) * width],
            &ids[i * width..(i + 1) * width],
        );
        let k = m[p..].iter().take_while(|&&x| x > 0.0).count();
        if m[p + k..].iter().any(|&x| x > 0.0) {
            bail!("row {i}'s response has a gap: an endpoint teacher scores whole responses");
        }
        let row = t.iter().zip(m).filter(|(_, m)| **m > 0.0);
        out.push((row.map(|(t, _)| *t as u32).collect(), k));
    }
    Ok(out)
}

/// The endpoint's `echo` log-probs of each row's response tokens, `[rows, response_len]`.
fn echoed_log_probs(e: &Endpoint, exp: &LlmExperience) -> Result<Tensor<2>> {
    let rows = rows_of(exp)?;
    let n = exp.response_len;
    let mut out = vec![0f32; rows.len() * n];
    let asked: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].1 > 0).collect();
    for chunk in asked.chunks(CHUNK) {
        let prompts: Vec<&Vec<u32>> = chunk.iter().map(|&i| &rows[i].0).collect();
        let body = json!({"model": e.model, "prompt": prompts, "max_tokens": 0,
                          "echo": true, "logprobs": 1, "temperature": 1.0});
        let v = e.call("/v1/completions", Some(&body))?;
        for (c, &i) in choices(&v, chunk.len(), "the teacher")?.iter().zip(chunk) {
            let (ids, k) = (&rows[i].0, rows[i].1);
            let lps = c["logprobs"]["token_logprobs"]
                .as_array()
                .filter(|a| a.len() == ids.len());
            let lps =
                lps.context("the teacher's answer has no echoed log-prob per prompt token")?;
            for (j, x) in lps[ids.len() - k..].iter().enumerate() {
                let x = x.as_f64().filter(|x| x.is_finite() && *x <= 1e-3);
                out[i * n + j] =
                    x.context("the teacher echoed a missing or impossible log-prob")? as f32;
            }
        }
    }
    let device = exp.tokens.device();
    Ok(Tensor::from_data(
        TensorData::new(out, [rows.len(), n]),
        &device,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lm::step::experience;
    use ember_llm::SamplingConfig;

    /// The main recipe's policy, smaller, with `--set` overrides (random: no warm-up is run).
    fn policy(sets: &[&str], device: &Device) -> Policy {
        let small = ["model.d_model=32", "model.layers=1", "model.d_ff=64"];
        let sets: Vec<String> = small.iter().chain(sets).map(|s| s.to_string()).collect();
        let r = crate::llm::schema::parse(include_str!("../arithmetic-cpu.toml"), &sets).unwrap();
        crate::llm::build_policy(&r, device).unwrap()
    }

    /// By hand: β = 0.5, teacher [−1, −2, −3], student [−1.5, −0.5, 0], mask [1, 1, 0]:
    /// d = [0.5, −1.5], mean −0.5, so 0.5·[1, −1] and 0 on the masked step.
    #[test]
    fn distillation_rewards_by_hand() {
        let d = Device::default();
        let t = Tensor::<2>::from_floats([[-1.0, -2.0, -3.0]], &d);
        let s = Tensor::<2>::from_floats([[-1.5, -0.5, 0.0]], &d);
        let m = Tensor::<2>::from_floats([[1.0, 1.0, 0.0]], &d);
        let r = distillation_rewards(t, s, m, 0.5)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(r, vec![0.5, -0.5, 0.0]);
    }

    /// A teacher loaded from a Hugging Face directory scores the student's samples as a
    /// separate full pass does (log-softmax of the logits at the position before each token);
    /// its rewards are β·(teacher − sampler) on the response steps, and its metrics their means.
    #[test]
    fn token_rewards_are_the_teachers_log_probs_minus_the_students() {
        let d = Device::default();
        let dir = std::env::temp_dir().join(format!("ember-teacher-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        crate::lm::save_tiny(&policy(&["model.d_model=48", "seed=3"], &d), &dir).unwrap();
        let student = policy(&[], &d);
        let spec: TeacherSpec = toml::from_str(&format!(
            "path = {:?}\ncoef = 0.5",
            dir.display().to_string()
        ))
        .unwrap();
        let teacher = Teacher::new(&spec, &d, &student, "1+2=").unwrap();
        let prompts: Vec<Vec<u32>> = ["1+2=", "6+0="]
            .iter()
            .map(|q| {
                [
                    vec![ember_llm::chartok::BOS],
                    student.encode_plain(q).unwrap(),
                ]
                .concat()
            })
            .collect();
        let sc = SamplingConfig {
            temperature: 1.0,
            max_new_tokens: 4,
            n: 3,
            seed: 7,
            ..SamplingConfig::default()
        };
        let g = ember_llm::generate(&student.model, &prompts, &sc, &d).unwrap();
        let (seq, mask) = g.sequences();
        let exp = experience(seq.clone(), mask.clone(), 4, &sc);
        let got = teacher
            .log_probs(&exp)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        // The separate pass.
        let loaded = ember_llm::load(&dir, &d).unwrap().model;
        let logits = loaded.forward_with(seq.clone(), mask.clone(), false);
        let lp = burn::tensor::activation::log_softmax(logits, 2);
        let [rows, width, v] = lp.dims();
        let lp = lp.into_data().try_to_vec::<f32>().unwrap();
        let ids = seq
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .unwrap();
        let m = g.mask.clone().into_data().try_to_vec::<f32>().unwrap();
        let p = width - 4;
        for i in 0..rows {
            for j in 0..4 {
                let want = match m[i * 4 + j] > 0.0 {
                    true => lp[(i * width + p + j - 1) * v + ids[i * width + p + j] as usize],
                    false => 0.0,
                };
                let have = got[i * 4 + j];
                assert!(
                    (have - want).abs() < 1e-5,
                    "row {i} step {j}: {have} vs {want}"
                );
            }
        }
        // The rewards and metrics of the batch whose sampler log-probs are `lp`.
        let batch_of = |lp: Tensor<2>| {
            RolloutBatch::new(g.mask.clone(), Tensor::zeros([rows], &d), &g.group_ids)
                .unwrap()
                .with_rollout_log_probs(lp)
                .unwrap()
        };
        let batch = batch_of(g.log_probs.clone());
        let mut row = BTreeMap::new();
        let b = teacher.apply(batch, &exp, &d, &mut row).unwrap();
        let r = b
            .token_rewards
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let s = g.log_probs.into_data().try_to_vec::<f32>().unwrap();
        let (mut kl, mut n) = (0.0, 0.0);
        for k in 0..rows * 4 {
            kl += f64::from((s[k] - got[k]) * m[k]);
            n += f64::from(m[k]);
        }
        for k in 0..rows * 4 {
            let want = 0.5 * (f64::from(got[k] - s[k]) + kl / n) * f64::from(m[k]);
            assert!(
                (f64::from(r[k]) - want).abs() < 1e-5,
                "{k}: {} vs {want}",
                r[k]
            );
        }
        assert!((row["teacher/reverse_kl"] - kl / n).abs() < 1e-4);
        // As the KL term's reference: the teacher's log-probs, no token rewards.
        let kl_spec = TeacherSpec {
            role: TeacherRole::Kl,
            ..spec.clone()
        };
        let as_ref = Teacher::new(&kl_spec, &d, &student, "1").unwrap();
        let batch = batch_of(Tensor::zeros([rows, 4], &d));
        let b = as_ref.apply(batch, &exp, &d, &mut row).unwrap();
        assert!(b.token_rewards.is_none());
        let r = b
            .ref_log_probs
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(r, got);
        // Another vocabulary is refused, naming a token.
        let bytes = policy(&["model.vocab=\"bytes\""], &d);
        let e = Teacher::new(&spec, &d, &bytes, "1").err().unwrap();
        assert!(format!("{e:#}").contains("share one tokenizer"), "{e:#}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
