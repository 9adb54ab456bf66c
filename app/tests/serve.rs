//! `durable-agent serve` end to end, with `emit`, `status` and `confirm`
//! as its clients: a one-time trigger fires exactly once across a kill -9
//! of the daemon, a second daemon on the same root is refused, and the
//! commands work both through the API and directly on an idle root.

mod common;

use std::time::Duration;

use common::*;
use durable_agent_cli::mock_llm::MockLlm;
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

fn trigger_statuses(status: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(map) = status["triggers"].as_object() {
        for (state, list) in map {
            for t in list.as_array().into_iter().flatten() {
                out.push((t["dedup_key"].as_str().unwrap_or("").to_string(), state.clone()));
            }
        }
    }
    out
}

#[test]
fn one_time_trigger_fires_exactly_once_across_a_kill_9_restart_of_serve() -> TestResult {
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
    let (mut first, url) = start_serve(&config)?;
    let api = client(&url)?;
    let created = api.call(
        "POST",
        "/agents",
        Some(&json!({"name": "mailer", "instructions": "Send mail."})),
    )?;
    assert!(created["id"].is_string(), "{created}");
    // Through the CLI: the root is locked by the daemon, so `emit` asks it.
    let emitted = run(&[
        "emit",
        "--config",
        path_str(&config),
        "--dedup-key",
        "remind-ada",
        "--agent",
        "mailer",
        "--prompt",
        "remind ada",
        "--delay-ms",
        "1500",
    ])?;
    assert!(emitted.status.success(), "{emitted:?}");
    assert_eq!(emitted.json()?["duplicate"], false);
    let stored_fire_at = emitted.json()?["fire_at_ms"].clone();
    assert!(stored_fire_at.as_u64().is_some(), "{stored_fire_at}");
    // The daemon dies before the trigger is due.
    signal(&first, "KILL")?;
    first.wait()?;
    assert_eq!(sink.requests(), 0);

    let (second, url) = start_serve(&config)?;
    let api = client(&url)?;
    wait_for("the trigger to fire", || sink.deliveries_len() == 1)?;
    wait_for("the trigger to be DONE", || {
        api.call("GET", "/status", None)
            .is_ok_and(|s| trigger_statuses(&s) == vec![("remind-ada".to_string(), "DONE".to_string())])
    })?;
    // Emitting the same key again is a no-op, and nothing fires twice.
    let again = api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "remind-ada", "agent": "mailer", "prompt": "remind ada"})),
    )?;
    assert_eq!(again["duplicate"], true);
    // The answer is the trigger as stored, not the time this request asked.
    assert_eq!(again["fire_at_ms"], stored_fire_at, "{again}");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(sink.requests(), 1);
    let key = sink.deliveries()[0].idempotency_key().unwrap_or("").to_string();
    assert!(key.starts_with("trigger:remind-ada-"), "{key}");

    // A turn over the API, then a graceful stop.
    let turn = api.call("POST", "/agents/mailer/turn", Some(&json!({"prompt": "hello"})))?;
    assert_eq!(turn["tool_calls"][0]["tool"], "send_email", "{turn}");
    signal(&second, "TERM")?;
    let out = finish(second)?;
    assert!(out.status.success(), "{out:?}");

    // No daemon now: `status` boots the root itself.
    let status = run(&["status", "--config", path_str(&config)])?;
    assert!(status.status.success(), "{status:?}");
    let status = status.json()?;
    assert_eq!(
        trigger_statuses(&status),
        vec![("remind-ada".to_string(), "DONE".to_string())]
    );
    assert_eq!(status["agents"][0]["name"], "mailer");
    assert_eq!(status["agents"][0]["turns"], 2);
    Ok(())
}

#[test]
fn a_second_serve_on_the_same_root_is_refused_with_the_locked_error() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo(loopback())?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        "http://127.0.0.1:9/send",
        false,
        free_addr()?,
    )?;
    let (first, url) = start_serve(&config)?;
    let second = run(&["serve", "--config", path_str(&config)])?;
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    assert!(
        second.stderr.contains("is in use by another durable-agent"),
        "{second:?}"
    );
    // A bad request names its problem; an unknown key is a 404.
    let api = client(&url)?;
    let err = api
        .call(
            "POST",
            "/confirm",
            Some(&json!({"idem_key": "nope", "delivered": true})),
        )
        .expect_err("unknown key");
    assert!(
        err.to_string().contains("404") && err.to_string().contains("nope"),
        "{err}"
    );
    let err = api
        .call("POST", "/triggers", Some(&json!({"agent": "x"})))
        .expect_err("bad body");
    assert!(
        err.to_string().contains("400") && err.to_string().contains("dedup_key"),
        "{err}"
    );
    let err = api
        .call(
            "POST",
            "/triggers",
            Some(&json!({"dedup_key": "k", "agent": "ghost", "prompt": "p"})),
        )
        .expect_err("unknown agent");
    assert!(
        err.to_string().contains("404") && err.to_string().contains("ghost"),
        "{err}"
    );
    signal(&first, "INT")?;
    let out = finish(first)?;
    assert!(out.status.success(), "{out:?}");
    Ok(())
}

