//! [`WebhookSink`]: a loopback HTTP server standing in for the external
//! service an irreversible tool calls (an email API, a payment provider).
//!
//! Invariant: `requests()` counts every request that reached the sink;
//! `deliveries()` lists the ones that took effect, in order. With dedup on,
//! a request whose `Idempotency-Key` was already delivered gets the
//! original id with 200 and is not a new delivery — so "no side effect
//! twice" is checked by counting deliveries per key. A scripted status
//! (see [`WebhookSink::script`]) answers without delivering; a reply delay
//! ([`WebhookSink::delay_replies`]) delivers first and answers late.
//!
//! Requests are handled one at a time, in arrival order, so
//! [`WebhookSink::settle`] (a request to [`SETTLE_PATH`], answered without
//! being counted) returns only once every request that reached the sink
//! before it is recorded: what a kill -9'd daemon had already sent may
//! still wait in the queue behind a delayed reply.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;

use crate::server::{json_response, respond, LoopbackServer, Recorded, ServerError};

/// The path of [`WebhookSink::settle`]'s request: never a delivery.
pub const SETTLE_PATH: &str = "/_settle";

/// One request that took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The id returned to the caller (`{"id": ...}`).
    pub id: String,
    pub request: Recorded,
}

impl Delivery {
    pub fn idempotency_key(&self) -> Option<&str> {
        self.request.header("Idempotency-Key")
    }
}

#[derive(Debug, Default)]
struct State {
    dedup: bool,
    requests: u64,
    deliveries: Vec<Delivery>,
    by_key: BTreeMap<String, String>,
    script: VecDeque<u16>,
    /// Wait this long after a delivery before answering it.
    reply_delay_ms: u64,
}

#[derive(Debug)]
pub struct WebhookSink {
    state: Arc<Mutex<State>>,
    server: LoopbackServer,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update to State is one step; a poisoned lock is still usable.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl WebhookSink {
    /// Listen on `listen` (loopback; port 0 picks one). `dedup`: honour
    /// `Idempotency-Key`.
    pub fn start(listen: SocketAddr, dedup: bool) -> Result<WebhookSink, ServerError> {
        let state = Arc::new(Mutex::new(State {
            dedup,
            ..State::default()
        }));
        let handler_state = Arc::clone(&state);
        let server = LoopbackServer::start(listen, "webhook-sink", move |mut request| {
            let recorded = Recorded::read(&mut request);
            if recorded.path == SETTLE_PATH {
                respond(request, json_response(200, r#"{"settled":true}"#));
                return;
            }
            let (status, body) = accept(&handler_state, recorded);
            let delay_ms = lock(&handler_state).reply_delay_ms;
            if delay_ms > 0 {
                // On the accept thread: later requests wait too, as they
                // would behind a stalled upstream.
                std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            }
            respond(request, json_response(status, &body.to_string()));
        })?;
        Ok(WebhookSink { state, server })
    }

    /// Wait until every request that reached the sink before this call is
    /// recorded (see the module docs): the sink's own loopback request to
    /// [`SETTLE_PATH`], answered in arrival order, at most `timeout` late.
    pub fn settle(&self, timeout: std::time::Duration) -> Result<(), crate::api::ClientError> {
        crate::api::Client::new(self.addr(), timeout)
            .call("GET", SETTLE_PATH, None)
            .map(|_| ())
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://<addr>` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url())
    }

    /// Answer the next requests with these statuses instead of delivering
    /// (e.g. 400 to reject, 500 to fail) — one status per request.
    pub fn script(&self, statuses: impl IntoIterator<Item = u16>) {
        lock(&self.state).script.extend(statuses);
    }

    /// Take effect at once but answer `delay_ms` later: the window in
    /// which a caller that dies has sent an effect it never heard about.
    pub fn delay_replies(&self, delay_ms: u64) {
        lock(&self.state).reply_delay_ms = delay_ms;
    }

    /// Requests received (deduplicated repeats and scripted answers
    /// included).
    pub fn requests(&self) -> u64 {
        lock(&self.state).requests
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        lock(&self.state).deliveries.clone()
    }

    pub fn deliveries_len(&self) -> usize {
        lock(&self.state).deliveries.len()
    }

    /// Deliveries carrying `key` as their `Idempotency-Key`.
    pub fn deliveries_for(&self, key: &str) -> usize {
        lock(&self.state)
            .deliveries
            .iter()
            .filter(|d| d.idempotency_key() == Some(key))
            .count()
    }
}

fn accept(state: &Mutex<State>, recorded: Recorded) -> (u16, serde_json::Value) {
    let mut s = lock(state);
    s.requests += 1;
    let key = recorded.header("Idempotency-Key").map(str::to_string);
    if s.dedup {
        if let Some(id) = key.as_ref().and_then(|k| s.by_key.get(k)) {
            return (200, json!({"id": id, "duplicate": true}));
        }
    }
    if let Some(status) = s.script.pop_front() {
        return (status, json!({"error": format!("scripted status {status}")}));
    }
    let id = format!("dlv-{}", s.deliveries.len() + 1);
    if let Some(k) = key {
        s.by_key.insert(k, id.clone());
    }
    tracing::debug!(id, path = %recorded.path, "delivery");
    s.deliveries.push(Delivery {
        id: id.clone(),
        request: recorded,
    });
    (200, json!({"id": id}))
}
