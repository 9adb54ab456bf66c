//! A root whose `schedules.json` no command can read (a newer build's
//! file, as after a downgrade, or one that does not parse): every command
//! that boots the root refuses it, naming the file, and so must `verify`
//! ("checks what the boot checks ... exit 1 if damaged",
//! docs/OPERATING.md) and `serve`, before it listens. Found by a review:
//! `verify` called the root healthy, and `serve` printed its URL, then
//! stopped with "outcome unknown: restart to recover", which no restart
//! does.

mod common;

use common::*;
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::webhook_sink::WebhookSink;

/// A booted root (made by `status`), then a `schedules.json` of a newer
/// build put in it.
fn root_with_a_newer_schedules_file(
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
    std::fs::write(
        dir.path().join("root").join("schedules.json"),
        r#"{"version": 2, "schedules": []}"#,
    )?;
    // Every command that boots the root now refuses it, naming the file.
    let status = run(&["status", "--config", path_str(&config)])?;
    assert_eq!(status.status.code(), Some(1), "{status:?}");
    assert!(status.stderr.contains("schedules.json"), "{status:?}");
    Ok((dir, mock, sink, config))
}

#[test]
fn verify_reports_a_schedules_file_every_command_refuses() -> TestResult {
    let (dir, _mock, _sink, _config) = root_with_a_newer_schedules_file()?;
    let root = dir.path().join("root");
    let out = run(&["verify", path_str(&root), "--json"])?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "verify must report a root the boot refuses as damaged (exit 1), naming schedules.json; it said:\n{}",
        out.stdout
    );
    assert!(out.stdout.contains("schedules.json"), "{out:?}");
    assert!(out.stdout.contains("\"newer_schema\""), "{}", out.stdout);
    // A file that does not parse: its own kind, and what to do about it.
    std::fs::write(root.join("schedules.json"), "{not json")?;
    let out = run(&["verify", path_str(&root)])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json = run(&["verify", path_str(&root), "--json"])?;
    assert!(json.stdout.contains("\"schedules_invalid\""), "{}", json.stdout);
    assert!(json.stdout.contains("move it aside"), "{}", json.stdout);
    Ok(())
}

#[test]
fn serve_refuses_such_a_root_before_it_prints_its_url() -> TestResult {
    let (_dir, _mock, _sink, config) = root_with_a_newer_schedules_file()?;
    let out = run(&["serve", "--config", path_str(&config)])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("schedules.json"), "{out:?}");
    assert!(
        out.stdout.trim().is_empty(),
        "serve printed its URL (\"scripts capture it\") for a daemon that never served: stdout {:?}, stderr {:?}",
        out.stdout,
        out.stderr
    );
    assert!(
        !out.stderr.contains("restart to recover"),
        "a restart refuses the same file again: {:?}",
        out.stderr
    );
    Ok(())
}
