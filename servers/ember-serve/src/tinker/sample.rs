//! Tinker's sampling: sampling sessions (the base model, a saved `tinker://` adapter, or the
//! weights of a `save_weights_and_get_sampling_client`), and `asample` on the engine's
//! continuous batcher, answered as a protobuf `SampleResponse` with every token's log-prob.

use super::wire::{SampleResponse, SampledSequence, f32_bytes, i32_bytes};
use super::{Json, Service, body, check_session, service};
use crate::answer::{check_budget, cut, submit};
use crate::api::{ApiError, LoadLora, Params};
use crate::engine::{Choice, Msg};
use crate::state::AppState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prost::Message;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::oneshot;

#[derive(Deserialize)]
struct CreateSession {
    session_id: String,
    sampling_session_seq_id: u64,
    model_path: Option<String>,
    base_model: Option<String>,
}

/// `create_sampling_session`: a session over the base model or a saved adapter (loaded into
/// the engine when it does not hold it yet).
pub(super) async fn create_session(
    State(st): State<Arc<AppState>>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: CreateSession = body(&b)?;
    check_session(&r.session_id)?;
    let id = format!("{}:sample:{}", r.session_id, r.sampling_session_seq_id);
    match (&r.model_path, &r.base_model) {
        (Some(path), _) => load_path(&st, s, &id, path).await?,
        (None, Some(base)) => {
            s.base_of(base)?;
            s.samplers.register(&id, &st.info.base_name, None, false);
        }
        (None, None) => return Err(ApiError::bad("model_path", "give model_path or base_model")),
    }
    Ok(Json(json!({"sampling_session_id": id, "type": "create_sampling_session"})).into_response())
}

/// Points session `id` at the adapter saved at `path`, loading it into the engine if needed.
async fn load_path(st: &AppState, s: &Service, id: &str, path: &str) -> Result<(), ApiError> {
    let (model, kind, name) =
        super::store::parse_path(path).map_err(|e| ApiError::bad("model_path", e))?;
    let dir = s.store_dir.join(model).join(kind).join(name);
    if !dir.join("adapter_config.json").is_file() {
        return Err(ApiError::bad(
            "model_path",
            format!("{path} does not exist"),
        ));
    }
    if !s.samplers.is_loaded(path) {
        let (tx, rx) = oneshot::channel();
        let req = LoadLora {
            lora_name: path.to_string(),
            lora_path: dir.display().to_string(),
            load_inplace: true,
        };
        st.sender()?
            .send(Msg::Load(req, tx))
            .await
            .map_err(|_| crate::state::shutting_down())?;
        rx.await.map_err(|_| crate::state::shutting_down())??;
    }
    for old in s.samplers.register(id, path, Some(path.to_string()), true) {
        let (tx, _rx) = oneshot::channel();
        let _ = st.sender()?.send(Msg::Unload(old, tx)).await;
    }
    Ok(())
}

/// `GET /api/v1/samplers/{id}`: what a session samples.
pub(super) async fn sampler_info(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let Some((_, path)) = s.samplers.get(&id) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no sampling session `{id}`"),
        ));
    };
    let base = s.names.first().cloned().unwrap_or_default();
    Ok(Json(json!({"sampler_id": id, "base_model": base, "model_path": path})).into_response())
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    tokens: Vec<u32>,
    #[serde(rename = "type", default)]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct Prompt {
    chunks: Vec<Chunk>,
}

#[derive(Deserialize, Default)]
struct SamplingParams {
    max_tokens: Option<usize>,
    seed: Option<u64>,
    stop: Option<Value>,
    temperature: Option<f32>,
    top_k: Option<i64>,
    top_p: Option<f32>,
}

#[derive(Deserialize)]
struct SampleRequest {
    num_samples: usize,
    prompt: Prompt,
    #[serde(default)]
    sampling_params: SamplingParams,
    sampling_session_id: Option<String>,
    base_model: Option<String>,
    seq_id: Option<i64>,
    #[serde(default)]
    prompt_logprobs: bool,
    #[serde(default)]
    topk_prompt_logprobs: usize,
    #[serde(default)]
    topk_sample_logprobs: usize,
    #[serde(default)]
    prompt_alt_tokens_k: usize,
    target_prompt_logprobs: Option<Value>,
    prompt_logprobs_last_n: Option<usize>,
}

/// What one `asample` runs.
struct Plan {
    model: String,
    prompt: Vec<u32>,
    params: Params,
    max_tokens: usize,
    stops: Vec<String>,
    prompt_logprobs: Option<usize>,
}

