//! One client cannot fill the queue the others wait in: at most `--max-requests-per-client`
//! requests of one client (its IP address) are in flight at once, counted from the request's
//! head to its answer (a stream, to its last event); past that the client gets 429 naming the
//! flag while the others are still taken. Behind a proxy every client shares its address.
//! Every server of Ember takes it through `HttpLimits::guard`.

use super::api::ApiError;
use super::metrics::until_answered;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// Each client's requests in flight, and the most it may have.
#[derive(Debug)]
pub struct Clients {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl Clients {
    /// At most `max` requests of one client in flight.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a slot of `ip`'s, or None when it already holds `max`.
    fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut m = self.held.lock().ok()?;
        let n = m.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Slot {
            clients: self.clone(),
            ip,
        })
    }
}

/// A request of `ip` in flight; it stops counting when dropped.
struct Slot {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.clients.held.lock()
            && let Some(n) = m.get_mut(&self.ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Admits a request within its client's share (every route but `/health`, `/metrics` and
/// Tinker's `retrieve_future`).
pub async fn per_client(State(clients): State<Arc<Clients>>, req: Request, next: Next) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    // Tinker's `retrieve_future` long-polls without work of the engine's (bounded by the
    // connection limit): a loop with many samples out does not use up its share with polls.
    let free = matches!(
        req.uri().path(),
        "/health" | "/metrics" | "/api/v1/retrieve_future"
    );
    let (Some(ip), false) = (peer, free) else {
        return next.run(req).await;
    };
    let Some(slot) = clients.enter(ip) else {
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "this client already has {} requests in flight (--max-requests-per-client)",
                clients.max
            ),
        )
        .into_response();
    };
    let response = next.run(req).await;
    until_answered(response, slot)
}
