//! The inspection views (`GET /runs`, `/agents`, `/transcripts`, `/work`,
//! `/usage`, `/errors`, `/triggers`, `/confirmations`, `/schedules`;
//! `durable-agent inspect …` and `transcript …`) against a root populated
//! by real turns: the binary's `run` and `serve` against a scripted mock
//! LLM and a webhook sink on loopback — two job runs (one killed
//! mid-delivery, left waiting for a human), an agent tree, an API work
//! turn, fired and pending triggers, a schedule, a message waiting, and a
//! provider failure.
//!
//! Properties: every view answers from the daemon (API, and the CLI
//! through it) and from the stopped root (the CLI's snapshot) with the
//! same JSON; pages are newest first and cover every row once; an unknown
//! run, agent, work or trigger is a 404 naming it; and a view of a stopped
//! root changes no byte of it. Snapshots (insta) redact what differs
//! between machines and runs: timestamps, ids (replaced by the agent's
//! name), the loopback ports and the schedule's time bucket.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use common::*;
use durable_agent_cli::access::Token;
use durable_agent_cli::api::{Client, ClientError};
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

/// A year: the schedule's period (one firing in the test) and the delay
/// of the trigger left PENDING.
const YEAR_MS: u64 = 365 * 24 * 3_600_000;

struct World {
    dir: tempfile::TempDir,
    mock: MockLlm,
    sink: WebhookSink,
    config: PathBuf,
}

fn email() -> Value {
    json!({"to": "ada@example.com", "body": "the release is out"})
}

fn job(dir: &Path, file: &str, run_id: &str, agent: &str, prompt: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(file);
    std::fs::write(
        &path,
        format!("run_id = \"{run_id}\"\nagent = \"{agent}\"\ninstructions = \"Send what you are asked to.\"\nprompt = \"{prompt}\"\n"),
    )?;
    Ok(path)
}

fn start_serve(config: &Path) -> Result<(Child, Client), Box<dyn std::error::Error>> {
    let mut child = spawn(&["serve", "--config", path_str(config)])?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim().is_empty() {
        let out = finish(child)?;
        return Err(format!("serve printed no URL: {out:?}").into());
    }
    let addr = line.trim().trim_start_matches("http://").parse()?;
    let api = Client::new(addr, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN));
    Ok((child, api))
}

fn total(api: &Client, path: &str) -> u64 {
    api.call("GET", path, None)
        .ok()
        .and_then(|v| v["total"].as_u64())
        .unwrap_or(0)
}