/// `asample`: checked at once (bad input is a 400), then run on the engine behind a future.
pub(super) async fn asample(
    State(st): State<Arc<AppState>>,
    b: Bytes,
) -> Result<Response, ApiError> {
    let s = service(&st)?;
    let r: SampleRequest = body(&b)?;
    let key = r.seq_id.map(|q| {
        format!(
            "sample {}#{q}",
            r.sampling_session_id.as_deref().unwrap_or("")
        )
    });
    let n = r.num_samples;
    let plan = plan(&st, s, r)?;
    let (id, fresh) = s.futures.open(key);
    if fresh {
        let (st2, id2) = (st.clone(), id.clone());
        tokio::spawn(async move {
            let out = match run(&st2, plan).await {
                Ok(bytes) => super::Outcome::Proto(bytes),
                Err(e) if e.status.is_client_error() => super::Outcome::user(e.message),
                Err(e) => super::Outcome::Error {
                    message: e.message,
                    category: "server",
                },
            };
            if let Ok(s) = service(&st2) {
                s.futures.finish(&id2, out);
            }
        });
    }
    let ids: Vec<String> = (0..n).map(|i| format!("{id}-{i}")).collect();
    Ok(Json(json!({"request_id": id, "sample_sequence_ids": ids})).into_response())
}

fn plan(st: &AppState, s: &Service, r: SampleRequest) -> Result<Plan, ApiError> {
    let unsupported = [
        ("topk_prompt_logprobs", r.topk_prompt_logprobs > 0),
        ("topk_sample_logprobs", r.topk_sample_logprobs > 0),
        ("prompt_alt_tokens_k", r.prompt_alt_tokens_k > 0),
        ("target_prompt_logprobs", r.target_prompt_logprobs.is_some()),
    ];
    if let Some((name, _)) = unsupported.iter().find(|(_, on)| *on) {
        return Err(ApiError::bad(
            name,
            format!("{name} is not supported by this server"),
        ));
    }
    let model = match (&r.sampling_session_id, &r.base_model) {
        (Some(id), _) => s.samplers.use_session(id).ok_or_else(|| {
            ApiError::bad(
                "sampling_session_id",
                format!(
                    "no sampling session `{id}` (unknown, or its adapter was dropped: the \
                     server keeps the newest {} sampler adapters)",
                    super::store::SAMPLERS_KEPT
                ),
            )
        })?,
        (None, Some(base)) => {
            s.base_of(base)?;
            st.info.base_name.clone()
        }
        (None, None) => {
            return Err(ApiError::bad(
                "sampling_session_id",
                "no sampling session given",
            ));
        }
    };
    let mut prompt = Vec::new();
    for c in r.prompt.chunks {
        if c.kind.as_deref().is_some_and(|k| k != "encoded_text") {
            return Err(ApiError::bad(
                "prompt",
                "only encoded_text chunks are supported",
            ));
        }
        prompt.extend(c.tokens);
    }
    let vocab = st.info.vocab;
    if prompt.is_empty() || prompt.iter().any(|&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            "prompt",
            format!("the prompt must be 1 or more token ids below {vocab}"),
        ));
    }
    let p = r.sampling_params;
    let room = st.info.context.saturating_sub(prompt.len());
    let max_tokens = p.max_tokens.unwrap_or(room);
    if max_tokens == 0 || max_tokens > room {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "the context is {} tokens, the prompt {}: max_tokens must be in 1..={room}",
                st.info.context,
                prompt.len()
            ),
        ));
    }
    let (stop_tokens, stops, ignore_eos) = stop(p.stop)?;
    let temperature = p.temperature.unwrap_or(1.0);
    if !ember_llm::temperature_ok(f64::from(temperature), true) {
        return Err(ApiError::bad(
            "temperature",
            format!("temperature {temperature} is out of range"),
        ));
    }
    let top_p = p.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", "top_p must be in (0, 1]"));
    }
    if r.num_samples == 0 || r.num_samples > crate::api::MAX_N {
        return Err(ApiError::bad(
            "num_samples",
            format!("num_samples must be in 1..={}", crate::api::MAX_N),
        ));
    }
    check_budget(st, r.num_samples, prompt.len(), max_tokens)?;
    let params = Params {
        temperature,
        top_p,
        top_k: usize::try_from(p.top_k.unwrap_or(-1)).unwrap_or(0),
        min_p: 0.0,
        n: r.num_samples,
        seed: p.seed,
        stop_tokens,
        ignore_eos,
    };
    let prompt_logprobs = r
        .prompt_logprobs
        .then(|| r.prompt_logprobs_last_n.unwrap_or(prompt.len()));
    Ok(Plan {
        model,
        prompt,
        params,
        max_tokens,
        stops,
        prompt_logprobs,
    })
}