/// The bucket in a scheduled delivery's idempotency key
/// (`trigger:scheduled:{id}:{bucket}-r0-c0-…`).
fn bucket_of(key: &str) -> Option<u64> {
    let rest = key.strip_prefix("trigger:scheduled:tick:")?;
    rest.split('-').next()?.parse().ok()
}

#[test]
fn recurring_schedule_fires_each_bucket_at_most_once_across_kill_9_restarts_of_serve() -> TestResult {
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
    let (first, url) = start_serve(&config)?;
    let api = client(&url)?;
    api.call("POST", "/agents", Some(&json!({"name": "mailer"})))?;
    let schedule = json!({"id": "tick", "agent": "mailer", "prompt": "tick", "period_ms": 1000});
    let added = api.call("POST", "/schedules", Some(&schedule))?;
    assert_eq!(added["created"], true, "{added}");
    // A retried request is a no-op; a bad period is refused.
    assert_eq!(api.call("POST", "/schedules", Some(&schedule))?["created"], false);
    let bad = json!({"id": "fast", "agent": "mailer", "prompt": "p", "period_ms": 1});
    let err = api.call("POST", "/schedules", Some(&bad)).expect_err("too fast");
    assert!(err.to_string().contains("400"), "{err}");
    // The first bucket fires at once, the next one a period later.
    wait_for("two buckets to fire", || sink.deliveries_len() >= 2)?;
    signal(&first, "KILL")?;
    finish(first)?;
    // Down for more than two periods: the missed buckets must coalesce.
    std::thread::sleep(Duration::from_millis(2_300));

    // The schedule is durable: no new POST after the restart.
    let (second, url) = start_serve(&config)?;
    let before = sink.deliveries_len();
    wait_for("a bucket after the restart", || sink.deliveries_len() > before)?;
    assert!(
        mock.request_bodies()
            .iter()
            .any(|b| b.to_string().contains("overdue: schedule tick missed")),
        "no coalescing note reached the model"
    );
    // Killed again right away, maybe mid-bucket: the next boot reclaims.
    signal(&second, "KILL")?;
    finish(second)?;
    let (third, url3) = start_serve(&config)?;
    let before = sink.deliveries_len();
    wait_for("a bucket after the second restart", || {
        sink.deliveries_len() > before
    })?;
    let status = client(&url3)?.call("GET", "/status", None)?;
    assert_eq!(status["schedules"][0]["id"], "tick", "{status}");
    signal(&third, "TERM")?;
    let out = finish(third)?;
    assert!(out.status.success(), "{out:?}");
    drop(url);

    let mut buckets: Vec<u64> = sink
        .deliveries()
        .iter()
        .map(|d| {
            d.idempotency_key()
                .and_then(bucket_of)
                .ok_or("a delivery without a bucket")
        })
        .collect::<Result<_, _>>()?;
    let fired = buckets.len();
    buckets.sort_unstable();
    buckets.dedup();
    assert_eq!(buckets.len(), fired, "a bucket fired twice: {buckets:?}");
    // Coalesced: far fewer firings than periods elapsed would be, and the
    // gap of the first restart is one jump, not a burst.
    assert!(buckets.windows(2).any(|w| w[1] - w[0] >= 2), "{buckets:?}");
    Ok(())
}

