//! [`MockLlm`]: an OpenAI-compatible chat-completions server on loopback,
//! scripted ([`Script`]) or in echo mode, so the product runs and is tested
//! without an API key.
//!
//! Echo mode is deterministic: if the request offers tools and its last
//! message is the user's, it asks for the first offered tool whose name
//! the user's message contains, else the first offered tool (arguments
//! filled from the schema's required properties); otherwise it answers
//! `echo: <last user message>`, quoting the last tool result if any.
//!
//! Rewording ([`Reword`]: `mock-llm --reword --seed N`, a script's
//! `[reword]` table, [`MockLlm::echo_rewording`]) makes the mock answer
//! every ask differently, deterministically per seed and ask number, as a
//! real model asked again does (see [`reword`]). Without it the answers
//! are exactly the plain ones.
//!
//! A request with `stream: true` is answered as server-sent events
//! ([`stream`]): the same completion, in chunks; a script can cut such a
//! stream short (`cut_after_chunks`) or send a raw event stream (`sse`).
//! Requests without it get the whole JSON body, byte for byte as before.
//!
//! Invariant: each request to `/chat/completions` gets the first reply of
//! the script it fits that is not used up ([`Script::select`]: without
//! `when_*` conditions, the n-th request gets `replies[n]`; a delayed
//! reply is answered on its own thread, so it does not hold up the next
//! one), and every request is recorded before it is answered. A request
//! no reply is left for gets a 500 saying so. A test may watch each
//! exchange ([`MockLlm::with_tap`]): to kill a client at a chosen request.

pub mod reword;
mod script;
mod stream;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Value};

pub use reword::{Reword, Variant};
pub use script::{Asked, Reply, Script, ScriptError, ScriptedCall, MAX_DELAY_MS};

use crate::server::{json_response, respond, Chunked, LoopbackServer, Recorded, ServerError};

#[derive(Debug, Default)]
struct State {
    /// None: echo mode.
    script: Option<Script>,
    /// Some: every answer reworded (see [`reword`]).
    reword: Option<Reword>,
    next: usize,
    /// Per script reply: it has answered (see [`Script::select`]).
    used: Vec<bool>,
    requests: Vec<Recorded>,
    tap: Option<Tap>,
}

/// A point of one completion exchange, with the request's 1-based number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// The request is recorded; its answer is not sent yet.
    Asked(usize),
    /// Its answer went out.
    Answered(usize),
}

type TapFn = Arc<dyn Fn(Exchange) + Send + Sync>;

/// The watcher [`MockLlm::with_tap`] installs.
#[derive(Clone)]
struct Tap(TapFn);

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tap")
    }
}

/// A running mock; dropping it stops the server.
#[derive(Debug)]
pub struct MockLlm {
    state: Arc<Mutex<State>>,
    server: LoopbackServer,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Each handler updates State in one step; a poisoned lock is usable.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl MockLlm {
    /// Serve `script` on `listen` (loopback; port 0 picks one), reworded
    /// if the script says so (`reword`).
    pub fn scripted(listen: SocketAddr, script: Script) -> Result<MockLlm, ServerError> {
        let reword = script.reword;
        Self::start(listen, Some(script), reword)
    }

    /// Serve echo replies on `listen`.
    pub fn echo(listen: SocketAddr) -> Result<MockLlm, ServerError> {
        Self::start(listen, None, None)
    }

    /// Serve echo replies on `listen`, every one reworded per `reword`.
    pub fn echo_rewording(listen: SocketAddr, reword: Reword) -> Result<MockLlm, ServerError> {
        Self::start(listen, None, Some(reword))
    }

    fn start(
        listen: SocketAddr,
        script: Option<Script>,
        reword: Option<Reword>,
    ) -> Result<MockLlm, ServerError> {
        let used = script
            .as_ref()
            .map_or(Vec::new(), |s| vec![false; s.replies.len()]);
        let state = Arc::new(Mutex::new(State {
            used,
            script,
            reword,
            ..State::default()
        }));
        let handler_state = Arc::clone(&state);
        let server = LoopbackServer::start(listen, "mock-llm", move |request| {
            handle(&handler_state, request);
        })?;
        Ok(MockLlm { state, server })
    }

    /// Call `tap` at each completion exchange, outside the mock's lock:
    /// [`Exchange::Asked`] before the answer is sent, [`Exchange::Answered`]
    /// after (a test kills its client there).
    pub fn with_tap(self, tap: impl Fn(Exchange) + Send + Sync + 'static) -> MockLlm {
        lock(&self.state).tap = Some(Tap(Arc::new(tap)));
        self
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The `base_url` for `[provider]`: `http://<addr>/v1`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.server.url())
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.state).requests.clone()
    }

    /// The bodies of the completion requests, parsed (non-JSON bodies as
    /// JSON strings).
    pub fn request_bodies(&self) -> Vec<Value> {
        self.requests()
            .iter()
            .filter(|r| r.path.ends_with("/chat/completions"))
            .map(|r| serde_json::from_str(&r.body).unwrap_or_else(|_| Value::String(r.body.clone())))
            .collect()
    }
}

