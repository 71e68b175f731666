//! `stream: true`: the answer as Server-Sent Events, as the OpenAI API sends them and its
//! clients read them. The engine sends each streaming job its new tokens at every decode step
//! (`engine::relay`); here they become text deltas: the text decoded so far, less what was
//! sent, holding back a tail that may still turn into a stop string or is an unfinished UTF-8
//! character. The last event of each choice carries the rest of the text as the non-streaming
//! answer has it (cut at the stop string) and the finish reason; `stream_options.include_usage`
//! adds an event with the usage and no choices; `data: [DONE]` ends the stream. A client that
//! disconnects drops the stream, which the engine sees (the request is no longer generated).

use super::answer::{Answer, cut, finish, queue};
use super::api::{ApiError, Params, StreamOptions, Usage};
use super::state::{AppState, now};
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use ember_llm::Tokenizer;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Chat (`chat.completion.chunk`, text in `delta.content`) or text completion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

/// What a streamed request asked for.
pub(crate) struct Ask {
    /// The route's kind.
    pub kind: Kind,
    /// The model name.
    pub model: String,
    /// Prompts (token ids), the sampling settings and the new-token budget.
    pub job: (Vec<Vec<u32>>, Params, usize),
    /// Stop strings.
    pub stops: Vec<String>,
    /// `stream_options.include_usage`.
    pub usage: bool,
}

impl Ask {
    /// A stream of `kind` for `model` with the request's `stream_options`.
    pub(crate) fn new(
        kind: Kind,
        model: &str,
        job: (Vec<Vec<u32>>, Params, usize),
        stops: Vec<String>,
        options: Option<&StreamOptions>,
    ) -> Self {
        Self {
            kind,
            model: model.to_string(),
            job,
            stops,
            usage: options.is_some_and(|o| o.include_usage),
        }
    }
}

