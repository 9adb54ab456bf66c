//! Durable decisions, end to end (issue 22): the real binary, a mock LLM
//! that never answers the same way twice (`MockLlm::echo_rewording`), and
//! an irreversible `send_email` at a slow endpoint that cannot
//! deduplicate, all on loopback, each test on a fresh temp root.
//!
//! The property: a kill -9 while the email is at the endpoint, then a
//! resume (`run --resume`, or a restarted `serve` and a retried work id),
//! never sends it a second time — not even worded differently, because the
//! resumed turn continues from the model's logged decision instead of
//! asking the model again — and what the run or the API reports lists the
//! email (blocked on a human's confirmation, then as the effect it was).
//! A runtime that re-asked the model would send a second, reworded email
//! under a new idempotency key: these tests see that as two deliveries.

mod common;

use common::*;
use durable_agent_cli::api::ClientError;
use durable_agent_cli::mock_llm::{MockLlm, Reword, Variant};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

/// The job's prompt; echo mode mails it (`to` and `body`), reworded.
const PROMPT: &str = "Tell ada@example.com that the release is out, use send_email";

/// How long the sink holds its answer after taking the effect: the kill
/// lands inside this window.
const SLOW_REPLY_MS: u64 = 1_500;

/// A seed whose first two asks both ask for the email, worded differently
/// (each names its ask number): a runtime that asked the model again for
/// the interrupted round would get a new key and send a second email.
fn rewording_seed() -> u64 {
    (0..)
        .find(|s| (0..2).all(|ask| Reword::new(*s).variant(ask) == Variant::Reworded))
        .unwrap_or(0)
}

struct World {
    dir: tempfile::TempDir,
    mock: MockLlm,
    sink: WebhookSink,
    config: std::path::PathBuf,
}

/// A rewording echo LLM, a non-deduplicating sink, and a config with
/// `send_email` (irreversible, `dedup = false`) posting to it.
fn world() -> Result<World, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::echo_rewording(loopback(), Reword::new(rewording_seed()))?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    Ok(World {
        dir,
        mock,
        sink,
        config,
    })
}

impl World {
    /// After the kill: the sink answers at once again, and every request
    /// that reached it is recorded.
    fn settle(&self) -> TestResult {
        self.sink.delay_replies(0);
        self.sink.settle(DEADLINE)?;
        Ok(())
    }

    /// The one email the sink took: its key and delivery id.
    fn the_email(&self) -> Result<(String, String), Box<dyn std::error::Error>> {
        let deliveries = self.sink.deliveries();
        assert_eq!(
            deliveries.len(),
            1,
            "the endpoint received the email {} times: {:#?}",
            deliveries.len(),
            deliveries.iter().map(|d| &d.request.body).collect::<Vec<_>>()
        );
        let key = deliveries[0]
            .idempotency_key()
            .ok_or("the delivery carries no Idempotency-Key")?;
        Ok((key.to_string(), deliveries[0].id.clone()))
    }
}

/// The entry of `calls` (a summary's or an answer's `tool_calls`) for
/// idempotency key `key`.
fn call_with_key<'a>(calls: &'a Value, key: &str) -> Option<&'a Value> {
    calls.as_array()?.iter().find(|c| c["idem_key"] == key)
}

