//! `ember gym serve`: evaluations over HTTP. `POST /v1/evaluate` takes an
//! [`EvaluateRequest`] and answers the gym's report (400 for an unknown task or a setting past
//! the server's bounds, 503 when the gym itself fails); `GET /v1/tasks` lists the suite;
//! `GET /health` answers `ok`. At most `--workers` evaluations run at once (the rest wait), each
//! in processes of its own. The HTTP layer is `ember serve`'s, with the same flags
//! (`HttpLimits`): 413 past `--max-body-bytes`, 408 past `--body-read-timeout`, 429 past
//! `--max-requests-per-client`, 401 without the key of `--api-key`, `--api-key-env` or
//! `EMBER_API_KEY` on every route but `/health`; the first SIGINT or SIGTERM stops accepting and
//! lets the evaluations taken finish, a second exits at once.

use crate::access::{Access, AccessArgs};
use crate::listen;
use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ember_gym::{EvalConfig, EvaluateRequest};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The server's settings.
#[derive(Debug, Clone)]
pub struct GymServer {
    /// `host:port` to listen on.
    pub listen: String,
    /// Evaluations at once.
    pub workers: usize,
    /// The largest CPU limit a request may ask for.
    pub max_cpu_s: u64,
    /// Body, header, connection and per-client bounds and the key.
    pub http: listen::HttpLimits,
}

struct Shared {
    permits: Arc<Semaphore>,
    max_cpu_s: u64,
}

/// Serves until the first signal.
pub fn serve(s: &GymServer) -> Result<()> {
    s.http.check()?;
    let access = Access::new(AccessArgs {
        api_key: s.http.api_key()?,
        enable_admin: false,
        admin_key: None,
        allowed_paths: &[],
    })?;
    let host = s.listen.rsplit_once(':').map_or(&s.listen[..], |(h, _)| h);
    if let Some(w) = access.open_warning(host.trim_matches(['[', ']'])) {
        eprintln!("ember gym serve: {w}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let shared = Arc::new(Shared {
        permits: Arc::new(Semaphore::new(s.workers.max(1))),
        max_cpu_s: s.max_cpu_s,
    });
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&s.listen)
            .await
            .with_context(|| format!("listening on {}", s.listen))?;
        // Printed on stdout, flushed, as `ember serve` does: scripts and tests wait for it.
        println!(
            "ember gym serve: listening on http://{}",
            listener.local_addr()?
        );
        std::io::Write::flush(&mut std::io::stdout()).ok();
        let stop = listen::first_signal("ember gym serve");
        let app = s.http.guard(router(shared), Arc::new(access));
        listen::serve(listener, app, s.http.connections(), stop).await
    })
}

/// The routes.
fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/tasks", get(tasks))
        .route("/v1/evaluate", post(evaluate))
        .with_state(shared)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": { "message": message.into() } });
    (status, Json(body)).into_response()
}

async fn tasks() -> Response {
    let names: Vec<&str> = ember_gym::suite().iter().map(|t| t.name).collect();
    Json(serde_json::json!({ "tasks": names })).into_response()
}

async fn evaluate(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<EvaluateRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(r)) => r,
        Err(e) => return error(e.status(), e.body_text()),
    };
    let Some(task) = ember_gym::task(&req.task) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("no kernel task named {:?}", req.task),
        );
    };
    if req.hidden_shapes > 16 || !(1..=shared.max_cpu_s).contains(&req.cpu_s) {
        let max = shared.max_cpu_s;
        return error(
            StatusCode::BAD_REQUEST,
            format!("hidden_shapes must be at most 16 and cpu_s within 1..={max}"),
        );
    }
    // The permit travels with the evaluation: a client that hangs up does not free it early.
    let Ok(permit) = shared.permits.clone().acquire_owned().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping");
    };
    let mut cfg = EvalConfig {
        hidden_shapes: req.hidden_shapes,
        ..EvalConfig::default()
    };
    cfg.run.cpu_s = req.cpu_s;
    cfg.run.wall_s = 2.0 * req.cpu_s as f64 + 5.0;
    let run = tokio::task::spawn_blocking(move || {
        let report = ember_gym::evaluate(task, &req.code, req.seed, &cfg);
        drop(permit);
        report
    });
    match run.await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the evaluation failed: {e}"),
        ),
    }
}