/// Tinker's `stop`: absent (the end-of-sequence tokens), `[]` (nothing, not even those), a
/// string, strings, or token ids.
fn stop(v: Option<Value>) -> Result<(Vec<u32>, Vec<String>, bool), ApiError> {
    let bad = || {
        ApiError::bad(
            "stop",
            "stop must be a string, a list of strings or a list of token ids",
        )
    };
    match v {
        None | Some(Value::Null) => Ok((Vec::new(), Vec::new(), false)),
        Some(Value::String(s)) => Ok((Vec::new(), vec![s], false)),
        Some(Value::Array(a)) if a.is_empty() => Ok((Vec::new(), Vec::new(), true)),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => Ok((
            Vec::new(),
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect(),
            false,
        )),
        Some(Value::Array(a)) => {
            let mut ids: Vec<u32> = a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(bad)
                })
                .collect::<Result<_, _>>()?;
            ids.sort_unstable();
            ids.dedup();
            Ok((ids, Vec::new(), false))
        }
        Some(_) => Err(bad()),
    }
}

async fn run(st: &AppState, plan: Plan) -> Result<Vec<u8>, ApiError> {
    let choices = submit(
        st,
        &plan.model,
        vec![plan.prompt.clone()],
        plan.params.clone(),
        plan.max_tokens,
    )
    .await?;
    let mut sequences = Vec::with_capacity(choices.len());
    for c in &choices {
        sequences.push(sequence(st, c, &plan.stops)?);
    }
    let prompt_logprobs = match plan.prompt_logprobs {
        Some(last_n) => Some(f32_bytes(
            &score(st, &plan.model, &plan.prompt, last_n).await?,
        )),
        None => None,
    };
    Ok(SampleResponse {
        sequences,
        prompt_logprobs,
        prompt_cache_hit_tokens: 0,
    }
    .encode_to_vec())
}

/// One choice cut at its first stop string (the tokens that complete it kept).
fn sequence(st: &AppState, c: &Choice, stops: &[String]) -> Result<SampledSequence, ApiError> {
    let (keep, stopped) = if stops.is_empty() {
        (c.tokens.len(), false)
    } else {
        let (_, keep, stopped) = cut(&st.tok, c, stops)?;
        (keep, stopped)
    };
    Ok(SampledSequence {
        stop_reason: if c.eos || stopped { 0 } else { 1 },
        tokens: i32_bytes(&c.tokens[..keep]),
        logprobs: Some(f32_bytes(&c.log_probs[..keep.min(c.log_probs.len())])),
    })
}

/// The prompt's log-probs: NaN at position 0 and before the last `last_n` positions.
async fn score(
    st: &AppState,
    model: &str,
    prompt: &[u32],
    last_n: usize,
) -> Result<Vec<f32>, ApiError> {
    let mut out = vec![f32::NAN; prompt.len()];
    if prompt.len() < 2 {
        return Ok(out);
    }
    let (tx, rx) = oneshot::channel();
    st.sender()?
        .send(Msg::Score(model.to_string(), vec![prompt.to_vec()], tx))
        .await
        .map_err(|_| crate::state::shutting_down())?;
    let scores = rx.await.map_err(|_| crate::state::shutting_down())??;
    let first = prompt.len().saturating_sub(last_n).max(1);
    if let Some(row) = scores.first() {
        for (i, (lp, _, _)) in row.iter().enumerate() {
            if i + 1 >= first && i + 1 < out.len() {
                out[i + 1] = *lp;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_takes_each_of_tinkers_forms() {
        assert_eq!(stop(None).unwrap(), (vec![], vec![], false));
        assert_eq!(stop(Some(json!([]))).unwrap(), (vec![], vec![], true));
        assert_eq!(
            stop(Some(json!("\n"))).unwrap(),
            (vec![], vec!["\n".to_string()], false)
        );
        assert_eq!(
            stop(Some(json!([7, 3, 7]))).unwrap(),
            (vec![3, 7], vec![], false)
        );
        assert!(stop(Some(json!([1, "a"]))).is_err());
        assert!(stop(Some(json!({"a": 1}))).is_err());
    }
}
