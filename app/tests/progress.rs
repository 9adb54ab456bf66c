//! `durable-agent run`'s live progress, end to end: the real binary
//! against a scripted mock LLM and a webhook sink on loopback. stderr (a
//! pipe here: plain lines) carries the round, tool-call, retry, resume and
//! end lines in the order they happened; stdout is exactly the JSON
//! summary; `--quiet` prints no progress at all.

mod common;

use common::*;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

fn email() -> serde_json::Value {
    json!({"to": "ada@example.com", "body": "the release is out"})
}

struct World {
    dir: tempfile::TempDir,
    _mock: MockLlm,
    sink: WebhookSink,
    config: std::path::PathBuf,
}

/// A fresh root; the provider retries `provider_retries` times.
fn world(
    replies: Vec<Reply>,
    dedup: bool,
    provider_retries: u32,
) -> Result<World, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let sink = WebhookSink::start(loopback(), dedup)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        dedup,
        free_addr()?,
    )?;
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(
        &config,
        text.replace("max_retries = 0", &format!("max_retries = {provider_retries}")),
    )?;
    Ok(World {
        dir,
        _mock: mock,
        sink,
        config,
    })
}

/// stdout is the summary and nothing else: the whole of it parses as
/// one JSON object (a parser refuses anything before or after it).
fn summary_alone(out: &Output) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let summary: serde_json::Value = serde_json::from_str(&out.stdout)?;
    assert!(summary.is_object() && out.stdout.starts_with('{'), "{out:?}");
    Ok(summary)
}

/// Each of `wanted` is on a line of `stderr` (a substring of it), each
/// on a later line than the one before.
fn in_order(stderr: &str, wanted: &[&str]) -> TestResult {
    let lines: Vec<&str> = stderr.lines().collect();
    let mut from = 0;
    for w in wanted {
        match lines[from..].iter().position(|l| l.contains(w)) {
            Some(i) => from += i + 1,
            None => return Err(format!("no line with {w:?} after line {from} of stderr:\n{stderr}").into()),
        }
    }
    Ok(())
}

/// The sink's only delivery's key, shortened as progress shows it.
fn shown_key(w: &World, work: &str) -> Result<String, Box<dyn std::error::Error>> {
    let deliveries = w.sink.deliveries();
    let key = deliveries
        .first()
        .and_then(|d| d.idempotency_key())
        .ok_or("no delivery with a key")?;
    Ok(durable_agent_cli::progress::shorten(key, work))
}

#[test]
fn a_run_shows_its_rounds_calls_and_end_on_stderr_and_only_the_summary_on_stdout() -> TestResult {
    let w = world(
        vec![Reply::tool_call("send_email", email()), Reply::text("sent it")],
        false,
        0,
    )?;
    let job = write_job(w.dir.path(), "job.toml", None, "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = summary_alone(&out)?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    let key = shown_key(&w, "run:job-1")?;
    assert!(
        key.starts_with("r0-c0-") && key.len() == "r0-c0-".len() + 8,
        "{key}"
    );
    in_order(
        &out.stderr,
        &[
            "run job-1: agent mailer",
            "round 0: asking the model",
            &format!("round 0: tool send_email [{key}] ok"),
            "round 1: asking the model",
            "run job-1: succeeded (1 tool call)",
        ],
    )?;
    // Progress is not log output: no JSON, no log levels on these lines.
    assert!(!out.stderr.contains(" INFO "), "{}", out.stderr);
    Ok(())
}

#[test]
fn quiet_prints_only_the_summary() -> TestResult {
    let w = world(
        vec![Reply::tool_call("send_email", email()), Reply::text("sent it")],
        false,
        0,
    )?;
    let job = write_job(w.dir.path(), "job.toml", None, "tell ada")?;
    let out = run(&["run", "--quiet", path_str(&job), "--config", path_str(&w.config)])?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(summary_alone(&out)?["outcome"], "succeeded");
    assert_eq!(w.sink.requests(), 1);
    for line in ["run job-1", "round ", "tool send_email", "succeeded"] {
        assert!(
            !out.stderr.contains(line),
            "{line:?} in --quiet's stderr:\n{}",
            out.stderr
        );
    }
    Ok(())
}

#[test]
fn a_provider_that_fails_once_shows_a_retry_line() -> TestResult {
    let w = world(vec![Reply::status(500, None), Reply::text("fine now")], false, 2)?;
    let job = write_job(w.dir.path(), "job.toml", None, "hello")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = summary_alone(&out)?;
    assert_eq!(summary["response"], "fine now", "{summary}");
    // backoff_base_ms = 10: the first retry waits 10 ms.
    in_order(
        &out.stderr,
        &[
            "round 0: asking the model",
            "round 0: provider failed: ",
            "run job-1: succeeded (0 tool calls)",
        ],
    )?;
    in_order(
        &out.stderr,
        &[
            "round 0: asking the model",
            "retry in 0.01 s, attempt 2",
            "run job-1: succeeded (0 tool calls)",
        ],
    )?;
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("retry in") && l.contains("500")),
        "the retry line says why:\n{}",
        out.stderr
    );
    Ok(())
}

#[test]
fn a_resume_after_a_kill_9_mid_tool_shows_the_resumed_round() -> TestResult {
    // A deduplicating endpoint: the resumed round re-sends the email with
    // its logged key and the endpoint answers the first delivery.
    let w = world(
        vec![Reply::tool_call("send_email", email()), Reply::text("sent it")],
        true,
        0,
    )?;
    w.sink.delay_replies(1_500);
    let job = write_job(w.dir.path(), "job.toml", Some("mail"), "tell ada")?;
    let mut child = spawn(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    wait_for("the email to reach the endpoint", || w.sink.deliveries_len() == 1)?;
    signal(&child, "KILL")?;
    child.wait()?;
    w.sink.delay_replies(0);
    w.sink.settle(DEADLINE)?;
    let key = shown_key(&w, "run:mail")?;

    let out = run(&["run", "--resume", "mail", "--config", path_str(&w.config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = summary_alone(&out)?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(w.sink.deliveries_len(), 1, "the email was delivered twice");
    in_order(
        &out.stderr,
        &[
            "run mail: resuming (agent mailer",
            "resuming round 0 from its logged decision",
            &format!("round 0: tool send_email [{key}] ok"),
            "round 1: asking the model",
            "run mail: succeeded (1 tool call)",
        ],
    )?;
    assert!(
        !out.stderr.contains("round 0: asking the model"),
        "a decided round is not asked again:\n{}",
        out.stderr
    );
    Ok(())
}
