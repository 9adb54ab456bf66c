//! HttpOutbox and ConfigTools against the webhook sink on loopback: the
//! idempotency key travels, a deduplicating endpoint absorbs a re-send,
//! refusals are `Rejected` and everything uncertain is `Unknown`.

use std::net::{SocketAddr, TcpListener};

use durable_agent::runtime::{AgentId, SessionId, ToolContext, ToolExecutor, ToolRequest};
use durable_agent::world::{DeliveryError, Outbox};
use durable_agent_cli::config::{HttpGetToolConfig, HttpToolConfig, ReadFileToolConfig, ToolConfig};
use durable_agent_cli::tools::{HttpOutbox, ToolSet};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn tool(name: &str, url: String, irreversible: bool, dedup: bool) -> HttpToolConfig {
    HttpToolConfig {
        name: name.to_string(),
        description: String::new(),
        method: "POST".to_string(),
        url,
        headers: [("X-Team".to_string(), "ops".to_string())].into(),
        allow_hosts: vec![],
        parameters: json!({"type": "object"}),
        irreversible,
        dedup,
        timeout_ms: 500,
    }
}

#[test]
fn outbox_sends_payload_with_idempotency_key() {
    let sink = WebhookSink::start(loopback(), false).expect("sink");
    let outbox = HttpOutbox::new(&tool("send_email", sink.url("/send"), true, false));
    assert!(!outbox.supports_dedup("notify"));
    let payload = json!({"to": "a@example.com", "body": "hi"});
    let provider_ref = outbox
        .send("sess-t0-r0-c0-abc", "send_email", &payload)
        .expect("delivered");
    assert_eq!(provider_ref, "dlv-1");
    let deliveries = sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    let request = &deliveries[0].request;
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/send");
    assert_eq!(deliveries[0].idempotency_key(), Some("sess-t0-r0-c0-abc"));
    assert_eq!(request.header("x-team"), Some("ops"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&request.body).expect("JSON body");
    assert_eq!(body, payload);
}

#[test]
fn dedup_endpoint_delivers_a_resend_once() {
    let sink = WebhookSink::start(loopback(), true).expect("sink");
    let outbox = HttpOutbox::new(&tool("pay", sink.url("/pay"), true, true));
    assert!(outbox.supports_dedup("notify"));
    let payload = json!({"amount": 5});
    let first = outbox.send("key-1", "pay", &payload).expect("first");
    let again = outbox.send("key-1", "pay", &payload).expect("re-send");
    assert_eq!(first, again, "a re-send returns the original reference");
    assert_eq!(sink.deliveries_for("key-1"), 1);
    assert_eq!(sink.deliveries_len(), 1);
    assert_eq!(sink.requests(), 2);
    outbox.send("key-2", "pay", &payload).expect("another key");
    assert_eq!(sink.deliveries_len(), 2);
}

#[test]
fn client_errors_are_rejected_and_server_errors_unknown() {
    let sink = WebhookSink::start(loopback(), false).expect("sink");
    let outbox = HttpOutbox::new(&tool("send", sink.url("/send"), true, false));
    sink.script([422, 409, 500]);
    match outbox.send("k", "send", &json!({})) {
        Err(DeliveryError::Rejected { idem_key, reason }) => {
            assert_eq!(idem_key, "k");
            assert!(reason.contains("422"), "{reason}");
        }
        other => panic!("422 should be Rejected, got {other:?}"),
    }
    // 409: the same key is still being processed; it may yet land.
    assert!(matches!(
        outbox.send("k", "send", &json!({})),
        Err(DeliveryError::Unknown { .. })
    ));
    assert!(matches!(
        outbox.send("k", "send", &json!({})),
        Err(DeliveryError::Unknown { .. })
    ));
    assert_eq!(sink.deliveries_len(), 0);
    assert_eq!(sink.requests(), 3);
}

#[test]
fn sink_down_is_rejected_because_a_refused_connection_sent_nothing() {
    // A stopped sink's port refuses connections once tiny_http's accept
    // thread has let go of the listener (it closes it asynchronously after
    // the drop: poll a little) — unless a parallel test got the same port
    // meanwhile: then take another one.
    let refused = |addr| {
        (0..50).any(|_| match std::net::TcpStream::connect(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => true,
            _ => {
                std::thread::sleep(std::time::Duration::from_millis(20));
                false
            }
        })
    };
    let url = (0..20)
        .find_map(|_| {
            let sink = WebhookSink::start(loopback(), false).expect("sink");
            let (addr, url) = (sink.addr(), sink.url("/send"));
            drop(sink);
            refused(addr).then_some(url)
        })
        .expect("a refused port within 20 tries");
    let outbox = HttpOutbox::new(&tool("send", url, true, false));
    match outbox.send("k9", "send", &json!({})) {
        Err(DeliveryError::Rejected { idem_key, reason }) => {
            assert_eq!(idem_key, "k9");
            assert!(reason.contains("connection failed"), "{reason}");
        }
        other => panic!("a refused connection should be Rejected, got {other:?}"),
    }
}

#[test]
fn no_answer_within_the_timeout_is_unknown() {
    // Accepts connections (kernel backlog) but never answers.
    let silent = TcpListener::bind(loopback()).expect("bind");
    let addr = silent.local_addr().expect("addr");
    let outbox = HttpOutbox::new(&tool("send", format!("http://{addr}/send"), true, false));
    let started = std::time::Instant::now();
    assert!(matches!(
        outbox.send("k", "send", &json!({})),
        Err(DeliveryError::Unknown { .. })
    ));
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
}

fn ctx<'a>(agent: &'a AgentId, session: &'a SessionId, key: &'a str) -> ToolContext<'a> {
    ToolContext {
        agent,
        session,
        call_id: "call-1",
        idempotency_key: key,
        now: 1,
    }
}

