//! The admin commands' thin client reaches whatever daemon listens at
//! the config's `[api] listen`; it names the root it is meant for (its
//! store id, `X-Durable-Agent-Root`) and a daemon serving another root
//! refuses (409). Found by a review: with two roots sharing a listen
//! address (the default, for every config without `[api]`) and a token
//! variable, `emit --config A` while a `run` held root A was acknowledged
//! and applied to root B's daemon.

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::*;
use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::json;

#[test]
fn emit_for_a_root_held_by_a_run_is_refused_by_another_roots_daemon() -> TestResult {
    // One slow completion: root A's `run` holds A's lock while it waits.
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![Reply::text("slow").delayed(15_000)])?,
    )?;
    let sink = WebhookSink::start(loopback(), false)?;
    // Two roots, one API address (as two configs without [api] share the
    // default), one token variable.
    let api = free_addr()?;
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let config_a = write_config(dir_a.path(), &mock.base_url(), &sink.url("/send"), false, api)?;
    let config_b = write_config(dir_b.path(), &mock.base_url(), &sink.url("/send"), false, api)?;

    // Root B's daemon, with an agent named as root A's job agent is.
    let mut serve_b = spawn(&["serve", "--config", path_str(&config_b)])?;
    let mut line = String::new();
    BufReader::new(serve_b.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    assert!(!line.trim().is_empty(), "serve B printed no URL");
    let b = Client::new(api, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN));
    b.call("POST", "/agents", Some(&json!({"name": "mailer"})))?;

    // Root A: a job run holds its lock (waiting for the slow completion).
    let job = write_job(dir_a.path(), "job.toml", Some("a-1"), "hello")?;
    let run_a = spawn(&["run", path_str(&job), "--config", path_str(&config_a)])?;
    wait_for("root A's run to ask the model", || mock.requests().len() == 1)?;

    // An emit for root A.
    let emit = run(&[
        "emit",
        "--config",
        path_str(&config_a),
        "--dedup-key",
        "meant-for-root-a",
        "--agent",
        "mailer",
        "--prompt",
        "p",
        "--delay-ms",
        "3600000",
    ])?;
    let status_b = b.call("GET", "/status", None)?;
    let landed_in_b = status_b.to_string().contains("meant-for-root-a");

    signal(&run_a, "KILL")?;
    let _ = finish(run_a);
    signal(&serve_b, "TERM")?;
    let _ = finish(serve_b);

    assert!(
        !landed_in_b,
        "`emit --config A` (root A held by a run) was applied to root B's daemon: \
         B's status now lists trigger meant-for-root-a; emit said: {:?}",
        emit.stdout
    );
    assert_eq!(emit.status.code(), Some(1), "{emit:?}");
    assert!(
        emit.stderr.contains("409") || emit.stderr.contains("another root"),
        "{:?}",
        emit.stderr
    );
    Ok(())
}
