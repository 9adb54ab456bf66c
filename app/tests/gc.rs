//! The root keeps itself (issue 24 item 4): `serve` runs the GC on its
//! `[gc]` schedule, `durable-agent gc` runs it by hand (through the daemon
//! when one holds the root, else on the root itself), and a `run --resume`
//! that finished its run leaves no PENDING RESUME trigger behind.
//!
//! Every root here is populated by real turns — the binary against a
//! scripted mock LLM and a webhook sink on loopback — and watched through
//! the API's views (`/triggers`, `/runs/{id}`, `/confirmations`, `/work`)
//! and the CLI's `inspect` of a stopped root.
//!
//! Properties: settled rows past the TTL go (a fired trigger is seen DONE,
//! then gone; a finished run's ledger effect goes) while what recovery and
//! humans need stays — the NEEDS_CONFIRMATION call, the FAILED trigger
//! blocked on it, the PENDING trigger, every agent and acknowledged turn —
//! and the daemon restarted after GC boots, answers the same, and sends
//! and asks nothing again.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use common::*;
use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;
use durable_agent_cli::mock_llm::{MockLlm, Reply, Script};
use durable_agent_cli::webhook_sink::WebhookSink;
use serde_json::{json, Value};

/// A year: the delay of the trigger left PENDING.
const YEAR_MS: u64 = 365 * 24 * 3_600_000;

struct World {
    dir: tempfile::TempDir,
    mock: MockLlm,
    sink: WebhookSink,
    config: PathBuf,
}

fn world(replies: Vec<Reply>, gc: &str) -> Result<World, Box<dyn std::error::Error>> {
    world_with(replies, gc, false)
}

/// A world whose email endpoint deduplicates by key (`dedup`) or not, and
/// which also has a reversible tool, `post_note`, posting to the sink.
fn world_with(replies: Vec<Reply>, gc: &str, dedup: bool) -> Result<World, Box<dyn std::error::Error>> {
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
    let note = format!(
        "[[tools]]\nkind = \"http\"\nname = \"post_note\"\ndescription = \"Post a note.\"\n\
         url = \"{}\"\ntimeout_ms = 5000\n\
         parameters = {{ type = \"object\", properties = {{ text = {{ type = \"string\" }} }} }}\n",
        sink.url("/note")
    );
    std::fs::write(&config, format!("{text}\n{note}\n[gc]\n{gc}\n"))?;
    Ok(World {
        dir,
        mock,
        sink,
        config,
    })
}

fn email(to: &str) -> Value {
    json!({"to": to, "body": "the release is out"})
}

fn job(dir: &Path, run_id: &str, agent: &str, prompt: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(format!("{run_id}.toml"));
    std::fs::write(
        &path,
        format!("run_id = \"{run_id}\"\nagent = \"{agent}\"\ninstructions = \"Send what you are asked to.\"\nprompt = \"{prompt}\"\n"),
    )?;
    Ok(path)
}

fn start_serve(config: &Path) -> Result<(Child, Client), Box<dyn std::error::Error>> {
    let (child, addr) = start_serve_at(config)?;
    Ok((child, client(addr)))
}

/// `serve` started, and the address it printed.
fn start_serve_at(config: &Path) -> Result<(Child, SocketAddr), Box<dyn std::error::Error>> {
    let mut child = spawn(&["serve", "--config", path_str(config)])?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim().is_empty() {
        let out = finish(child)?;
        return Err(format!("serve printed no URL: {out:?}").into());
    }
    Ok((child, line.trim().trim_start_matches("http://").parse()?))
}

fn client(addr: SocketAddr) -> Client {
    Client::new(addr, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN))
}

fn stop_serve(serve: Child) -> TestResult {
    signal(&serve, "INT")?;
    let out = finish(serve)?;
    assert!(out.status.success(), "{out:?}");
    Ok(())
}