/// A turn's completion is in flight off the worker: while it waits, the
/// API answers, another agent runs a whole turn, and a second turn of the
/// same agent is refused (409) instead of queueing behind it.
#[test]
fn a_slow_completion_stalls_no_other_request_and_no_other_agent() -> TestResult {
    let dir = tempfile::tempdir()?;
    let script: durable_agent_cli::mock_llm::Script = serde_json::from_value(json!({"replies": [
        {"delay_ms": 3000, "text": "slow answer"},
        {"text": "quick answer"},
    ]}))?;
    let mock = MockLlm::scripted(loopback(), script)?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let (mut child, url) = start_serve(&config)?;
    let api = client(&url)?;
    for name in ["slow", "quick"] {
        api.call("POST", "/agents", Some(&json!({"name": name})))?;
    }
    let slow = {
        let api = client(&url)?;
        std::thread::spawn(move || {
            api.call(
                "POST",
                "/agents/slow/turn",
                Some(&json!({"prompt": "take your time"})),
            )
        })
    };
    wait_for("the slow completion to be asked", || mock.requests().len() == 1)?;

    if slow.is_finished() {
        let early = slow.join().map_err(|_| "panicked")?;
        return Err(format!("the slow turn ended early: {early:?}").into());
    }
    let status = api.call("GET", "/status", None)?;
    assert!(
        status["agents"].is_array() || status["agents"].is_object(),
        "{status}"
    );
    let second = api.call("POST", "/agents/slow/turn", Some(&json!({"prompt": "again"})));
    let refused = format!("{second:?}");
    assert!(
        refused.contains("409") && refused.contains("turn in flight"),
        "{refused}"
    );
    let quick = api.call("POST", "/agents/quick/turn", Some(&json!({"prompt": "hurry"})))?;
    assert_eq!(quick["response"], "quick answer", "{quick}");
    assert!(!slow.is_finished(), "the slow turn answered before the quick one");

    let slow = slow.join().map_err(|_| "slow turn thread panicked")??;
    assert_eq!(slow["response"], "slow answer", "{slow}");
    signal(&child, "TERM")?;
    let status = child.wait()?;
    assert!(status.success(), "serve exited {status}");
    Ok(())
}

/// A job run killed mid-turn (its round 0's email sent, round 1's
/// completion awaited) is finished by the next `serve`: boot emits the
/// RESUME trigger `resume:run:{id}` and the scheduler fires it — the turn
/// continues after its completed round (not asked again, the email not
/// re-sent) and the run is recorded succeeded.
#[test]
fn a_job_killed_mid_turn_is_finished_by_serve_through_its_resume_trigger() -> TestResult {
    use durable_agent_cli::mock_llm::{Reply, Script};
    let dir = tempfile::tempdir()?;
    let replies = vec![
        Reply::tool_call("send_email", json!({"to": "ada@example.com", "body": "hi"})),
        Reply::text("never seen").delayed(15_000),
        Reply::text("finished by serve"),
    ];
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let job = write_job(dir.path(), "job.toml", Some("job-1"), "tell ada")?;
    let child = spawn(&["run", path_str(&job), "--config", path_str(&config)])?;
    wait_for("the delivery and the slow completion", || {
        sink.deliveries_len() == 1 && mock.requests().len() == 2
    })?;
    signal(&child, "KILL")?;
    let _ = finish(child)?;

    let (mut serve, url) = start_serve(&config)?;
    let api = client(&url)?;
    let mut status = Value::Null;
    wait_for("the RESUME trigger to finish the run", || {
        status = api.call("GET", "/status", None).unwrap_or(Value::Null);
        trigger_statuses(&status)
            .iter()
            .any(|(key, state)| key.starts_with("resume:run:job-1@") && state == "DONE")
    })?;
    let runs = status["runs"].as_array().cloned().unwrap_or_default();
    assert!(
        runs.iter()
            .any(|r| r["run_id"] == "job-1" && r["status"] == "succeeded"),
        "{status}"
    );
    assert_eq!(mock.requests().len(), 3, "round 0 was asked for again");
    assert_eq!(sink.requests(), 1, "the email was re-sent");
    signal(&serve, "TERM")?;
    assert!(serve.wait()?.success());
    // The next boot finds the work done: no second RESUME.
    let (mut again, url) = start_serve(&config)?;
    let status = client(&url)?.call("GET", "/status", None)?;
    let resumes = trigger_statuses(&status)
        .into_iter()
        .filter(|(key, _)| key.starts_with("resume:"))
        .count();
    assert_eq!(resumes, 1, "{status}");
    signal(&again, "TERM")?;
    assert!(again.wait()?.success());
    Ok(())
}

