//! `[retries]` end to end: the real binary, a scripted mock LLM and a
//! flaky endpoint — a tiny_http server on loopback this test starts, which
//! fails its first N requests — each test on a fresh root. A hard failure
//! (5xx) of a reversible tool is retried with the same idempotency key and
//! every failed attempt is a numbered ledger row; a 4xx is the model's to
//! read, never retried; an irreversible call at an endpoint that cannot
//! deduplicate is never sent twice, and one at a deduplicating endpoint is
//! retried under its one key and takes effect once.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;
use durable_agent::store::tool_calls::ToolCallStore;
use durable_agent_cli::boot::{boot_with, ApiKey};
use durable_agent_cli::config::Config;
use durable_agent_cli::interrupt::Stop;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use serde_json::{json, Value};

/// One request the flaky endpoint saw.
#[derive(Debug, Clone)]
struct Seen {
    key: Option<String>,
    body: String,
    status: u16,
}

#[derive(Debug, Default)]
struct State {
    /// Answer the next requests with these statuses (then 200).
    failures: Vec<u16>,
    /// Whether a failed request took effect anyway (a 5xx after acting).
    acts_before_failing: bool,
    dedup: bool,
    seen: Vec<Seen>,
    /// Effects by key, in order (a dedup endpoint's repeat is not one).
    effects: Vec<String>,
    ids: BTreeMap<String, String>,
}

/// The flaky endpoint: answers `{"id": ...}` with 200 once its scripted
/// failures are used up.
struct Flaky {
    state: Arc<Mutex<State>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flaky {
    fn start(
        failures: &[u16],
        acts_before_failing: bool,
        dedup: bool,
    ) -> Result<Flaky, Box<dyn std::error::Error>> {
        let server = Arc::new(tiny_http::Server::http(loopback()).map_err(|e| e.to_string())?);
        let state = Arc::new(Mutex::new(State {
            failures: failures.iter().rev().copied().collect(),
            acts_before_failing,
            dedup,
            ..State::default()
        }));
        let (srv, st) = (server.clone(), state.clone());
        let thread = std::thread::spawn(move || {
            for mut request in srv.incoming_requests() {
                let mut body = String::new();
                let _ = request.as_reader().read_to_string(&mut body);
                let key = request
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("Idempotency-Key"))
                    .map(|h| h.value.to_string());
                let (status, answer) = {
                    let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
                    let status = s.failures.pop().unwrap_or(200);
                    let k = key.clone().unwrap_or_default();
                    let repeat = s.dedup && s.ids.contains_key(&k);
                    if !repeat && (status == 200 || (status >= 500 && s.acts_before_failing)) {
                        let id = format!("fx-{}", s.effects.len() + 1);
                        s.effects.push(k.clone());
                        s.ids.insert(k.clone(), id);
                    }
                    s.seen.push(Seen {
                        key: key.clone(),
                        body,
                        status,
                    });
                    let id = s.ids.get(&k).cloned().unwrap_or_default();
                    (status, json!({"id": id}).to_string())
                };
                let _ = request.respond(tiny_http::Response::from_string(answer).with_status_code(status));
            }
        });
        Ok(Flaky {
            state,
            server,
            thread: Some(thread),
        })
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.server.server_addr())
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).seen.clone()
    }

    fn effects(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .effects
            .clone()
    }
}

impl Drop for Flaky {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A config with the mock LLM, `send_email` (irreversible, at
/// `email_url`), `lookup` (reversible, at `lookup_url`) and `extra`.
fn write_tools_config(
    dir: &std::path::Path,
    mock: &MockLlm,
    email_url: &str,
    dedup: bool,
    lookup_url: &str,
    extra: &str,
) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    let path = write_config(dir, &mock.base_url(), email_url, dedup, free_addr()?)?;
    let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
    write!(
        file,
        r#"
[[tools]]
kind = "http"
name = "lookup"
description = "Look something up."
url = "{lookup_url}"
timeout_ms = 5000
{extra}
"#
    )?;
    Ok(path)
}

fn run_job(
    dir: &std::path::Path,
    config: &std::path::Path,
    run_id: &str,
) -> Result<Output, Box<dyn std::error::Error>> {
    let job = write_job(dir, &format!("{run_id}.toml"), Some(run_id), "look it up")?;
    run(&["run", path_str(&job), "--config", path_str(config)])
}

/// The failed attempts the ledger holds for call `call_id`: (number, error).
fn attempts(
    config: &std::path::Path,
    call_id: &str,
) -> Result<Vec<(u32, String)>, Box<dyn std::error::Error>> {
    let config = Config::load(config)?;
    let (system, _, _) = boot_with(&config, &Stop::new(), ApiKey::Optional)?;
    let rows = ToolCallStore::default().attempts(system.db().conn(), call_id)?;
    Ok(rows.into_iter().map(|a| (a.attempt, a.error)).collect())
}

#[test]
fn a_server_error_is_retried_with_the_same_key_and_each_attempt_recorded() -> TestResult {
    let dir = tempfile::tempdir()?;
    let flaky = Flaky::start(&[503, 502], false, false)?;
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![
            Reply::tool_call("lookup", json!({"q": "weather"})),
            Reply::text("done"),
        ])?,
    )?;
    let extra = "[retries.tools.lookup]\nmax_retries = 3\nbackoff_base_ms = 10\nbackoff_max_ms = 20\n";
    let config = write_tools_config(
        dir.path(),
        &mock,
        "http://127.0.0.1:9/never",
        false,
        &flaky.url(),
        extra,
    )?;
    let out = run_job(dir.path(), &config, "job-1")?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;
    let call = &summary["tool_calls"][0];
    assert_eq!(call["ok"], true, "{summary}");
    let seen = flaky.seen();
    let statuses: Vec<u16> = seen.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [503, 502, 200]);
    let key = seen[0].key.clone().ok_or("no key")?;
    assert!(
        seen.iter().all(|s| s.key.as_deref() == Some(key.as_str())),
        "{seen:?}"
    );
    assert!(seen.iter().all(|s| s.body == seen[0].body), "{seen:?}");
    assert_eq!(call["idem_key"], key.as_str(), "{summary}");
    assert!(
        out.stderr.contains("retrying with the same key"),
        "{}",
        out.stderr
    );
    let call_id = call["call_id"].as_str().ok_or("no call id")?;
    let recorded = attempts(&config, call_id)?;
    let numbers: Vec<u32> = recorded.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, [1, 2], "{recorded:?}");
    assert!(
        recorded[0].1.contains("HTTP 503") && recorded[1].1.contains("HTTP 502"),
        "{recorded:?}"
    );
    Ok(())
}

