//! End to end: a `schedules.json` holding a schedule `POST /schedules`
//! refuses (here `period_ms = 0`: a damaged or hand-edited file) is
//! damage `verify` reports (`schedules_invalid`, naming the file, exit 1),
//! and `serve` refuses it naming the file before it listens (no URL
//! printed), instead of a worker that panics dividing by the period on
//! its first scheduler pass at every restart.
//!
//! docs/OPERATING.md: `verify` checks "`schedules.json` ...: it parses, a
//! newer build did not write it, and it holds only what `POST /schedules`
//! accepts ... `serve` and every command that boots the root refuse it
//! otherwise, before listening".

mod common;

use common::*;
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::webhook_sink::WebhookSink;

const ZERO_PERIOD: &str = r#"{
  "version": 1,
  "schedules": [
    {"id": "daily", "agent": "mailer", "prompt": "report", "period_ms": 0}
  ]
}"#;

/// A booted root (made by `status`), then a schedules file holding a
/// schedule with a zero period.
fn root_with_a_zero_period_schedule(
) -> Result<(tempfile::TempDir, MockLlm, WebhookSink, std::path::PathBuf), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let booted = run(&["status", "--config", path_str(&config)])?;
    assert!(booted.status.success(), "{booted:?}");
    std::fs::write(dir.path().join("root").join("schedules.json"), ZERO_PERIOD)?;
    Ok((dir, mock, sink, config))
}

#[test]
fn verify_does_not_call_a_root_healthy_whose_schedules_file_serve_cannot_run() -> TestResult {
    let (dir, _mock, _sink, _config) = root_with_a_zero_period_schedule()?;
    let root = dir.path().join("root");
    let out = run(&["verify", path_str(&root), "--json"])?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "verify called a root healthy whose schedules.json holds a schedule with period_ms = 0 (which \
         `serve` cannot run); it said:\n{}",
        out.stdout
    );
    assert!(out.stdout.contains("schedules.json"), "{}", out.stdout);
    Ok(())
}

#[test]
fn serve_refuses_a_zero_period_schedule_naming_the_file_before_it_prints_its_url() -> TestResult {
    let (_dir, _mock, _sink, config) = root_with_a_zero_period_schedule()?;
    let out = run(&["serve", "--config", path_str(&config)])?;
    assert!(
        out.stderr.contains("schedules.json"),
        "serve stopped (exit {:?}) without naming schedules.json: stdout {:?}, stderr {:?}",
        out.status.code(),
        out.stdout,
        out.stderr
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stdout.trim().is_empty(),
        "serve printed its URL for a daemon that never served: stdout {:?}, stderr {:?}",
        out.stdout,
        out.stderr
    );
    Ok(())
}
