//! Tools are fenced: `http_get` and HTTP tools refuse the daemon's own
//! API, and loopback, link-local or private addresses not listed in the
//! tool's `allow_hosts`, BEFORE any connection (checked against a listener
//! the test owns: nothing is ever accepted; 169.254.169.254 is refused by
//! its address, never connected to). Header secrets come from `${VAR}`
//! and never reach a log, even at `RUST_LOG=trace`.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use common::*;
use durable_agent::runtime::{AgentId, SessionId, ToolContext, ToolExecutor, ToolRequest};
use durable_agent::world::{DeliveryError, Outbox};
use durable_agent_cli::config::{HttpGetToolConfig, HttpToolConfig, ToolConfig};
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::tools::{HttpOutbox, ToolSet};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

fn http_get(allow_hosts: &[&str]) -> ToolConfig {
    ToolConfig::HttpGet(HttpGetToolConfig {
        name: "http_get".into(),
        description: String::new(),
        timeout_ms: 2_000,
        max_bytes: 1024,
        allow_hosts: allow_hosts.iter().map(|h| h.to_string()).collect(),
    })
}

fn http_tool(url: String, headers: &[(&str, &str)]) -> HttpToolConfig {
    HttpToolConfig {
        name: "send".into(),
        description: String::new(),
        method: "POST".into(),
        url,
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        allow_hosts: vec![],
        parameters: json!({"type": "object"}),
        irreversible: true,
        dedup: false,
        timeout_ms: 2_000,
    }
}

/// A listener nobody should reach: non-blocking, so `accepted` can ask.
fn trap() -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(loopback())?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn accepted(listener: &TcpListener) -> bool {
    listener.accept().is_ok()
}

/// Run `http_get` on `url` with `set`; the output (ok, text).
fn get(set: &ToolSet, url: &str) -> (bool, String) {
    let agent = AgentId::from_hex("00000000000000a1").expect("id");
    let session = SessionId::from_hex("00000000000000b1").expect("id");
    let ctx = ToolContext {
        agent: &agent,
        session: &session,
        call_id: "c1",
        idempotency_key: "k1",
        now: 1,
    };
    let call = ToolRequest {
        tool: "http_get".into(),
        args: json!({"url": url}),
        irreversible: false,
        invalid_args: None,
    };
    let out = set.executor.execute(&ctx, &call).expect("the executor runs");
    (out.ok, out.output)
}

#[test]
fn http_get_refuses_loopback_link_local_and_the_daemon_before_connecting() -> TestResult {
    let target = trap()?;
    let daemon = trap()?;
    let set = ToolSet::from_config(&[http_get(&[])], Some(daemon.local_addr()?));

    let (ok, out) = get(&set, &format!("http://{}/x", target.local_addr()?));
    assert!(!ok && out.contains("refused by the tool fence"), "{out}");
    assert!(out.contains("loopback, link-local or private"), "{out}");
    assert!(!accepted(&target), "a refused loopback request connected");

    // Refused by its address: no connection is attempted (a connection
    // would wait for the 2 s timeout; nothing listens there on a test box).
    let started = Instant::now();
    let (ok, out) = get(&set, "http://169.254.169.254/latest/meta-data/");
    assert!(!ok && out.contains("refused by the tool fence"), "{out}");
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "took {:?}",
        started.elapsed()
    );
    let (ok, out) = get(&set, "http://[::ffff:169.254.169.254]/");
    assert!(!ok && out.contains("refused by the tool fence"), "{out}");

    // Listing loopback lets the target through, never the daemon.
    let listed = ToolSet::from_config(&[http_get(&["127.0.0.1"])], Some(daemon.local_addr()?));
    let (ok, out) = get(&listed, &format!("http://{}/agents", daemon.local_addr()?));
    assert!(!ok && out.contains("own API"), "{out}");
    assert!(!accepted(&daemon), "the daemon's port was connected to");
    let (ok, out) = get(&listed, "http://localhost:1/");
    assert!(
        !ok && out.contains("refused by the tool fence"),
        "localhost is not listed: {out}"
    );
    // A host outside a non-empty list is refused before its name is even
    // looked up to connect.
    let (ok, out) = get(&listed, "http://example.invalid/");
    assert!(!ok && out.contains("not in the tool's allow_hosts"), "{out}");
    Ok(())
}