/// A root populated by real turns, and `serve` running on it.
fn populate() -> Result<(World, Child, Client), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // Every provider request of the test, in order; past the end the
    // mock answers 500 (the failure the errors view shows).
    let replies = vec![
        // job-1: an email, then the answer.
        Reply::tool_call("send_email", email()),
        Reply::text("sent it"),
        // killed: an email the process dies delivering.
        Reply::tool_call(
            "send_email",
            json!({"to": "bob@example.com", "body": "hello bob"}),
        ),
        // The API work turn w1 of `helper`.
        Reply::text("hi from helper"),
        // The trigger `remind` on `boss`.
        Reply::text("reminded"),
        // The schedule `weekly` on `boss`.
        Reply::text("weekly report"),
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
    let w = World {
        dir,
        mock,
        sink,
        config,
    };
    let cfg = path_str(&w.config);

    let job1 = job(w.dir.path(), "job1.toml", "job-1", "mailer", "tell ada")?;
    let out = run(&["run", path_str(&job1), "--config", cfg])?;
    assert!(out.status.success(), "{out:?}");

    // `killed`: kill -9 while the sink holds the email: an INTENT whose
    // fate is unknown; resumed, it waits for a human.
    w.sink.delay_replies(1_000);
    let killed = job(w.dir.path(), "killed.toml", "killed", "courier", "tell bob")?;
    let child = spawn(&["run", path_str(&killed), "--config", cfg])?;
    wait_for("the delivery", || w.sink.deliveries_len() == 2)?;
    signal(&child, "KILL")?;
    finish(child)?;
    w.sink.delay_replies(0);
    w.sink.settle(DEADLINE)?;
    let resumed = run(&["run", "--resume", "killed", "--config", cfg])?;
    assert_eq!(resumed.json()?["outcome"], "needs_confirmation", "{resumed:?}");

    let (serve, api) = start_serve(&w.config)?;
    // The boot's RESUME trigger for `killed` stops on the same call.
    wait_for("the RESUME trigger to stop on the confirmation", || {
        total(&api, "/triggers?status=FAILED") == 1
    })?;
    api.call(
        "POST",
        "/agents",
        Some(&json!({"name": "boss", "instructions": "Lead."})),
    )?;
    api.call(
        "POST",
        "/agents",
        Some(&json!({"name": "helper", "instructions": "Help.", "parent": "boss"})),
    )?;
    let turn = api.call(
        "POST",
        "/agents/helper/turn",
        Some(&json!({"prompt": "hello", "work_id": "w1"})),
    )?;
    assert_eq!(turn["response"], "hi from helper", "{turn}");
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "remind", "agent": "boss", "prompt": "remind me"})),
    )?;
    wait_for("`remind` to fire", || total(&api, "/triggers?status=DONE") == 1)?;
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "later", "agent": "helper", "prompt": "next year", "delay_ms": YEAR_MS})),
    )?;
    api.call(
        "POST",
        "/schedules",
        Some(&json!({"id": "weekly", "agent": "boss", "prompt": "weekly report", "period_ms": YEAR_MS})),
    )?;
    wait_for("the schedule's bucket to fire", || {
        total(&api, "/triggers?status=DONE") == 2
    })?;
    // A message `helper` has not read yet.
    api.call(
        "POST",
        "/messages",
        Some(&json!({"from": "boss", "to": "helper", "payload": "status?"})),
    )?;
    // The script is spent: the provider answers 500, the turn fails, and
    // the failure is stored with its attempt.
    let failed = api.call("POST", "/agents/boss/turn", Some(&json!({"prompt": "one more"})));
    assert!(
        matches!(failed, Err(ClientError::Api { status: 502, .. })),
        "{failed:?}"
    );
    assert_eq!(w.mock.requests().len(), 7);
    Ok((w, serve, api))
}

/// Every view, as the CLI names it and as the API path answers it.
fn views() -> Vec<(&'static str, Vec<&'static str>, &'static str)> {
    vec![
        ("runs", vec!["runs"], "/runs"),
        ("run_job_1", vec!["runs", "job-1"], "/runs/job-1"),
        ("run_killed", vec!["runs", "killed"], "/runs/killed"),
        ("agents", vec!["agents"], "/agents"),
        ("agent_helper", vec!["agents", "helper"], "/agents/helper"),
        ("work_w1", vec!["work", "w1"], "/work/w1"),
        ("work_run_job_1", vec!["work", "run:job-1"], "/work/run%3Ajob-1"),
        ("usage", vec!["usage"], "/usage"),
        ("errors", vec!["errors"], "/errors"),
        ("triggers", vec!["triggers"], "/triggers"),
        ("trigger_remind", vec!["triggers", "trg-2"], "/triggers/trg-2"),
        ("confirmations", vec!["confirmations"], "/confirmations"),
        ("schedules", vec!["schedules"], "/schedules"),
    ]
}

/// Names for the ids a root's answers carry: each live agent's id and
/// session id become `<agent:NAME>` / `<session:NAME>`.
fn id_names(agents: &Value) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    fn walk(node: &Value, names: &mut BTreeMap<String, String>) {
        let name = node["name"].as_str().unwrap_or("?");
        if let Some(id) = node["id"].as_str() {
            names.insert(id.to_string(), format!("<agent:{name}>"));
        }
        if let Some(s) = node["session_id"].as_str() {
            names.insert(s.to_string(), format!("<session:{name}>"));
        }
        for c in node["children"].as_array().into_iter().flatten() {
            walk(c, names);
        }
    }
    for root in agents["items"].as_array().into_iter().flatten() {
        walk(root, &mut names);
    }
    names
}

