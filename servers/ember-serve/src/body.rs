//! A request's body read under two bounds before any handler sees it: its declared length (a
//! `Content-Length` past `--max-body-bytes` is answered 413 at once, before a byte of the body
//! is read) and its time (`--body-read-timeout`: a client that sends its body slowly is answered
//! 408 and its connection closed, so slow bodies cannot keep the connection slots).

use super::api::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::time::Duration;

/// The bounds on a request's body.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body in bytes (`--max-body-bytes`).
    pub max_bytes: usize,
    /// Longest time to receive the whole body once the head has arrived
    /// (`--body-read-timeout`).
    pub read_timeout: Duration,
}

/// Reads the whole body within `limits`, then runs the handler on it; 413 or 408 (with the
/// connection closed) otherwise.
pub async fn bounded_body(State(limits): State<BodyLimits>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limits.max_bytes as u64) {
        return closing(too_large(&n.to_string(), limits.max_bytes));
    }
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(limits.read_timeout, collect(body, limits.max_bytes)).await;
    match read {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => closing(e),
        Err(_) => closing(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within --body-read-timeout {} s",
                limits.read_timeout.as_secs()
            ),
        )),
    }
}

/// The body's bytes, refused once they pass `max` (a body sent without a length).
async fn collect(body: Body, max: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("reading the request body: {e}"),
            )
        })?;
        if buf.len().saturating_add(chunk.len()) > max {
            return Err(too_large("more than that", max));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.into())
}

fn too_large(size: &str, max: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("the request body ({size} bytes) is larger than --max-body-bytes {max}"),
    )
}

/// `e` with `Connection: close`: a body left unread cannot precede another request.
fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
