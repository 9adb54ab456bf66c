//! OpenTelemetry traces from the binary, received by a loopback OTLP/HTTP
//! receiver the test starts (protobuf, decoded with opentelemetry-proto).
//!
//! The properties: the spans of a two-round run killed (-9) during its
//! second round and resumed form ONE trace — one root span (exported by
//! the resume, with the resume facts), the interrupted process's round 0
//! and the resume's round 1 both its children, each provider attempt and
//! tool call a child of its round, with the GenAI attributes and the
//! idempotency key; and a receiver that is down or never answers slows a
//! run by a bounded amount only.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

/// A loopback OTLP/HTTP receiver keeping every span it is sent.
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Result<Receiver, Box<dyn std::error::Error>> {
        let server = tiny_http::Server::http("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = server.server_addr().to_ip().ok_or("not an IP listener")?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let mut body = Vec::new();
                let ok = std::io::Read::read_to_end(request.as_reader(), &mut body).is_ok()
                    && request.url() == "/v1/traces";
                if let (true, Ok(export)) = (ok, ExportTraceServiceRequest::decode(&body[..])) {
                    let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                    for rs in export.resource_spans {
                        for ss in rs.scope_spans {
                            kept.extend(ss.spans);
                        }
                    }
                }
                let _ = request.respond(tiny_http::Response::empty(if ok { 200 } else { 400 }));
            }
        });
        Ok(Receiver {
            url: format!("http://{addr}/v1/traces"),
            spans,
        })
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// `[telemetry.otlp]` appended to `config`: `endpoint`, quick batches.
fn with_otlp(config: &std::path::Path, endpoint: &str, timeout_ms: u64) -> TestResult {
    let mut text = std::fs::read_to_string(config)?;
    text.push_str(&format!(
        "\n[telemetry]\nevents_jsonl = \"events.jsonl\"\n\n[telemetry.otlp]\nendpoint = \"{endpoint}\"\nscheduled_delay_ms = 50\ntimeout_ms = {timeout_ms}\nshutdown_timeout_ms = {timeout_ms}\n"
    ));
    std::fs::write(config, text)?;
    Ok(())
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn attr_str<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(AnyValue::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn attr_int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(AnyValue::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn attr_bool(span: &Span, key: &str) -> Option<bool> {
    match attr(span, key) {
        Some(AnyValue::BoolValue(b)) => Some(*b),
        _ => None,
    }
}

fn names(spans: &[Span]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

#[test]
fn a_two_round_run_killed_and_resumed_is_one_trace_of_rounds_calls_and_genai_attributes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let receiver = Receiver::start()?;
    // Round 0 asks for the email; round 1's answer is slow (the kill
    // lands in it); the resume's ask of round 1 answers at once.
    let replies = vec![
        Reply::tool_call("send_email", json!({"to": "ada@example.com", "body": "out"})),
        Reply::text("sent").delayed(5_000),
        Reply::text("sent"),
    ];
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let sink = WebhookSink::start(loopback(), true)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        true,
        free_addr()?,
    )?;
    with_otlp(&config, &receiver.url, 2_000)?;
    let job = write_job(dir.path(), "job.toml", Some("otel-1"), "Mail ada")?;

    let mut child = spawn(&["run", path_str(&job), "--config", path_str(&config)])?;
    wait_for("round 1's ask", || mock.requests().len() == 2)?;
    // Round 0's spans ended before the ask; a batch goes every 50 ms.
    wait_for("round 0's spans at the receiver", || {
        receiver.spans().iter().any(|s| s.name == "round 0")
    })?;
    signal(&child, "KILL")?;
    child.wait()?;
    let before_resume = receiver.spans();

    let resumed = run(&["run", "--resume", "otel-1", "--config", path_str(&config)])?;
    assert!(resumed.status.success(), "{resumed:?}");
    assert_eq!(resumed.json()?["outcome"], "succeeded");
    let spans = receiver.spans();

    // One trace.
    let trace = &spans[0].trace_id;
    assert!(
        spans.iter().all(|s| &s.trace_id == trace),
        "spans of two traces: {:?}",
        names(&spans)
    );
    // One root, exported by the resume, with the resume facts.
    let roots: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    assert_eq!(roots.len(), 1, "roots: {:?}", names(&spans));
    let root = roots[0];
    assert!(
        !before_resume.iter().any(|s| s.span_id == root.span_id),
        "the killed process exported the root"
    );
    assert_eq!(root.name, "run otel-1");
    assert_eq!(attr_str(root, "gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(attr_str(root, "gen_ai.request.model"), Some("mock-1"));
    assert_eq!(attr_str(root, "durable_agent.work"), Some("run:otel-1"));
    assert_eq!(attr_bool(root, "durable_agent.resumed"), Some(true));
    assert_eq!(attr_int(root, "durable_agent.resumed.round"), Some(1));
    assert_eq!(attr_bool(root, "durable_agent.resumed.decided"), Some(false));

    // Rounds 0 (the killed process's) and 1 (the resume's) under it.
    let by_name = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let round0 = by_name("round 0");
    let round1 = by_name("round 1");
    assert_eq!((round0.len(), round1.len()), (1, 1), "{:?}", names(&spans));
    let (round0, round1) = (round0[0], round1[0]);
    assert!(before_resume.iter().any(|s| s.span_id == round0.span_id));
    for round in [round0, round1] {
        assert_eq!(
            round.parent_span_id, root.span_id,
            "{} is not the root's child",
            round.name
        );
    }
    assert_eq!(attr_int(round1, "durable_agent.round"), Some(1));

    // A provider attempt in each round (the killed attempt never ended).
    let chats = by_name("chat mock-1");
    assert_eq!(chats.len(), 2, "{:?}", names(&spans));
    for (chat, round) in chats.iter().zip([round0, round1]) {
        assert_eq!(chat.parent_span_id, round.span_id);
        assert_eq!(chat.kind, 3, "a provider call is a CLIENT span");
        assert_eq!(attr_str(chat, "gen_ai.operation.name"), Some("chat"));
        assert_eq!(attr_str(chat, "gen_ai.request.model"), Some("mock-1"));
        assert!(attr_int(chat, "gen_ai.usage.input_tokens").is_some_and(|n| n > 0));
        assert!(attr_int(chat, "gen_ai.usage.output_tokens").is_some_and(|n| n > 0));
    }

    // The tool call, in round 0, with its name, call id and key.
    let tools = by_name("execute_tool send_email");
    assert_eq!(tools.len(), 1, "{:?}", names(&spans));
    let tool = tools[0];
    assert_eq!(tool.parent_span_id, round0.span_id);
    assert_eq!(attr_str(tool, "gen_ai.tool.name"), Some("send_email"));
    assert!(attr_str(tool, "gen_ai.tool.call.id").is_some_and(|id| !id.is_empty()));
    let key = attr_str(tool, "durable_agent.idempotency_key").ok_or("no key")?;
    assert!(key.starts_with("run:otel-1-r0-c0-"), "{key}");
    let delivered = sink.deliveries();
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].idempotency_key(), Some(key));

    // Every span is accounted for: nothing but these.
    let mut counts: HashMap<String, usize> = HashMap::new();
    for s in &spans {
        *counts.entry(s.name.clone()).or_default() += 1;
    }
    assert_eq!(spans.len(), 6, "{counts:?}");

    // The JSONL telemetry carries the same trace id (hex).
    let hex: String = trace.iter().map(|b| format!("{b:02x}")).collect();
    let events = std::fs::read_to_string(dir.path().join("events.jsonl"))?;
    let lines: Vec<serde_json::Value> = events
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let turn_starts: Vec<_> = lines.iter().filter(|l| l["event_type"] == "turn_start").collect();
    assert_eq!(turn_starts.len(), 2, "one per process");
    assert!(turn_starts.iter().all(|l| l["trace_id"] == hex.as_str()));
    assert!(lines.iter().any(|l| l["event_type"] == "provider_call"
        && l["payload"]["gen_ai.usage.input_tokens"].as_u64().is_some()));
    assert!(lines
        .iter()
        .any(|l| l["event_type"] == "pre_tool_use" && l["payload"]["tool"]["idempotency_key"] == key));
    Ok(())
}

/// Wall time of a one-round-trip run (echo: a tool call, then an answer)
/// with `otlp` appended to its config, if any.
fn timed_run(otlp: Option<(&str, u64)>) -> Result<Duration, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let sink = WebhookSink::start(loopback(), true)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        true,
        free_addr()?,
    )?;
    if let Some((endpoint, timeout_ms)) = otlp {
        with_otlp(&config, endpoint, timeout_ms)?;
    }
    let job = write_job(
        dir.path(),
        "job.toml",
        Some("t"),
        "Tell ada@example.com hi, use send_email",
    )?;
    let started = Instant::now();
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    let took = started.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()?["outcome"], "succeeded", "{out:?}");
    Ok(took)
}

#[test]
fn a_receiver_down_or_never_answering_slows_a_run_by_a_bounded_amount_only() -> TestResult {
    const TIMEOUT_MS: u64 = 1_000;
    let baseline = timed_run(None)?;
    // Down: nothing listens on the port.
    let down = format!("http://{}/v1/traces", free_addr()?);
    let with_down = timed_run(Some((&down, TIMEOUT_MS)))?;
    // Slow: accepts, reads nothing, never answers.
    let listener = TcpListener::bind(loopback())?;
    let slow = format!("http://{}/v1/traces", listener.local_addr()?);
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            keep.lock().unwrap_or_else(|e| e.into_inner()).push(conn);
        }
    });
    let with_slow = timed_run(Some((&slow, TIMEOUT_MS)))?;
    eprintln!("run wall time: baseline {baseline:?}, receiver down {with_down:?}, receiver never answering {with_slow:?}");
    // The bound: the last flush at exit (shutdown_timeout_ms) plus slack
    // for a loaded 2-core box; a turn itself never waits for export.
    let bound = baseline + Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2);
    assert!(with_down < bound, "down: {with_down:?} vs bound {bound:?}");
    assert!(with_slow < bound, "slow: {with_slow:?} vs bound {bound:?}");
    Ok(())
}
