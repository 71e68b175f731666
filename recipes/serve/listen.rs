//! The accept loop: each connection served by hyper's HTTP/1 builder with a timer, so that a
//! client that sends its request head too slowly (or idles on a kept-alive connection) is cut
//! after `--header-read-timeout`, and at most `--max-connections` are open at once (the rest wait
//! in the kernel's backlog, holding no file descriptor of ours). `axum::serve` sets no timer,
//! which leaves hyper's 30 s header timeout inert: slow clients could hold every descriptor.

use anyhow::Result;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The bounds on connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest wait for a request's head (the whole head, also between kept-alive requests).
    pub header_read_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets each
/// connection finish the request it is answering (idle ones close) and returns.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p?,
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was taken:
                    // wait a little rather than spin, as axum::serve does.
                    log::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = stream;
        // The client's address, for the per-client share (`fair.rs`).
        let app = app
            .clone()
            .layer(axum::Extension(axum::extract::ConnectInfo(peer)));
        let service = TowerToHyperService::new(app);
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A connection's error (a reset, a header timeout) ends only that connection.
            if let Err(e) = conn.await {
                log::debug!("connection: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