fn total(api: &Client, path: &str) -> u64 {
    api.call("GET", path, None)
        .ok()
        .and_then(|v| v["total"].as_u64())
        .unwrap_or(u64::MAX)
}

fn effects(api: &Client, run: &str) -> usize {
    api.call("GET", &format!("/runs/{run}"), None)
        .ok()
        .and_then(|v| v["effects"].as_array().map(Vec::len))
        .unwrap_or(usize::MAX)
}

/// A finished job (`job-1`, its email DONE) and a job killed mid-delivery
/// whose resume stopped at the call a human must confirm (`killed`).
fn two_runs(w: &World) -> TestResult {
    let cfg = path_str(&w.config);
    let job1 = job(w.dir.path(), "job-1", "mailer", "tell ada")?;
    let out = run(&["run", path_str(&job1), "--config", cfg])?;
    assert!(out.status.success(), "{out:?}");
    w.sink.delay_replies(1_000);
    let killed = job(w.dir.path(), "killed", "courier", "tell bob")?;
    let child = spawn(&["run", path_str(&killed), "--config", cfg])?;
    wait_for("the delivery", || w.sink.deliveries_len() == 2)?;
    signal(&child, "KILL")?;
    finish(child)?;
    w.sink.delay_replies(0);
    w.sink.settle(DEADLINE)?;
    let resumed = run(&["run", "--resume", "killed", "--config", cfg])?;
    assert_eq!(resumed.json()?["outcome"], "needs_confirmation", "{resumed:?}");
    Ok(())
}

#[test]
fn serve_collects_settled_rows_on_its_schedule_keeps_what_recovery_needs_and_restarts_clean() -> TestResult {
    let replies = vec![
        Reply::tool_call("send_email", email("ada@example.com")),
        Reply::text("sent it"),
        Reply::tool_call("send_email", email("bob@example.com")),
        // The API work turn w1 of `boss`.
        Reply::text("hi from boss"),
        // The trigger `remind` on `boss`.
        Reply::text("reminded"),
    ];
    let w = world(replies, "ttl_ms = 1500\npayload_ttl_ms = 500\nperiod_ms = 100")?;
    two_runs(&w)?;

    let (serve, api) = start_serve(&w.config)?;
    // The boot's RESUME trigger for `killed` stops on the same call:
    // FAILED, blocked on the key a human must confirm.
    wait_for("the RESUME trigger to stop on the confirmation", || {
        total(&api, "/triggers?status=FAILED") == 1
    })?;
    api.call(
        "POST",
        "/agents",
        Some(&json!({"name": "boss", "instructions": "Lead."})),
    )?;
    let turn = api.call(
        "POST",
        "/agents/boss/turn",
        Some(&json!({"prompt": "hello", "work_id": "w1"})),
    )?;
    assert_eq!(turn["response"], "hi from boss", "{turn}");
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "remind", "agent": "boss", "prompt": "remind me"})),
    )?;
    wait_for("`remind` to fire", || total(&api, "/triggers?status=DONE") == 1)?;
    // Newest: GC never collects the newest row, and a PENDING one never.
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "later", "agent": "boss", "prompt": "next year", "delay_ms": YEAR_MS})),
    )?;
    // Watch them go: the DONE trigger, and the finished run with its
    // ledger rows (the run row goes last, with its calls).
    wait_for("GC to collect the DONE trigger", || {
        total(&api, "/triggers?status=DONE") == 0
    })?;
    wait_for("GC to collect the finished run job-1", || {
        total(&api, "/runs") == 1
    })?;
    let gone = api.call("GET", "/runs/job-1", None).expect_err("job-1 collected");
    assert!(gone.to_string().contains("404"), "{gone}");
    // Kept: the trigger blocked on a human, the PENDING one, the call
    // waiting for a human and the killed run's own ledger rows (its agent
    // has unfinished work).
    assert_eq!(total(&api, "/triggers?status=FAILED"), 1);
    assert_eq!(total(&api, "/triggers?status=PENDING"), 1);
    assert_eq!(total(&api, "/confirmations"), 1);
    assert_eq!(effects(&api, "killed"), 1);
    let requests = w.mock.requests().len();
    assert_eq!(requests, 5, "every scripted reply used once");
    stop_serve(serve)?;

    // Restarted after GC: it boots, every agent and acknowledged turn is
    // there, the pending trigger waits, the human's question stands, and
    // nothing is asked or sent again.
    let (serve, api) = start_serve(&w.config)?;
    let agents = api.call("GET", "/agents?limit=50", None)?.to_string();
    for name in ["mailer", "courier", "boss"] {
        assert!(agents.contains(&format!("\"{name}\"")), "{name}: {agents}");
    }
    assert_eq!(api.call("GET", "/work/w1", None)?["response"], "hi from boss");
    // The run's rows are gone; its turn's answer is in the agent's log,
    // which no GC touches.
    let job1 = api.call("GET", "/work/run%3Ajob-1", None)?;
    assert_eq!(job1["response"], "sent it", "{job1}");
    assert_eq!(total(&api, "/runs"), 1, "only the unfinished run is listed");
    assert_eq!(effects(&api, "killed"), 1);
    assert_eq!(total(&api, "/triggers?status=PENDING"), 1);
    assert_eq!(total(&api, "/triggers?status=FAILED"), 1);
    assert_eq!(total(&api, "/confirmations"), 1);
    // A GC pass of the new daemon has run by now (the first soon after
    // boot); the answers above are what it left.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(total(&api, "/confirmations"), 1);
    assert_eq!(w.mock.requests().len(), requests, "nothing asked again");
    assert_eq!(w.sink.deliveries_len(), 2, "nothing sent again");
    stop_serve(serve)?;
    Ok(())
}