/// What to send back, decided under the lock and sent outside it.
struct Answer {
    status: u16,
    body: String,
    retry_after: Option<u64>,
    delay_ms: u64,
    /// Some: send these `data:` payloads as an event stream instead of
    /// `body`, the first `cut_after` of them only if that is set.
    events: Option<Events>,
}

struct Events {
    data: Vec<String>,
    cut_after: Option<usize>,
    /// A scripted raw stream, sent as it is.
    raw: Option<String>,
}

fn handle(state: &Arc<Mutex<State>>, mut request: tiny_http::Request) {
    let recorded = Recorded::read(&mut request);
    let mut number = None;
    let (answer, tap) = {
        let mut s = lock(state);
        let answer = if recorded.method != "POST" || !recorded.path.ends_with("/chat/completions") {
            Answer::now(
                404,
                json!({"error": {"message": "the mock serves POST */chat/completions only"}}),
            )
        } else {
            let n = s.next;
            s.next += 1;
            number = Some(n + 1);
            let body: Value = serde_json::from_str(&recorded.body).unwrap_or(Value::Null);
            let reword = s.reword;
            let State { script, used, .. } = &mut *s;
            match script {
                None => Answer::now(200, completion(n, &body, answer(reword, n, &body, echo(&body))))
                    .streamed_if_asked(&body, None),
                Some(script) => {
                    let asked = Asked::of(&body);
                    match script.select(used, &asked) {
                        Some(index) => scripted(n, &body, &script.replies[index], reword),
                        None => Answer::now(
                            500,
                            json!({"error": {"message": format!(
                                "mock script: no reply left for request {} (system {:?}, round {}) among {} replies",
                                n + 1,
                                crate::http::excerpt(&asked.system, 60),
                                asked.round,
                                script.replies.len()
                            )}}),
                        ),
                    }
                }
            }
        };
        s.requests.push(recorded);
        (answer, s.tap.clone())
    };
    let exchange = move |request: tiny_http::Request, answer: Answer| {
        let watch = |point: fn(usize) -> Exchange| {
            if let (Some(Tap(tap)), Some(n)) = (&tap, number) {
                tap(point(n));
            }
        };
        watch(Exchange::Asked);
        send(request, answer);
        watch(Exchange::Answered);
    };
    if answer.delay_ms == 0 {
        exchange(request, answer);
        return;
    }
    // On its own thread: the client may retry while this one sleeps.
    let spawned = std::thread::Builder::new()
        .name("mock-llm-delayed".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(answer.delay_ms));
            exchange(request, answer);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot spawn the delayed-reply thread; reply dropped");
    }
}

