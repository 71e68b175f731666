//! What both completion routes (and `echo`) share: a batch submitted to the engine, the
//! length checks, stop strings, token text and offsets, the finish reason and the response
//! envelope.

use super::api::{ApiError, Params, Usage};
use super::engine::{Choice, Deltas, Job, Msg};
use super::state::{AppState, now, shutting_down};
use axum::http::StatusCode;
use ember_llm::Tokenizer;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// Queues a job and waits for its choices (429 when the queue is full).
pub(crate) async fn submit(
    st: &AppState,
    model: &str,
    prompts: Vec<Vec<u32>>,
    params: Params,
    max_tokens: usize,
) -> Result<Vec<Choice>, ApiError> {
    let rx = queue(st, model, prompts, params, max_tokens, None)?;
    rx.await.map_err(|_| shutting_down())?
}

/// The answer of a queued job, once the engine has it.
pub(crate) type Answer = oneshot::Receiver<Result<Vec<Choice>, ApiError>>;

/// Queues a job (its tokens sent to `stream` as they are drawn, if given) without waiting.
pub(crate) fn queue(
    st: &AppState,
    model: &str,
    prompts: Vec<Vec<u32>>,
    params: Params,
    max_tokens: usize,
    stream: Option<Deltas>,
) -> Result<Answer, ApiError> {
    if !st.served().iter().any(|n| n == model) {
        return Err(ApiError::no_model(model, &st.served()));
    }
    let rows = prompts.len() * params.n;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    check_budget(st, rows, longest, max_tokens)?;
    let (reply, rx) = oneshot::channel();
    let job = Job {
        model: model.to_string(),
        prompts,
        params,
        max_tokens,
        reply,
        stream,
    };
    enqueue(st, Msg::Generate(job))?;
    Ok(rx)
}

/// `rows` rows of prompts of up to `longest` tokens plus `max_tokens` new ones within the
/// server's `--max-batch` and `--max-batch-tokens` (400 naming the flag otherwise).
pub(crate) fn check_budget(
    st: &AppState,
    rows: usize,
    longest: usize,
    max_tokens: usize,
) -> Result<(), ApiError> {
    if rows > st.max_rows {
        return Err(ApiError::bad(
            "n",
            format!(
                "prompts × n = {rows} exceeds the server's --max-batch of {} rows",
                st.max_rows
            ),
        ));
    }
    let cells = rows.saturating_mul(longest.saturating_add(max_tokens));
    if cells > st.max_cells {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "prompts × n × (prompt + max_tokens) = {cells} KV-cache positions exceeds the \
                 server's --max-batch-tokens of {}; lower max_tokens or n",
                st.max_cells
            ),
        ));
    }
    Ok(())
}

/// Queues `msg` without waiting: 429 when `--max-queue` requests already wait, 503 once the
/// server is shutting down.
pub(crate) fn enqueue(st: &AppState, msg: Msg) -> Result<(), ApiError> {
    match st.sender()?.try_send(msg) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Full(_)) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "the server's queue is full; retry later",
        )),
        Err(mpsc::error::TrySendError::Closed(_)) => Err(shutting_down()),
    }
}

/// Checks prompt ids (`param` names them in errors) and fixes `max_tokens` (`default` when
/// absent: a number, or the rest of the context within the server's KV-cache budget for
/// `rows` rows).
pub(crate) fn check_lengths(
    st: &AppState,
    prompts: &[Vec<u32>],
    param: &str,
    max_tokens: Option<usize>,
    default: Option<usize>,
    rows: usize,
) -> Result<usize, ApiError> {
    let vocab = st.info.vocab;
    let context = st.info.context;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::bad(
            param,
            "every prompt must have at least one token",
        ));
    }
    if let Some(t) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            param,
            format!("token id {t} is outside the vocabulary of {vocab}"),
        ));
    }
    if longest >= context {
        return Err(ApiError::bad(
            param,
            format!("the prompt has {longest} tokens; this model's context is {context}"),
        ));
    }
    let max = match max_tokens.or(default) {
        Some(m) => m,
        None => (context - longest)
            .min((st.max_cells / rows.max(1)).saturating_sub(longest))
            .max(1),
    };
    if max == 0 {
        return Err(ApiError::bad("max_tokens", "max_tokens must be >= 1"));
    }
    if longest.checked_add(max).is_none_or(|n| n > context) {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "this model's context is {context} tokens; the prompt has {longest} and \
                 max_tokens is {max}"
            ),
        ));
    }
    Ok(max)
}

/// A choice's text, cut before the first stop string; and the number of its tokens kept (the
/// shortest prefix whose text holds the stop string, or all).
pub(crate) fn cut(
    tok: &Tokenizer,
    c: &Choice,
    stops: &[String],
) -> Result<(String, usize, bool), ApiError> {
    let decode = |ids: &[u32]| {
        tok.decode(ids, true).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("decoding: {e}"),
            )
        })
    };
    let text = decode(&c.tokens)?;
    let first = |t: &str| stops.iter().filter_map(|s| t.find(s.as_str())).min();
    let Some(at) = first(&text) else {
        return Ok((text, c.tokens.len(), false));
    };
    // The text of a longer prefix holds a stop string if a shorter one does: bisect.
    let (mut lo, mut hi) = (0, c.tokens.len());
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if first(&decode(&c.tokens[..mid])?).is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok((text[..at].to_string(), hi, true))
}

pub(crate) fn token_text(tok: &Tokenizer, id: u32, as_ids: bool) -> String {
    if as_ids {
        format!("token_id:{id}")
    } else {
        tok.decode(&[id], false).unwrap_or_default()
    }
}

/// The byte offset of each token's text in their concatenation (`text_offset`).
pub(crate) fn text_offsets(tokens: &[String]) -> Vec<usize> {
    tokens
        .iter()
        .scan(0, |at, t| {
            let o = *at;
            *at += t.len();
            Some(o)
        })
        .collect()
}

pub(crate) fn finish(eos: bool, stopped: bool) -> &'static str {
    if eos || stopped { "stop" } else { "length" }
}

/// A response: id, object, creation time, model, choices and usage.
pub(crate) fn envelope(
    st: &AppState,
    prefix: &str,
    object: &str,
    model: &str,
    choices: Vec<Value>,
    usage: Usage,
) -> Value {
    json!({
        "id": st.next_id(prefix),
        "object": object,
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage,
    })
}