/// Every table a pass collects from, as `gc` names them.
const TABLES: [&str; 7] = [
    "triggers",
    "activity_log",
    "tool_calls",
    "tool_call_attempts",
    "runs",
    "token_usage",
    "errors",
];

/// The `collected` counts of a pass's answer: `counts`, every other table 0.
fn collected(counts: &[(&str, u64)]) -> Value {
    let mut all = serde_json::Map::new();
    for table in TABLES {
        let n = counts.iter().find(|(t, _)| *t == table).map_or(0, |(_, n)| *n);
        all.insert(table.to_string(), json!(n));
    }
    Value::Object(all)
}

/// `gc` with a table of counts, `gc --json` with the API's answer.
fn gc(config: &Path, extra: &[&str]) -> Result<Output, Box<dyn std::error::Error>> {
    let mut args = vec!["gc", "--config", path_str(config)];
    args.extend_from_slice(extra);
    let out = run(&args)?;
    assert!(out.status.success(), "{out:?}");
    Ok(out)
}

#[test]
fn gc_by_hand_prints_counts_per_table_on_a_stopped_root_and_through_a_running_daemon() -> TestResult {
    let replies = vec![
        Reply::tool_call("send_email", email("ada@example.com")),
        Reply::text("sent it"),
        Reply::text("reminded"),
    ];
    // serve does not collect by itself here: every count is the command's.
    let w = world(replies, "enabled = false\nttl_ms = 3600000\npayload_ttl_ms = 1")?;
    let job1 = job(w.dir.path(), "job-1", "mailer", "tell ada")?;
    let out = run(&["run", path_str(&job1), "--config", path_str(&w.config)])?;
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_millis(20));

    // No daemon: on the root itself. Young rows stay; their bodies go.
    let first = gc(&w.config, &["--json"])?.json()?;
    assert_eq!(
        (&first["collected"], &first["stripped"]),
        (&collected(&[]), &json!({"activity_log": 1, "tool_calls": 1})),
        "{first}"
    );
    assert_eq!(first["payload_ttl_ms"], 1);
    // Again: nothing left to do; the table names every table.
    let table = gc(&w.config, &[])?.stdout;
    assert!(
        table.contains("collected") && table.contains("stripped"),
        "{table}"
    );
    for row in TABLES {
        let line = table.lines().find(|l| l.starts_with(row)).ok_or(row)?;
        assert!(
            line.split_whitespace().skip(1).all(|n| n == "0" || n == "-"),
            "{line}"
        );
    }

    // A daemon holds the root: through its API.
    let (serve, api) = start_serve(&w.config)?;
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "remind", "agent": "mailer", "prompt": "remind me"})),
    )?;
    wait_for("`remind` to fire", || total(&api, "/triggers?status=DONE") == 1)?;
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "later", "agent": "mailer", "prompt": "next year", "delay_ms": YEAR_MS})),
    )?;
    std::thread::sleep(Duration::from_millis(20));
    let through = gc(&w.config, &["--ttl", "1ms", "--json"])?.json()?;
    // The fired trigger, and everything of the finished run: its email's
    // activity and call rows, the run, and the usage of its two provider
    // calls and of the trigger's turn.
    assert_eq!(
        through["collected"],
        collected(&[
            ("triggers", 1),
            ("activity_log", 1),
            ("tool_calls", 1),
            ("runs", 1),
            ("token_usage", 3)
        ]),
        "{through}"
    );
    assert_eq!(through["ttl_ms"], 1);
    assert_eq!(total(&api, "/triggers?status=DONE"), 0);
    assert_eq!(total(&api, "/triggers?status=PENDING"), 1, "a live trigger stays");
    let bad = run(&["gc", "--config", path_str(&w.config), "--ttl", "soon"])?;
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(bad.stderr.contains("not a duration"), "{bad:?}");
    stop_serve(serve)?;
    Ok(())
}