#[test]
fn listed_loopback_is_reachable() -> TestResult {
    let sink = WebhookSink::start(loopback(), false)?;
    let set = ToolSet::from_config(&[http_get(&["127.0.0.1"])], None);
    let (ok, out) = get(&set, &sink.url("/page"));
    assert!(ok, "{out}");
    assert_eq!(sink.requests(), 1);
    Ok(())
}

#[test]
fn an_irreversible_tool_never_reaches_the_daemon_and_says_not_sent() -> TestResult {
    let daemon = trap()?;
    let addr: SocketAddr = daemon.local_addr()?;
    let outbox = HttpOutbox::fenced(&http_tool(format!("http://{addr}/agents"), &[]), Some(addr));
    match outbox.send("k1", "send", &json!({})) {
        Err(DeliveryError::Rejected { reason, .. }) => assert!(reason.contains("own API"), "{reason}"),
        other => panic!("expected Rejected (certainly not sent), got {other:?}"),
    }
    assert!(!accepted(&daemon));
    Ok(())
}

#[test]
fn header_secrets_come_from_the_environment_and_never_reach_a_log() -> TestResult {
    const SECRET: &str = "sekrit-4f1c9e77d2";
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
    let text = std::fs::read_to_string(&config)?.replace(
        "dedup = true\n",
        "dedup = true\nheaders = { Authorization = \"Bearer ${DA_FENCE_TEST_SECRET}\" }\n",
    );
    std::fs::write(&config, &text)?;
    assert!(!text.contains(SECRET));
    let job = write_job(dir.path(), "job.toml", Some("job-1"), "mail ada")?;
    let out = finish(
        std::process::Command::new(BIN)
            .args(["run", path_str(&job), "--config", path_str(&config)])
            .env("RUST_LOG", "trace,ureq_proto=trace")
            .env("DA_FENCE_TEST_SECRET", SECRET)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?,
    )?;
    assert!(out.status.success(), "{}", out.stderr);
    let deliveries = sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(
        deliveries[0].request.header("authorization"),
        Some(format!("Bearer {SECRET}").as_str())
    );
    assert!(out.stderr.contains("TRACE"), "trace logging was on");
    // The HTTP client's wire dump (ureq_proto::util, 16 bytes a line,
    // hex then text) would split the secret across lines: no dump at all,
    // and no 8-character piece of the secret anywhere.
    assert!(
        !out.stderr.contains("ureq_proto::util"),
        "the HTTP wire dump is on"
    );
    let pieces: Vec<&str> = (0..=SECRET.len() - 8).map(|i| &SECRET[i..i + 8]).collect();
    for text in [&out.stderr, &out.stdout] {
        for piece in &pieces {
            assert!(
                !text.contains(piece),
                "a piece of the secret ({piece}) reached a log"
            );
        }
    }
    for entry in walk(&dir.path().join("root"))? {
        let bytes = std::fs::read(&entry)?;
        assert!(
            !String::from_utf8_lossy(&bytes).contains(SECRET),
            "{} holds the secret",
            entry.display()
        );
    }

    // An unset variable: the call fails, certainly not sent.
    let job = write_job(dir.path(), "job2.toml", Some("job-2"), "mail bob")?;
    let out = finish(
        std::process::Command::new(BIN)
            .args(["run", path_str(&job), "--config", path_str(&config)])
            .env_remove("DA_FENCE_TEST_SECRET")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?,
    )?;
    assert!(out.stdout.contains("DA_FENCE_TEST_SECRET"), "{out:?}");
    assert_eq!(sink.deliveries().len(), 1, "nothing sent without the secret");
    Ok(())
}

fn walk(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(walk(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}