struct Redact {
    names: BTreeMap<String, String>,
    /// Loopback URLs (their ports change every run).
    urls: Vec<(String, &'static str)>,
}

impl Redact {
    fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (url, name) in &self.urls {
            out = out.replace(url.as_str(), name);
        }
        for (id, name) in &self.names {
            out = out.replace(id.as_str(), name);
        }
        // Any other id of the root (a message's): its 16 hex digits start
        // with the prefix every id of this root shares.
        if let Some(prefix) = self.names.keys().next().and_then(|id| id.get(..8)) {
            while let Some(i) = out.find(prefix) {
                let end = i + out[i..].bytes().take_while(u8::is_ascii_hexdigit).count();
                out.replace_range(i..end, "<id>");
            }
        }
        // The schedule's bucket is the host time divided by its period.
        if let Some(i) = out.find("scheduled:weekly:") {
            let start = i + "scheduled:weekly:".len();
            let digits = out[start..].bytes().take_while(u8::is_ascii_digit).count();
            out.replace_range(start..start + digits, "<bucket>");
        }
        out
    }

    /// `v` with its times and ids redacted.
    fn json(&self, v: &Value) -> Value {
        match v {
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let timed = k.ends_with("_ms") && k != "period_ms" && !v.is_null();
                        let v = if timed { json!("<ms>") } else { self.json(v) };
                        (self.text(k), v)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|i| self.json(i)).collect()),
            Value::String(s) => Value::String(self.text(s)),
            other => other.clone(),
        }
    }
}

/// What a view answers only in a running daemon: an ACTIVE session (it
/// holds a provider slot) is SUSPENDED after a restart, and a trigger's
/// overdue time is measured at the moment of the read.
fn settled(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("session_state", Value::String(s)) if s == "ACTIVE" => (k.clone(), json!("SUSPENDED")),
                    ("overdue_by_ms", _) => (k.clone(), Value::Null),
                    _ => (k.clone(), settled(v)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(settled).collect()),
        other => other.clone(),
    }
}

fn cli(config: &Path, args: &[&str]) -> Result<Output, Box<dyn std::error::Error>> {
    let mut all = vec!["inspect", "--config", path_str(config)];
    all.extend_from_slice(args);
    run(&all)
}

/// Every file under `root` with its bytes.
fn files(root: &Path) -> std::io::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

