//! `/metrics` in the Prometheus text format, as vLLM and SGLang expose theirs: the requests in
//! flight, those waiting for the engine, the age of the oldest, and the answers by status
//! class. A request counts from its head to its answer (a stream, to its last event); one
//! whose client has gone stops counting then.

use super::state::{AppState, Load};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A request in flight; it stops counting when dropped.
struct InFlight {
    load: Arc<AppState>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut m) = self.load.load.inflight.lock() {
            m.remove(&self.id);
        }
    }
}

/// Counts a request from now until the guard drops.
fn begin(st: &Arc<AppState>) -> InFlight {
    let id = st.load.next.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut m) = st.load.inflight.lock() {
        m.insert(id, Instant::now());
    }
    InFlight {
        load: st.clone(),
        id,
    }
}

/// Counts an answer by its status class.
fn answered(load: &Load, status: u16) {
    let class = usize::from(status / 100).clamp(1, 5) - 1;
    load.answered[class].fetch_add(1, Ordering::Relaxed);
}

/// Counts every request but `/health` and `/metrics` while it is answered.
pub async fn track(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if matches!(req.uri().path(), "/health" | "/metrics") {
        return next.run(req).await;
    }
    let guard = begin(&st);
    let response = next.run(req).await;
    answered(&st.load, response.status().as_u16());
    until_answered(response, guard)
}

/// `response`, with `guard` dropped once it is answered: at once, or for a stream after its last
/// event (or when its client goes).
pub(crate) fn until_answered<G: Send + Sync + 'static>(response: Response, guard: G) -> Response {
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        return response;
    }
    let (parts, body) = response.into_parts();
    let events = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(events))
}

/// `GET /metrics`.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let (inflight, oldest) = match st.load.inflight.lock() {
        Ok(m) => (
            m.len(),
            m.values()
                .map(|t| t.elapsed().as_secs_f64())
                .fold(0.0, f64::max),
        ),
        Err(_) => (0, 0.0),
    };
    let waiting = st.waiting();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    };
    gauge(
        "ember_requests_in_flight",
        "Requests taken and not yet answered (waiting or running).",
        inflight as f64,
    );
    gauge(
        "ember_requests_waiting",
        "Requests queued for the engine (at most --max-queue).",
        waiting as f64,
    );
    gauge(
        "ember_requests_running",
        "Requests in flight and not waiting: being answered, parsed or streamed.",
        inflight.saturating_sub(waiting) as f64,
    );
    gauge(
        "ember_oldest_request_age_seconds",
        "Seconds since the oldest request in flight arrived (0 when none is).",
        oldest,
    );
    let _ = writeln!(
        out,
        "# HELP ember_requests_total Requests answered, by status class.\n\
         # TYPE ember_requests_total counter"
    );
    for (i, n) in st.load.answered.iter().enumerate() {
        let n = n.load(Ordering::Relaxed);
        let _ = writeln!(out, "ember_requests_total{{code=\"{}xx\"}} {n}", i + 1);
    }
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