#[test]
fn config_tools_run_reversible_tools_and_refuse_irreversible_ones() -> std::io::Result<()> {
    let sink = WebhookSink::start(loopback(), false).expect("sink");
    let workspace = tempfile::tempdir()?;
    std::fs::write(workspace.path().join("notes.txt"), "remember")?;
    let set = ToolSet::from_config(
        &[
            ToolConfig::Http(tool("lookup", sink.url("/lookup"), false, false)),
            ToolConfig::Http(tool("send", sink.url("/send"), true, true)),
            ToolConfig::ReadFile(ReadFileToolConfig {
                name: "read_file".into(),
                description: String::new(),
                workspace: workspace.path().to_path_buf(),
                max_bytes: 1024,
            }),
            ToolConfig::HttpGet(HttpGetToolConfig {
                name: "http_get".into(),
                description: String::new(),
                timeout_ms: 500,
                max_bytes: 1024,
                allow_hosts: vec!["127.0.0.1".into()],
            }),
        ],
        None,
    );
    assert_eq!(set.outboxes.keys().collect::<Vec<_>>(), vec!["send"]);
    let agent = AgentId::from_hex("00000000000000a1").expect("id");
    let session = SessionId::from_hex("00000000000000b1").expect("id");
    let c = ctx(&agent, &session, "idem-7");
    let call = |tool: &str, args: serde_json::Value| ToolRequest {
        tool: tool.to_string(),
        args,
        irreversible: false,
        invalid_args: None,
    };
    let tools = &set.executor;

    let out = tools.execute(&c, &call("lookup", json!({"q": 1}))).expect("runs");
    assert!(out.ok, "{out:?}");
    assert!(out.output.contains("dlv-1"), "{out:?}");
    assert_eq!(sink.deliveries()[0].idempotency_key(), Some("idem-7"));

    sink.script([404]);
    let out = tools.execute(&c, &call("lookup", json!({}))).expect("runs");
    assert!(!out.ok && out.output.contains("HTTP 404"), "{out:?}");

    let out = tools
        .execute(&c, &call("read_file", json!({"path": "notes.txt"})))
        .expect("runs");
    assert_eq!((out.ok, out.output.as_str()), (true, "remember"));
    let out = tools
        .execute(&c, &call("read_file", json!({"path": "../x"})))
        .expect("runs");
    assert!(!out.ok);
    let out = tools.execute(&c, &call("read_file", json!({}))).expect("runs");
    assert!(!out.ok && out.output.contains("`path`"), "{out:?}");

    let out = tools
        .execute(&c, &call("http_get", json!({"url": sink.url("/page")})))
        .expect("runs");
    assert!(out.ok, "{out:?}");
    assert_eq!(
        sink.deliveries().last().map(|d| d.request.method.clone()),
        Some("GET".into())
    );

    let out = tools.execute(&c, &call("nope", json!({}))).expect("runs");
    assert!(!out.ok && out.output.contains("unknown tool"), "{out:?}");

    // Irreversible calls belong to the ledger: an executor-level fault,
    // before any request is made.
    let before = sink.requests();
    assert!(tools.execute(&c, &call("send", json!({}))).is_err());
    let mut flagged = call("lookup", json!({}));
    flagged.irreversible = true;
    assert!(tools.execute(&c, &flagged).is_err());
    assert_eq!(sink.requests(), before);
    Ok(())
}

/// A send still queued behind a delayed reply when its sender died is on
/// record once `settle` returns (the kill soak answers confirmations after
/// it), and the settle request itself is never counted.
#[test]
fn settle_waits_for_queued_sends_and_is_not_a_delivery() {
    let sink = WebhookSink::start(loopback(), false).expect("sink");
    sink.delay_replies(200);
    let send = |i: u32| {
        let outbox = HttpOutbox::new(&tool("send_email", sink.url("/send"), true, false));
        // The outcome does not matter here (the caller may time out).
        std::thread::spawn(move || {
            let _ = outbox.send(&format!("k{i}"), "send_email", &json!({"i": i}));
        })
    };
    let first = send(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sink.deliveries_len() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The second send queues behind the first's delayed reply.
    let second = send(1);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(sink.deliveries_len(), 1, "the second send is still queued");
    sink.settle(std::time::Duration::from_secs(10)).expect("settle");
    assert_eq!(sink.deliveries_len(), 2, "a queued send was not on record");
    assert_eq!(sink.requests(), 2, "the settle request was counted");
    for s in [first, second] {
        s.join().expect("sender");
    }
}
