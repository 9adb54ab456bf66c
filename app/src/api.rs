//! The control API's wire: HTTP method + path + JSON body to an
//! [`ops::Request`](crate::ops::Request) (the daemon's side), and the thin
//! client the `status`/`emit`/`confirm` commands use when a daemon holds
//! the root.
//!
//! | method | path                  | body                                             |
//! |--------|-----------------------|--------------------------------------------------|
//! | POST   | `/agents`             | `{name, instructions?, parent?}`                 |
//! | DELETE | `/agents/{name}`      |                                                  |
//! | POST   | `/agents/{name}/turn` | `{prompt, work_id?}` (streamed: see below)       |
//! | POST   | `/messages`           | `{from, to, payload}`                            |
//! | POST   | `/triggers`           | `{dedup_key, fire_at_ms? \| delay_ms?, agent, prompt}` |
//! | GET    | `/status`             |                                                  |
//! | POST   | `/confirm`            | `{idem_key, delivered, provider_ref?}`           |
//! | POST   | `/schedules`          | `{id, agent, prompt, period_ms}`                 |
//! | DELETE | `/schedules/{id}`     |                                                  |
//! | POST   | `/gc`                 | `{ttl_ms, payload_ttl_ms}` (both) → counts per table |
//!
//! The read-only views ([`crate::inspect`]; lists take `?limit=&offset=`,
//! newest first, and answer `{items, total, limit, offset, next_offset}`):
//!
//! | method | path                     | answer                                             |
//! |--------|--------------------------|----------------------------------------------------|
//! | GET    | `/runs`                  | user runs (no `session:…` bookkeeping runs)        |
//! | GET    | `/runs/{id}`             | status, rounds, calls, effects, outcome, usage, errors |
//! | GET    | `/agents`                | the live agents as a tree (a page of roots)        |
//! | GET    | `/agents/{name\|id}`     | one agent and its conversation                     |
//! | GET    | `/transcripts/{agent\|run}` | `{agent, run_id, markdown}`                     |
//! | GET    | `/work/{work_id}`        | a completed work turn's stored answer              |
//! | GET    | `/usage`                 | tokens: total, by model, by agent, by run          |
//! | GET    | `/errors[?run=]`         | provider-call failures with their attempt          |
//! | GET    | `/triggers[?status=]`    | triggers, attempts, last error                     |
//! | GET    | `/triggers/{id}`         | one trigger and its work turn                      |
//! | GET    | `/confirmations`         | NEEDS_CONFIRMATION calls                           |
//! | GET    | `/schedules`             | recurring schedules                                |
//!
//! Answers are JSON: the result with 200, or `{"error": "..."}` with the
//! status of [`OpError::http_status`](crate::ops::OpError::http_status).
//! A turn asked with `Accept: text/event-stream` (or `?stream=1`) is
//! answered as server-sent events while it runs, the same JSON last
//! ([`stream`]).
//!
//! Invariant: routing is total — any method, path and body give a
//! `Request` or a 4xx with a message naming what is wrong; nothing here
//! touches the system.

pub mod listen;
pub mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::access::Token;
use crate::http;
use crate::inspect::View;
use crate::ops::Request;

/// A request the API refuses before it reaches the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

fn refused(status: u16, message: impl Into<String>) -> Refused {
    Refused {
        status,
        message: message.into(),
    }
}

/// The operation `method path` with `body` asks for.
pub fn route(method: &str, path: &str, body: &str) -> Result<Request, Refused> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if method == "GET" {
        let decoded = parts.iter().map(|p| decode(p)).collect::<Result<Vec<_>, _>>()?;
        let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
        if let Some(view) = View::route(&segments, query) {
            return view.map(Request::View).map_err(|e| refused(400, e.0));
        }
    }
    match (method, parts.as_slice()) {
        ("POST", ["agents"]) => parse(body).map(Request::CreateAgent),
        ("DELETE", ["agents", name]) => Ok(Request::DeleteAgent(decode(name)?)),
        ("POST", ["agents", name, "turn"]) => Ok(Request::Turn(decode(name)?, parse(body)?)),
        ("POST", ["messages"]) => parse(body).map(Request::Message),
        ("POST", ["triggers"]) => parse(body).map(Request::Emit),
        ("POST", ["triggers", id, "retry"]) => Ok(Request::RetryTrigger(decode(id)?)),
        ("POST", ["runs", id, "release"]) => Ok(Request::ReleaseRun(decode(id)?)),
        ("GET", ["status"]) => Ok(Request::Status),
        ("POST", ["confirm"]) => parse(body).map(Request::Confirm),
        ("POST", ["schedules"]) => parse(body).map(Request::AddSchedule),
        ("DELETE", ["schedules", id]) => Ok(Request::DeleteSchedule(decode(id)?)),
        ("POST", ["gc"]) => parse(body).map(Request::Gc),
        (
            _,
            ["agents"]
            | ["agents", _]
            | ["agents", _, "turn"]
            | ["messages"]
            | ["triggers"]
            | ["triggers", _, "retry"]
            | ["runs", _, "release"]
            | ["status"]
            | ["confirm"]
            | ["schedules"]
            | ["schedules", _]
            | ["gc"]
            | ["runs" | "usage" | "errors" | "confirmations"]
            | ["runs" | "transcripts" | "work", _],
        ) => Err(refused(405, format!("{method} is not allowed on {path}"))),
        _ => Err(refused(
            404,
            format!("no endpoint {path} (see the API table in app/README.md)"),
        )),
    }
}

