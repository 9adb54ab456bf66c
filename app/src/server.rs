//! The loopback HTTP server under the mock LLM and the webhook sink: one
//! thread accepting requests, stopped and joined when the handle drops.
//!
//! (`serve`'s API is not on it: see [`crate::api::listen`].)
//!
//! Invariant: it binds loopback addresses only (these servers have no
//! authentication and answer whatever they are scripted to), and after
//! `drop` returns no request is accepted any more and the accept thread
//! has exited.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest request body a test server keeps.
pub const MAX_REQUEST_BYTES: u64 = 8 * 1024 * 1024;

/// How often the accept loop checks for shutdown (bounds `drop`'s wait).
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{addr} is not a loopback address: test servers bind 127.0.0.1 or ::1 only")]
    NotLoopback { addr: SocketAddr },
    #[error("cannot listen on {addr}: {detail}")]
    Bind { addr: SocketAddr, detail: String },
    #[error("cannot start the server thread: {0}")]
    Thread(std::io::Error),
}

/// One request as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// In arrival order, names as sent.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Recorded {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Read `request`'s head and body (at most [`MAX_REQUEST_BYTES`]).
    pub fn read(request: &mut tiny_http::Request) -> Recorded {
        Self::read_limited(request, MAX_REQUEST_BYTES).unwrap_or_else(|cut| cut)
    }

    /// `request`'s method, path and headers, without touching its body.
    pub fn head(request: &tiny_http::Request) -> Recorded {
        Recorded {
            method: request.method().as_str().to_string(),
            path: request.url().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|h| (h.field.as_str().to_string(), h.value.as_str().to_string()))
                .collect(),
            body: String::new(),
        }
    }

    /// Read `request`'s head and body; `Err` with the first `limit` bytes
    /// if the body is longer than `limit`.
    pub fn read_limited(request: &mut tiny_http::Request, limit: u64) -> Result<Recorded, Recorded> {
        let mut bytes = Vec::new();
        // A body that fails mid-read is recorded as far as it got: the
        // recording is for tests to inspect, not to act on.
        if let Err(e) = request
            .as_reader()
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
        {
            tracing::debug!(error = %e, "request body read failed");
        }
        let over = bytes.len() as u64 > limit;
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let recorded = Recorded {
            body: String::from_utf8_lossy(&bytes).into_owned(),
            ..Self::head(request)
        };
        if over {
            Err(recorded)
        } else {
            Ok(recorded)
        }
    }
}

/// A running server; dropping it stops it.
pub struct LoopbackServer {
    addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

// By hand: tiny_http::Server has no Debug.
impl std::fmt::Debug for LoopbackServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl LoopbackServer {
    /// Bind `listen` (port 0 picks a free one) and call `handle` for each
    /// request on the server's thread.
    pub fn start<H>(listen: SocketAddr, name: &str, handle: H) -> Result<Self, ServerError>
    where
        H: Fn(tiny_http::Request) + Send + 'static,
    {
        if !listen.ip().is_loopback() {
            return Err(ServerError::NotLoopback { addr: listen });
        }
        let server = tiny_http::Server::http(listen).map_err(|e| ServerError::Bind {
            addr: listen,
            detail: e.to_string(),
        })?;
        let addr = server.server_addr().to_ip().ok_or_else(|| ServerError::Bind {
            addr: listen,
            detail: "bound address is not an IP address".into(),
        })?;
        let server = Arc::new(server);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("{name}-{}", addr.port()))
                .spawn(move || accept_loop(&server, &stop, handle))
                .map_err(ServerError::Thread)?
        };
        tracing::info!(%addr, name, "listening");
        Ok(LoopbackServer {
            addr,
            server,
            stop,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn accept_loop<H: Fn(tiny_http::Request)>(server: &tiny_http::Server, stop: &AtomicBool, handle: H) {
    while !stop.load(Ordering::Acquire) {
        match server.recv_timeout(POLL) {
            Ok(Some(request)) => handle(request),
            Ok(None) => {}
            Err(e) => {
                // unblock() at shutdown lands here too.
                if !stop.load(Ordering::Acquire) {
                    tracing::warn!(error = %e, "accept failed");
                }
            }
        }
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(addr = %self.addr, "server thread panicked");
            }
        }
    }
}

/// A response with a JSON body.
pub fn json_response(status: u16, body: &str) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let response = tiny_http::Response::from_string(body).with_status_code(status);
    match tiny_http::Header::from_bytes("Content-Type", "application/json") {
        Ok(h) => response.with_header(h),
        Err(()) => response,
    }
}

/// A response whose body is written piece by piece as it is produced
/// (server-sent events): HTTP/1.1 chunked transfer encoding, each piece
/// one chunk, flushed at once.
///
/// Written by hand on the connection ([`tiny_http::Request::into_writer`])
/// because tiny_http's own chunked responses buffer up to 8 KB before
/// sending, which would hold a stream's events back. The body ends only
/// with [`Chunked::finish`]: dropped without it, the client sees a body
/// that never ended (its timeout), never a complete one.
pub struct Chunked {
    writer: Box<dyn std::io::Write + Send>,
}

// By hand: the boxed writer has no Debug.
impl std::fmt::Debug for Chunked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunked").finish_non_exhaustive()
    }
}

impl Chunked {
    /// Answer `request` with `status` and `content_type`, the body to come.
    pub fn start(request: tiny_http::Request, status: u16, content_type: &str) -> std::io::Result<Chunked> {
        let reason = tiny_http::StatusCode(status).default_reason_phrase();
        let mut writer = request.into_writer();
        write!(
            writer,
            "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )?;
        writer.flush()?;
        Ok(Chunked { writer })
    }

    /// One piece of the body, sent now.
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.is_empty() {
            return Ok(()); // an empty chunk would end the body
        }
        write!(self.writer, "{:x}\r\n", bytes.len())?;
        self.writer.write_all(bytes)?;
        self.writer.write_all(b"\r\n")?;
        self.writer.flush()
    }

    /// End the body (the connection stays open for the next request).
    pub fn finish(mut self) -> std::io::Result<()> {
        self.writer.write_all(b"0\r\n\r\n")?;
        self.writer.flush()
    }
}

/// Send `response`, logging (not failing on) a client that went away.
pub fn respond<R: Read>(request: tiny_http::Request, response: tiny_http::Response<R>) {
    if let Err(e) = request.respond(response) {
        tracing::debug!(error = %e, "client went away before the response");
    }
}
