//! The routes of `ember serve` and the text side of each request: the chat template, token ids
//! in, text, stop strings and log-probs out.

use super::answer::{check_lengths, cut, envelope, finish, submit, text_offsets, token_text};
use super::api::{
    ApiError, ChatRequest, CompletionRequest, LoadLora, Prompt, Stop, UnloadLora, UpdateWeights,
    Usage, chat_messages, parse,
};
use super::engine::Msg;
use super::state::{AppState, control};
use super::stream::{self, Ask, Kind};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::oneshot;

/// The routes, with request bodies read within `http`'s bounds before any handler.
pub fn router(state: Arc<AppState>, http: &super::listen::HttpLimits) -> Router {
    let routes = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(super::metrics::metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/load_lora_adapter", post(load_lora))
        .route("/v1/unload_lora_adapter", post(unload_lora))
        .route("/update_weights_from_disk", post(update_weights))
        .route("/tokenize", post(super::tokenize::tokenize))
        .route("/detokenize", post(super::tokenize::detokenize))
        .route("/tokenizer_info", get(super::tokenize::info));
    let routes = if state.tinker.is_some() {
        routes.merge(super::tinker::routes())
    } else {
        routes
    };
    let routes = routes
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such route")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method not allowed on this route",
            )
        });
    http.guard(routes, state.access.clone())
        .layer(middleware::from_fn_with_state(
            state.clone(),
            super::metrics::track,
        ))
        .with_state(state)
}

