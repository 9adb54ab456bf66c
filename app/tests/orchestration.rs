//! Orchestration tools end to end (issue 25 item 1): the real binary
//! (`serve`), a model on loopback, and a kill -9 at every provider request
//! of the exchange.
//!
//! The exchange: a trigger asks the boss to "go"; the boss's model spawns
//! children `a` and `b` and messages each a task in one turn; the children
//! are created when that turn ends and woken by their messages; each
//! answers its parent with `send_message`; the boss is woken by each
//! answer. Kill points: before the n-th provider request is answered, and
//! just after it is answered, for every n of a clean run. After a restart
//! the exchange must finish with each child created once, each message
//! enqueued once (none lost, none doubled) and read.
//!
//! The model is a function of the request (who asks — the system prompt —
//! and how far its turn got), not the `mock-llm` script: a script answers
//! the n-th request with the n-th reply whoever asks, and a kill shifts
//! which agent asks n-th.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;
use durable_agent_cli::server::{json_response, respond, LoopbackServer, Recorded};
use serde_json::{json, Value};

const BOSS: &str = "You run a team of two.";
const CHILD: &str = "Do your task and report to your parent.";

/// When to kill the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    Never,
    /// While the n-th request (1-based) is out: before it is answered.
    Before(usize),
    /// Right after the n-th answer went out: the persistence steps that
    /// follow race with the kill.
    After(usize),
}