#[test]
fn a_client_error_goes_to_the_model_and_the_default_retries_once() -> TestResult {
    // 404: the model's to read, one request.
    let dir = tempfile::tempdir()?;
    let flaky = Flaky::start(&[404], false, false)?;
    let replies = vec![Reply::tool_call("lookup", json!({"q": "x"})), Reply::text("done")];
    let mock = MockLlm::scripted(loopback(), Script::new(replies.clone())?)?;
    let config = write_tools_config(
        dir.path(),
        &mock,
        "http://127.0.0.1:9/never",
        false,
        &flaky.url(),
        "",
    )?;
    let out = run_job(dir.path(), &config, "job-1")?;
    assert!(out.status.success(), "{out:?}");
    let call = &out.json()?["tool_calls"][0];
    assert_eq!(call["ok"], false, "{call}");
    assert!(
        call["output"].as_str().is_some_and(|o| o.contains("HTTP 404")),
        "{call}"
    );
    assert_eq!(flaky.seen().len(), 1, "a 4xx was retried");

    // Three 503s, no [retries]: the reversible default is one retry, then
    // the last failure is the model's to read.
    let dir = tempfile::tempdir()?;
    let flaky = Flaky::start(&[503, 503, 503], false, false)?;
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let config = write_tools_config(
        dir.path(),
        &mock,
        "http://127.0.0.1:9/never",
        false,
        &flaky.url(),
        "",
    )?;
    let out = run_job(dir.path(), &config, "job-1")?;
    assert!(out.status.success(), "{out:?}");
    let call = &out.json()?["tool_calls"][0];
    assert_eq!(call["ok"], false, "{call}");
    assert!(
        call["output"]
            .as_str()
            .is_some_and(|o| o.contains("failed 2 time(s)")),
        "{call}"
    );
    assert_eq!(flaky.seen().len(), 2);
    let recorded = attempts(&config, call["call_id"].as_str().ok_or("no call id")?)?;
    assert_eq!(recorded.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2]);
    Ok(())
}

fn email_world(
    failures: &[u16],
    dedup: bool,
    extra: &str,
) -> Result<(tempfile::TempDir, Flaky, MockLlm, std::path::PathBuf), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // A 5xx after acting: the effect may have happened.
    let flaky = Flaky::start(failures, true, dedup)?;
    let replies = vec![
        Reply::tool_call("send_email", json!({"to": "ada@example.com", "body": "hi"})),
        Reply::text("done"),
    ];
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let config = write_tools_config(
        dir.path(),
        &mock,
        &flaky.url(),
        dedup,
        "http://127.0.0.1:9/never",
        extra,
    )?;
    Ok((dir, flaky, mock, config))
}

#[test]
fn an_irreversible_call_at_an_endpoint_without_dedup_is_never_sent_twice() -> TestResult {
    let (dir, flaky, _mock, config) = email_world(&[503], false, "")?;
    let out = run_job(dir.path(), &config, "mail")?;
    assert!(
        !out.status.success(),
        "an unknown outcome was taken for an answer: {out:?}"
    );
    assert_eq!(flaky.seen().len(), 1);
    // Resumed: the ledger asks a human instead of re-sending.
    let resumed = run(&["run", "--resume", "mail", "--config", path_str(&config)])?;
    assert_eq!(resumed.json()?["outcome"], "needs_confirmation", "{resumed:?}");
    assert_eq!(flaky.seen().len(), 1, "sent twice: {:?}", flaky.seen());
    assert_eq!(flaky.effects().len(), 1);
    // And a config that asks for retries of it is refused, naming the key.
    let text = std::fs::read_to_string(&config)? + "\n[retries.tools.send_email]\nmax_retries = 2\n";
    std::fs::write(&config, text)?;
    let refused = run(&["check-config", path_str(&config)])?;
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("retries.tools.send_email.max_retries"),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn an_irreversible_call_at_a_dedup_endpoint_is_retried_under_its_one_key() -> TestResult {
    let extra = "[retries.tools.send_email]\nmax_retries = 2\nbackoff_base_ms = 10\n";
    let (dir, flaky, _mock, config) = email_world(&[503], true, extra)?;
    let out = run_job(dir.path(), &config, "mail")?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["tool_calls"][0]["ok"], true, "{summary}");
    let seen = flaky.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].key, seen[1].key, "a retry changed the key");
    assert_eq!(flaky.effects().len(), 1, "the effect happened twice");
    let call_id = summary["tool_calls"][0]["call_id"].as_str().ok_or("no call id")?;
    assert_eq!(attempts(&config, call_id)?.len(), 1);
    let _: Value = serde_json::from_str(&seen[0].body)?;
    Ok(())
}
