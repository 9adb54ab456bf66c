//! The one place this crate builds HTTP clients and classifies their
//! failures, so the provider, the outbox and the tools agree on what a
//! timeout is and on which failures leave the outcome unknown.
//!
//! Invariant: every client has a total timeout and a response-size limit
//! (no request can hang or grow without bound), never turns an HTTP status
//! into an error (callers see every status and decide), and talks to
//! loopback directly even when a proxy is set in the environment.

use std::io::Read;
use std::time::Duration;

use ureq::http::Response;
use ureq::Body;

/// Largest response body read from any server (a chat completion, a tool
/// reply): bigger bodies are refused rather than buffered.
pub const MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;

/// How a request failed below HTTP (no status was received).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportFailure {
    /// No complete answer within the timeout: the request may have landed.
    Timeout,
    /// Could not connect, or the connection broke mid-exchange. A reset
    /// after the request was written may still mean it landed.
    Connection(String),
    /// The request could not be made at all (bad URL, TLS misconfiguration,
    /// oversized body): retrying will not help.
    Fatal(String),
}

impl std::fmt::Display for TransportFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TransportFailure::Timeout => write!(f, "timed out"),
            TransportFailure::Connection(d) => write!(f, "connection failed: {d}"),
            TransportFailure::Fatal(d) => write!(f, "{d}"),
        }
    }
}

/// Which `ureq` errors mean what.
pub fn classify(err: &ureq::Error) -> TransportFailure {
    use std::io::ErrorKind;
    match err {
        ureq::Error::Timeout(_) => TransportFailure::Timeout,
        ureq::Error::Io(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            TransportFailure::Timeout
        }
        // The tool fence's refusal: no connection was made.
        ureq::Error::Io(e) if e.kind() == ErrorKind::PermissionDenied => {
            TransportFailure::Fatal(e.to_string())
        }
        ureq::Error::Io(e) => TransportFailure::Connection(e.to_string()),
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound | ureq::Error::Protocol(_) => {
            TransportFailure::Connection(err.to_string())
        }
        other => TransportFailure::Fatal(other.to_string()),
    }
}

/// A client with a total `timeout` per call that follows at most
/// `max_redirects` (0 for anything with a side effect: a redirected POST
/// could be replayed somewhere else).
pub fn agent(url: &str, timeout: Duration, max_redirects: u32) -> ureq::Agent {
    // A corporate HTTP_PROXY must not capture the mock servers.
    agent_via(timeout, max_redirects, !is_loopback_url(url))
}

/// [`agent`] that never goes through a proxy, whatever the environment
/// says: for the daemon's own API, whose requests carry its token (a
/// daemon listening beyond loopback is not a loopback URL, and its token
/// must not reach a proxy).
pub fn direct_agent(timeout: Duration, max_redirects: u32) -> ureq::Agent {
    agent_via(timeout, max_redirects, false)
}

fn agent_via(timeout: Duration, max_redirects: u32, proxied: bool) -> ureq::Agent {
    let builder = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .max_redirects(max_redirects)
        .user_agent(concat!("durable-agent/", env!("CARGO_PKG_VERSION")));
    let builder = if proxied { builder } else { builder.proxy(None) };
    builder.build().into()
}

/// A client for a tool: like [`agent`], but every address it would connect
/// to — the first request's and each redirect's — passes `fence` first
/// (see [`crate::tools::fence`]), and it uses no proxy, so the address the
/// fence sees is the one it connects to.
pub fn fenced_agent(
    timeout: Duration,
    max_redirects: u32,
    fence: std::sync::Arc<crate::tools::fence::Fence>,
) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .max_redirects(max_redirects)
        .user_agent(concat!("durable-agent/", env!("CARGO_PKG_VERSION")))
        .proxy(None)
        .build();
    ureq::Agent::with_parts(
        config,
        ureq::unversioned::transport::DefaultConnector::new(),
        crate::tools::fence::FencedResolver::new(fence),
    )
}

/// Whether `url`'s host is 127.0.0.0/8, ::1 or localhost.
pub fn is_loopback_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The body as text, at most `limit` bytes. Errors are classified like the
/// request's (a timeout while reading the body is a timeout).
pub fn read_body(response: &mut Response<Body>, limit: u64) -> Result<String, TransportFailure> {
    let mut bytes = Vec::new();
    let mut reader = response.body_mut().as_reader();
    // Read one byte past the limit to tell "exactly at" from "over".
    let read = (&mut reader)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        // ureq wraps its own errors (a timeout) in io::Error; From unwraps.
        .map_err(|e| classify(&ureq::Error::from(e)))?;
    if read as u64 > limit {
        return Err(TransportFailure::Fatal(format!(
            "response body exceeds {limit} bytes"
        )));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// At most `max_chars` of `s`, for error messages (a 5 MB HTML error page
/// does not belong in a log line).
pub fn excerpt(s: &str, max_chars: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_urls_are_recognised() {
        assert!(is_loopback_url("http://127.0.0.1:80/x"));
        assert!(is_loopback_url("http://localhost/x"));
        assert!(is_loopback_url("http://[::1]:9/x"));
        assert!(!is_loopback_url("https://api.openai.com/v1"));
        assert!(!is_loopback_url("http://10.0.0.1:80"));
    }

    /// The daemon's API client never takes the environment's proxy, even
    /// for a daemon beyond loopback: its requests carry the API token
    /// (found by a review). The proxy named is never connected to: only
    /// the agents' configs are read. No other test of this binary makes
    /// a request through a non-loopback agent, which is all the variable
    /// changes.
    #[test]
    fn the_daemon_client_never_goes_through_a_proxy() {
        std::env::set_var("HTTP_PROXY", "http://127.0.0.1:9");
        let timeout = Duration::from_secs(1);
        let proxied = agent("http://192.0.2.1:7341/status", timeout, 0);
        assert!(proxied.config().proxy().is_some(), "the variable is read");
        assert!(agent("http://127.0.0.1:7341/status", timeout, 0)
            .config()
            .proxy()
            .is_none());
        assert!(direct_agent(timeout, 0).config().proxy().is_none());
        std::env::remove_var("HTTP_PROXY");
    }

    #[test]
    fn excerpt_cuts_on_a_char_boundary() {
        assert_eq!(excerpt("héllo", 2), "hé…");
        assert_eq!(excerpt(" ok ", 10), "ok");
    }
}
