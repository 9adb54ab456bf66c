//! `serve`'s API listener: hyper 1's HTTP/1.1 server on a tokio runtime
//! that [`Listener`] owns, for the listener alone.
//!
//! A request's way through it, in order:
//! 1. a slot among [`MAX_WAITING_REQUESTS`], else 503;
//! 2. the [`Gate`] on its head, before a byte of its body is read (401,
//!    403, and 413 for a declared `Content-Length` over the limit);
//! 3. its body, read within `api.max_body_bytes` (413 for a chunked body,
//!    cut at the limit) and [`BODY_READ_TIMEOUT`] (408);
//! 4. routed ([`api::route`](crate::api::route)) and handed to the worker
//!    ([`Ask`]) as one [`Envelope`]; the request's task awaits the reply
//!    on a one-shot channel, so a turn that takes minutes holds a slot,
//!    never a runtime thread;
//! 5. answered as JSON, or as server-sent events while the turn runs
//!    ([`crate::api::stream`]).
//!
//! An answer sent before the body was read whole (every refusal above)
//! says `Connection: close`, and the connection closes after it: what the
//! client sends next — the rest of a refused body — is not a request.
//!
//! Invariant: the runtime runs this listener and nothing else. It never
//! touches the system — the worker thread does, unchanged, and a request
//! reaches it only as an [`Envelope`] — and nothing on it blocks: sending
//! to the worker is a non-blocking channel send and every wait is an
//! `.await`. After [`Listener::shutdown`] (or `drop`) returns, nothing is
//! accepted any more, every connection has finished the response in hand
//! or was cut at the grace deadline, and the runtime's threads are gone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Body as _, Incoming};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::{json, Value};
use tokio::sync::{oneshot, Semaphore};

use crate::access::{self, Gate};
use crate::api::{self, Refused};
use crate::ops::{OpError, Request};
use crate::progress::Progress;
use crate::server::Recorded;

/// Requests waiting for their answer at once (a streamed turn's until its
/// answer is in); more are answered 503 at once.
pub const MAX_WAITING_REQUESTS: usize = 64;

/// Open connections at once; past it the accept loop waits (the kernel's
/// backlog holds the next ones) until one closes.
pub const MAX_CONNECTIONS: usize = 256;

/// A request's head must arrive within this (hyper's own timer; a client
/// that opens a connection and sends nothing is dropped). It also closes
/// a keep-alive connection idle that long: longer than our own client
/// keeps one in its pool (ureq's 15 s), so the CLI and the soak never
/// reuse a connection the server has closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A request's body must arrive within this once its head has (408).
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`Listener`]'s `drop` lets open connections finish.
pub const DROP_GRACE: Duration = Duration::from_secs(5);

/// The runtime's threads: the listener parses, checks and serializes;
/// the work is on the worker thread. Two, on a 2-core machine, so that a
/// large JSON answer being written stalls no other request.
const RUNTIME_THREADS: usize = 2;

/// After a failed `accept` (out of file descriptors, say), the loop waits
/// this long before the next, rather than spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How long the runtime's shutdown waits for a task to reach an `.await`
/// once everything was cancelled (nothing here blocks, so it is quick).
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("{addr} is not a loopback address; set api.allow_non_loopback = true (and api.token_env) to expose the API")]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the API's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Which addresses the listener may bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// 127.0.0.1 or ::1 only (the default).
    Loopback,
    /// Any: the config says `api.allow_non_loopback = true`.
    Any,
}

/// The worker's answer to one request.
pub type Reply = Result<Value, OpError>;

/// One request on its way to the worker, with where its reply goes.
#[derive(Debug)]
pub struct Envelope {
    pub request: Request,
    /// A one-shot sender: the worker thread sends without a runtime, the
    /// request's task awaits without blocking one. Dropped unanswered, the
    /// client gets a 503 saying the outcome is unknown.
    pub reply: oneshot::Sender<Reply>,
}

/// The worker has stopped: nothing takes requests any more.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the worker has stopped")]
pub struct WorkerGone;

/// How the listener hands a request to the worker (the daemon's channel
/// to its worker thread; a fake in tests). Must not block.
pub type Ask = Arc<dyn Fn(Envelope) -> Result<(), WorkerGone> + Send + Sync>;

/// A response body: a JSON answer, or a streamed turn's events.
pub type Body = BoxBody<Bytes, BodyError>;

