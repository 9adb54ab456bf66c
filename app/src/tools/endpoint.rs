//! One configured HTTP endpoint (`kind = "http"`): how a call's JSON
//! arguments become a request. Shared by the outbox (irreversible tools)
//! and the executor (reversible ones) so both send the same bytes.
//!
//! Invariant: every request carries the configured headers plus
//! `Idempotency-Key` (the call's key, its bytes outside visible ASCII and
//! `%` percent-encoded: a header carries nothing else; a `${VAR}` in a
//! header value is read from the environment at call time), passes the tool fence, follows no redirect (a redirected POST could be
//! replayed at another address) and is bounded by the tool's timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::fence::Fence;
use crate::config::HttpToolConfig;
use crate::http::{self, TransportFailure};

/// What came back, if anything did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub reason: String,
    pub body: String,
}

#[derive(Debug)]
pub struct Endpoint {
    pub name: String,
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    agent: ureq::Agent,
}

/// Why no [`Reply`]: `sent` says whether the request may have reached the
/// server (false only when it was never made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub failure: TransportFailure,
    pub sent: bool,
}

impl Endpoint {
    /// Fenced (see [`super::fence`]): its URL host and `allow_hosts` may be
    /// internal, `daemon` (the API's address) never.
    pub fn new(tool: &HttpToolConfig, daemon: Option<SocketAddr>) -> Self {
        let fence = Fence::for_endpoint(&tool.url, &tool.allow_hosts, daemon);
        Endpoint {
            name: tool.name.clone(),
            method: tool.method.clone(),
            url: tool.url.clone(),
            headers: tool.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            agent: http::fenced_agent(Duration::from_millis(tool.timeout_ms), 0, Arc::new(fence)),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Send `args`: as the JSON body, or for GET as query parameters.
    pub fn call(&self, idem_key: &str, args: &Value) -> Result<Reply, Failed> {
        let (uri, body) = if self.method == "GET" {
            (with_query(&self.url, args), Vec::new())
        } else {
            (self.url.clone(), args.to_string().into_bytes())
        };
        let mut builder = ureq::http::Request::builder()
            .method(self.method.as_str())
            .uri(uri.as_str())
            .header("Idempotency-Key", header_key(idem_key));
        if self.method != "GET" {
            builder = builder.header("Content-Type", "application/json");
        }
        for (k, v) in &self.headers {
            // `${VAR}` is read now, never stored or logged.
            let value = expand_env(v).map_err(|var| Failed {
                failure: TransportFailure::Fatal(format!(
                    "tool {}: header {k} names ${{{var}}}, which is not set",
                    self.name
                )),
                sent: false,
            })?;
            builder = builder.header(k.as_str(), value.as_str());
        }
        let request = builder.body(body).map_err(|e| Failed {
            failure: TransportFailure::Fatal(format!("cannot build request to {uri}: {e}")),
            sent: false,
        })?;
        let mut response = self.agent.run(request).map_err(|e| Failed {
            failure: http::classify(&e),
            sent: may_have_been_sent(&e),
        })?;
        let status = response.status();
        let body = http::read_body(&mut response, http::MAX_BODY_BYTES)
            .map_err(|failure| Failed { failure, sent: true })?;
        Ok(Reply {
            status: status.as_u16(),
            reason: status.canonical_reason().unwrap_or("").to_string(),
            body,
        })
    }
}

/// Whether the request may have reached the server before `e`. Only
/// failures before a connection existed say "no": a bad URL, a name that
/// did not resolve, a refused connection. Anything after connecting (a
/// reset, a timeout) may have happened after the request left.
fn may_have_been_sent(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::HostNotFound
        | ureq::Error::ConnectionFailed => false,
        // Refused (a closed port, or the tool fence): nothing left.
        ureq::Error::Io(io) => !matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::PermissionDenied
        ),
        _ => true,
    }
}

/// `idem_key` as a header value: each byte outside visible ASCII, and
/// `%`, as `%XX` — the same key always gives the same value, two keys
/// never one, and any work id or trigger key can be carried (found by a
/// review: a non-ASCII trigger key went out as raw bytes, which the
/// endpoint dropped, and a control character failed every call).
pub fn header_key(idem_key: &str) -> String {
    let mut out = String::with_capacity(idem_key.len());
    for b in idem_key.bytes() {
        match b {
            b'%' => out.push_str("%25"),
            0x21..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `value` with every `${NAME}` replaced by the environment variable
/// `NAME` (how a header carries a secret without the config holding it);
/// `Err(NAME)` for an unset one. Text without `${` is returned as is.
pub fn expand_env(value: &str) -> Result<String, String> {
    crate::config::expand_placeholders(value, |name| std::env::var(name).map_err(|_| name.to_string()))
}

/// `url?k=v&...` from a JSON object's top-level fields (strings as they
/// are, anything else as JSON text), percent-encoded.
fn with_query(url: &str, args: &Value) -> String {
    let Some(map) = args.as_object().filter(|m| !m.is_empty()) else {
        return url.to_string();
    };
    let mut out = url.to_string();
    let mut sep = if url.contains('?') { '&' } else { '?' };
    for (k, v) in map {
        let value = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push(sep);
        out.push_str(&percent_encode(k));
        out.push('=');
        out.push_str(&percent_encode(&value));
        sep = '&';
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_arguments_become_an_encoded_query() {
        let args = serde_json::json!({"q": "a b&c", "n": 2});
        assert_eq!(with_query("http://h/x", &args), "http://h/x?n=2&q=a%20b%26c");
        assert_eq!(
            with_query("http://h/x?k=1", &serde_json::json!({"a": "é"})),
            "http://h/x?k=1&a=%C3%A9"
        );
        assert_eq!(with_query("http://h/x", &serde_json::json!({})), "http://h/x");
    }
}