#[test]
fn every_view_answers_the_same_json_from_the_daemon_and_from_the_stopped_root() -> TestResult {
    let (w, serve, api) = populate()?;
    let redact = Redact {
        names: id_names(&api.call("GET", "/agents", None)?),
        urls: vec![(w.mock.base_url(), "<mock>"), (w.sink.url(""), "<sink>")],
    };
    let mut from_daemon = BTreeMap::new();
    for (name, args, path) in views() {
        let answer = api.call("GET", path, None)?;
        // The CLI beside the daemon asks it: the same answer.
        let through = cli(&w.config, &[&["--json"][..], &args].concat())?;
        assert!(through.status.success(), "{name}: {through:?}");
        assert_eq!(
            settled(&through.json()?),
            settled(&answer),
            "{name}: the CLI through the daemon"
        );
        insta::assert_json_snapshot!(format!("api_{name}"), redact.json(&answer));
        from_daemon.insert(name, answer);
    }
    let transcript = api.call("GET", "/transcripts/helper", None)?;
    insta::assert_snapshot!(
        "transcript_helper",
        redact.text(transcript["markdown"].as_str().unwrap_or(""))
    );

    signal(&serve, "TERM")?;
    let out = finish(serve)?;
    assert!(out.status.success(), "{out:?}");
    let root = w.dir.path().join("root");
    let before = files(&root)?;

    // No daemon: the CLI reads a snapshot of the stopped root.
    for (name, args, _) in views() {
        let out = cli(&w.config, &[&["--json"][..], &args].concat())?;
        assert!(out.status.success(), "{name}: {out:?}");
        let daemon = from_daemon.get(name).ok_or("no daemon answer")?;
        assert_eq!(
            settled(&out.json()?),
            settled(daemon),
            "{name}: stopped root vs daemon"
        );
    }
    let md = run(&["transcript", "--config", path_str(&w.config), "job-1"])?;
    assert!(md.status.success(), "{md:?}");
    insta::assert_snapshot!("transcript_run_job_1", redact.text(md.stdout.trim_end()));
    // A run stopped at a call a human must confirm: its open turn.
    let md = run(&["transcript", "--config", path_str(&w.config), "killed"])?;
    assert!(md.status.success(), "{md:?}");
    insta::assert_snapshot!("transcript_run_killed", redact.text(md.stdout.trim_end()));
    // The tables.
    for (name, args) in [
        ("runs", vec!["runs"]),
        ("run_killed", vec!["runs", "killed"]),
        ("agents", vec!["agents"]),
        ("usage", vec!["usage"]),
        ("triggers", vec!["triggers"]),
        ("confirmations", vec!["confirmations"]),
    ] {
        let out = cli(&w.config, &args)?;
        assert!(out.status.success(), "{name}: {out:?}");
        insta::assert_snapshot!(format!("cli_{name}"), redact.text(out.stdout.trim_end()));
    }
    assert_eq!(files(&root)?, before, "a view changed the stopped root");
    Ok(())
}

#[test]
fn pages_are_newest_first_and_cover_every_row_once_and_unknown_ids_are_404s() -> TestResult {
    let (w, serve, api) = populate()?;
    // Pages of one: every trigger once, newest first.
    let mut seen = Vec::new();
    let mut offset = Some(0);
    while let Some(o) = offset {
        let page = api.call("GET", &format!("/triggers?limit=1&offset={o}"), None)?;
        assert_eq!(page["total"], 4, "{page}");
        let items = page["items"].as_array().ok_or("items")?;
        assert_eq!(items.len(), 1, "{page}");
        seen.push(items[0]["id"].as_str().unwrap_or("").to_string());
        offset = page["next_offset"].as_u64();
    }
    assert_eq!(seen, ["trg-4", "trg-3", "trg-2", "trg-1"]);
    let runs = api.call("GET", "/runs?limit=1", None)?;
    assert_eq!(runs["items"][0]["run_id"], "killed", "{runs}");
    assert_eq!(
        (runs["total"].as_u64(), runs["next_offset"].as_u64()),
        (Some(2), Some(1)),
        "{runs}"
    );
    let older = api.call("GET", "/runs?limit=1&offset=1", None)?;
    assert_eq!(older["items"][0]["run_id"], "job-1", "{older}");
    assert_eq!(older["next_offset"], Value::Null, "{older}");
    // Bookkeeping runs are not user runs, yet one can be read by its id.
    let sessions = api.call("GET", "/agents/mailer", None)?;
    let session = sessions["session_id"].as_str().ok_or("session")?;
    let bookkeeping = api.call("GET", &format!("/runs/session%3A{session}"), None)?;
    assert_eq!(bookkeeping["calls"][0]["tool"], "send_email", "{bookkeeping}");
    let agents = api.call("GET", "/agents?limit=1&offset=1", None)?;
    assert_eq!(agents["total"], 3, "{agents}");
    assert_eq!(agents["items"][0]["name"], "courier", "{agents}");
    // A bad page is a 400 saying what is wrong.
    match api.call("GET", "/runs?limit=0", None) {
        Err(ClientError::Api {
            status: 400, message, ..
        }) => assert!(message.contains("limit"), "{message}"),
        other => return Err(format!("limit=0 answered {other:?}").into()),
    }
    let unknown = [
        ("/runs/nope", "no run \"nope\""),
        ("/agents/nope", "no live agent named \"nope\""),
        ("/transcripts/nope", "no live agent and no run named \"nope\""),
        ("/work/nope", "no completed work turn \"nope\""),
        ("/triggers/trg-99", "no trigger \"trg-99\""),
        ("/errors?run=nope", "no run \"nope\""),
    ];
    for (path, needle) in unknown {
        match api.call("GET", path, None) {
            Err(ClientError::Api {
                status: 404, message, ..
            }) => {
                assert!(message.contains(needle), "{path}: {message}")
            }
            other => return Err(format!("{path} answered {other:?}").into()),
        }
    }
    // The CLI says the same, through the daemon and on the stopped root.
    let through = cli(&w.config, &["runs", "nope"])?;
    assert_eq!(through.status.code(), Some(1), "{through:?}");
    assert!(through.stderr.contains("no run \"nope\""), "{through:?}");
    assert!(through.stderr.contains("404"), "{through:?}");
    let page = cli(&w.config, &["--limit", "1", "runs"])?;
    assert!(page.stdout.contains("next page: --offset 1"), "{page:?}");
    signal(&serve, "TERM")?;
    finish(serve)?;
    for args in [
        vec!["runs", "nope"],
        vec!["agents", "nope"],
        vec!["work", "nope"],
        vec!["triggers", "trg-99"],
    ] {
        let out = cli(&w.config, &args)?;
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(
            out.stderr.contains("nope") || out.stderr.contains("trg-99"),
            "{out:?}"
        );
    }
    let transcript = run(&["transcript", "--config", path_str(&w.config), "nope"])?;
    assert_eq!(transcript.status.code(), Some(1), "{transcript:?}");
    assert!(
        transcript.stderr.contains("no live agent and no run named"),
        "{transcript:?}"
    );
    let bad = cli(&w.config, &["--limit", "0", "runs"])?;
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    Ok(())
}

