//! A command hook's `timeout_ms` bounds how long the round waits for it
//! ("killed after; logged and skipped ... unless fail_closed"), and what
//! it started dies with it (`app/src/hooks.rs`, `run`).
//!
//! Found by a review: once the hook program had exited, its output was
//! read to the end with no deadline, so a hook that left a background
//! process holding its stdout (`cmd &`, a logger, a daemonised helper)
//! held the tool round, and `Drop for ConfigHooks` ("each bounded by its
//! timeout"), for as long as that process lived; and a hook killed at its
//! timeout left its children running.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_agent::runtime::{AgentId, HookDecision, HookEvent, Hooks, PreToolUse};
use durable_agent_cli::config::{HookAction, HookConfig};
use durable_agent_cli::hooks::ConfigHooks;
use serde_json::json;

/// How long the grandchild keeps the pipe open (bounded, so a failing
/// test leaves nothing behind for long).
const GRANDCHILD_SECS: u64 = 8;

fn command_hook(event: &str, script: &str, timeout_ms: u64, fail_closed: bool) -> HookConfig {
    HookConfig {
        event: event.into(),
        matcher: None,
        action: HookAction::Command,
        reason: None,
        patch: None,
        command: vec!["sh".into(), "-c".into(), script.into()],
        timeout_ms,
        fail_closed,
    }
}

#[test]
fn a_pre_tool_use_hook_that_leaves_a_background_child_is_still_bounded_by_its_timeout() {
    // The hook answers "allow" and exits at once, but a background child
    // inherits its stdout and lives on for GRANDCHILD_SECS. The answer is
    // the hook's (allow), not a timeout's (fail_closed: deny).
    // (Its own duration: the observer test's child must not be counted.)
    let script = format!("sleep {GRANDCHILD_SECS}.5 & echo '{{\"decision\":\"allow\"}}'");
    let hooks = Arc::new(ConfigHooks::from_config(&[command_hook(
        "PreToolUse",
        &script,
        500,
        true,
    )]));
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    {
        let hooks = hooks.clone();
        std::thread::spawn(move || {
            let agent = AgentId::from_hex("00000000000000a1").expect("agent id");
            let args = json!({"to": "ada@example.com"});
            let decisions = hooks.pre_tool_use(&PreToolUse {
                agent: &agent,
                round: 0,
                index: 0,
                tool_name: "send_email",
                tool_input: &args,
                irreversible: true,
            });
            let _ = tx.send(decisions);
        });
    }
    // timeout_ms = 500: the round may wait about that long (plus process
    // start-up), never seconds more.
    let answer = rx.recv_timeout(Duration::from_secs(3));
    let waited = started.elapsed();
    assert!(
        answer.is_ok(),
        "pre_tool_use with timeout_ms = 500 had not answered after {waited:?}: the round waits for \
         the hook's background child (up to {GRANDCHILD_SECS} s), not for its timeout"
    );
    let decisions = answer.unwrap_or_default();
    assert!(
        matches!(decisions.as_slice(), [HookDecision::Allow]),
        "{decisions:?}"
    );
    // The background child was killed with the group at the deadline.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(processes_running(&["sleep", &format!("{GRANDCHILD_SECS}.5")]), 0);
}

#[test]
fn dropping_the_hooks_waits_for_an_observer_at_most_its_timeout() {
    // An observe-only hook whose program exits at once but leaves a
    // background child on its stdout: `Drop` joins the observer thread,
    // which is documented as bounded by the hook's timeout.
    let script = format!("sleep {GRANDCHILD_SECS} & true");
    let hooks = ConfigHooks::from_config(&[command_hook("TurnEnd", &script, 500, false)]);
    let agent = AgentId::from_hex("00000000000000a1").expect("agent id");
    hooks.observe(&HookEvent::TurnEnd { agent, turn: 0 });
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        drop(hooks);
        let _ = tx.send(());
    });
    let done = rx.recv_timeout(Duration::from_secs(3));
    assert!(
        done.is_ok(),
        "dropping ConfigHooks (an observer with timeout_ms = 500) had not returned after {:?}: \
         `run` at exit waits for the observer's background child, not its timeout",
        started.elapsed()
    );
}

/// Control: the same hook without the background child answers well
/// within the bound.
#[test]
fn control_the_same_hook_without_a_background_child_answers_in_time() {
    let script = "echo '{\"decision\":\"deny\",\"reason\":\"late\"}'";
    let hooks = ConfigHooks::from_config(&[command_hook("PreToolUse", script, 500, true)]);
    let agent = AgentId::from_hex("00000000000000a1").expect("agent id");
    let args = json!({});
    let started = Instant::now();
    let decisions = hooks.pre_tool_use(&PreToolUse {
        agent: &agent,
        round: 0,
        index: 0,
        tool_name: "send_email",
        tool_input: &args,
        irreversible: true,
    });
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(decisions.as_slice(), [HookDecision::Deny { .. }]),
        "{decisions:?}"
    );
}

/// Every live process whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> usize {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
                .count()
        })
        .unwrap_or(0)
}

/// "timeout_ms = 5000  # killed after": the hook's process group is
/// killed, not only its direct child (which left one process per
/// timed-out round running).
#[test]
fn a_hook_killed_at_its_timeout_leaves_nothing_running() {
    // Not `exec`ed by sh (a command follows), so sleep is sh's child.
    let marker = ["sleep", "7.25"];
    let script = "sleep 7.25; echo '{\"decision\":\"allow\"}'";
    let hooks = ConfigHooks::from_config(&[command_hook("PreToolUse", script, 300, true)]);
    let agent = AgentId::from_hex("00000000000000a1").expect("agent id");
    let args = json!({});
    let decisions = hooks.pre_tool_use(&PreToolUse {
        agent: &agent,
        round: 0,
        index: 0,
        tool_name: "send_email",
        tool_input: &args,
        irreversible: true,
    });
    // Timed out and fails closed: denied.
    assert!(
        matches!(decisions.as_slice(), [HookDecision::Deny { .. }]),
        "{decisions:?}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let left = processes_running(&marker);
    assert_eq!(
        left, 0,
        "the hook was 'killed' at its 300 ms timeout, yet {left} process(es) it started are still running"
    );
}