/// Start `durable-agent run` on a job with run id `run_id` and kill -9 it
/// while the email is at the endpoint (taken, not yet answered).
fn kill_run_mid_send(w: &World, run_id: &str) -> TestResult {
    w.sink.delay_replies(SLOW_REPLY_MS);
    let job = write_job(w.dir.path(), "job.toml", Some(run_id), PROMPT)?;
    let mut child = spawn(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    wait_for("the email to reach the endpoint", || w.sink.deliveries_len() == 1)?;
    signal(&child, "KILL")?;
    child.wait()?;
    w.settle()
}

/// (a) kill -9 of `run` mid-send, then `run --resume`: the resumed turn
/// continues from the logged decision (the model is not asked again for
/// round 0), stops on needs_confirmation before any second send, and its
/// summary lists the email; answered `--delivered`, the run completes and
/// lists it as the effect it was; resumed once more, it answers the stored
/// response and calls. The endpoint received one email throughout.
#[test]
fn kill_9_of_run_mid_send_then_resume_with_a_rewording_model_sends_the_email_once() -> TestResult {
    let w = world()?;
    kill_run_mid_send(&w, "mail")?;
    let (key, delivery) = w.the_email()?;
    assert!(key.starts_with("run:mail-r0-c0"), "{key}");
    assert_eq!(w.mock.requests().len(), 1);

    let resumed = run(&["run", "--resume", "mail", "--config", path_str(&w.config)])?;
    // The property first: no second email, whatever the summary says.
    w.sink.settle(DEADLINE)?;
    w.the_email()?;
    let summary = resumed.json()?;
    assert_eq!(summary["outcome"], "needs_confirmation", "{summary}");
    assert_eq!(resumed.status.code(), Some(1), "{resumed:?}");
    assert_eq!(summary["needs_confirmation"], json!([key]), "{summary}");
    let blocked = call_with_key(&summary["tool_calls"], &key).ok_or("the summary lacks the email")?;
    assert_eq!(blocked["tool"], "send_email", "{summary}");
    assert_eq!(blocked["irreversible"], true);
    assert_eq!(blocked["effect"], "NEEDS_CONFIRMATION", "{summary}");
    assert!(
        summary["error"].as_str().is_some_and(|e| e.contains(&key)),
        "{summary}"
    );
    assert_eq!(
        w.mock.requests().len(),
        1,
        "the model was asked again for a round whose decision was logged"
    );

    // A human answers from the sink's record; the resume reads it.
    let confirmed = run(&[
        "confirm",
        &key,
        "--delivered",
        "--provider-ref",
        &delivery,
        "--config",
        path_str(&w.config),
    ])?;
    assert!(confirmed.status.success(), "{confirmed:?}");
    let done = run(&["run", "--resume", "mail", "--config", path_str(&w.config)])?;
    assert!(done.status.success(), "{done:?}");
    let summary = done.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["needs_confirmation"], json!([]), "{summary}");
    let calls = summary["tool_calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 1, "{summary}");
    let sent = &calls[0];
    assert_eq!(
        (&sent["tool"], &sent["ok"], &sent["idem_key"], &sent["effect"]),
        (&json!("send_email"), &json!(true), &json!(key), &json!("DONE")),
        "{summary}"
    );
    assert!(
        sent["output"].as_str().is_some_and(|o| o.contains(&delivery)),
        "{summary}"
    );
    let response = summary["response"].clone();
    assert!(
        response.as_str().is_some_and(|r| r.contains(&delivery)),
        "the model read the confirmed answer: {summary}"
    );
    // Only round 1 was asked for.
    assert_eq!(w.mock.requests().len(), 2);

    // Done: a resume answers the stored response and calls.
    let again = run(&["run", "--resume", "mail", "--config", path_str(&w.config)])?;
    assert!(again.status.success(), "{again:?}");
    let summary = again.json()?;
    assert_eq!(summary["outcome"], "already_done", "{summary}");
    assert_eq!(summary["response"], response, "{summary}");
    assert_eq!(summary["tool_calls"], json!(calls), "{summary}");
    assert_eq!(w.mock.requests().len(), 2);
    w.sink.settle(DEADLINE)?;
    w.the_email()?;
    Ok(())
}

/// Issue 22 item 2: a key answered `--not-delivered` is honoured by the
/// decision, not by the model — the resumed round sends that very call
/// once more, with its key and its logged arguments, though the model
/// would word it differently now (here the human's answer is wrong on
/// purpose, so the sink sees the re-send: same key, same body).
#[test]
fn a_key_answered_not_delivered_is_sent_once_from_the_decision_not_from_a_new_ask() -> TestResult {
    let w = world()?;
    kill_run_mid_send(&w, "again")?;
    let (key, _) = w.the_email()?;
    let blocked = run(&["run", "--resume", "again", "--config", path_str(&w.config)])?;
    w.sink.settle(DEADLINE)?;
    w.the_email()?;
    assert_eq!(blocked.json()?["outcome"], "needs_confirmation", "{blocked:?}");
    let answered = run(&[
        "confirm",
        &key,
        "--not-delivered",
        "--config",
        path_str(&w.config),
    ])?;
    assert!(answered.status.success(), "{answered:?}");
    let done = run(&["run", "--resume", "again", "--config", path_str(&w.config)])?;
    assert!(done.status.success(), "{done:?}");
    let summary = done.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    w.sink.settle(DEADLINE)?;
    let deliveries = w.sink.deliveries();
    assert_eq!(deliveries.len(), 2, "sent once more after `--not-delivered`");
    assert_eq!(deliveries[1].idempotency_key(), Some(key.as_str()));
    assert_eq!(
        deliveries[1].request.body, deliveries[0].request.body,
        "re-sent from the logged decision, not from a new ask"
    );
    let sent = call_with_key(&summary["tool_calls"], &key).ok_or("the summary lacks the email")?;
    assert_eq!(sent["ok"], true, "{summary}");
    assert_eq!(sent["effect"], "DONE", "{summary}");
    // Round 0 was never asked again: ask 0, then round 1.
    assert_eq!(w.mock.requests().len(), 2);
    Ok(())
}

/// (b) The same with `serve` and an API work turn: kill -9 of `serve`
/// while the turn's email is at the endpoint, restart, retry the work id.
/// The retry (and the RESUME trigger the boot emitted) stops on the
/// confirmation — a 409 whose body lists the email and its key — before
/// any second send; confirmed, the retry is answered with the response and
/// the email as its effect, and a later retry answers the stored response
/// and calls with `already_done`. One email throughout.
#[test]
fn kill_9_of_serve_mid_send_then_a_retried_work_id_sends_the_email_once() -> TestResult {
    let w = world()?;
    let (first, url) = start_serve(&w.config)?;
    let api = client(&url)?;
    api.call("POST", "/agents", Some(&json!({"name": "mailer"})))?;
    w.sink.delay_replies(SLOW_REPLY_MS);
    let turn = json!({"prompt": PROMPT, "work_id": "w1"});
    let cut = {
        let turn = turn.clone();
        std::thread::spawn(move || api.call("POST", "/agents/mailer/turn", Some(&turn)))
    };
    wait_for("the email to reach the endpoint", || w.sink.deliveries_len() == 1)?;
    signal(&first, "KILL")?;
    finish(first)?;
    let cut = cut.join().map_err(|_| "the turn's client panicked")?;
    assert!(cut.is_err(), "the cut turn was answered: {cut:?}");
    w.settle()?;
    let (key, delivery) = w.the_email()?;
    assert!(key.starts_with("api:w1-r0-c0"), "{key}");

    let (second, url) = start_serve(&w.config)?;
    let api = client(&url)?;
    // The boot's RESUME trigger may hold the agent (409 "turn in flight");
    // either way the turn stops at the email, blocked on a human. (A
    // second email, or an answer, ends the wait too: the checks below say
    // what went wrong.)
    let mut refusal = Value::Null;
    wait_for("the retry to be blocked on the confirmation", || {
        match api.call("POST", "/agents/mailer/turn", Some(&turn)) {
            Err(ClientError::Api {
                status: 409,
                message,
                body,
            }) if message.contains("needs confirmation") => {
                refusal = body;
                true
            }
            Ok(answer) => {
                refusal = json!({"answered": answer});
                true
            }
            Err(_) => w.sink.deliveries_len() > 1,
        }
    })?;
    w.sink.settle(DEADLINE)?;
    w.the_email()?;
    assert_eq!(refusal["needs_confirmation"], json!([key]), "{refusal}");
    let blocked = call_with_key(&refusal["tool_calls"], &key).ok_or("the 409 lacks the email")?;
    assert_eq!(blocked["tool"], "send_email", "{refusal}");
    assert_eq!(blocked["effect"], "NEEDS_CONFIRMATION", "{refusal}");
    assert_eq!(
        w.mock.requests().len(),
        1,
        "the model was asked again for a round whose decision was logged"
    );

    let answer = api.call(
        "POST",
        "/confirm",
        Some(&json!({"idem_key": key, "delivered": true, "provider_ref": delivery})),
    )?;
    assert_eq!(answer["status"], "DONE", "{answer}");
    // The re-pended RESUME trigger and the retry race for the turn; the
    // retry is answered once the turn completed (by either).
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
    let sent = call_with_key(&retried["tool_calls"], &key).ok_or("the answer lacks the email")?;
    assert_eq!(
        (&sent["tool"], &sent["ok"], &sent["effect"]),
        (&json!("send_email"), &json!(true), &json!("DONE")),
        "{retried}"
    );
    assert!(
        sent["output"].as_str().is_some_and(|o| o.contains(&delivery)),
        "{retried}"
    );
    let response = retried["response"].clone();
    assert!(response.is_string(), "{retried}");

    // Done: the same work id answers the stored response and calls.
    let again = api.call("POST", "/agents/mailer/turn", Some(&turn))?;
    assert_eq!(again["already_done"], true, "{again}");
    assert_eq!(again["response"], response, "{again}");
    assert_eq!(again["tool_calls"], retried["tool_calls"], "{again}");
    assert_eq!(
        w.mock.requests().len(),
        2,
        "round 0 asked again, or round 1 twice"
    );
    w.sink.settle(DEADLINE)?;
    w.the_email()?;
    let status = api.call("GET", "/status", None)?;
    assert_eq!(status["needs_confirmation"], json!([]), "{status}");
    signal(&second, "TERM")?;
    assert!(finish(second)?.status.success());
    Ok(())
}

/// Issue 22 item 6: tool-call arguments the model got wrong (not JSON)
/// are a failed call answered to the model, not a failed run: the call is
/// recorded like any failed call (the summary lists it, `ok: false`), it
/// is never sent, and the model reads the error and answers.
#[test]
fn arguments_that_are_not_json_are_a_failed_call_the_model_reads_not_a_failed_run() -> TestResult {
    use durable_agent_cli::mock_llm::{Reply, Script};
    let dir = tempfile::tempdir()?;
    let replies = vec![
        // Truncated JSON, sent verbatim as the call's arguments.
        Reply::tool_call(
            "send_email",
            json!(r#"{"to": "ada@example.com", "body": "the rel"#),
        ),
        Reply::text("sorry, my arguments were cut"),
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
    let job = write_job(dir.path(), "job.toml", Some("bad-args"), PROMPT)?;
    let out = run(&["run", path_str(&job), "--config", path_str(&config)])?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["response"], "sorry, my arguments were cut");
    let calls = summary["tool_calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 1, "{summary}");
    assert_eq!(
        (&calls[0]["tool"], &calls[0]["ok"], &calls[0]["status"]),
        (&json!("send_email"), &json!(false), &json!("failed")),
        "{summary}"
    );
    assert!(
        calls[0]["output"]
            .as_str()
            .is_some_and(|o| o.contains("not JSON")),
        "{summary}"
    );
    assert_eq!(sink.requests(), 0, "a call on unusable arguments was sent");
    // The model was told, as a failed tool result, after its own call
    // with the arguments as it wrote them.
    let bodies = mock.request_bodies();
    let told = bodies.get(1).ok_or("the model was not asked again")?;
    let asked = told["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["tool_calls"].is_array()))
        .ok_or("no assistant tool call in the history")?;
    assert_eq!(
        asked["tool_calls"][0]["function"]["arguments"], r#"{"to": "ada@example.com", "body": "the rel"#,
        "{asked}"
    );
    let tool_message = told["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "tool"))
        .ok_or("no tool message")?;
    assert!(
        tool_message["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("error: ") && c.contains("not JSON")),
        "{tool_message}"
    );
    Ok(())
}
