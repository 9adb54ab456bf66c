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

use std::sync::{mpsc, Arc};

use durable_agent::runtime::{AgentId, SessionId};
use serde_json::{json, Value};

use crate::progress::{Progress, Step};
use crate::server::{json_response, respond, Chunked, Recorded};

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

/// Answer `request` (its head and body in `recorded`, asking a streamed
/// turn of `agent`): resolve the agent, subscribe to its steps, hand the
/// request to `answer` (the worker's, as for any request) on a thread of
/// its own, and stream the steps, then the answer.
pub fn serve(
    request: tiny_http::Request,
    recorded: &Recorded,
    agent: &str,
    progress: &Arc<Progress>,
    answer: &(dyn Fn(&Recorded) -> (u16, Value) + Sync),
) {
    if super::route(&recorded.method, &recorded.path, &recorded.body).is_err() {
        // Refused as it would be unstreamed (a bad body: 400), plainly.
        let (status, body) = answer(recorded);
        return respond(request, json_response(status, &body.to_string()));
    }
    let (tx, rx) = mpsc::channel::<Event>();
    // Which agent (and session) the name means now, asked of the worker
    // like any view; if it cannot say, the turn's own answer will.
    let subscription = watched(recorded, agent, answer).map(|(id, session, work)| {
        let tx = tx.clone();
        progress.subscribe(
            id,
            session,
            work,
            Arc::new(move |step: &Step| {
                // The stream may be gone; the turn goes on.
                let _ = tx.send(Event::Step(step.clone()));
            }),
        )
    });
    std::thread::scope(|scope| {
        let ended = tx.clone();
        scope.spawn(move || {
            let (status, body) = answer(recorded);
            let _ = ended.send(Event::End(status, body));
        });
        drop(tx);
        let streamed = Chunked::start(request, 200, "text/event-stream").and_then(|mut body| {
            for event in &rx {
                match event {
                    Event::Step(step) => {
                        let data = serde_json::to_value(&step).unwrap_or(Value::Null);
                        body.send(event_text(step.name(), &data).as_bytes())?;
                    }
                    Event::End(status, answer) => {
                        let data = json!({"status": status, "body": answer});
                        body.send(event_text("end", &data).as_bytes())?;
                        break;
                    }
                }
            }
            body.finish()
        });
        if let Err(e) = streamed {
            // The turn stands; its answer is kept as a non-streamed one's.
            tracing::debug!(error = %e, "streaming client went away");
        }
        drop(subscription);
    });
}

/// The agent's id and session, and the turn's work id, from the worker's
/// view of the agent and the request's body.
fn watched(
    recorded: &Recorded,
    agent: &str,
    answer: &dyn Fn(&Recorded) -> (u16, Value),
) -> Option<(AgentId, SessionId, Option<String>)> {
    let view = Recorded {
        method: "GET".into(),
        path: format!("/agents/{}", super::encode(agent)),
        headers: Vec::new(),
        body: String::new(),
    };
    let (status, body) = answer(&view);
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
