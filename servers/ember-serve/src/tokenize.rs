//! vLLM's tokenizer routes: `POST /tokenize`, `POST /detokenize` and `GET /tokenizer_info`, the
//! ones lm-eval-harness's `tokenizer_backend=remote` calls, so a served model (a GGUF file
//! included) is evaluated without a copy of its tokenizer on the client's side.

use super::api::{ApiError, chat_messages, parse};
use super::state::AppState;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// `POST /tokenize`: a prompt, or chat messages through the chat template.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    /// Ignored beyond its type: every served model shares the tokenizer.
    #[serde(default)]
    #[allow(dead_code)]
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<super::api::ChatMessage>>,
    /// The tokenizer's own specials (a BOS) are added (vLLM's default: true for a prompt,
    /// false for messages, whose template writes them).
    add_special_tokens: Option<bool>,
    /// Open the assistant's turn after the messages (default true).
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    /// Extra chat-template variables, as in `/v1/chat/completions`.
    #[serde(default)]
    chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Each token's text beside its id.
    #[serde(default)]
    return_token_strs: bool,
}

fn yes() -> bool {
    true
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    #[serde(default)]
    #[allow(dead_code)]
    model: Option<String>,
    tokens: Vec<u32>,
}

pub(crate) async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    tokenize_inner(&st, body).unwrap_or_else(IntoResponse::into_response)
}

fn tokenize_inner(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse(body)?;
    let tok = &st.tok;
    let (text, param, specials) = match (&req.prompt, &req.messages) {
        (Some(p), None) => (p.clone(), "prompt", req.add_special_tokens.unwrap_or(true)),
        (None, Some(list)) => {
            let messages = chat_messages(list)?;
            let text = tok
                .apply_chat_template_with(
                    &messages,
                    req.add_generation_prompt,
                    &req.chat_template_kwargs,
                )
                .map_err(|e| ApiError::bad("messages", format!("the chat template: {e}")))?;
            (text, "messages", req.add_special_tokens.unwrap_or(false))
        }
        _ => {
            return Err(ApiError::bad(
                "prompt",
                "give one of `prompt` and `messages`",
            ));
        }
    };
    let tokens = tok
        .encode_with(&text, specials)
        .map_err(|e| ApiError::bad(param, format!("tokenizing: {e}")))?;
    let strs = req.return_token_strs.then(|| {
        let strs: Vec<String> = tokens
            .iter()
            .map(|&t| super::answer::token_text(tok, t, false))
            .collect();
        strs
    });
    let body = json!({
        "count": tokens.len(),
        "max_model_len": st.info.context,
        "tokens": tokens,
        "token_strs": strs,
    });
    Ok(axum::Json(body).into_response())
}

pub(crate) async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    detokenize_inner(&st, body).unwrap_or_else(IntoResponse::into_response)
}

fn detokenize_inner(
    st: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse(body)?;
    if let Some((i, t)) = req
        .tokens
        .iter()
        .enumerate()
        .find(|&(_, &t)| t as usize >= st.info.vocab)
    {
        return Err(ApiError::bad(
            &format!("tokens[{i}]"),
            format!(
                "token id {t} is outside the vocabulary of {}",
                st.info.vocab
            ),
        ));
    }
    let prompt = st
        .tok
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad("tokens", format!("decoding: {e}")))?;
    Ok(axum::Json(json!({ "prompt": prompt })).into_response())
}

/// `GET /tokenizer_info`: the special tokens and the chat template (what vLLM's route gives
/// and lm-eval's remote tokenizer reads).
pub(crate) async fn info(State(st): State<Arc<AppState>>) -> Response {
    let tok = &st.tok;
    axum::Json(json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": null,
        "chat_template": tok.chat_template,
        "model_max_length": st.info.context,
        "vocab_size": tok.vocab_size(),
    }))
    .into_response()
}