#[test]
fn run_resume_that_finishes_a_run_settles_its_resume_trigger() -> TestResult {
    let w = world(
        vec![Reply::raw("this is not json"), Reply::text("fine now")],
        "enabled = true",
    )?;
    let cfg = path_str(&w.config);
    let job = job(w.dir.path(), "g", "mailer", "tell ada")?;
    let out = run(&["run", path_str(&job), "--config", cfg])?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // The boot of `--resume` turns the unfinished run into its RESUME
    // trigger; the run finishes here, so the trigger is settled, not left
    // PENDING for the next `serve` to fire.
    let resumed = run(&["run", "--resume", "g", "--config", cfg])?;
    assert!(resumed.status.success(), "{resumed:?}");
    assert_eq!(resumed.json()?["response"], "fine now");
    let listed = run(&["inspect", "triggers", "--config", cfg, "--json"])?;
    assert!(listed.status.success(), "{listed:?}");
    let items = listed.json()?["items"].as_array().cloned().unwrap_or_default();
    let resume: Vec<&Value> = items.iter().filter(|t| t["source"] == "RESUME").collect();
    assert_eq!(resume.len(), 1, "{items:?}");
    assert_eq!(resume[0]["status"], "DONE", "{items:?}");
    assert_eq!(resume[0]["work"], "run:g", "{items:?}");
    assert!(
        items.iter().all(|t| t["status"] != "PENDING"),
        "nothing left PENDING: {items:?}"
    );
    Ok(())
}

/// One `run` of a job file, expected to exit with `code`.
fn run_job(w: &World, file: &Path, code: i32) -> TestResult {
    let out = run(&["run", path_str(file), "--config", path_str(&w.config)])?;
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    Ok(())
}

