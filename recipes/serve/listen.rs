//! The accept loop: each connection served by hyper's HTTP/1 builder with a timer, so that a
//! client that sends its request head too slowly (or idles on a kept-alive connection) is cut
//! after `--header-read-timeout`, and at most `--max-connections` are open at once (the rest wait
//! in the kernel's backlog, holding no file descriptor of ours). `axum::serve` sets no timer,
//! which leaves hyper's 30 s header timeout inert: slow clients could hold every descriptor.

use super::body::{BodyLimits, bounded_body};
use anyhow::{Result, bail};
use axum::extract::DefaultBodyLimit;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The HTTP bounds every server of Ember shares (`ember serve`, `ember gym serve`): the same
/// flags, checked once, applied by the same layers and the same accept loop.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpLimits {
    /// Largest request body in bytes; larger gets 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a client may take to send a request's head (and may idle between requests on a
    /// kept-alive connection) before its connection is closed.
    #[arg(long, default_value_t = 30)]
    pub header_read_timeout: u64,
    /// Seconds a client may take to send a request's body once its head has arrived; a slower
    /// one gets 408 and its connection is closed.
    #[arg(long, default_value_t = 30)]
    pub body_read_timeout: u64,
    /// Connections served at once; more wait in the kernel's backlog until one closes.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
}

impl HttpLimits {
    /// The flags' values, checked.
    ///
    /// # Errors
    /// A size of 0, a timeout outside 1..=86400 s, more connections than tokio can count.
    pub fn check(&self) -> Result<()> {
        if self.max_body_bytes == 0 || self.max_connections == 0 {
            bail!("--max-body-bytes and --max-connections must be >= 1");
        }
        for (flag, s) in [
            ("--header-read-timeout", self.header_read_timeout),
            ("--body-read-timeout", self.body_read_timeout),
        ] {
            if !(1..=86_400).contains(&s) {
                bail!("{flag} {s} must be in 1..=86400 seconds");
            }
        }
        // tokio's semaphore holds at most usize::MAX >> 3 permits.
        if self.max_connections > Semaphore::MAX_PERMITS {
            bail!("--max-connections {} is too large", self.max_connections);
        }
        Ok(())
    }

    /// `router` with every request's body read within the bounds before any handler (413 past
    /// the size, 408 past the time, the connection closed).
    pub fn guard<S: Clone + Send + Sync + 'static>(
        &self,
        router: axum::Router<S>,
    ) -> axum::Router<S> {
        let body = BodyLimits {
            max_bytes: self.max_body_bytes,
            read_timeout: Duration::from_secs(self.body_read_timeout),
        };
        router
            .layer(DefaultBodyLimit::max(body.max_bytes))
            .layer(axum::middleware::from_fn_with_state(body, bounded_body))
    }

    /// The accept loop's bounds.
    pub fn connections(&self) -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout),
            max_connections: self.max_connections,
        }
    }
}

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
