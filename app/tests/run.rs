//! `durable-agent run` end to end: the real binary against a mock LLM and a
//! webhook sink on loopback, each run on a fresh root. The property under
//! test is the product's promise: a job finishes, a stop or a kill -9 in
//! the middle loses nothing acknowledged, and `--resume` never performs an
//! irreversible call twice.

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
    mock: MockLlm,
    sink: WebhookSink,
    config: std::path::PathBuf,
}

fn world(replies: Vec<Reply>, dedup: bool) -> Result<World, Box<dyn std::error::Error>> {
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
    Ok(World {
        dir,
        mock,
        sink,
        config,
    })
}

#[test]
fn job_with_an_irreversible_tool_round_runs_to_completion() -> TestResult {
    let w = world(
        vec![Reply::tool_call("send_email", email()), Reply::text("sent it")],
        false,
    )?;
    let job = write_job(w.dir.path(), "job.toml", None, "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["run_id"], "job-1", "{summary}");
    assert_eq!(summary["outcome"], "succeeded");
    assert_eq!(summary["response"], "sent it");
    assert_eq!(summary["tool_calls"][0]["tool"], "send_email");
    assert_eq!(summary["tool_calls"][0]["ok"], true);
    let deliveries = w.sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert!(
        deliveries[0]
            .idempotency_key()
            .is_some_and(|k| k.starts_with("run:job-1-")),
        "{:?}",
        deliveries[0].idempotency_key()
    );
    // The provider saw the job's instructions and prompt.
    let first = &w.mock.request_bodies()[0];
    assert!(
        first.to_string().contains("Send what you are asked to."),
        "{first}"
    );

    // Resuming a finished run runs nothing and sends nothing.
    let again = run(&["run", "--resume", "job-1", "--config", path_str(&w.config)])?;
    assert!(again.status.success(), "{again:?}");
    assert_eq!(again.json()?["outcome"], "already_done");
    assert_eq!(again.json()?["response"], "sent it");
    assert_eq!(w.sink.requests(), 1);
    assert_eq!(w.mock.requests().len(), 2);

    // An unknown run is named, with the runs there are: job runs only,
    // never the per-session bookkeeping runs (`session:…`), which are
    // not runs `--resume` can take and are refused as unknown (found by
    // review: they were listed, and resuming one blamed "another
    // version" for its missing job).
    let unknown = run(&["run", "--resume", "job-9", "--config", path_str(&w.config)])?;
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        unknown.stderr.contains("no run job-9") && unknown.stderr.contains("job-1"),
        "{unknown:?}"
    );
    assert!(!unknown.stderr.contains("session:"), "{unknown:?}");
    // The job's agent's session (its directory under the root's agents/).
    let session = std::fs::read_dir(w.dir.path().join("root/agents"))?
        .next()
        .ok_or("no session directory")??
        .file_name()
        .to_string_lossy()
        .into_owned();
    let session_run = format!("session:{session}");
    let bookkeeping = run(&["run", "--resume", &session_run, "--config", path_str(&w.config)])?;
    assert_eq!(bookkeeping.status.code(), Some(1));
    assert!(
        bookkeeping.stderr.contains(&format!("no run {session_run}")),
        "{bookkeeping:?}"
    );
    Ok(())
}

#[test]
fn sigint_mid_job_stops_cleanly_and_resume_sends_nothing_twice() -> TestResult {
    let w = world(
        vec![
            Reply::tool_call("send_email", email()),
            // Slow: the stop arrives while this completion is awaited.
            Reply::text("never seen").delayed(15_000),
            // The resumed turn continues after its completed round 0 (the
            // round's checkpoint): only round 1 is asked for again.
            Reply::text("done after resume"),
        ],
        false,
    )?;
    let job = write_job(w.dir.path(), "job.toml", Some("slow"), "tell ada")?;
    let child = spawn(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    wait_for("the delivery and the slow completion", || {
        w.sink.deliveries_len() == 1 && w.mock.requests().len() == 2
    })?;
    signal(&child, "INT")?;
    // A second signal is not a second stop. Whether it reaches the handler
    // at all is a race (POSIX merges it into the first while that one is
    // pending; the process may already be exiting): the debounce itself is
    // `interrupt`'s unit test; here it must change nothing.
    let _ = signal(&child, "INT");
    let started = std::time::Instant::now();
    let out = finish(child)?;
    assert!(out.status.success(), "{out:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "stop took {:?}",
        started.elapsed()
    );
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "interrupted", "{summary}");
    assert_eq!(out.stderr.matches("stopping the run").count(), 1, "{out:?}");

    let resumed = run(&["run", "--resume", "slow", "--config", path_str(&w.config)])?;
    assert!(resumed.status.success(), "{resumed:?}");
    let summary = resumed.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["response"], "done after resume");
    // Round 0's call comes from the log: neither asked for nor re-sent.
    assert_eq!(summary["tool_calls"][0]["ok"], true, "{summary}");
    assert_eq!(w.mock.requests().len(), 3, "round 0 was asked for again");
    assert_eq!(
        w.sink.requests(),
        1,
        "the irreversible call reached the sink again"
    );
    Ok(())
}

