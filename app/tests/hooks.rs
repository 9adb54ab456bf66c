//! `[[hooks]]` end to end: the real binary, a scripted mock LLM and a
//! webhook sink on loopback, each test on a fresh root. A `deny` hook's
//! reason is the model's tool result and nothing is sent; `modify_args`
//! rewrites what the endpoint receives and what the idempotency key is
//! derived from; `require_confirmation` parks the call until `confirm`;
//! a command hook that fails or overruns is logged and skipped (or denies,
//! with `fail_closed`); and after a kill -9 the resumed round applies the
//! decision logged before the crash — not the hooks' answer now.

mod common;

use std::io::Write;
use std::path::Path;

use common::*;
use durable_agent::runtime::{work_idempotency_key, SessionId, ToolRequest};
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

fn email() -> Value {
    json!({"to": "ada@example.com", "body": "the release is out"})
}

struct World {
    dir: tempfile::TempDir,
    mock: MockLlm,
    sink: WebhookSink,
    config: std::path::PathBuf,
}

/// The common config (an irreversible `send_email` to the sink) with
/// `hooks` appended; the mock asks for one email, then answers `done`.
fn world(hooks: &str, dedup: bool) -> Result<World, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let replies = vec![Reply::tool_call("send_email", email()), Reply::text("done")];
    let mock = MockLlm::scripted(loopback(), Script::new(replies)?)?;
    let sink = WebhookSink::start(loopback(), dedup)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        dedup,
        free_addr()?,
    )?;
    append(&config, hooks)?;
    Ok(World {
        dir,
        mock,
        sink,
        config,
    })
}

fn append(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    file.write_all(format!("\n{text}\n").as_bytes())
}

impl World {
    fn run(&self, run_id: &str) -> Result<Output, Box<dyn std::error::Error>> {
        let job = write_job(
            self.dir.path(),
            &format!("{run_id}.toml"),
            Some(run_id),
            "tell ada",
        )?;
        run(&["run", path_str(&job), "--config", path_str(&self.config)])
    }

    fn resume(&self, run_id: &str) -> Result<Output, Box<dyn std::error::Error>> {
        run(&["run", "--resume", run_id, "--config", path_str(&self.config)])
    }

    /// The second completion request: what the model read after the call.
    fn model_read(&self) -> String {
        self.mock
            .request_bodies()
            .get(1)
            .map(Value::to_string)
            .unwrap_or_default()
    }
}