/// The model's answer to one chat-completions request body.
fn model(body: &Value) -> Value {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let system = messages.first().and_then(|m| m["content"].as_str()).unwrap_or("");
    let last_user = messages.iter().rposition(|m| m["role"] == "user").unwrap_or(0);
    let prompt = messages[last_user]["content"].as_str().unwrap_or("");
    let round = messages[last_user..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    let call = |i: usize, name: &str, args: Value| json!({"id": format!("c{i}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}});
    let calls = match (system, round) {
        (BOSS, 0) if prompt.starts_with("go") => vec![
            call(0, "spawn_agent", json!({"name": "a", "instructions": CHILD})),
            call(1, "spawn_agent", json!({"name": "b", "instructions": CHILD})),
            call(2, "send_message", json!({"to": "a", "payload": "task a"})),
            call(3, "send_message", json!({"to": "b", "payload": "task b"})),
        ],
        (CHILD, 0) => {
            let task = prompt.lines().last().unwrap_or("").trim();
            vec![call(
                0,
                "send_message",
                json!({"to": "parent", "payload": format!("answer to {task}")}),
            )]
        }
        _ => Vec::new(),
    };
    let message = match calls.is_empty() {
        true => json!({"role": "assistant", "content": "done"}),
        false => json!({"role": "assistant", "content": null, "tool_calls": calls}),
    };
    json!({
        "id": "m", "object": "chat.completion", "model": "mock-1",
        "choices": [{"index": 0, "message": message, "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
}

/// The model on loopback, which kills the daemon (pid in `victim`) at its
/// kill point.
struct Model {
    server: LoopbackServer,
    requests: Arc<AtomicUsize>,
}

fn start_model(kill: Kill, victim: Arc<Mutex<Option<u32>>>) -> Result<Model, Box<dyn std::error::Error>> {
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&requests);
    let kill9 = move || {
        if let Some(pid) = victim.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    };
    let server = LoopbackServer::start(loopback(), "model", move |mut request: tiny_http::Request| {
        let recorded = Recorded::read(&mut request);
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        if kill == Kill::Before(n) {
            kill9();
        }
        let body: Value = serde_json::from_str(&recorded.body).unwrap_or(Value::Null);
        respond(request, json_response(200, &model(&body).to_string()));
        if kill == Kill::After(n) {
            kill9();
        }
    })?;
    Ok(Model { server, requests })
}

fn write_config(dir: &Path, base_url: &str) -> std::io::Result<PathBuf> {
    let path = dir.join("agent.toml");
    let api = free_addr()?;
    std::fs::write(
        &path,
        format!(
            r#"[provider]
base_url = "{base_url}"
model = "mock-1"
timeout_ms = 15000
max_retries = 0
backoff_base_ms = 10
backoff_max_ms = 50

[runtime]
root = "root"

[api]
listen = "{api}"
token_env = "{TOKEN_ENV}"

[[tools]]
kind = "spawn_agent"
[[tools]]
kind = "send_message"
[[tools]]
kind = "list_agents"

[orchestration]
max_depth = 1
max_children = 2
agents = {{ a = ["send_message"], b = ["send_message"] }}
"#
        ),
    )?;
    Ok(path)
}

/// Start `serve`; its URL once it listens.
fn start_serve(config: &Path) -> Result<(Child, String), Box<dyn std::error::Error>> {
    let mut child = spawn(&["serve", "--config", path_str(config)])?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim().is_empty() {
        let out = finish(child)?;
        return Err(format!("serve printed no URL: {out:?}").into());
    }
    Ok((child, line.trim().to_string()))
}

fn client(url: &str) -> Result<Client, Box<dyn std::error::Error>> {
    let addr = url.trim_start_matches("http://").parse()?;
    Ok(Client::new(addr, Duration::from_secs(10)).with_token(Token::new(TEST_TOKEN)))
}

/// What the root's logs hold: every `agent.created` name (by session),
/// every enqueued message (payload by id), every delivered id, and the
/// completed turns per agent name.
#[derive(Debug, Default)]
struct Disk {
    created: Vec<String>,
    enqueued: BTreeMap<String, Vec<String>>,
    delivered: Vec<String>,
    turns: BTreeMap<String, usize>,
}

fn read_disk(root: &Path) -> Disk {
    let mut disk = Disk::default();
    let Ok(dirs) = std::fs::read_dir(root.join("agents")) else {
        return disk;
    };
    for dir in dirs.flatten() {
        let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap_or_default();
        let mut name = String::new();
        // Only complete lines: a live daemon may be mid-append.
        for line in text.lines().filter(|l| l.ends_with('}')) {
            let Ok(entry) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let data = &entry["data"];
            let ids = |v: &Value| -> Vec<String> {
                v.as_array()
                    .map(|a| a.iter().filter_map(|i| i.as_str().map(str::to_string)).collect())
                    .unwrap_or_default()
            };
            match entry["event"].as_str().unwrap_or("") {
                "agent.created" => {
                    name = data["name"].as_str().unwrap_or("").to_string();
                    disk.created.push(name.clone());
                }
                "message.enqueued" => disk
                    .enqueued
                    .entry(data["payload"].as_str().unwrap_or("").to_string())
                    .or_default()
                    .push(data["message_id"].as_str().unwrap_or("").to_string()),
                "message.delivered" => disk.delivered.extend(ids(&data["message_ids"])),
                "turn.complete" => {
                    disk.delivered.extend(ids(&data["delivered"]));
                    *disk.turns.entry(name.clone()).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    disk.created.sort();
    disk
}

const PAYLOADS: [&str; 4] = ["answer to task a", "answer to task b", "task a", "task b"];

impl Disk {
    /// The exchange finished: every message read, every turn done.
    fn finished(&self) -> bool {
        PAYLOADS.iter().all(|p| {
            self.enqueued
                .get(*p)
                .is_some_and(|ids| ids.iter().all(|id| self.delivered.contains(id)))
        }) && self.turns.get("boss") >= Some(&3)
            && self.turns.get("a") >= Some(&1)
            && self.turns.get("b") >= Some(&1)
    }

    /// Each child once, each message once, all read.
    fn check(&self, kill: Kill) -> TestResult {
        assert_eq!(
            self.created,
            ["a", "b", "boss"],
            "{kill:?}: agents created: {self:#?}"
        );
        for p in PAYLOADS {
            let ids = self.enqueued.get(p).cloned().unwrap_or_default();
            assert_eq!(
                ids.len(),
                1,
                "{kill:?}: message {p:?} enqueued {} times: {self:#?}",
                ids.len()
            );
            assert!(
                self.delivered.contains(&ids[0]),
                "{kill:?}: {p:?} never read: {self:#?}"
            );
        }
        assert_eq!(self.enqueued.len(), PAYLOADS.len(), "{kill:?}: {self:#?}");
        assert_eq!(self.turns.get("a"), Some(&1), "{kill:?}: {self:#?}");
        assert_eq!(self.turns.get("b"), Some(&1), "{kill:?}: {self:#?}");
        assert_eq!(self.turns.get("boss"), Some(&3), "{kill:?}: {self:#?}");
        Ok(())
    }
}

/// Run the exchange with `kill`; returns how many model requests it took.
fn exchange(kill: Kill) -> Result<usize, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let victim = Arc::new(Mutex::new(None));
    let model = start_model(kill, Arc::clone(&victim))?;
    let config = write_config(dir.path(), &format!("{}/v1", model.server.url()))?;
    let root = dir.path().join("root");
    let (first, url) = start_serve(&config)?;
    *victim.lock().unwrap_or_else(|e| e.into_inner()) = Some(first.id());
    let api = client(&url)?;
    api.call(
        "POST",
        "/agents",
        Some(&json!({"name": "boss", "instructions": BOSS})),
    )?;
    api.call(
        "POST",
        "/triggers",
        Some(&json!({"dedup_key": "go", "agent": "boss", "prompt": "go"})),
    )?;
    let mut daemon = first;
    if kill == Kill::Never {
        wait_for("the exchange to finish", || read_disk(&root).finished())?;
    } else {
        // The kill point is always reached (a clean run makes every
        // request); then restart on the same root: the exchange must finish.
        wait_for("the kill", || matches!(daemon.try_wait(), Ok(Some(_))))?;
        finish(daemon)?;
        let (second, _) = start_serve(&config)?;
        daemon = second;
        wait_for("the exchange to finish after the restart", || {
            read_disk(&root).finished()
        })?;
    }
    signal(&daemon, "TERM")?;
    let out = finish(daemon)?;
    assert!(out.status.success(), "{kill:?}: serve failed: {out:?}");
    read_disk(&root).check(kill)?;
    Ok(model.requests.load(Ordering::SeqCst))
}

#[test]
fn a_kill_9_at_any_request_of_the_exchange_loses_no_message_and_creates_no_child_twice() -> TestResult {
    let requests = exchange(Kill::Never)?;
    assert_eq!(requests, 8, "a clean exchange asks the model 8 times");
    for n in 1..=requests {
        exchange(Kill::Before(n))?;
        exchange(Kill::After(n))?;
    }
    Ok(())
}