/// Why a response body broke off; hyper then cuts the connection, so the
/// client sees a body that never ended, never a complete one.
#[derive(Debug, Clone, Copy, thiserror::Error)]
pub enum BodyError {
    #[error("the turn's stream ended before its `end` event (its answer was lost: the daemon stopped)")]
    Unended,
}

/// What every request's task shares.
pub(crate) struct Handler {
    gate: Gate,
    progress: Arc<Progress>,
    ask: Ask,
    waiting: Arc<Semaphore>,
}

impl Handler {
    pub(crate) fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// Route `recorded` to the worker and wait for its answer.
    pub(crate) async fn answer(&self, recorded: &Recorded) -> (u16, Value) {
        let request = match api::route(&recorded.method, &recorded.path, &recorded.body) {
            Ok(request) => request,
            Err(refused) => return (refused.status, json!({"error": refused.message})),
        };
        let (reply, replied) = oneshot::channel();
        if (self.ask)(Envelope { request, reply }).is_err() {
            return (503, json!({"error": "the daemon is shutting down"}));
        }
        match replied.await {
            Ok(Ok(value)) => (200, value),
            Ok(Err(e)) => (e.http_status(), e.body()),
            Err(_) => (
                503,
                json!({"error": "the daemon stopped before answering; the outcome is unknown (check /status after a restart)"}),
            ),
        }
    }
}

/// A bound socket, not yet serving: its address (port 0 resolved) is
/// known, which the [`Gate`] needs before the first request.
#[derive(Debug)]
pub struct Bound {
    socket: std::net::TcpListener,
    addr: SocketAddr,
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Start the runtime and serve: every request passes `gate`, then goes
    /// to `ask`; streamed turns watch `progress`.
    pub fn serve(self, gate: Gate, progress: Arc<Progress>, ask: Ask) -> Result<Listener, ListenError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("api")
            .enable_io()
            .enable_time()
            .build()
            .map_err(ListenError::Runtime)?;
        let socket = {
            // `from_std` registers the socket with this runtime's reactor.
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(self.socket).map_err(|source| ListenError::Bind {
                addr: self.addr,
                source,
            })?
        };
        let handler = Arc::new(Handler {
            gate,
            progress,
            ask,
            waiting: Arc::new(Semaphore::new(MAX_WAITING_REQUESTS)),
        });
        let (stop, stopped) = oneshot::channel();
        let served = runtime.spawn(accept_loop(socket, handler, stopped));
        tracing::info!(addr = %self.addr, "API listening");
        Ok(Listener {
            addr: self.addr,
            runtime: Some(runtime),
            stop: Some(stop),
            served: Some(served),
        })
    }
}

/// The API's listener, serving; [`Listener::shutdown`] or `drop` stops it.
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    /// `None` once shut down.
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl Listener {
    /// Bind `listen` (port 0 picks a free one), on loopback unless
    /// `exposure` says otherwise.
    pub fn bind(listen: SocketAddr, exposure: Exposure) -> Result<Bound, ListenError> {
        if exposure == Exposure::Loopback && !listen.ip().is_loopback() {
            return Err(ListenError::NotLoopback { addr: listen });
        }
        let bind_err = |source| ListenError::Bind { addr: listen, source };
        let socket = std::net::TcpListener::bind(listen).map_err(bind_err)?;
        // tokio's listener requires it.
        socket.set_nonblocking(true).map_err(bind_err)?;
        let addr = socket.local_addr().map_err(bind_err)?;
        Ok(Bound { socket, addr })
    }

    /// The bound address (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting (a new client is refused by the kernel from here),
    /// let every open connection finish the response in hand for at most
    /// `grace` (idle ones close at once), then cut what is left and stop
    /// the runtime. Call it from a thread outside the runtime.
    pub fn shutdown(mut self, grace: Duration) {
        self.close(grace);
    }

    fn close(&mut self, grace: Duration) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if let Some(stop) = self.stop.take() {
            // The loop may be gone already (it panicked): nothing to stop.
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            // The timer is created inside: it needs the runtime's context.
            match runtime.block_on(async { tokio::time::timeout(grace, served).await }) {
                Ok(Ok(())) => tracing::info!(addr = %self.addr, "API closed"),
                Ok(Err(e)) => tracing::error!(addr = %self.addr, error = %e, "the API's accept loop failed"),
                Err(_) => tracing::warn!(
                    addr = %self.addr,
                    grace_ms = grace.as_millis(),
                    "API connections still open after the grace period; cut"
                ),
            }
        }
        runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close(DROP_GRACE);
    }
}