/// Queues the request and answers with its event stream (errors before the queue, such as a
/// full queue, are ordinary JSON errors).
pub(crate) fn respond(st: &Arc<AppState>, ask: Ask) -> Result<Response, ApiError> {
    if !st.served().contains(&ask.model) {
        return Err(ApiError::no_model(&ask.model, &st.served()));
    }
    let (tx, deltas) = mpsc::unbounded_channel();
    let prompt_tokens = ask.job.0.iter().map(Vec::len).sum();
    let choices = ask.job.0.len() * ask.job.1.n;
    let (prefix, object) = match ask.kind {
        Kind::Chat => ("chatcmpl", "chat.completion.chunk"),
        Kind::Text => ("cmpl", "text_completion"),
    };
    let (prompts, params, max_tokens) = ask.job;
    let answer = queue(st, &ask.model, prompts, params, max_tokens, Some(tx))?;
    let state = Events {
        tok: st.tok.clone(),
        head: json!({"id": st.next_id(prefix), "object": object, "created": now(),
                     "model": ask.model}),
        kind: ask.kind,
        stops: ask.stops,
        usage: ask.usage,
        deltas,
        answer: Some(answer),
        tokens: vec![Vec::new(); choices],
        sent: vec![0; choices],
        prompt_tokens,
        phase: Phase::Start,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        let bytes = s.next().await?;
        Some((Ok::<Bytes, Infallible>(bytes), s))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Start,
    Deltas,
    Finish,
    Done,
    End,
}

/// The state of one event stream.
struct Events {
    tok: Arc<Tokenizer>,
    head: Value,
    kind: Kind,
    stops: Vec<String>,
    usage: bool,
    deltas: mpsc::UnboundedReceiver<Vec<(usize, Vec<u32>)>>,
    answer: Option<Answer>,
    tokens: Vec<Vec<u32>>,
    /// Bytes of each choice's text already sent.
    sent: Vec<usize>,
    prompt_tokens: usize,
    phase: Phase,
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl Events {
    /// The next event(s), or `None` after `[DONE]`.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            match self.phase {
                Phase::Start => {
                    self.phase = Phase::Deltas;
                    if self.kind == Kind::Chat {
                        let parts = (0..self.tokens.len())
                            .map(|i| (i, json!({"role": "assistant", "content": ""}), None))
                            .collect();
                        return Some(self.chunk(parts));
                    }
                }
                Phase::Deltas => match self.deltas.recv().await {
                    Some(d) => {
                        if let Some(b) = self.deltas_event(d) {
                            return Some(b);
                        }
                    }
                    // The job is done (the engine dropped it): its answer is ready.
                    None => self.phase = Phase::Finish,
                },
                Phase::Finish => {
                    self.phase = Phase::Done;
                    return Some(self.finish_events().await);
                }
                Phase::Done => {
                    self.phase = Phase::End;
                    return Some(Bytes::from_static(b"data: [DONE]\n\n"));
                }
                Phase::End => return None,
            }
        }
    }

    /// One chunk: the head, the given choices (index, delta or text, finish reason) and, with
    /// `include_usage`, `usage: null`.
    fn chunk(&self, parts: Vec<(usize, Value, Option<&str>)>) -> Bytes {
        let choices: Vec<Value> = parts
            .into_iter()
            .map(|(i, d, f)| match self.kind {
                Kind::Chat => json!({"index": i, "delta": d, "logprobs": null, "finish_reason": f}),
                Kind::Text => json!({"index": i, "text": d, "logprobs": null, "finish_reason": f}),
            })
            .collect();
        let mut v = self.head.clone();
        v["choices"] = json!(choices);
        if self.usage {
            v["usage"] = Value::Null;
        }
        event(&v)
    }

    fn delta(&self, text: &str) -> Value {
        match self.kind {
            Kind::Chat => json!({"content": text}),
            Kind::Text => json!(text),
        }
    }

    /// The text each choice may send now, as one chunk (`None` when nothing is new).
    fn deltas_event(&mut self, d: Vec<(usize, Vec<u32>)>) -> Option<Bytes> {
        let mut parts = Vec::new();
        for (c, toks) in d {
            let Some(mine) = self.tokens.get_mut(c) else {
                continue;
            };
            mine.extend(toks);
            let text = self.tok.decode(mine, true).unwrap_or_default();
            let end = safe_end(&text, &self.stops);
            if end > self.sent[c] {
                let piece = text[self.sent[c]..end].to_string();
                self.sent[c] = end;
                parts.push((c, self.delta(&piece), None));
            }
        }
        (!parts.is_empty()).then(|| self.chunk(parts))
    }

    /// The last chunk of every choice (the rest of its text, its finish reason) and the usage
    /// event; an error event if generation failed.
    async fn finish_events(&mut self) -> Bytes {
        let answer = match self.answer.take() {
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| Err(super::state::shutting_down())),
            None => Err(super::state::shutting_down()),
        };
        let choices = match answer {
            Ok(c) => c,
            Err(e) => return event(&json!({"error": e.body()})),
        };
        let mut parts = Vec::new();
        let mut completion_tokens = 0;
        for (i, c) in choices.iter().enumerate() {
            let (text, keep, stopped) = match cut(&self.tok, c, &self.stops) {
                Ok(t) => t,
                Err(e) => return event(&json!({"error": e.body()})),
            };
            completion_tokens += keep;
            let at = self.sent.get(i).copied().unwrap_or(0);
            let rest = text.get(at..).unwrap_or_default();
            parts.push((
                i,
                self.delta(rest),
                Some(finish(c.eos && !stopped, stopped)),
            ));
        }
        let mut out = self.chunk(parts).to_vec();
        if self.usage {
            let mut v = self.head.clone();
            v["choices"] = json!([]);
            v["usage"] = json!(Usage::of(self.prompt_tokens, completion_tokens));
            out.extend_from_slice(&event(&v));
        }
        Bytes::from(out)
    }
}

/// How much of `text` can be sent: all but a tail that is the start of a stop string (or up to
/// the first stop string), and never an unfinished character (decoded as U+FFFD).
pub(crate) fn safe_end(text: &str, stops: &[String]) -> usize {
    if let Some(at) = stops.iter().filter_map(|s| text.find(s.as_str())).min() {
        return at;
    }
    let mut end = text.trim_end_matches('\u{FFFD}').len();
    for s in stops {
        // The longest proper prefix of `s` that `text[..end]` ends with.
        let held = (1..s.len())
            .rev()
            .filter(|&k| s.is_char_boundary(k))
            .find(|&k| text[..end].ends_with(&s[..k]));
        if let Some(k) = held {
            end = end.min(text[..end].len() - k);
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::safe_end;

    #[test]
    fn held_back_tails() {
        let stops = vec!["\n\nUser:".to_string()];
        assert_eq!(safe_end("42 is it", &stops), 8);
        // A tail that may become the stop string waits.
        assert_eq!(safe_end("42\n\nUs", &stops), 2);
        // The stop string cuts.
        assert_eq!(safe_end("42\n\nUser: more", &stops), 2);
        // An unfinished character waits.
        assert_eq!(safe_end("caf\u{FFFD}", &[]), 3);
        assert_eq!(safe_end("", &stops), 0);
    }
}
