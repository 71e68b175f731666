//! `echo` in `/v1/completions`: the prompt given back before the completion, with its tokens'
//! log-probs (the first token's `null`) and, with `logprobs = 1`, the most likely token at each
//! position — OpenAI's legacy completions semantics, which lm-eval-harness's
//! `local-completions` model uses for its log-likelihood tasks (it sends token-id prompts with
//! `echo`, `logprobs = 1`, `max_tokens` 0 or 1 and temperature 0, and reads
//! `token_logprobs[ctxlen:-1]` and `top_logprobs` to sum the continuation's log-probs and
//! decide whether it was the greedy one).
//!
//! The completion (if `max_tokens` > 0) is generated as any other; then prompt + kept
//! completion tokens are scored by one forward pass under the same model at temperature 1, so
//! every reported log-prob, prompt or completion, comes from that pass.

use super::answer::{
    check_budget, check_lengths, cut, enqueue, envelope, finish, submit, text_offsets, token_text,
};
use super::api::{ApiError, CompletionRequest, Params, Usage};
use super::engine::{Choice, Msg};
use super::state::{AppState, shutting_down};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// The answer to an `echo` request whose prompts are already token ids.
pub(crate) async fn completions(
    st: &AppState,
    req: &CompletionRequest,
    prompts: Vec<Vec<u32>>,
    params: Params,
    stops: &[String],
) -> Result<Value, ApiError> {
    let tok = &st.tok;
    let n = params.n;
    let rows = prompts.len() * n;
    let choices: Vec<Choice> = if req.max_tokens == Some(0) {
        // Scoring only: the lengths are checked as for one new token, and the rows against
        // the server's budgets as any request's.
        check_lengths(st, &prompts, "prompt", Some(1), None, rows)?;
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        check_budget(st, rows, longest, 0)?;
        if !st.served().contains(&req.model) {
            return Err(ApiError::no_model(&req.model, &st.served()));
        }
        (0..rows)
            .map(|i| Choice {
                prompt: i / n,
                tokens: Vec::new(),
                log_probs: Vec::new(),
                eos: false,
            })
            .collect()
    } else {
        let max_tokens = check_lengths(st, &prompts, "prompt", req.max_tokens, Some(16), rows)?;
        submit(st, &req.model, prompts.clone(), params, max_tokens).await?
    };
    let mut kept = Vec::with_capacity(choices.len());
    let mut seqs = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        let (text, keep, stopped) = cut(tok, c, stops)?;
        let mut seq = prompts[i / n].clone();
        seq.extend(&c.tokens[..keep]);
        seqs.push(seq);
        kept.push((text, keep, stopped));
    }
    // Queued like a generation (429 when the queue is full); the engine stops scoring once
    // this request's client has gone.
    let (reply, rx) = oneshot::channel();
    enqueue(st, Msg::Score(req.model.clone(), seqs.clone(), reply))?;
    let scores = rx.await.map_err(|_| shutting_down())??;
    let as_ids = req.sampling.return_tokens_as_token_ids;
    let with_ids = req.sampling.return_token_ids;
    let mut out = Vec::with_capacity(choices.len());
    let mut completion_tokens = 0;
    for (i, ((c, (text, keep, stopped)), (seq, sc))) in choices
        .iter()
        .zip(kept)
        .zip(seqs.iter().zip(&scores))
        .enumerate()
    {
        completion_tokens += keep;
        let prompt = &prompts[i / n];
        let prompt_text = tok.decode(prompt, false).map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("decoding the prompt: {e}"),
            )
        })?;
        let logprobs = req.logprobs.map(|k| {
            let tokens: Vec<String> = seq.iter().map(|&t| token_text(tok, t, as_ids)).collect();
            let offsets = text_offsets(&tokens);
            let token_logprobs: Vec<Value> = std::iter::once(Value::Null)
                .chain(sc.iter().map(|s| json!(s.0)))
                .collect();
            let top: Value = if k >= 1 {
                std::iter::once(Value::Null)
                    .chain(
                        sc.iter()
                            .map(|s| json!({ token_text(tok, s.1, as_ids): s.2 })),
                    )
                    .collect::<Vec<_>>()
                    .into()
            } else {
                Value::Null
            };
            json!({
                "tokens": tokens,
                "token_logprobs": token_logprobs,
                "top_logprobs": top,
                "text_offset": offsets,
            })
        });
        let mut choice = json!({
            "index": i,
            "text": format!("{prompt_text}{text}"),
            "logprobs": logprobs,
            "finish_reason": finish(c.eos && !stopped, stopped),
        });
        if with_ids {
            choice["token_ids"] = json!(&c.tokens[..keep]);
            choice["prompt_token_ids"] = json!(prompt);
        }
        out.push(choice);
    }
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    Ok(envelope(
        st,
        "cmpl",
        "text_completion",
        &req.model,
        out,
        Usage::of(prompt_tokens, completion_tokens),
    ))
}