/// Accept connections until `stopped` fires (or its sender is dropped),
/// each served on a task of its own; then stop accepting and wait for the
/// open connections to finish (the caller bounds the wait).
async fn accept_loop(
    socket: tokio::net::TcpListener,
    handler: Arc<Handler>,
    mut stopped: oneshot::Receiver<()>,
) {
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        let slot = tokio::select! {
            _ = &mut stopped => break,
            slot = Arc::clone(&connections).acquire_owned() => slot,
        };
        // The semaphore is never closed; if it were, no slot is no accept.
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            _ = &mut stopped => break,
            accepted = socket.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "API accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Small answers, and one event per write in a stream: each goes
        // out at once rather than waiting for Nagle's timer.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let handler = Arc::clone(&handler);
        let service = hyper::service::service_fn(move |request| {
            let handler = Arc::clone(&handler);
            async move { Ok::<_, std::convert::Infallible>(handle(&handler, request).await) }
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                // A client that went away, or hyper's own refusal of a
                // malformed request: the client's business, not ours.
                tracing::debug!(%peer, error = %e, "API connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(socket);
    graceful.shutdown().await;
}

/// One request, in the order of the module doc.
async fn handle(handler: &Arc<Handler>, request: hyper::Request<Incoming>) -> Response<Body> {
    let Ok(slot) = Arc::clone(&handler.waiting).try_acquire_owned() else {
        return refusal(Refused {
            status: 503,
            message: "too many requests in progress; try again".into(),
        });
    };
    let (parts, body) = request.into_parts();
    let mut recorded = head(&parts);
    // hyper's own reading of the framing: a `Content-Length` is exact; a
    // chunked body (or none on a request that may not have one) is not.
    let declared = body
        .size_hint()
        .exact()
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if let Err(refused) = handler.gate.check(&recorded.method, &recorded.headers, declared) {
        tracing::info!(
            status = refused.status,
            method = recorded.method,
            path = recorded.path,
            "API request refused"
        );
        return refusal(refused);
    }
    recorded.body = match read_body(body, handler.gate.max_body_bytes()).await {
        Ok(text) => text,
        Err(refused) => return refusal(refused),
    };
    if let Some(agent) = api::stream::requested(&recorded) {
        return api::stream::serve(Arc::clone(handler), recorded, &agent, slot).await;
    }
    let (status, answer) = handler.answer(&recorded).await;
    drop(slot);
    json_response(status, &answer)
}

/// A request's method, path (and query) and headers, its body to come.
fn head(parts: &hyper::http::request::Parts) -> Recorded {
    Recorded {
        method: parts.method.as_str().to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| {
                // A non-UTF-8 value can match no check: kept, lossily.
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_string(), value)
            })
            .collect(),
        body: String::new(),
    }
}

/// The whole body, within `limit` bytes and [`BODY_READ_TIMEOUT`].
async fn read_body(body: Incoming, limit: u64) -> Result<String, Refused> {
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    let collected = match tokio::time::timeout(BODY_READ_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => collected,
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(access::too_large(limit)),
        Ok(Err(e)) => {
            return Err(Refused {
                status: 400,
                message: format!("cannot read the request body: {e}"),
            })
        }
        Err(_) => {
            return Err(Refused {
                status: 408,
                message: format!(
                    "the request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            })
        }
    };
    String::from_utf8(collected.to_bytes().to_vec()).map_err(|_| Refused {
        status: 400,
        message: "the request body is not UTF-8 (send JSON)".into(),
    })
}

/// A body of `bytes`, whole.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// `status` with `body` as JSON.
pub(crate) fn json_response(status: u16, body: &Value) -> Response<Body> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status_code(status);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A refusal sent before the body was read: `{"error"}`, and the
/// connection closes after it.
fn refusal(refused: Refused) -> Response<Body> {
    let mut response = json_response(refused.status, &json!({"error": refused.message}));
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// `status` as a status code; the statuses here are all valid, but one
/// that is not is a server error, not a panic.
pub(crate) fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or_else(|_| {
        tracing::error!(status, "not an HTTP status; answering 500");
        StatusCode::INTERNAL_SERVER_ERROR
    })
}

#[cfg(test)]
mod tests;
