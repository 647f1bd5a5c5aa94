//! Connections of the control API: accepting, capping and timing them out,
//! so that no client (slow, idle, or many at once) can hold the host's
//! sockets or tasks for long.
//!
//! Owns the accept loop, the connection cap, hyper's header read timeout
//! (which also closes idle keep-alive connections) and the graceful drain on
//! shutdown. It must not know routes or tokens: requests go to the router it
//! is given; request-level limits (body size, request time) are the
//! router's layers (`server`).

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// How long a client may take to send a request's headers, from the moment
/// its connection opens or its previous response was sent. Also the idle
/// timeout of a keep-alive connection. Clients reuse connections for less
/// than this (the CLI's client: `client::POOL_IDLE`).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long in-flight requests may finish after shutdown before their
/// connections are dropped.
const DRAIN_ON_SHUTDOWN: Duration = Duration::from_secs(5);

/// Accept errors (say, out of file descriptors) are logged at most this
/// often; the loop pauses briefly after each so it does not spin.
const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(5);
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` until `shutdown`, with at most
/// `max_connections` open connections: one over the cap is closed at once
/// (the client sees a reset and may retry), so a flood of connections never
/// grows the host's memory or descriptors beyond the cap.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    max_connections: usize,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let graceful = GracefulShutdown::new();
    let mut warned = Warned::default();
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warned.once_in_a_while(|| tracing::warn!("control API: accepting a connection: {e}"));
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            warned.once_in_a_while(|| {
                tracing::warn!(
                    max_connections,
                    "control API: connection limit reached (control.max_connections); closing new connections"
                )
            });
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .keep_alive(true);
        let connection =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // Errors here are a client's (reset, timed out): nothing to do.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN_ON_SHUTDOWN) => {
            tracing::warn!("control API: requests still running {DRAIN_ON_SHUTDOWN:?} after shutdown; dropped");
        }
    }
}

/// Rate limit for a warning that a flood could otherwise repeat per event.
#[derive(Default)]
struct Warned {
    last: Option<Instant>,
}

impl Warned {
    fn once_in_a_while(&mut self, log: impl FnOnce()) {
        if self
            .last
            .is_none_or(|t| t.elapsed() >= ACCEPT_ERROR_LOG_EVERY)
        {
            self.last = Some(Instant::now());
            log();
        }
    }
}