fn parse<T: DeserializeOwned>(body: &str) -> Result<T, Refused> {
    serde_json::from_str(body).map_err(|e| refused(400, format!("bad JSON body: {e}")))
}

/// Percent-decoding of a path segment or query component (agent names
/// may hold spaces); the error says what is wrong.
pub fn decode_component(segment: &str) -> Result<String, String> {
    decode(segment).map_err(|r| r.message)
}

/// Percent-decoding of a path segment (agent names may hold spaces).
fn decode(segment: &str) -> Result<String, Refused> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| refused(400, format!("bad percent-escape in {segment:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| refused(400, format!("{segment:?} is not UTF-8")))
}

/// Percent-encode a path segment.
pub fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the daemon at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("daemon answered HTTP {status}: {message}")]
    Api {
        status: u16,
        message: String,
        /// The whole answer (a stopped turn's carries its calls).
        body: Value,
    },
    #[error("daemon sent a non-JSON answer: {0}")]
    Malformed(String),
}

/// A client of a running daemon's API.
#[derive(Debug)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    token: Option<Token>,
    /// The root the calls are meant for (its store id), if known.
    root: Option<u32>,
}

impl Client {
    /// Calls give up after `timeout` (a turn can take a while).
    pub fn new(addr: SocketAddr, timeout: Duration) -> Client {
        let base = format!("http://{addr}");
        Client {
            agent: http::direct_agent(timeout, 0),
            base,
            token: None,
            root: None,
        }
    }

    /// Name the root every call is meant for (its store id): a daemon
    /// serving another root refuses them (409, [`crate::access`]).
    pub fn for_root(mut self, store_id: u32) -> Client {
        self.root = Some(store_id);
        self
    }

    /// Send `token` with every call (the daemon answers 401 without it).
    pub fn with_token(mut self, token: Token) -> Client {
        self.token = Some(token);
        self
    }

    /// `method path` with `body`; the answer's JSON.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(url.as_str())
            .header("Content-Type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("Authorization", token.bearer());
        }
        if let Some(root) = self.root {
            request = request.header(crate::access::ROOT_HEADER, root.to_string());
        }
        let request = request
            .body(body.map_or_else(Vec::new, |b| b.to_string().into_bytes()))
            .map_err(|e| ClientError::Unreachable {
                url: url.clone(),
                detail: e.to_string(),
            })?;
        let mut response = self.agent.run(request).map_err(|e| ClientError::Unreachable {
            url: url.clone(),
            detail: http::classify(&e).to_string(),
        })?;
        let status = response.status().as_u16();
        let text =
            http::read_body(&mut response, http::MAX_BODY_BYTES).map_err(|f| ClientError::Unreachable {
                url: url.clone(),
                detail: f.to_string(),
            })?;
        let value: Value =
            serde_json::from_str(&text).map_err(|_| ClientError::Malformed(http::excerpt(&text, 200)))?;
        if (200..300).contains(&status) {
            Ok(value)
        } else {
            Err(ClientError::Api {
                status,
                message: value
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)")
                    .to_string(),
                body: value,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_refusals() {
        assert!(matches!(route("GET", "/status", ""), Ok(Request::Status)));
        assert!(matches!(
            route("POST", "/triggers/trg-3/retry", ""),
            Ok(Request::RetryTrigger(id)) if id == "trg-3"
        ));
        assert!(matches!(route("GET", "/triggers/trg-3/retry", ""), Err(r) if r.status == 405));
        assert!(matches!(
            route("POST", "/runs/session%3Aab/release", ""),
            Ok(Request::ReleaseRun(id)) if id == "session:ab"
        ));
        assert!(matches!(
            route("POST", "/agents/my%20bot/turn", r#"{"prompt":"hi"}"#),
            Ok(Request::Turn(name, _)) if name == "my bot"
        ));
        assert!(matches!(route("DELETE", "/agents/a", ""), Ok(Request::DeleteAgent(n)) if n == "a"));
        assert_eq!(route("PUT", "/agents", "").map(|_| ()).unwrap_err().status, 405);
        assert_eq!(route("POST", "/usage", "").map(|_| ()).unwrap_err().status, 405);
        assert_eq!(
            route("DELETE", "/runs/r1", "").map(|_| ()).unwrap_err().status,
            405
        );
        assert!(matches!(
            route("GET", "/runs/session%3Aab?x=1", ""),
            Ok(Request::View(View::Run(id))) if id == "session:ab"
        ));
        assert!(matches!(
            route("GET", "/agents", ""),
            Ok(Request::View(View::Agents(_)))
        ));
        assert_eq!(
            route("GET", "/runs?limit=0", "").map(|_| ()).unwrap_err().status,
            400
        );
        assert_eq!(route("GET", "/nope", "").map(|_| ()).unwrap_err().status, 404);
        let bad = route("POST", "/triggers", r#"{"dedup_key":"k"}"#)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(bad.status, 400);
        assert!(bad.message.contains("missing field"), "{}", bad.message);
        assert_eq!(encode("my bot/1"), "my%20bot%2F1");
        assert!(matches!(
            route("POST", "/gc", r#"{"ttl_ms":1000,"payload_ttl_ms":500}"#),
            Ok(Request::Gc(r)) if r.ttl_ms == 1_000 && r.payload_ttl_ms == 500
        ));
        assert_eq!(route("GET", "/gc", "").map(|_| ()).unwrap_err().status, 405);
        // Both TTLs are required (a pass deletes rows): a missing one is
        // named.
        let missing = route("POST", "/gc", r#"{"ttl_ms":1000}"#)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(missing.status, 400);
        assert!(missing.message.contains("payload_ttl_ms"), "{}", missing.message);
    }
}