fn send(request: tiny_http::Request, answer: Answer) {
    if let Some(events) = answer.events {
        return send_events(request, events);
    }
    let mut response = json_response(answer.status, &answer.body);
    if let Some(secs) = answer.retry_after {
        if let Ok(h) = tiny_http::Header::from_bytes("Retry-After", secs.to_string()) {
            response = response.with_header(h);
        }
    }
    respond(request, response);
}

/// An event stream; a write failing means the client went away.
fn send_events(request: tiny_http::Request, events: Events) {
    let sent = Chunked::start(request, 200, "text/event-stream").and_then(|mut body| {
        if let Some(raw) = &events.raw {
            body.send(raw.as_bytes())?;
        } else {
            let count = events.cut_after.unwrap_or(events.data.len());
            for data in events.data.iter().take(count) {
                body.send(stream::event(data).as_bytes())?;
            }
        }
        // A cut ends the body cleanly, short of `[DONE]`: what a proxy
        // that dropped its upstream sends.
        body.finish()
    });
    if let Err(e) = sent {
        tracing::debug!(error = %e, "client went away during the stream");
    }
}

impl Answer {
    fn now(status: u16, body: Value) -> Answer {
        Answer {
            status,
            body: body.to_string(),
            retry_after: None,
            delay_ms: 0,
            events: None,
        }
    }

    /// A 200 completion, as events if `request` asked for a stream.
    fn streamed_if_asked(mut self, request: &Value, cut_after: Option<usize>) -> Answer {
        if self.status == 200 && stream::wants_stream(request) {
            let completion: Value = serde_json::from_str(&self.body).unwrap_or(Value::Null);
            self.events = Some(Events {
                data: stream::chunks(request, &completion),
                cut_after,
                raw: None,
            });
        }
        self
    }
}

/// `plain` as ask `n` answers it: reworded in rewording mode.
fn answer(reword: Option<Reword>, n: usize, request: &Value, plain: Message) -> Message {
    match reword {
        Some(r) => r.apply(n, request, plain),
        None => plain,
    }
}

fn scripted(n: usize, request: &Value, reply: &Reply, reword: Option<Reword>) -> Answer {
    if let Some(raw) = &reply.sse {
        return Answer {
            status: 200,
            body: String::new(),
            retry_after: None,
            delay_ms: reply.delay_ms,
            events: Some(Events {
                data: Vec::new(),
                cut_after: None,
                raw: Some(raw.clone()),
            }),
        };
    }
    let is_completion = reply.text.is_some() || !reply.tool_calls.is_empty();
    let (status, body) = if let Some(status) = reply.status {
        let body = reply.body.clone().unwrap_or_else(|| {
            json!({"error": {"message": format!("scripted status {status}"), "type": "mock"}}).to_string()
        });
        (status, body)
    } else if let Some(raw) = &reply.raw {
        (200, raw.clone())
    } else {
        let calls: Vec<(String, String)> = reply
            .tool_calls
            .iter()
            .map(|c| {
                let args = match &c.arguments {
                    Value::String(verbatim) => verbatim.clone(),
                    other => other.to_string(),
                };
                (c.name.clone(), args)
            })
            .collect();
        let message = Message {
            text: reply.text.clone(),
            calls,
            finish_reason: reply.finish_reason.clone(),
        };
        (
            200,
            completion(n, request, answer(reword, n, request, message)).to_string(),
        )
    };
    let answer = Answer {
        status,
        body,
        retry_after: reply.retry_after,
        delay_ms: reply.delay_ms,
        events: None,
    };
    if is_completion {
        answer.streamed_if_asked(request, reply.cut_after_chunks)
    } else {
        answer
    }
}

/// The assistant message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Message {
    text: Option<String>,
    /// (name, JSON-string arguments)
    calls: Vec<(String, String)>,
    finish_reason: Option<String>,
}