#[test]
fn a_deny_hook_answers_the_model_and_nothing_is_sent() -> TestResult {
    let w = world(
        r#"[[hooks]]
matcher = "^send_"
action = "deny"
reason = "no mail during the freeze"
"#,
        false,
    )?;
    let out = w.run("job-1")?;
    assert!(out.status.success(), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    let call = &summary["tool_calls"][0];
    assert_eq!(call["ok"], false, "{summary}");
    assert!(
        call["output"]
            .as_str()
            .is_some_and(|o| o.contains("no mail during the freeze")),
        "{summary}"
    );
    assert_eq!(w.sink.requests(), 0, "a denied call reached the endpoint");
    assert!(
        w.model_read().contains("no mail during the freeze"),
        "{}",
        w.model_read()
    );
    Ok(())
}

#[test]
fn a_modify_args_hook_rewrites_what_the_endpoint_receives_and_the_key() -> TestResult {
    let w = world(
        r#"[[hooks]]
matcher = "send_email"
action = "modify_args"
patch = { to = "audit@example.com", cc = "ops@example.com" }
"#,
        false,
    )?;
    let out = w.run("job-1")?;
    assert!(out.status.success(), "{out:?}");
    let deliveries = w.sink.deliveries();
    assert_eq!(deliveries.len(), 1);
    let body: Value = serde_json::from_str(&deliveries[0].request.body)?;
    let modified = json!({"to": "audit@example.com", "cc": "ops@example.com", "body": "the release is out"});
    assert_eq!(body, modified);
    // The key is the work key of the MODIFIED call.
    let key = deliveries[0].idempotency_key().ok_or("no key")?;
    let session = key.rsplit('@').next().ok_or("no session in the key")?;
    let session = SessionId::from_hex(session).map_err(|e| format!("{e:?}"))?;
    let request = |args: Value| ToolRequest {
        tool: "send_email".into(),
        args,
        irreversible: true,
        invalid_args: None,
    };
    assert_eq!(
        key,
        work_idempotency_key(&session, "run:job-1", 0, 0, &request(modified))
    );
    assert_ne!(
        key,
        work_idempotency_key(&session, "run:job-1", 0, 0, &request(email()))
    );
    Ok(())
}

#[test]
fn a_require_confirmation_hook_parks_the_call_until_confirm() -> TestResult {
    let w = world(
        r#"[[hooks]]
matcher = "send_email"
action = "require_confirmation"
reason = "a human reads every email first"
"#,
        false,
    )?;
    let out = w.run("parked")?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let summary = out.json()?;
    assert_eq!(summary["outcome"], "needs_confirmation", "{summary}");
    let key = summary["needs_confirmation"][0]
        .as_str()
        .ok_or("a key")?
        .to_string();
    assert_eq!(w.sink.requests(), 0, "a parked call was sent");
    let status = run(&["status", "--config", path_str(&w.config)])?.json()?;
    assert_eq!(
        status["needs_confirmation"][0]["idem_key"],
        key.as_str(),
        "{status}"
    );
    // Still parked when resumed unanswered.
    let again = w.resume("parked")?;
    assert_eq!(again.json()?["outcome"], "needs_confirmation", "{again:?}");
    assert_eq!(w.sink.requests(), 0);
    // A human approves: `--not-delivered` releases the key; it runs once.
    let confirmed = run(&[
        "confirm",
        &key,
        "--not-delivered",
        "--config",
        path_str(&w.config),
    ])?;
    assert!(confirmed.status.success(), "{confirmed:?}");
    let done = w.resume("parked")?;
    assert!(done.status.success(), "{done:?}");
    assert_eq!(done.json()?["outcome"], "succeeded", "{done:?}");
    assert_eq!(w.sink.deliveries_for(&key), 1);
    assert_eq!(w.sink.requests(), 1);
    assert_eq!(
        w.mock.requests().len(),
        2,
        "the decided round was asked for again"
    );
    Ok(())
}

#[test]
fn a_failing_or_slow_command_hook_is_logged_and_skipped() -> TestResult {
    let w = world(
        r#"[[hooks]]
action = "command"
command = ["sh", "-c", "echo broken >&2; exit 7"]

[[hooks]]
action = "command"
command = ["sh", "-c", "sleep 5"]
timeout_ms = 200

[[hooks]]
action = "command"
command = ["sh", "-c", "echo 'not json'"]
"#,
        false,
    )?;
    let out = w.run("job-1")?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()?["tool_calls"][0]["ok"], true, "{out:?}");
    assert_eq!(w.sink.deliveries_len(), 1, "a broken hook stopped the call");
    for what in [
        "hooks[0]",
        "hooks[1]",
        "hooks[2]",
        "no answer within",
        "exited with status 7",
    ] {
        assert!(out.stderr.contains(what), "{what} not logged: {}", out.stderr);
    }
    assert_eq!(
        out.stderr.matches("hook failed; skipped").count(),
        3,
        "{}",
        out.stderr
    );
    Ok(())
}

#[test]
fn a_fail_closed_policy_hook_that_fails_denies_the_call() -> TestResult {
    let w = world(
        r#"[[hooks]]
action = "command"
command = ["/nonexistent/policy"]
fail_closed = true
"#,
        false,
    )?;
    let out = w.run("job-1")?;
    assert!(out.status.success(), "{out:?}");
    let call = &out.json()?["tool_calls"][0];
    assert_eq!(call["ok"], false, "{call}");
    assert!(
        call["output"]
            .as_str()
            .is_some_and(|o| o.contains("fails closed")),
        "{call}"
    );
    assert_eq!(w.sink.requests(), 0);
    Ok(())
}

#[test]
fn a_command_hook_decides_from_the_event_on_its_stdin() -> TestResult {
    // Denies mail to ada, lets anything else through.
    let w = world(
        r#"[[hooks]]
matcher = "send_email"
action = "command"
command = ["sh", "-c", "grep -q 'ada@example.com' && echo '{\"decision\":\"deny\",\"reason\":\"ada is on leave\"}' || true"]
"#,
        false,
    )?;
    let out = w.run("job-1")?;
    assert!(out.status.success(), "{out:?}");
    let call = &out.json()?["tool_calls"][0];
    assert!(
        call["output"]
            .as_str()
            .is_some_and(|o| o.contains("ada is on leave")),
        "{call}"
    );
    assert_eq!(w.sink.requests(), 0);
    Ok(())
}

