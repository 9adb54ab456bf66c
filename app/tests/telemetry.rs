//! Telemetry lifecycle events end to end: a job with one irreversible tool
//! call, run by the real binary with `[telemetry] events_jsonl` and
//! `http_endpoint`, exports seed 000's envelope in the order things
//! happened — to the file and, the same envelopes, by HTTP POST.

mod common;

use common::*;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// Every body a receiver was POSTed, parsed.
type Posts = Arc<Mutex<Vec<Value>>>;

/// A loopback HTTP receiver keeping every POSTed body, parsed.
fn receiver() -> Result<(String, Posts), Box<dyn std::error::Error>> {
    let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = server.server_addr().to_ip().ok_or("not an IP listener")?;
    let got = Arc::new(Mutex::new(Vec::new()));
    let kept = got.clone();
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = String::new();
            let _ = std::io::Read::read_to_string(request.as_reader(), &mut body);
            if let Ok(v) = serde_json::from_str(&body) {
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(v);
            }
            let _ = request.respond(tiny_http::Response::empty(200));
        }
    });
    Ok((format!("http://{addr}/events"), got))
}

fn events(path: &std::path::Path) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?)
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["event_type"].as_str()).collect()
}

#[test]
fn a_job_with_one_tool_call_exports_the_lifecycle_in_order() -> TestResult {
    let dir = tempfile::tempdir()?;
    let email = json!({"to": "ada@example.com", "body": "the release is out"});
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![
            Reply::tool_call("send_email", email.clone()),
            Reply::text("sent it"),
            // The second run's email goes to a refused port: a failure.
            Reply::tool_call("send_email", email),
            Reply::text("could not send"),
        ])?,
    )?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let mut text = std::fs::read_to_string(&config)?;
    let (posts_url, posts) = receiver()?;
    text = text.replace(
        "[api]",
        &format!("[telemetry]\nevents_jsonl = \"events.jsonl\"\nhttp_endpoint = \"{posts_url}\"\n\n[api]"),
    );
    std::fs::write(&config, &text)?;
    let job = write_job(dir.path(), "job.toml", Some("job-1"), "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;

    let log = dir.path().join("events.jsonl");
    let events = events(&log)?;
    assert_eq!(
        types(&events),
        [
            "agent_start",
            "turn_start",
            "provider_call",
            "pre_tool_use",
            "post_tool_use",
            "provider_call",
            "turn_end"
        ],
        "{events:#?}"
    );
    let agent = summary["agent_id"].as_str().ok_or("no agent id")?;
    for e in &events {
        assert_eq!(e["agent_id"], agent, "{e}");
        assert!(e["session_id"].is_string(), "{e}");
        assert!(e["timestamp_ms"].as_u64().is_some_and(|t| t > 0), "{e}");
    }
    assert_eq!(events[0]["payload"]["name"], "mailer");
    assert_eq!(events[1]["payload"]["work"], "run:job-1");
    assert_eq!(events[2]["payload"]["gen_ai.request.model"], "mock-1");
    assert!(events[2]["payload"]["gen_ai.usage.input_tokens"]
        .as_u64()
        .is_some_and(|n| n > 0));
    assert_eq!(events[3]["payload"]["tool"]["name"], "send_email");
    assert_eq!(events[3]["payload"]["tool"]["irreversible"], true);
    assert!(events[3]["payload"]["tool"]["idempotency_key"]
        .as_str()
        .is_some_and(|k| k.starts_with("run:job-1-r0-c0-")));
    assert_eq!(events[3]["payload"]["args"]["to"], "ada@example.com");
    assert_eq!(events[4]["payload"]["output"], "dlv-1");
    assert_eq!(events[6]["payload"]["ok"], true);
    assert_eq!(events[6]["payload"]["result"]["tool_calls"], 1);
    // Every event of the turn carries its trace id (32 hex), the same one.
    let trace = events[1]["trace_id"]
        .as_str()
        .ok_or("turn_start has no trace id")?;
    assert_eq!(trace.len(), 32);
    assert!(events[1..].iter().all(|e| e["trace_id"] == trace), "{events:#?}");
    assert!(
        events[0].get("trace_id").is_none(),
        "agent_start is outside the turn"
    );
    // The POST sink got the same envelopes (the run waited for its queue).
    let posted = posts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(posted, events, "POSTed envelopes differ from the file's");

    // The same job again, its endpoint refusing: tool_failure, and the
    // turn still ends (the model answers after the failed call).
    let text = text.replace(&sink.url("/send"), "http://127.0.0.1:9/send");
    std::fs::write(&config, text)?;
    let job = write_job(dir.path(), "job2.toml", Some("job-2"), "tell ada again")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert!(out.status.success(), "{out:?}");
    let events = self::events(&log)?;
    assert_eq!(
        types(&events[7..]),
        [
            "agent_start",
            "turn_start",
            "provider_call",
            "pre_tool_use",
            "tool_failure",
            "provider_call",
            "turn_end"
        ],
        "{events:#?}"
    );
    assert!(
        events[11]["payload"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("rejected")),
        "{}",
        events[11]
    );
    Ok(())
}