fn inspect_json(w: &World, args: &[&str]) -> Result<Value, Box<dyn std::error::Error>> {
    let mut all = vec!["inspect"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", path_str(&w.config), "--json"]);
    let out = run(&all)?;
    assert!(out.status.success(), "{out:?}");
    out.json()
}

#[test]
fn gc_collects_settled_calls_attempts_runs_usage_and_errors_and_keeps_unsettled_ones() -> TestResult {
    let replies = vec![
        // job-1 (`scribe`): a reversible call whose first attempt fails
        // hard (a 503, retried: a numbered attempt row), then the answer.
        Reply::tool_call("post_note", json!({"text": "n"})).when_user("^note$"),
        Reply::text("noted").when_user("^note$").when_round(1),
        // g (`fixer`): the provider fails once (an error row), then the
        // resumed run finishes.
        Reply::raw("this is not json").when_user("^flaky$"),
        Reply::text("fine now").when_user("^flaky$"),
        // h (`broken`): fails and is never resumed — not settled.
        Reply::raw("this is not json either").when_user("^broken$"),
        // killed (`courier`): killed mid-delivery; its resume stops at the
        // call a human must confirm — not settled.
        Reply::tool_call("send_email", email("bob@example.com")).when_user("^tell bob$"),
    ];
    let w = world_with(replies, "enabled = false", false)?;
    let dir = w.dir.path();
    w.sink.script([503]);
    run_job(&w, &job(dir, "job-1", "scribe", "note")?, 0)?;
    run_job(&w, &job(dir, "g", "fixer", "flaky")?, 1)?;
    let resumed = run(&["run", "--resume", "g", "--config", path_str(&w.config)])?;
    assert!(resumed.status.success(), "{resumed:?}");
    run_job(&w, &job(dir, "h", "broken", "broken")?, 1)?;
    let before = w.sink.deliveries_len();
    w.sink.delay_replies(1_000);
    let child = spawn(&[
        "run",
        path_str(&job(dir, "killed", "courier", "tell bob")?),
        "--config",
        path_str(&w.config),
    ])?;
    wait_for("the delivery", || w.sink.deliveries_len() == before + 1)?;
    signal(&child, "KILL")?;
    finish(child)?;
    w.sink.delay_replies(0);
    w.sink.settle(DEADLINE)?;
    let resumed = run(&["run", "--resume", "killed", "--config", path_str(&w.config)])?;
    assert_eq!(resumed.json()?["outcome"], "needs_confirmation", "{resumed:?}");
    assert_eq!(inspect_json(&w, &["runs"])?["total"], 4);
    assert_eq!(inspect_json(&w, &["errors"])?["total"], 2);
    std::thread::sleep(Duration::from_millis(20));

    // Young rows stay: a TTL of an hour collects nothing.
    assert_eq!(
        gc(&w.config, &["--ttl", "1h", "--json"])?.json()?["collected"],
        collected(&[])
    );

    // Past the TTL: job-1 and g are settled, with everything they wrote —
    // the call, its attempt, both runs, the usage of their three provider
    // calls, g's error, and g's RESUME trigger (DONE: `--resume` finished
    // it; the newest trigger, h's, stays).
    let pass = gc(&w.config, &["--ttl", "1ms", "--json"])?.json()?;
    assert_eq!(
        pass["collected"],
        collected(&[
            ("triggers", 1),
            ("tool_calls", 1),
            ("tool_call_attempts", 1),
            ("runs", 2),
            ("token_usage", 3),
            ("errors", 1)
        ]),
        "{pass}"
    );
    assert_eq!(
        pass["detail"]["collected"]["tool_calls"]["runs"],
        json!(["job-1", "g"]),
        "{pass}"
    );
    // Kept: the runs not settled, with their rows — h's error (why it
    // stopped), killed's call in flight, the key waiting for a human, its
    // usage — and g's RESUME trigger's answer is in its log.
    let runs = inspect_json(&w, &["runs"])?;
    let ids: Vec<&str> = runs["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["run_id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, ["killed", "h"], "{runs}");
    let errors = inspect_json(&w, &["errors"])?;
    assert_eq!(errors["total"], 1, "{errors}");
    assert_eq!(errors["items"][0]["agent"]["name"], "broken", "{errors}");
    assert_eq!(inspect_json(&w, &["usage"])?["total"]["calls"], 1);
    let killed = inspect_json(&w, &["runs", "killed"])?;
    assert_eq!(killed["calls"].as_array().map(Vec::len), Some(1), "{killed}");
    assert_eq!(inspect_json(&w, &["confirmations"])?["total"], 1);
    let gone = run(&["inspect", "runs", "job-1", "--config", path_str(&w.config)])?;
    assert!(!gone.status.success(), "{gone:?}");

    // Idempotent: a second pass finds nothing; and the kept run still
    // resumes to the same question, sending nothing again.
    let again = gc(&w.config, &["--ttl", "1ms", "--json"])?.json()?;
    assert_eq!(again["collected"], collected(&[]), "{again}");
    let deliveries = w.sink.deliveries_len();
    let resumed = run(&["run", "--resume", "killed", "--config", path_str(&w.config)])?;
    assert_eq!(resumed.json()?["outcome"], "needs_confirmation", "{resumed:?}");
    assert_eq!(w.sink.deliveries_len(), deliveries, "nothing sent again");
    Ok(())
}

#[test]
fn gc_keeps_the_ledger_rows_of_a_parked_plain_turn_so_its_retry_sends_nothing_twice() -> TestResult {
    let replies = vec![
        Reply::tool_call("send_email", email("ada@example.com"))
            .when_user("^first$")
            .when_round(0),
        Reply::text("first done").when_user("^first$").when_round(1),
        Reply::text("second done").when_user("^second$"),
    ];
    // The email endpoint deduplicates, so the boot after the kill settles
    // the call in flight (DONE, by its key) instead of asking a human.
    let w = world_with(replies, "enabled = false", true)?;
    let (serve, addr) = start_serve_at(&w.config)?;
    client(addr).call(
        "POST",
        "/agents",
        Some(&json!({"name": "boss", "instructions": "Send what you are asked to."})),
    )?;
    // A plain turn (no work id), killed while its email is being sent.
    w.sink.delay_replies(2_000);
    let turn = std::thread::spawn(move || {
        // Its answer never comes: the daemon is killed mid-turn.
        client(addr)
            .call("POST", "/agents/boss/turn", Some(&json!({"prompt": "first"})))
            .is_ok()
    });
    wait_for("the delivery", || w.sink.deliveries_len() == 1)?;
    signal(&serve, "KILL")?;
    finish(serve)?;
    assert_eq!(turn.join().ok(), Some(false), "the killed turn answered");
    w.sink.delay_replies(0);
    w.sink.settle(DEADLINE)?;

    let (serve, api) = start_serve(&w.config)?;
    // A newer plain turn supersedes the interrupted one: parked, its
    // email DONE in the ledger, its result never logged.
    let second = api.call("POST", "/agents/boss/turn", Some(&json!({"prompt": "second"})))?;
    assert_eq!(second["response"], "second done", "{second}");
    std::thread::sleep(Duration::from_millis(20));
    let pass = gc(&w.config, &["--ttl", "1ms", "--json"])?.json()?;
    assert_eq!(
        pass["collected"],
        collected(&[]),
        "the parked turn's rows stay: {pass}"
    );
    assert_eq!(
        pass["stripped"],
        json!({"activity_log": 0, "tool_calls": 0}),
        "{pass}"
    );

    // The caller retries the first prompt: the parked turn continues, its
    // email answered from the ledger — not sent again.
    let requests = w.sink.requests();
    let first = api.call("POST", "/agents/boss/turn", Some(&json!({"prompt": "first"})))?;
    assert_eq!(first["response"], "first done", "{first}");
    assert_eq!(w.sink.requests(), requests, "nothing sent again");
    assert_eq!(w.sink.deliveries_len(), 1);
    // Now every turn of boss completed: its rows are settled and go.
    std::thread::sleep(Duration::from_millis(20));
    let pass = gc(&w.config, &["--ttl", "1ms", "--json"])?.json()?;
    assert_eq!(pass["collected"]["activity_log"], 1, "{pass}");
    assert_eq!(pass["collected"]["tool_calls"], 1, "{pass}");
    stop_serve(serve)?;
    Ok(())
}