/// A command hook that answers differently every time it runs (a counter
/// in a file: the first answer rewrites the recipient, every later one
/// denies). kill -9 while the endpoint holds the email; then the config's
/// hook is replaced by a plain deny. The resumed run applies the decision
/// logged before the crash: the call keeps its first, rewritten arguments
/// and its key, the dedup endpoint absorbs the re-send (one delivery), and
/// no hook runs again.
#[test]
fn a_resumed_round_applies_the_logged_decision_not_a_new_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let counter = dir.path().join("asked");
    let script = dir.path().join("hook.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\nn=$(cat {c} 2>/dev/null || echo 0)\necho $((n+1)) > {c}\n\
             if [ \"$n\" = 0 ]; then echo '{{\"decision\":\"modify_args\",\"args\":{{\"to\":\"first@example.com\"}}}}';\n\
             else echo '{{\"decision\":\"deny\",\"reason\":\"second thoughts\"}}'; fi\n",
            c = counter.display()
        ),
    )?;
    let w = world(
        &format!(
            "[[hooks]]\naction = \"command\"\ncommand = [\"sh\", \"{}\"]\n",
            script.display()
        ),
        true,
    )?;
    w.sink.delay_replies(1_000);
    let job = write_job(w.dir.path(), "job.toml", Some("killed"), "tell ada")?;
    let mut child = spawn(&["run", path_str(&job), "--config", path_str(&w.config)])?;
    wait_for("the delivery", || w.sink.deliveries_len() == 1)?;
    signal(&child, "KILL")?;
    child.wait()?;
    w.sink.delay_replies(0);
    w.sink.settle(DEADLINE)?;
    assert_eq!(std::fs::read_to_string(&counter)?.trim(), "1");
    // The hooks change between the crash and the resume.
    let text = std::fs::read_to_string(&w.config)?;
    let cut = text.find("[[hooks]]").ok_or("no hooks section")?;
    std::fs::write(
        &w.config,
        format!(
            "{}[[hooks]]\naction = \"deny\"\nreason = \"changed config\"\n",
            &text[..cut]
        ),
    )?;

    let resumed = w.resume("killed")?;
    assert!(resumed.status.success(), "{resumed:?}");
    let summary = resumed.json()?;
    assert_eq!(summary["outcome"], "succeeded", "{summary}");
    assert_eq!(summary["tool_calls"][0]["ok"], true, "{summary}");
    let deliveries = w.sink.deliveries();
    assert_eq!(deliveries.len(), 1, "sent twice");
    let body: Value = serde_json::from_str(&deliveries[0].request.body)?;
    assert_eq!(body["to"], "first@example.com");
    assert_eq!(
        std::fs::read_to_string(&counter)?.trim(),
        "1",
        "the hook ran again"
    );
    assert!(!summary.to_string().contains("changed config"), "{summary}");
    assert_eq!(
        w.mock.requests().len(),
        2,
        "the decided round was asked for again"
    );
    Ok(())
}

#[test]
fn observer_hooks_get_each_event_as_json_on_stdin() -> TestResult {
    let out_dir = tempfile::tempdir()?;
    // Each observer's event in a file of its own: two observers run on
    // threads of their own, so appends to one shared file could interleave.
    let append = format!("cat > $(mktemp '{}/event.XXXXXX')", out_dir.path().display());
    let w = world(
        &format!(
            r#"[[hooks]]
event = "PostToolUse"
matcher = "send_email"
action = "command"
command = ["sh", "-c", "{append}"]

[[hooks]]
event = "AgentStop"
action = "command"
command = ["sh", "-c", "{append}"]

[[hooks]]
event = "PostToolUse"
matcher = "^nothing$"
action = "command"
command = ["sh", "-c", "{append}"]
"#
        ),
        false,
    )?;
    let out = w.run("job-1")?;
    assert!(out.status.success(), "{out:?}");
    // The run waits for its observers before it exits.
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(out_dir.path())?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let events: Vec<Value> = files
        .iter()
        .map(|f| -> Result<Value, Box<dyn std::error::Error>> {
            Ok(serde_json::from_str(&std::fs::read_to_string(f)?)?)
        })
        .collect::<Result<_, _>>()?;
    let names: Vec<&str> = events
        .iter()
        .filter_map(|e| e["hook_event_name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{events:?}");
    assert!(
        names.contains(&"PostToolUse") && names.contains(&"AgentStop"),
        "{events:?}"
    );
    let post = events
        .iter()
        .find(|e| e["hook_event_name"] == "PostToolUse")
        .ok_or("no PostToolUse")?;
    assert_eq!(post["tool_name"], "send_email");
    assert_eq!(post["tool_input"], email());
    let stop = events
        .iter()
        .find(|e| e["hook_event_name"] == "AgentStop")
        .ok_or("no AgentStop")?;
    assert_eq!(stop["result"], "done");
    Ok(())
}
