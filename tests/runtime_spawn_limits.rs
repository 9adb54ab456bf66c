//! The spawn limits count the spawns of every turn not completed — a
//! *parked* one too (an interrupted turn a newer turn superseded): running
//! it again completes it and creates its children, so they were promised
//! a place when their calls ran. A newer turn's spawn is refused past
//! `max_children` or `max_agents`, or under a name a parked turn's child
//! already has, and after both turns complete the tree keeps the limits
//! and each parent's children's names unique.
//!
//! Held to:
//! - src/runtime/orchestration.rs (module doc): limits are checked "when
//!   the call runs, against the live tree plus the spawns of every turn of
//!   a live agent not completed — in flight, interrupted, or parked by a
//!   newer turn".
//! - `Orchestration::max_children` / `max_agents`: live, and spawned in
//!   turns not completed (in flight, interrupted or parked).
//! - docs/GUARANTEES.md #33: "Limits (`max_depth`, `max_children`,
//!   `max_agents`) and per-agent grants are checked when the call runs; a
//!   refused call is a failed result the model reads."
//! - docs/GUARANTEES.md #5: an interrupted turn superseded by another "is
//!   parked", and running it again continues it.

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, CallResult, ConversationItem, Orchestration, ProviderError, ProviderReply, Runtime,
    RuntimeConfig, RuntimeError, Started, ToolRequest, TurnKind, TurnStep, TurnTask,
};
use serde_json::json;

fn open(sim: &SimFs, orch: Orchestration) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut config = RuntimeConfig::new(8).with_slots(4);
    config.orchestration = Some(orch);
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

fn spawn(name: &str) -> CallResult {
    CallResult::Provider(Ok(ProviderReply {
        text: String::new(),
        tool_calls: vec![ToolRequest {
            tool: "spawn_agent".into(),
            args: json!({"name": name, "instructions": "child"}),
            irreversible: false,
            invalid_args: None,
        }],
        usage: None,
    }))
}

fn text(t: &str) -> CallResult {
    CallResult::Provider(Ok(ProviderReply {
        text: t.into(),
        tool_calls: Vec::new(),
        usage: None,
    }))
}

fn start(rt: &mut Runtime, agent: &AgentId, prompt: &str) -> Box<TurnTask> {
    match rt.start_turn(agent, prompt, TurnKind::Plain).unwrap() {
        Started::Running(task, TurnStep::Call(_)) => task,
        other => panic!("expected a provider call, got {other:?}"),
    }
}

/// The result the spawn call of the turn's last round got (from the log's
/// view of the turn: the open turn's items).
fn last_spawn_result(rt: &Runtime, agent: &AgentId) -> (bool, String) {
    let open = rt.open_turn(agent).unwrap().expect("an open turn");
    open.items
        .iter()
        .rev()
        .find_map(|i| match i {
            ConversationItem::ToolResult { ok, output, .. } => Some((*ok, output.clone())),
            _ => None,
        })
        .expect("a tool result")
}

fn children_named(rt: &Runtime, parent: &AgentId) -> Vec<String> {
    let node = rt.tree().get(parent).unwrap();
    node.children
        .iter()
        .map(|c| rt.tree().get(c).unwrap().name.clone())
        .collect()
}

/// Turn "first" spawns `first_child` and is interrupted by a provider
/// failure; turn "second" supersedes it and spawns `second_child`, then
/// completes; turn "first" is run again and completes.
fn scenario(
    orch: Orchestration,
    first_child: &str,
    second_child: &str,
) -> (Runtime, AgentId, (bool, String)) {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, orch);
    let boss = rt.create_root("boss", "You run the team.").unwrap();

    let mut t1 = start(&mut rt, &boss, "first");
    match rt.continue_turn(&mut t1, spawn(first_child)).unwrap() {
        TurnStep::Call(_) => {}
        other => panic!("expected round 1's ask, got {other:?}"),
    }
    let (ok, out) = last_spawn_result(&rt, &boss);
    assert!(ok, "the first spawn is within the limits: {out}");
    // Round 1's ask fails: the turn stays open, interrupted.
    let failed = CallResult::Provider(Err(ProviderError("HTTP 503".into())));
    assert!(matches!(
        rt.continue_turn(&mut t1, failed),
        Err(RuntimeError::Provider { .. })
    ));

    // Another turn supersedes it (the first one is parked) and spawns.
    let mut t2 = start(&mut rt, &boss, "second");
    match rt.continue_turn(&mut t2, spawn(second_child)).unwrap() {
        TurnStep::Call(_) => {}
        other => panic!("expected round 1's ask, got {other:?}"),
    }
    let second = last_spawn_result(&rt, &boss);
    match rt.continue_turn(&mut t2, text("done")).unwrap() {
        TurnStep::Done(_) => {}
        other => panic!("{other:?}"),
    }

    // The parked turn is run again (same prompt): it resumes at round 1.
    let mut t1 = start(&mut rt, &boss, "first");
    match rt.continue_turn(&mut t1, text("done")).unwrap() {
        TurnStep::Done(_) => {}
        other => panic!("{other:?}"),
    }
    (rt, boss, second)
}

#[test]
fn a_parked_turns_spawn_counts_against_max_children() {
    let orch = Orchestration {
        max_children: 1,
        ..Orchestration::all()
    };
    let (rt, boss, (second_ok, second_out)) = scenario(orch, "x", "y");
    let children = children_named(&rt, &boss);
    assert!(
        children.len() <= 1,
        "max_children = 1, but boss has {} children {children:?} (the second spawn was answered ok={second_ok}: {second_out})",
        children.len()
    );
    assert!(!second_ok, "the newer turn's spawn is refused: {second_out}");
}

#[test]
fn a_parked_turns_spawn_counts_against_max_agents() {
    let orch = Orchestration {
        max_agents: 2,
        ..Orchestration::all()
    };
    let (rt, _boss, (second_ok, second_out)) = scenario(orch, "x", "y");
    let n = rt.tree().nodes().len();
    assert!(
        n <= 2,
        "max_agents = 2, but the tree holds {n} agents (the second spawn was answered ok={second_ok}: {second_out})"
    );
    assert!(!second_ok, "the newer turn's spawn is refused: {second_out}");
}

#[test]
fn a_parked_turns_spawn_keeps_its_childs_name_unique_under_the_parent() {
    let (rt, boss, (second_ok, second_out)) = scenario(Orchestration::all(), "x", "x");
    let children = children_named(&rt, &boss);
    let xs = children.iter().filter(|n| *n == "x").count();
    assert!(
        xs <= 1,
        "boss has {xs} children named \"x\" {children:?} (the second spawn was answered ok={second_ok}: {second_out})"
    );
    assert!(!second_ok, "the newer turn's spawn is refused: {second_out}");
}
