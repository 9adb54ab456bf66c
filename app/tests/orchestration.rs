//! Orchestration tools end to end (issue 25 item 1): the real binary
//! (`serve`), the `mock-llm` on loopback playing every agent's model from
//! one script, and a kill -9 at every provider request of the exchange.
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
//! The script's replies say whom they answer (`when_system`, `when_user`,
//! `when_round`): which agent asks n-th depends on scheduling, and a kill
//! shifts it. They are `repeat`: a request a kill cut off is asked again
//! after the restart and must get the same answer.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};

use common::*;
use durable_agent_cli::mock_llm::{Exchange, MockLlm, Script};
use serde_json::{json, Value};

const BOSS: &str = "You run a team of two.";

/// Every agent's model. The children's instructions come from the boss's
/// spawn calls ("Do your task and report to your parent.").
const SCRIPT: &str = r#"
[[replies]]    # the boss, asked to begin: two children, a task each
when_system = "^You run a team"
when_user = "^go$"
when_round = 0
repeat = true
tool_calls = [
  { name = "spawn_agent", arguments = { name = "a", instructions = "Do your task and report to your parent." } },
  { name = "spawn_agent", arguments = { name = "b", instructions = "Do your task and report to your parent." } },
  { name = "send_message", arguments = { to = "a", payload = "task a" } },
  { name = "send_message", arguments = { to = "b", payload = "task b" } },
]
[[replies]]    # the boss after its calls, or woken by an answer
when_system = "^You run a team"
repeat = true
text = "done"
[[replies]]    # child a, woken by its task
when_system = "^Do your task"
when_user = "task a$"
when_round = 0
repeat = true
tool_calls = [{ name = "send_message", arguments = { to = "parent", payload = "answer to task a" } }]
[[replies]]
when_system = "^Do your task"
when_user = "task b$"
when_round = 0
repeat = true
tool_calls = [{ name = "send_message", arguments = { to = "parent", payload = "answer to task b" } }]
[[replies]]    # a child after its answer went
when_system = "^Do your task"
repeat = true
text = "done"
"#;

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

/// The mock on loopback, which kills the daemon (pid in `victim`) at its
/// kill point.
fn start_model(
    dir: &Path,
    kill: Kill,
    victim: Arc<Mutex<Option<u32>>>,
) -> Result<MockLlm, Box<dyn std::error::Error>> {
    let path = dir.join("script.toml");
    std::fs::write(&path, SCRIPT)?;
    let at = match kill {
        Kill::Never => None,
        Kill::Before(n) => Some(Exchange::Asked(n)),
        Kill::After(n) => Some(Exchange::Answered(n)),
    };
    let mock = MockLlm::scripted(loopback(), Script::load(&path)?)?.with_tap(move |point| {
        if Some(point) != at {
            return;
        }
        if let Some(pid) = victim.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
        }
    });
    Ok(mock)
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
    let model = start_model(dir.path(), kill, Arc::clone(&victim))?;
    let config = write_config(dir.path(), &model.base_url())?;
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
    // Each agent is offered its own tools: the children only what
    // `[orchestration] agents` grants them.
    let bodies = model.request_bodies();
    // The kill may cut off a request another agent is sending at that
    // instant: the mock records the part it read, which no model saw.
    // At most one per agent the kill can interrupt; a clean run has none.
    let cut = bodies.iter().filter(|b| !b.is_object()).count();
    let cut_allowed = if kill == Kill::Never { 0 } else { 2 };
    assert!(
        cut <= cut_allowed,
        "{kill:?}: {cut} request bodies are not JSON objects: {bodies:?}"
    );
    for body in bodies.iter().filter(|b| b.is_object()) {
        let offered: Vec<&str> = body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        let boss = body["messages"][0]["content"] == BOSS;
        let expected: &[&str] = match boss {
            true => &["spawn_agent", "send_message", "list_agents"],
            false => &["send_message"],
        };
        assert_eq!(
            offered, expected,
            "{kill:?}: tools offered (boss: {boss}) in {body}"
        );
    }
    Ok(model.request_bodies().len())
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
