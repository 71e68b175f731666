//! The HTTP layer every server of Ember shares (`ember serve`, `ember gym serve`): one set of
//! flags ([`HttpLimits`]), the same layers (the key, each client's share, the body's bounds)
//! and the same accept loop and signals. The accept loop serves each connection by hyper's
//! HTTP/1 builder with a timer, so that a client that sends its request head too slowly (or
//! idles on a kept-alive connection) is cut after `--header-read-timeout`, and at most
//! `--max-connections` are open at once (the rest wait in the kernel's backlog, holding no file
//! descriptor of ours). `axum::serve` sets no timer, which leaves hyper's 30 s header timeout
//! inert: slow clients could hold every descriptor. The first SIGINT or SIGTERM stops
//! accepting and lets the requests taken finish; a second exits at once.

use super::access::{Access, authorize};
use super::body::{BodyLimits, bounded_body};
use super::fair::{Clients, per_client};
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

/// The HTTP bounds and key every server of Ember shares (`ember serve`, `ember gym serve`):
/// the same flags, checked once, applied by the same layers and the same accept loop.
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
    /// Requests one client (an IP address) may have in flight at once; more get 429, so that
    /// one client cannot fill the queue the others wait in.
    #[arg(long, default_value_t = 64)]
    pub max_requests_per_client: usize,
    /// The key every request but `/health` must send as `Authorization: Bearer <key>`
    /// (default: the variable --api-key-env names, else EMBER_API_KEY, which keep it out of
    /// `ps`; none: no key is asked for).
    #[arg(long, conflicts_with = "api_key_env")]
    pub api_key: Option<String>,
    /// An environment variable holding the API key.
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
}

impl HttpLimits {
    /// The flags' values, checked.
    ///
    /// # Errors
    /// A size or count of 0, a timeout outside 1..=86400 s, more connections than tokio can
    /// count.
    pub fn check(&self) -> Result<()> {
        if self.max_body_bytes == 0 || self.max_connections == 0 {
            bail!("--max-body-bytes and --max-connections must be >= 1");
        }
        if self.max_requests_per_client == 0 {
            bail!("--max-requests-per-client must be >= 1");
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

    /// The API key: `--api-key`, else the variable `--api-key-env` names (which must be set),
    /// else `EMBER_API_KEY` when it is set and not empty.
    ///
    /// # Errors
    /// `--api-key-env` names a variable that is not set.
    pub fn api_key(&self) -> Result<Option<String>> {
        if let Some(k) = &self.api_key {
            return Ok(Some(k.clone()));
        }
        if let Some(var) = &self.api_key_env {
            return match std::env::var(var) {
                Ok(k) => Ok(Some(k)),
                Err(_) => bail!("--api-key-env: ${var} is not set"),
            };
        }
        Ok(std::env::var("EMBER_API_KEY")
            .ok()
            .filter(|k| !k.is_empty()))
    }

    /// `router` behind the layers every server shares, outermost first: `access` (the key, 401,
    /// before anything is read), the client's share (429), and the body read within its bounds
    /// before any handler (413 past the size, 408 past the time, the connection closed).
    pub fn guard<S: Clone + Send + Sync + 'static>(
        &self,
        router: axum::Router<S>,
        access: Arc<Access>,
    ) -> axum::Router<S> {
        let body = BodyLimits {
            max_bytes: self.max_body_bytes,
            read_timeout: Duration::from_secs(self.body_read_timeout),
        };
        let clients = Arc::new(Clients::new(self.max_requests_per_client));
        router
            .layer(DefaultBodyLimit::max(body.max_bytes))
            .layer(axum::middleware::from_fn_with_state(body, bounded_body))
            .layer(axum::middleware::from_fn_with_state(clients, per_client))
            .layer(axum::middleware::from_fn_with_state(access, authorize))
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

/// Waits for the first SIGINT or SIGTERM, says that `server` is shutting down, and from then
/// on a second one exits at once (128 + its number).
pub async fn first_signal(server: &'static str) {
    shutdown_signal().await;
    eprintln!(
        "{server}: shutting down; answering the requests already taken (a second signal exits \
         at once)"
    );
    exit_on_second_signal(server);
}

/// From the first signal on, a second SIGINT or SIGTERM exits at once (128 + its number), in
/// every phase of the shutdown: a thread of its own, since the HTTP runtime ends before the
/// engine has answered the work it took.
fn exit_on_second_signal(server: &'static str) {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGINT, SIGTERM};
        match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(mut signals) => {
                let spawned = std::thread::Builder::new()
                    .name("ember-second-signal".into())
                    .spawn(move || {
                        if let Some(sig) = signals.forever().next() {
                            eprintln!("{server}: second signal, exiting now");
                            std::process::exit(128 + sig);
                        }
                    });
                if let Err(e) = spawned {
                    log::warn!("no thread for a second signal ({e}): it will not exit at once");
                }
            }
            Err(e) => log::warn!("a second signal will not exit at once: {e}"),
        }
    }
    #[cfg(not(unix))]
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(shutdown_signal());
            std::process::exit(130);
        }
    });
}

/// The first SIGINT or SIGTERM (Ctrl-C elsewhere).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
