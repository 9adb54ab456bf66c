//! A second client's streamed turn, refused because the agent is in a
//! turn, leaves the running turn's stream as it was (found by a review:
//! `Progress::subscribe` erased the agent's round, and every later `tool`
//! event of the running turn carried `"round": null` and its raw call id
//! instead of the shortened key app/README.md documents).

mod common;

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::{Arc, Mutex};

use common::*;
use durable_agent::runtime::{work_idempotency_key, AgentId, HookEvent, NoHooks, SessionId, ToolRequest};
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::progress::{shorten, Progress, Step};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

fn email() -> Value {
    json!({"to": "ada@example.com", "body": "the release is out"})
}

/// In process, through the public `Progress` API: the sequence `serve`
/// performs when a streamed turn is asked of a busy agent.
#[test]
fn a_second_subscriber_does_not_erase_the_round_of_the_turn_in_flight() -> TestResult {
    let progress = Progress::quiet();
    let hooks = progress.hooks(Arc::new(NoHooks));
    let agent = AgentId::from_hex("00000000000000a1")?;
    let session = SessionId::from_hex("00000000000000b2")?;
    let work = "api:w1".to_string();

    let seen: Arc<Mutex<Vec<Step>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        Arc::new(move |s: &Step| seen.lock().map(|mut v| v.push(s.clone())).unwrap_or(()))
    };
    // Client A streams its turn; round 0 starts.
    let _a = progress.subscribe(agent.clone(), session.clone(), Some(work.clone()), sink);
    hooks.observe(&HookEvent::TurnStart {
        agent: agent.clone(),
        turn: 0,
    });
    // Client B asks a streamed turn of the same agent meanwhile: it is
    // subscribed, then refused 409 (the agent is in a turn) and goes away.
    let b = progress.subscribe(
        agent.clone(),
        session.clone(),
        Some("api:w2".into()),
        Arc::new(|_: &Step| {}),
    );
    drop(b);
    // A's round 0 call completes.
    hooks.observe(&HookEvent::PostToolUse {
        agent: agent.clone(),
        tool_name: "send_email".into(),
        tool_input: email(),
        tool_use_id: format!("{session}-2.0"),
        result: "done dlv-1".into(),
    });

    let request = ToolRequest {
        tool: "send_email".into(),
        args: email(),
        irreversible: true,
        invalid_args: None,
    };
    let want_key = shorten(&work_idempotency_key(&session, &work, 0, 0, &request), &work);
    let steps = seen.lock().map(|v| v.clone()).unwrap_or_default();
    let tool = steps
        .iter()
        .find(|s| matches!(s, Step::Tool { .. }))
        .ok_or("no tool step")?;
    assert_eq!(
        tool,
        &Step::Tool {
            round: Some(0),
            tool: "send_email".into(),
            key: want_key,
            ok: true,
            error: None,
        },
        "client A's tool step lost its round and shortened key because client B subscribed"
    );
    Ok(())
}

/// End to end: `serve`, two clients streaming turns of one agent; the
/// second is refused 409 while the first waits for the model, and the
/// first client's `tool` event loses its round and key.
#[test]
fn a_refused_streamed_turn_does_not_corrupt_the_running_turns_stream() -> TestResult {
    let dir = tempfile::tempdir()?;
    let replies = vec![
        Reply::tool_call("send_email", email()).delayed(1_500),
        Reply::text("sent it"),
    ];
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let mut served = Serve(start_serve(&config)?);
    let url = served.0 .1.clone();
    client(&url)?.call(
        "POST",
        "/agents",
        Some(&json!({"name": "mailer", "instructions": "Send what you are asked to."})),
    )?;

    let a = {
        let url = url.clone();
        std::thread::spawn(move || {
            post_streamed(
                &url,
                "/agents/mailer/turn",
                &json!({"prompt": "tell ada", "work_id": "w1"}),
            )
            .map_err(|e| e.to_string())
        })
    };
    // A's round 0 is at the (slow) model.
    wait_for("the model to be asked", || !mock.request_bodies().is_empty())?;
    let b = post_streamed(
        &url,
        "/agents/mailer/turn",
        &json!({"prompt": "something else", "work_id": "w2"}),
    )?;
    let b_end = b.last().map(|(_, e)| e.clone()).unwrap_or_default();
    assert_eq!(
        b_end["status"], 409,
        "B should be refused: the agent is busy: {b:?}"
    );

    let a = a.join().map_err(|_| "A panicked")??;
    let end = &a.last().ok_or("A has no events")?.1;
    assert_eq!(end["status"], 200, "{a:?}");
    let key = end["body"]["tool_calls"][0]["idem_key"]
        .as_str()
        .unwrap_or_default();
    let tool = &a
        .iter()
        .find(|(n, _)| n == "tool")
        .ok_or_else(|| format!("no tool event: {a:?}"))?
        .1;
    assert_eq!(
        (tool["round"].clone(), tool["key"].clone()),
        (json!(0), json!(shorten(key, "api:w1"))),
        "client A's `tool` event: {tool}"
    );
    let _ = &mut served;
    Ok(())
}

struct Serve((Child, String));

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0 .0.kill();
        let _ = self.0 .0.wait();
    }
}

/// `POST path` asking for events: (`event` name, `data` JSON), in order.
fn post_streamed(
    url: &str,
    path: &str,
    body: &Value,
) -> Result<Vec<(String, Value)>, Box<dyn std::error::Error>> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(DEADLINE))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .into();
    let mut response = agent
        .post(&format!("{url}{path}"))
        .header("Accept", "text/event-stream")
        .header("Content-Type", "application/json")
        .header("Authorization", format!("Bearer {TEST_TOKEN}"))
        .send(body.to_string().as_bytes())?;
    let mut events = Vec::new();
    let mut name = String::new();
    for line in BufReader::new(response.body_mut().as_reader()).lines() {
        let line = line?;
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            events.push((std::mem::take(&mut name), serde_json::from_str(data)?));
        }
    }
    Ok(events)
}