/// A turn cut by kill -9 inside its irreversible call (the sink has the
/// effect, the daemon not yet its answer), re-asked with the same work id:
/// it resumes the turn it began — with the messages it was handed then —
/// so the call keeps its idempotency key and the ledger does not send it
/// again. (Collecting the messages anew made it another turn with other
/// keys: the soak's first find.)
#[test]
fn a_retried_work_turn_cut_mid_tool_keeps_its_keys_and_sends_nothing_twice() -> TestResult {
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
    let (first, url) = start_serve(&config)?;
    let api = client(&url)?;
    api.call("POST", "/agents", Some(&json!({"name": "boss"})))?;
    api.call("POST", "/agents", Some(&json!({"name": "mailer"})))?;
    api.call(
        "POST",
        "/messages",
        Some(&json!({"from": "boss", "to": "mailer", "payload": "cc the board"})),
    )?;
    // The sink takes the effect at once and answers 3 s later.
    sink.delay_replies(3_000);
    let turn = json!({"prompt": "mail the release note", "work_id": "w1"});
    let cut = {
        let turn = turn.clone();
        std::thread::spawn(move || api.call("POST", "/agents/mailer/turn", Some(&turn)).is_err())
    };
    wait_for("the effect to land", || sink.deliveries_len() == 1)?;
    signal(&first, "KILL")?;
    finish(first)?;
    assert!(cut.join().map_err(|_| "panicked")?, "the cut turn was answered");
    sink.delay_replies(0);

    let (second, url) = start_serve(&config)?;
    let api = client(&url)?;
    // The boot turned the cut work into a RESUME trigger, which may be in
    // flight (409, busy). Either way the turn stops at the email: the
    // ledger holds its INTENT and the sink cannot deduplicate, so it is
    // neither sent again nor skipped — the retry is refused (409) until a
    // human answers.
    let mut refusal = String::new();
    wait_for("the retry to be blocked on the confirmation", || {
        match api.call("POST", "/agents/mailer/turn", Some(&turn)) {
            Err(e) => {
                refusal = e.to_string();
                refusal.contains("409") && refusal.contains("needs confirmation")
            }
            Ok(_) => false,
        }
    })?;
    assert_eq!(sink.requests(), 1, "{refusal}");
    let status = api.call("GET", "/status", None)?;
    let waiting = status["needs_confirmation"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(waiting.len(), 1, "{status}");
    let key = waiting[0]["idem_key"].as_str().ok_or("key")?.to_string();
    assert!(
        key.starts_with("api:w1-r0-") && refusal.contains(&key),
        "{refusal}"
    );
    // The RESUME trigger stopped at the same key: FAILED, naming it.
    let failed = status["triggers"]["FAILED"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        failed
            .iter()
            .any(|t| t["last_error"].as_str().is_some_and(|e| e.contains(&key))),
        "{status}"
    );
    // The human answers from the sink's record; the blocked trigger runs
    // again and the retry is answered, from the ledger: nothing re-sent.
    let answer = api.call(
        "POST",
        "/confirm",
        Some(&json!({"idem_key": key, "delivered": true, "provider_ref": "sink-1"})),
    )?;
    assert_eq!(answer["status"], "DONE", "{answer}");
    let mut retried = Value::Null;
    wait_for("the retry to be answered", || {
        match api.call("POST", "/agents/mailer/turn", Some(&turn)) {
            Ok(answer) => {
                retried = answer;
                true
            }
            Err(_) => false,
        }
    })?;
    assert!(
        retried["already_done"] == true || retried["tool_calls"][0]["ok"] == true,
        "{retried}"
    );
    assert_eq!(sink.requests(), 1, "{retried}");
    let status = api.call("GET", "/status", None)?;
    assert_eq!(status["needs_confirmation"], json!([]), "{status}");
    signal(&second, "TERM")?;
    assert!(finish(second)?.status.success());
    Ok(())
}

/// Seed 002 for API turns: the messages in a turn's prompt count as
/// delivered only with the turn. A turn whose provider fails leaves them
/// pending (the explicit hand-out before the turn lost them), and the
/// next turn reads and delivers them.
#[test]
fn an_api_turn_that_fails_leaves_its_messages_pending_for_the_next() -> TestResult {
    use durable_agent_cli::mock_llm::{Reply, Script};
    let dir = tempfile::tempdir()?;
    let replies = vec![Reply::status(400, None), Reply::text("read it")];
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let (mut serve, url) = start_serve(&config)?;
    let api = client(&url)?;
    api.call("POST", "/agents", Some(&json!({"name": "boss"})))?;
    api.call("POST", "/agents", Some(&json!({"name": "worker"})))?;
    api.call(
        "POST",
        "/messages",
        Some(&json!({"from": "boss", "to": "worker", "payload": "ship it"})),
    )?;
    let pending = |api: &durable_agent_cli::api::Client| -> Result<Value, Box<dyn std::error::Error>> {
        let status = api.call("GET", "/status", None)?;
        let agents = status["agents"].as_array().cloned().unwrap_or_default();
        Ok(agents
            .into_iter()
            .find(|a| a["name"] == "worker")
            .map_or(Value::Null, |a| a["pending_messages"].clone()))
    };
    let failed = api.call("POST", "/agents/worker/turn", Some(&json!({"prompt": "go"})));
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(pending(&api)?, 1, "a failed turn lost its message");
    let done = api.call("POST", "/agents/worker/turn", Some(&json!({"prompt": "go"})))?;
    assert_eq!(done["messages_delivered"], 1, "{done}");
    assert_eq!(pending(&api)?, 0);
    let asked = mock.request_bodies();
    assert!(
        asked.iter().all(|b| b.to_string().contains("ship it")),
        "both attempts had the message in their prompt: {asked:?}"
    );
    signal(&serve, "TERM")?;
    assert!(serve.wait()?.success());
    Ok(())
}

/// A trigger the daemon gave up on is listed by `status` and retried by a
/// human with `durable-agent retry` (the CLI asks the daemon's API, which
/// holds the root): PENDING again, attempts reset, and it fires.
#[test]
fn a_failed_trigger_is_retried_through_the_cli_and_fires() -> TestResult {
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
    let (mut serve, url) = start_serve(&config)?;
    let api = client(&url)?;
    // Its agent is gone when it fires: FAILED, not retried by itself.
    api.call("POST", "/agents", Some(&json!({"name": "x"})))?;
    let emitted = api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "once", "agent": "x", "prompt": "hello", "delay_ms": 300})),
    )?;
    let id = emitted["id"].as_str().ok_or("id")?.to_string();
    api.call("DELETE", "/agents/x", None)?;
    let mut status = Value::Null;
    wait_for("the trigger to fail", || {
        status = api.call("GET", "/status", None).unwrap_or(Value::Null);
        trigger_statuses(&status).contains(&("once".to_string(), "FAILED".to_string()))
    })?;
    // Not a trigger id: refused before anything is asked.
    let bad = run(&["retry", "../x", "--config", path_str(&config)])?;
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(bad.stderr.contains("not a trigger id"), "{bad:?}");
    // The human fixes the cause and retries it.
    api.call("POST", "/agents", Some(&json!({"name": "x"})))?;
    let retried = run(&["retry", &id, "--config", path_str(&config)])?;
    assert!(retried.status.success(), "{retried:?}");
    let answer = retried.json()?;
    assert_eq!(
        (answer["status"].as_str(), answer["attempts"].as_u64()),
        (Some("PENDING"), Some(0)),
        "{answer}"
    );
    wait_for("the retried trigger to fire", || {
        status = api.call("GET", "/status", None).unwrap_or(Value::Null);
        trigger_statuses(&status).contains(&("once".to_string(), "DONE".to_string()))
    })?;
    // A DONE trigger is not retried: 409, named.
    let again = run(&["retry", &id, "--config", path_str(&config)])?;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(
        again.stderr.contains("409") && again.stderr.contains("DONE"),
        "{again:?}"
    );
    signal(&serve, "TERM")?;
    assert!(serve.wait()?.success());
    Ok(())
}

/// A thin CLI client whose request the daemon refuses (a 4xx) says what
/// the daemon said, not that it "did not answer".
#[test]
fn a_cli_client_refused_by_the_daemon_says_what_the_daemon_said() -> TestResult {
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
    let (mut serve, _url) = start_serve(&config)?;
    let refused = run(&[
        "emit",
        "--config",
        path_str(&config),
        "--dedup-key",
        "k",
        "--agent",
        "nobody",
        "--prompt",
        "p",
    ])?;
    signal(&serve, "TERM")?;
    serve.wait()?;
    assert!(!refused.status.success(), "{refused:?}");
    let stderr = &refused.stderr;
    assert!(stderr.contains("refused") && stderr.contains("404"), "{stderr}");
    assert!(stderr.contains("nobody"), "the daemon's own words: {stderr}");
    assert!(!stderr.contains("did not answer"), "{stderr}");
    Ok(())
}
