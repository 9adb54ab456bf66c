//! A graceful stop of `serve` waits for an irreversible call in progress
//! as long as the tool's own bounds allow (app/README.md, "Stopping": "A
//! tool call in progress is never cut"). Found by a review: the worker
//! waited a fixed 30 s and exited 0, cutting an email whose answer came
//! at 36 s (within its tool's 60 s timeout); the endpoint had delivered,
//! and the next boot parked its key for a human.

mod common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use common::*;
use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

#[test]
fn a_sigterm_during_a_slow_irreversible_call_lets_it_finish() -> TestResult {
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![
            Reply::tool_call("send_email", json!({"to": "ada@example.com", "body": "out"})),
            Reply::text("sent"),
        ])?,
    )?;
    let sink = WebhookSink::start(loopback(), false)?;
    // Delivered at once, answered 36 s later (within the tool's timeout).
    sink.delay_replies(36_000);
    let dir = tempfile::tempdir()?;
    let api = free_addr()?;
    let config = write_config(dir.path(), &mock.base_url(), &sink.url("/send"), false, api)?;
    let text = std::fs::read_to_string(&config)?.replace("timeout_ms = 5000", "timeout_ms = 60000");
    std::fs::write(&config, text)?;

    let mut serve = spawn(&["serve", "--config", path_str(&config)])?;
    let mut line = String::new();
    BufReader::new(serve.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    assert!(!line.trim().is_empty(), "serve printed no URL");
    let client = Client::new(api, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN));
    client.call("POST", "/agents", Some(&json!({"name": "mailer"})))?;
    client.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "k", "agent": "mailer", "prompt": "tell ada"})),
    )?;
    wait_for("the delivery", || sink.deliveries_len() == 1)?;

    // A graceful stop while the email's answer is on its way.
    signal(&serve, "TERM")?;
    let stopped = Instant::now();
    let mut stderr = serve.stderr.take().ok_or("no stderr")?;
    let status = loop {
        if let Some(status) = serve.try_wait()? {
            break status;
        }
        if stopped.elapsed() > Duration::from_secs(70) {
            serve.kill()?;
            serve.wait()?;
            return Err("serve did not stop".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = stopped.elapsed();
    let mut err_text = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err_text)?;
    sink.delay_replies(0);

    // What the next boot finds.
    let after = run(&["status", "--config", path_str(&config)])?;
    assert!(after.status.success(), "{after:?}");
    let parked = after.json()?["needs_confirmation"].clone();
    assert_eq!(sink.deliveries_len(), 1);
    assert!(
        parked.as_array().is_some_and(Vec::is_empty),
        "serve exited {status} after {took:?} of a graceful stop (stderr: {:?}), \
         cutting the email in progress: the endpoint delivered it, yet the next boot \
         parks its key for a human: {parked}",
        err_text
            .lines()
            .filter(|l| !l.contains(" INFO "))
            .collect::<Vec<_>>()
    );
    Ok(())
}
