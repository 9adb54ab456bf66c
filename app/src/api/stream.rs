//! A turn as a stream: `POST /agents/{name}/turn` with `Accept:
//! text/event-stream` (or `?stream=1`) answers server-sent events as the
//! turn goes — `round`, `resumed`, `text`, `tool`, `retry`,
//! `provider_failed` (each a [`Step`], as `run`'s progress lines are) —
//! and last an `end` event, `{"status", "body"}`: the status and the very
//! JSON body the same request answers without streaming.
//!
//! Invariant: streaming changes what the client sees while it waits,
//! nothing else — the request is routed, authorized (the gate ran before
//! this) and answered by the worker exactly as the non-streamed one, and
//! the `end` event is always the last: a client that reads it has the
//! whole answer, one that does not (the connection broke) must ask
//! `GET /work/{work_id}` or `/agents/{name}` what became of the turn.
//! The steps come from the one watcher of the daemon's hooks and
//! provider ([`Progress::subscribe`]); there is no second event source.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use durable_agent::runtime::{AgentId, SessionId};
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;
use serde_json::{json, Value};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::listen::{json_response, Body, BodyError, Handler};
use crate::progress::{Step, Subscription};
use crate::server::Recorded;

/// What the stream carries, in order.
enum Event {
    Step(Step),
    End(u16, Value),
}

/// The agent a streamed turn is asked of, if `recorded` asks for one:
/// `POST /agents/{name}/turn` wanting `text/event-stream` (the `Accept`
/// header, or `stream=1|true` in the query).
pub fn requested(recorded: &Recorded) -> Option<String> {
    if recorded.method != "POST" {
        return None;
    }
    let (path, query) = recorded.path.split_once('?').unwrap_or((&recorded.path, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let ["agents", name, "turn"] = parts.as_slice() else {
        return None;
    };
    let by_query = query
        .split('&')
        .any(|kv| matches!(kv, "stream=1" | "stream=true"));
    let by_accept = recorded
        .header("Accept")
        .is_some_and(|a| a.to_ascii_lowercase().contains("text/event-stream"));
    (by_query || by_accept).then(|| super::decode_component(name).ok())?
}

/// One event as SSE: its name, its JSON on one `data:` line.
pub fn event_text(name: &str, data: &Value) -> String {
    // serde_json's compact form has no raw newline: one data line.
    format!("event: {name}\ndata: {data}\n\n")
}

/// Answer `recorded` (a request past the gate, its body read, asking a
/// streamed turn of `agent`): resolve the agent, subscribe to its steps,
/// hand the request to the worker on a task of its own (holding `slot`
/// until its answer is in), and answer at once with a body that carries
/// the steps as they come, then the answer. hyper writes that body, whose
/// length is unknown, with chunked transfer encoding, one chunk per event.
pub(crate) async fn serve(
    handler: Arc<Handler>,
    recorded: Recorded,
    agent: &str,
    slot: OwnedSemaphorePermit,
) -> Response<Body> {
    if super::route(&recorded.method, &recorded.path, &recorded.body).is_err() {
        // Refused as it would be unstreamed (a bad body: 400), plainly.
        let (status, body) = handler.answer(&recorded).await;
        return json_response(status, &body);
    }
    // Unbounded, as the std channel before it: one turn's steps are
    // bounded by its rounds and its reply's text, and the watcher's sink
    // runs on the turn's threads, which a slow client must never block.
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    // Which agent (and session) the name means now, asked of the worker
    // like any view; if it cannot say, the turn's own answer will.
    let subscription = watched(&handler, &recorded, agent)
        .await
        .map(|(id, session, work)| {
            let tx = tx.clone();
            handler.progress().subscribe(
                id,
                session,
                work,
                Arc::new(move |step: &Step| {
                    // The stream may be gone; the turn goes on.
                    let _ = tx.send(Event::Step(step.clone()));
                }),
            )
        });
    // The turn is asked whether or not the client stays to read it: a
    // client that goes away drops the body, not the turn.
    tokio::spawn(async move {
        let (status, body) = handler.answer(&recorded).await;
        let _ = tx.send(Event::End(status, body));
        drop(slot);
    });
    let events = Events {
        rx,
        subscription,
        ended: false,
    };
    let mut response = Response::new(events.boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A streamed turn's body: each step as an event, then the `end` event,
/// then the end of the body. The subscription lives as long as the body:
/// a client that goes away unsubscribes.
struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
    subscription: Option<Subscription>,
    ended: bool,
}

impl hyper::body::Body for Events {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let text = match ready!(this.rx.poll_recv(cx)) {
            Some(Event::Step(step)) => {
                let data = serde_json::to_value(&step).unwrap_or(Value::Null);
                event_text(step.name(), &data)
            }
            Some(Event::End(status, answer)) => {
                // The last event: nothing may follow it.
                this.ended = true;
                this.subscription = None;
                this.rx.close();
                event_text("end", &json!({"status": status, "body": answer}))
            }
            // The answering task is gone without an answer (the runtime
            // is stopping): an error, so the client sees a broken body,
            // never one that looks whole without its `end`.
            None => return Poll::Ready(Some(Err(BodyError::Unended))),
        };
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(text)))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// The agent's id and session, and the turn's work id, from the worker's
/// view of the agent and the request's body.
async fn watched(
    handler: &Handler,
    recorded: &Recorded,
    agent: &str,
) -> Option<(AgentId, SessionId, Option<String>)> {
    let view = Recorded {
        method: "GET".into(),
        path: format!("/agents/{}", super::encode(agent)),
        headers: Vec::new(),
        body: String::new(),
    };
    let (status, body) = handler.answer(&view).await;
    if status != 200 {
        return None;
    }
    let id = serde_json::from_value(body["id"].clone()).ok()?;
    let session = serde_json::from_value(body["session_id"].clone()).ok()?;
    let work = serde_json::from_str::<Value>(&recorded.body)
        .ok()
        .and_then(|b| b["work_id"].as_str().map(|w| format!("api:{w}")));
    Some((id, session, work))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(path: &str, accept: Option<&str>) -> Recorded {
        Recorded {
            method: "POST".into(),
            path: path.into(),
            headers: accept
                .map(|a| vec![("accept".to_string(), a.to_string())])
                .unwrap_or_default(),
            body: String::new(),
        }
    }

    #[test]
    fn a_stream_is_asked_by_accept_or_query_on_the_turn_endpoint_only() {
        assert_eq!(
            requested(&post("/agents/my%20bot/turn", Some("text/event-stream"))),
            Some("my bot".to_string())
        );
        assert_eq!(
            requested(&post("/agents/a/turn?stream=1", None)),
            Some("a".into())
        );
        assert_eq!(requested(&post("/agents/a/turn", None)), None);
        assert_eq!(requested(&post("/agents/a/turn?stream=0", None)), None);
        assert_eq!(requested(&post("/messages?stream=1", None)), None);
        let mut get = post("/agents/a/turn?stream=1", None);
        get.method = "GET".into();
        assert_eq!(requested(&get), None);
    }

    #[test]
    fn an_event_is_one_data_line() {
        let text = event_text("text", &json!({"delta": "a\nb"}));
        assert_eq!(text, "event: text\ndata: {\"delta\":\"a\\nb\"}\n\n");
    }
}