/// kill -9 while the sink has performed the effect but not yet answered:
/// the ledger holds an INTENT whose outcome is unknown. The provider is
/// asked once for round 0 (the email): a resume continues from that
/// logged decision and asks only for round 1 (the answer).
fn kill_during_delivery(dedup: bool) -> Result<World, Box<dyn std::error::Error>> {
    let replies = vec![
        Reply::tool_call("send_email", email()),
        Reply::text("done after resume"),
    ];
    let w = world(replies, dedup)?;
    w.sink.delay_replies(1_000);
    let job = write_job(w.dir.path(), "job.toml", Some("killed"), "tell ada")?;
    let mut child = spawn(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    wait_for("the delivery", || w.sink.deliveries_len() == 1)?;
    signal(&child, "KILL")?;
    child.wait()?;
    w.sink.delay_replies(0);
    Ok(w)
}

#[test]
fn kill_9_mid_delivery_then_resume_without_dedup_asks_a_human_instead_of_resending() -> TestResult {
    let w = kill_during_delivery(false)?;
    // The resumed run stops at the call whose fate is unknown: blocked,
    // not sent again and not skipped.
    let resumed = run(&["run", "--resume", "killed", "--config", path_str(&w.config)])?;
    assert_eq!(resumed.status.code(), Some(1), "{resumed:?}");
    let summary = resumed.json()?;
    assert_eq!(summary["outcome"], "needs_confirmation", "{summary}");
    let key = summary["needs_confirmation"][0]
        .as_str()
        .ok_or("a key needs confirmation")?
        .to_string();
    assert!(key.starts_with("run:killed-"), "{key}");
    assert!(
        summary["error"].as_str().is_some_and(|e| e.contains(&key)),
        "{summary}"
    );
    assert_eq!(w.sink.requests(), 1, "re-sent to an endpoint that cannot dedup");
    assert_eq!(w.sink.deliveries_len(), 1);
    // `status` lists it and the run waits for a human; they answer with
    // `confirm` (no daemon: direct).
    let status = run(&["status", "--config", path_str(&w.config)])?.json()?;
    assert_eq!(
        status["needs_confirmation"][0]["idem_key"],
        key.as_str(),
        "{status}"
    );
    assert_eq!(status["runs"][0]["status"], "waiting_for_human");
    assert_eq!(status["waiting_for_human"][0]["run_id"], "killed", "{status}");
    // A release cannot answer the call: refused, pointing at `confirm`.
    let release = run(&["release", "killed", "--config", path_str(&w.config)])?;
    assert_eq!(release.status.code(), Some(1), "{release:?}");
    assert!(release.stderr.contains("`confirm`"), "{release:?}");
    let confirmed = run(&[
        "confirm",
        &key,
        "--delivered",
        "--provider-ref",
        "dlv-1",
        "--config",
        path_str(&w.config),
    ])?;
    assert!(confirmed.status.success(), "{confirmed:?}");
    let status = run(&["status", "--config", path_str(&w.config)])?.json()?;
    assert_eq!(status["needs_confirmation"], json!([]), "{status}");
    // Resumed again: the call is answered from the ledger with the
    // human's reference, and the turn completes.
    let done = run(&["run", "--resume", "killed", "--config", path_str(&w.config)])?;
    assert!(done.status.success(), "{done:?}");
    let summary = done.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["tool_calls"][0]["ok"], true, "{summary}");
    assert!(
        summary["tool_calls"][0]["output"]
            .as_str()
            .is_some_and(|o| o.contains("dlv-1")),
        "{summary}"
    );
    assert_eq!(w.sink.requests(), 1, "sent again after the human said delivered");
    assert_eq!(summary["response"], "done after resume", "{summary}");
    assert_eq!(w.mock.requests().len(), 2, "round 0 was asked for again");
    let status = run(&["status", "--config", path_str(&w.config)])?.json()?;
    assert_eq!(status["runs"][0]["status"], "succeeded");
    assert_eq!(status["waiting_for_human"], json!([]), "{status}");
    // Only a parked run can be released; an unknown one is named.
    let late = run(&["release", "killed", "--config", path_str(&w.config)])?;
    assert_eq!(late.status.code(), Some(1), "{late:?}");
    assert!(late.stderr.contains("succeeded"), "{late:?}");
    let unknown = run(&["release", "no such/run", "--config", path_str(&w.config)])?;
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    assert!(unknown.stderr.contains("no such/run"), "{unknown:?}");
    Ok(())
}