/// 200 while the engine thread takes requests, 503 once it has ended or shutdown began.
async fn health(State(st): State<Arc<AppState>>) -> StatusCode {
    match st.sender() {
        Ok(tx) if !tx.is_closed() => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let base = st.info.base_name.clone();
    let weights = st.weights();
    let data: Vec<Value> = st
        .served()
        .into_iter()
        .map(|id| {
            let adapter = id != base;
            json!({
                "id": id,
                "object": "model",
                "created": st.created,
                "owned_by": "ember",
                "root": if adapter { Value::Null } else { weights.0.clone().into() },
                "weight_version": if adapter { Value::Null } else { weights.1.clone().into() },
                "parent": if adapter { base.clone().into() } else { Value::Null },
                "max_model_len": st.info.context,
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn load_lora(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let name = |r: &LoadLora| r.lora_name.clone();
    let req = parse::<LoadLora>(body).and_then(|mut r| {
        r.lora_path = st
            .access
            .allowed_path("lora_path", &r.lora_path)?
            .display()
            .to_string();
        Ok(r)
    });
    adapter_call(&st, req, name, Msg::Load, "added").await
}

async fn unload_lora(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let name = |r: &UnloadLora| r.lora_name.clone();
    let msg = |r: UnloadLora, reply| Msg::Unload(r.lora_name, reply);
    adapter_call(&st, parse(body), name, msg, "removed").await
}

/// SGLang's `update_weights_from_disk`: queued as a control message (requests queued before it
/// are answered with the old weights); SGLang's answer shape, OpenAI-style errors.
async fn update_weights(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: UpdateWeights = parse(body)?;
        if let Some(f) = req.load_format.as_deref().filter(|f| *f != "auto") {
            return Err(ApiError::bad(
                "load_format",
                format!("load_format `{f}` is not supported (only `auto`: read from the path)"),
            ));
        }
        let path = st.access.allowed_path("model_path", &req.model_path)?;
        let path = path.display().to_string();
        let tx = st.sender()?;
        control(&tx, |r| Msg::UpdateWeights(path, r)).await?;
        st.set_weights(req.model_path, req.weight_version);
        Ok::<_, ApiError>(axum::Json(json!({
            "success": true,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
        })))
    };
    match run.await {
        Ok(v) => v.into_response(),
        Err(e) => e.into_response(),
    }
}

/// vLLM's adapter endpoints: the request queued as a control message; its plain-text answer.
async fn adapter_call<T>(
    st: &AppState,
    req: Result<T, ApiError>,
    name: impl Fn(&T) -> String,
    msg: impl FnOnce(T, oneshot::Sender<Result<(), ApiError>>) -> Msg,
    done: &str,
) -> Response {
    let run = async {
        let req = req?;
        let name = name(&req);
        let tx = st.sender()?;
        control(&tx, |r| msg(req, r)).await?;
        Ok::<_, ApiError>(format!(
            "Success: LoRA adapter '{name}' {done} successfully."
        ))
    };
    match run.await {
        Ok(text) => (StatusCode::OK, text).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    completions_inner(&st, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions_inner(
    st: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(body)?;
    let params = req.sampling.params_with(&st.info.defaults)?;
    let stops = Stop::strings(req.sampling.stop.clone())?;
    if req.suffix.is_some() {
        return Err(ApiError::bad("suffix", "suffix is not supported"));
    }
    if req.best_of.is_some_and(|b| b != params.n) {
        return Err(ApiError::bad(
            "best_of",
            "best_of other than n is not supported",
        ));
    }
    if req.logprobs.is_some_and(|k| k > 1) {
        return Err(ApiError::bad(
            "logprobs",
            "at most the top-1 alternative is computed (with echo): logprobs must be 0 or 1",
        ));
    }
    let tok = &st.tok;
    let encode = |t: &str| {
        tok.encode(t)
            .map_err(|e| ApiError::bad("prompt", format!("tokenizing: {e}")))
    };
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        Prompt::Text(t) => vec![encode(t)?],
        Prompt::Texts(v) => v.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Prompt::Ids(ids) => vec![ids.clone()],
        Prompt::IdLists(v) => v.clone(),
    };
    if req.sampling.stream {
        refuse_in_stream(&[
            ("echo", req.echo),
            ("logprobs", req.logprobs.is_some()),
            ("return_token_ids", req.sampling.return_token_ids),
        ])?;
    }
    if req.echo {
        let v = super::echo::completions(st, &req, prompts, params, &stops).await?;
        return Ok(axum::Json(v).into_response());
    }
    let rows = prompts.len() * params.n;
    let max_tokens = check_lengths(st, &prompts, "prompt", req.max_tokens, Some(16), rows)?;
    if req.sampling.stream {
        let (job, options) = ((prompts, params, max_tokens), req.sampling.stream_options);
        let ask = Ask::new(Kind::Text, &req.model, job, stops, options.as_ref());
        return stream::respond(st, ask);
    }
    let (with_ids, as_ids) = (
        req.sampling.return_token_ids,
        req.sampling.return_tokens_as_token_ids,
    );
    let n = params.n;
    let choices = submit(st, &req.model, prompts.clone(), params, max_tokens).await?;
    let mut out = Vec::with_capacity(choices.len());
    let mut completion_tokens = 0;
    for (i, c) in choices.iter().enumerate() {
        let (text, keep, stopped) = cut(tok, c, &stops)?;
        completion_tokens += keep;
        let logprobs = req.logprobs.map(|_| {
            let tokens: Vec<String> = c.tokens[..keep]
                .iter()
                .map(|&t| token_text(tok, t, as_ids))
                .collect();
            let offsets = text_offsets(&tokens);
            json!({
                "tokens": tokens,
                "token_logprobs": &c.log_probs[..keep],
                "top_logprobs": Value::Null,
                "text_offset": offsets,
            })
        });
        let mut choice = json!({
            "index": i,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish(c.eos && !stopped, stopped),
        });
        if with_ids {
            choice["token_ids"] = json!(&c.tokens[..keep]);
            choice["prompt_token_ids"] = json!(&prompts[i / n]);
        }
        out.push(choice);
    }
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let v = envelope(
        st,
        "cmpl",
        "text_completion",
        &req.model,
        out,
        Usage::of(prompt_tokens, completion_tokens),
    );
    Ok(axum::Json(v).into_response())
}

/// 400 for the first option given that a stream does not carry.
fn refuse_in_stream(options: &[(&str, bool)]) -> Result<(), ApiError> {
    match options.iter().find(|(_, on)| *on) {
        Some((name, _)) => Err(ApiError::bad(
            name,
            format!("{name} is not sent in a stream; send stream = false for it"),
        )),
        None => Ok(()),
    }
}

async fn chat(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    chat_inner(&st, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_inner(
    st: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(body)?;
    let params = req.sampling.params_with(&st.info.defaults)?;
    let stops = Stop::strings(req.sampling.stop.clone())?;
    if req.top_logprobs.is_some_and(|k| k > 0) {
        return Err(ApiError::bad(
            "top_logprobs",
            "top alternatives are not returned: top_logprobs must be 0 (logprobs = true gives \
             the sampled tokens' log-probs)",
        ));
    }
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::bad("tools", "tools are not supported"));
    }
    if let Some(f) = &req.response_format
        && f.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::bad(
            "response_format",
            "only response_format {\"type\": \"text\"} is supported",
        ));
    }
    let messages = chat_messages(&req.messages)?;
    let tok = &st.tok;
    let text = tok
        .apply_chat_template_with(&messages, true, &req.chat_template_kwargs)
        .map_err(|e| ApiError::bad("messages", format!("the chat template: {e}")))?;
    let prompt = tok
        .encode(&text)
        .map_err(|e| ApiError::bad("messages", format!("tokenizing: {e}")))?;
    let prompts = vec![prompt];
    let asked = req.max_completion_tokens.or(req.max_tokens);
    let rows = params.n;
    let max_tokens = check_lengths(st, &prompts, "messages", asked, None, rows)?;
    if req.sampling.stream {
        refuse_in_stream(&[
            ("logprobs", req.logprobs),
            ("return_token_ids", req.sampling.return_token_ids),
        ])?;
        let (job, options) = ((prompts, params, max_tokens), req.sampling.stream_options);
        let ask = Ask::new(Kind::Chat, &req.model, job, stops, options.as_ref());
        return stream::respond(st, ask);
    }
    let (with_ids, as_ids) = (
        req.sampling.return_token_ids,
        req.sampling.return_tokens_as_token_ids,
    );
    let choices = submit(st, &req.model, prompts.clone(), params, max_tokens).await?;
    let mut out = Vec::with_capacity(choices.len());
    let mut completion_tokens = 0;
    for (i, c) in choices.iter().enumerate() {
        let (text, keep, stopped) = cut(tok, c, &stops)?;
        completion_tokens += keep;
        let logprobs = req.logprobs.then(|| {
            let content: Vec<Value> = c.tokens[..keep]
                .iter()
                .zip(&c.log_probs[..keep])
                .map(|(&t, &lp)| {
                    let piece = token_text(tok, t, false);
                    json!({
                        "token": token_text(tok, t, as_ids),
                        "logprob": lp,
                        "bytes": piece.as_bytes(),
                        "top_logprobs": [],
                    })
                })
                .collect();
            json!({ "content": content })
        });
        let mut choice = json!({
            "index": i,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish(c.eos && !stopped, stopped),
        });
        if with_ids {
            choice["token_ids"] = json!(&c.tokens[..keep]);
        }
        out.push(choice);
    }
    let mut v = envelope(
        st,
        "chatcmpl",
        "chat.completion",
        &req.model,
        out,
        Usage::of(prompts[0].len(), completion_tokens),
    );
    if with_ids {
        v["prompt_token_ids"] = json!(&prompts[0]);
    }
    Ok(axum::Json(v).into_response())
}