fn completion(n: usize, request: &Value, m: Message) -> Value {
    let tool_calls: Vec<Value> = m
        .calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{n}_{i}"), "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect();
    let finish = m.finish_reason.unwrap_or_else(|| {
        if tool_calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        }
        .to_string()
    });
    let mut message = json!({"role": "assistant", "content": m.text});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    // Deterministic stand-ins for token counts: ~4 bytes a token.
    let prompt_tokens = request.to_string().len() / 4;
    let completion_tokens = message.to_string().len() / 4;
    json!({
        "id": format!("mock-{n}"),
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model").cloned().unwrap_or(Value::Null),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })
}

/// Echo mode's reply to `request` (see the module doc).
fn echo(request: &Value) -> Message {
    let empty = Vec::new();
    let messages = request
        .get("messages")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let tools = request.get("tools").and_then(Value::as_array).unwrap_or(&empty);
    let last_role = messages
        .last()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str);
    let content = |m: &Value| m.get("content").and_then(Value::as_str).unwrap_or("").to_string();
    let last_user = last_user(request);
    // The first offered tool the user's message names, else the first
    // offered tool: a prompt can pick its tool ("... use note").
    let named = tools.iter().find(|t| {
        t["function"]["name"]
            .as_str()
            .is_some_and(|name| last_user.contains(name))
    });
    if let (Some("user"), Some(tool)) = (last_role, named.or(tools.first())) {
        let function = &tool["function"];
        let name = function["name"].as_str().unwrap_or("unnamed").to_string();
        let args = example_args(&function["parameters"], &last_user);
        return Message {
            text: None,
            calls: vec![(name, args.to_string())],
            finish_reason: None,
        };
    }
    let text = match messages.last() {
        Some(m) if last_role == Some("tool") => {
            format!(
                "echo: {last_user} (tool said: {})",
                crate::http::excerpt(&content(m), 200)
            )
        }
        _ => format!("echo: {last_user}"),
    };
    Message {
        text: Some(text),
        calls: Vec::new(),
        finish_reason: None,
    }
}

/// The content of the request's last user message ("" if none).
fn last_user(request: &Value) -> String {
    request
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|ms| {
            ms.iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        })
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Arguments satisfying the required properties of a JSON schema.
fn example_args(schema: &Value, user_text: &str) -> Value {
    let mut args = serde_json::Map::new();
    let empty = Vec::new();
    let required = schema.get("required").and_then(Value::as_array).unwrap_or(&empty);
    for key in required.iter().filter_map(Value::as_str) {
        let kind = schema["properties"][key]["type"].as_str().unwrap_or("string");
        let value = match kind {
            "integer" | "number" => json!(1),
            "boolean" => json!(false),
            "object" => json!({}),
            "array" => json!([]),
            _ => json!(user_text),
        };
        args.insert(key.to_string(), value);
    }
    Value::Object(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_asks_for_a_tool_then_answers() {
        let tools = json!([{"type": "function", "function": {"name": "lookup",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer"}},
                           "required": ["key", "n"]}}}]);
        let first = json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools});
        let m = echo(&first);
        assert_eq!(
            m.calls,
            vec![("lookup".to_string(), r#"{"key":"hi","n":1}"#.to_string())]
        );
        let second = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "c", "content": "42"}], "tools": tools});
        let m = echo(&second);
        assert!(m.calls.is_empty());
        assert_eq!(m.text.as_deref(), Some("echo: hi (tool said: 42)"));
        // A message naming an offered tool picks it.
        let two = json!([tools[0], {"type": "function", "function": {"name": "note",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]);
        let named = json!({"messages": [{"role": "user", "content": "use note"}], "tools": two});
        assert_eq!(
            echo(&named).calls,
            vec![("note".to_string(), r#"{"text":"use note"}"#.to_string())]
        );
        let unnamed = json!({"messages": [{"role": "user", "content": "hi"}], "tools": two});
        assert_eq!(echo(&unnamed).calls[0].0, "lookup");
        let no_tools = json!({"messages": [{"role": "user", "content": "yo"}]});
        assert_eq!(echo(&no_tools).text.as_deref(), Some("echo: yo"));
    }
}