#[test]
fn usage_is_summed_per_model_as_each_call_recorded_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mock = MockLlm::scripted(
        loopback(),
        Script::new(vec![Reply::text("one"), Reply::text("two"), Reply::text("three")])?,
    )?;
    let sink = WebhookSink::start(loopback(), false)?;
    let config = write_config(
        dir.path(),
        &mock.base_url(),
        &sink.url("/send"),
        false,
        free_addr()?,
    )?;
    let cfg = path_str(&config);
    // Two runs with the configured model, then the operator switches the
    // provider's model and runs a third: each call keeps its own.
    for (i, model) in [(1, "mock-1"), (2, "mock-1"), (3, "mock-2")] {
        let text = std::fs::read_to_string(&config)?;
        let switched = text.replace("model = \"mock-1\"", &format!("model = \"{model}\""));
        std::fs::write(
            &config,
            switched.replace("model = \"mock-2\"", &format!("model = \"{model}\"")),
        )?;
        let file = job(
            dir.path(),
            &format!("j{i}.toml"),
            &format!("j{i}"),
            "solo",
            "hello",
        )?;
        let out = run(&["run", path_str(&file), "--config", cfg])?;
        assert!(out.status.success(), "{out:?}");
    }
    let usage = cli(&config, &["usage", "--json"])?;
    assert!(usage.status.success(), "{usage:?}");
    let usage = usage.json()?;
    let by_model: Vec<(String, u64)> = usage["by_model"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    (
                        r["model"].as_str().unwrap_or("?").to_string(),
                        r["calls"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        by_model,
        [("mock-1".to_string(), 2), ("mock-2".to_string(), 1)],
        "{usage}"
    );
    assert_eq!(usage["total"]["calls"], 3, "{usage}");
    // The table names both.
    let table = cli(&config, &["usage"])?;
    assert!(
        table.stdout.contains("mock-1") && table.stdout.contains("mock-2"),
        "{table:?}"
    );
    Ok(())
}
