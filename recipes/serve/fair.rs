//! One client cannot fill the queue the others wait in: at most `--max-requests-per-client`
//! requests of one client (its IP address) are in flight at once, counted from the request's
//! head to its answer (a stream, to its last event); past that the client gets 429 naming the
//! flag while the others are still taken. Behind a proxy every client shares its address.

use super::api::ApiError;
use super::metrics::until_answered;
use super::state::AppState;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// A request of `ip` in flight; it stops counting when dropped.
struct Slot {
    st: Arc<AppState>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.st.clients.lock()
            && let Some(n) = m.get_mut(&self.ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Takes a slot of `ip`'s, or None when it already holds `--max-requests-per-client`.
fn enter(st: &Arc<AppState>, ip: IpAddr) -> Option<Slot> {
    let mut m = st.clients.lock().ok()?;
    let n = m.entry(ip).or_insert(0);
    if *n >= st.max_per_client {
        return None;
    }
    *n += 1;
    Some(Slot { st: st.clone(), ip })
}

/// Admits a request within its client's share (every route but `/health` and `/metrics`).
pub async fn per_client(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let (Some(ip), false) = (peer, matches!(req.uri().path(), "/health" | "/metrics")) else {
        return next.run(req).await;
    };
    let Some(slot) = enter(&st, ip) else {
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "this client already has {} requests in flight (--max-requests-per-client)",
                st.max_per_client
            ),
        )
        .into_response();
    };
    let response = next.run(req).await;
    until_answered(response, slot)
}