#[test]
fn kill_9_mid_delivery_then_resume_with_dedup_delivers_exactly_once() -> TestResult {
    let w = kill_during_delivery(true)?;
    let resumed = run(&["run", "--resume", "killed", "--config", path_str(&w.config)])?;
    assert!(resumed.status.success(), "{resumed:?}");
    let summary = resumed.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["tool_calls"][0]["ok"], true, "{summary}");
    assert_eq!(summary["needs_confirmation"], json!([]));
    let deliveries = w.sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    let key = deliveries[0].idempotency_key().ok_or("key")?;
    // Boot re-sent the INTENT with its key; the sink recognised it.
    assert_eq!(w.sink.deliveries_for(key), 1);
    assert_eq!(w.sink.requests(), 2);
    assert_eq!(summary["response"], "done after resume", "{summary}");
    assert_eq!(w.mock.requests().len(), 2, "round 0 was asked for again");
    Ok(())
}

#[test]
fn fork_records_its_parent_and_carries_the_parents_conversation() -> TestResult {
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
    let job = write_job(dir.path(), "report.toml", None, "tell ada")?;
    let first = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert!(first.status.success(), "{first:?}");
    assert_eq!(first.json()?["run_id"], "report-1");
    let fork = run(&["run", "--fork", "report-1", "--config", path_str(&config)])?;
    assert!(fork.status.success(), "{fork:?}");
    let summary = fork.json()?;
    assert_eq!(summary["run_id"], "report-1-fork-1", "{summary}");
    assert_eq!(summary["parent_run_id"], "report-1");
    assert_eq!(summary["outcome"], "succeeded");
    assert_ne!(
        summary["agent_id"],
        first.json()?["agent_id"],
        "a fork runs on its own agent"
    );
    // The fork's first completion carries the parent's conversation.
    let bodies = mock.request_bodies();
    let fork_request = bodies.get(2).ok_or("the fork asked the provider")?.to_string();
    assert!(fork_request.contains("fork of run report-1"), "{fork_request}");
    assert!(
        fork_request.contains("assistant: echo: tell ada"),
        "{fork_request}"
    );
    Ok(())
}

#[test]
fn provider_garbage_fails_the_run_clearly_and_resume_finishes_it() -> TestResult {
    let w = world(
        vec![Reply::raw("this is not json"), Reply::text("fine now")],
        false,
    )?;
    let job = write_job(w.dir.path(), "job.toml", Some("g"), "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "failed");
    assert!(
        summary["error"]
            .as_str()
            .is_some_and(|e| e.contains("malformed reply")),
        "{summary}"
    );
    // The failed run is kept and can be finished.
    let resumed = run(&["run", "--resume", "g", "--config", path_str(&w.config)])?;
    assert!(resumed.status.success(), "{resumed:?}");
    assert_eq!(resumed.json()?["response"], "fine now");
    Ok(())
}

#[test]
fn unreachable_provider_and_malformed_config_are_clear_errors() -> TestResult {
    let dir = tempfile::tempdir()?;
    let closed = free_addr()?;
    let config = write_config(
        dir.path(),
        &format!("http://{closed}/v1"),
        "http://127.0.0.1:9/send",
        false,
        free_addr()?,
    )?;
    let job = write_job(dir.path(), "job.toml", Some("u"), "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "failed");
    let error = summary["error"].as_str().unwrap_or_default();
    assert!(error.contains("is the provider running"), "{error}");

    std::fs::write(&config, "[provider]\nbase_url = \"http://x\"\nmodel = 3\n")?;
    let bad = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(
        bad.stderr.contains(&format!("{}:3:", config.display())),
        "{bad:?}"
    );
    assert!(bad.stderr.contains("`provider.model`"), "{bad:?}");

    std::fs::write(&job, "agent = \"a\"\n")?;
    std::fs::write(
        &config,
        "[provider]\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\n",
    )?;
    let bad_job = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert_eq!(bad_job.status.code(), Some(1), "{bad_job:?}");
    assert!(
        bad_job.stderr.contains("job.toml") && bad_job.stderr.contains("prompt"),
        "{bad_job:?}"
    );
    Ok(())
}
