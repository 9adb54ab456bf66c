//! A 429, or an endpoint not reached, is a hard failure `[retries]`
//! retries (README, "Hooks and retries": `[retries]  # hard failures
//! only: not reached, 5xx, 429`); for an irreversible tool at an endpoint
//! that deduplicates by key, under the same key, through the ledger.
//! Found by a review: both were final failures there, and `max_retries`
//! never applied. (At an endpoint without dedup they stay final: nothing
//! was delivered, and a re-send needs the dedup the endpoint lacks.)
//! Loopback only: the webhook sink and the mock LLM this test starts.

mod common;

use common::*;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

#[test]
fn a_429_from_a_dedup_endpoint_of_an_irreversible_tool_is_retried_under_its_key() -> TestResult {
    let dir = tempfile::tempdir()?;
    let sink = WebhookSink::start(loopback(), true)?;
    sink.script([429]); // rate-limited once, then it delivers
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![
            Reply::tool_call("send_email", json!({"to": "ada@example.com", "body": "hi"})),
            Reply::text("done"),
        ])?,
    )?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        true,
        free_addr()?,
    )?;
    let text = std::fs::read_to_string(&config)?
        + "\n[retries.tools.send_email]\nmax_retries = 2\nbackoff_base_ms = 10\nbackoff_max_ms = 50\n";
    std::fs::write(&config, text)?;
    let checked = run(&["check-config", path_str(&config)])?;
    assert!(checked.status.success(), "the config is valid: {checked:?}");

    let job = write_job(dir.path(), "mail.toml", Some("mail"), "send it")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    let summary = out.json()?;
    let call = &summary["tool_calls"][0];
    assert_eq!(
        (sink.requests(), sink.deliveries_len()),
        (2, 1),
        "a 429 at a dedup endpoint with max_retries = 2 was not retried; the call: {call}"
    );
    assert_eq!(call["ok"], true, "{summary}");
    Ok(())
}

#[test]
fn a_refused_connection_to_a_dedup_irreversible_endpoint_is_retried() -> TestResult {
    // "not reached" is the first hard failure the docs list. The endpoint
    // is down for the first attempt (nothing listens on the port), and up
    // again before the backoff ends.
    let dir = tempfile::tempdir()?;
    let port = free_addr()?;
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![
            Reply::tool_call("send_email", json!({"to": "ada@example.com", "body": "hi"})),
            Reply::text("done"),
        ])?,
    )?;
    let url = format!("http://{port}/send");
    let config = write_config(dir.path(), &mock.base_url(), &url, true, free_addr()?)?;
    let text = std::fs::read_to_string(&config)?
        + "\n[retries.tools.send_email]\nmax_retries = 2\nbackoff_base_ms = 1500\nbackoff_max_ms = 1500\n";
    std::fs::write(&config, text)?;
    let job = write_job(dir.path(), "mail.toml", Some("mail"), "send it")?;
    let child = spawn(&["run", path_str(&job), "--config", path_str(&config)])?;
    // Let the first attempt meet the closed port, then bring the sink up.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let sink = WebhookSink::start(port, true)?;
    let out = finish(child)?;
    let summary = out.json()?;
    assert_eq!(
        sink.deliveries_len(),
        1,
        "a refused connection at a dedup endpoint with max_retries = 2 was not retried: {}",
        summary["tool_calls"][0]
    );
    Ok(())
}
