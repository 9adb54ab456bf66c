//! An id a durable orchestration result reserved is never handed out
//! again, even when the agent whose log holds that result was terminated
//! before a reopen: here a spawn's child ids, reserved by an interrupted
//! turn that never completed (so the child was never created, and no
//! session record names them).
//!
//! Held to:
//! - docs/GUARANTEES.md #19: "Ids are a seed-derived prefix plus a counter
//!   (never reused, not even for cleaned orphans)".
//! - docs/GUARANTEES.md #33: "the id generator observes every reserved id."
//! - src/runtime/orchestration.rs: "Reserved ids are observed by the id
//!   generator at open — those in the logs of terminated agents too — so
//!   none is ever handed out twice."

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{CrashMode, Fs, SimConfig, SimFs};
use durable_agent::runtime::{
    CallResult, ConversationItem, Orchestration, ProviderError, ProviderReply, Runtime, RuntimeConfig,
    RuntimeError, Started, ToolRequest, TurnKind, TurnStep,
};
use serde_json::{json, Value};

fn open(sim: &SimFs) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let mut config = RuntimeConfig::new(8).with_slots(4);
    config.orchestration = Some(Orchestration::all());
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

#[test]
fn an_id_a_durable_spawn_result_reserved_is_never_handed_out_again() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim);
    let boss = rt.create_root("boss", "You run the team.").unwrap();

    // The boss's turn spawns "x": the result (durable) reserves its ids.
    let mut task = match rt.start_turn(&boss, "go", TurnKind::Plain).unwrap() {
        Started::Running(task, TurnStep::Call(_)) => task,
        other => panic!("{other:?}"),
    };
    let spawn = CallResult::Provider(Ok(ProviderReply {
        text: String::new(),
        tool_calls: vec![ToolRequest {
            tool: "spawn_agent".into(),
            args: json!({"name": "x", "instructions": "child"}),
            irreversible: false,
            invalid_args: None,
        }],
        usage: None,
    }));
    assert!(matches!(
        rt.continue_turn(&mut task, spawn).unwrap(),
        TurnStep::Call(_)
    ));
    let result = rt
        .open_turn(&boss)
        .unwrap()
        .unwrap()
        .items
        .iter()
        .find_map(|i| match i {
            ConversationItem::ToolResult { output, .. } => Some(output.clone()),
            _ => None,
        })
        .expect("the spawn's result");
    let record: Value = serde_json::from_str(&result).unwrap();
    let reserved_agent = record["spawned"]["agent_id"].as_str().unwrap().to_string();
    let reserved_session = record["spawned"]["session_id"].as_str().unwrap().to_string();
    // The turn is interrupted (provider failure), and the boss — with no
    // live child — is terminated.
    let failed = CallResult::Provider(Err(ProviderError("HTTP 503".into())));
    assert!(matches!(
        rt.continue_turn(&mut task, failed),
        Err(RuntimeError::Provider { .. })
    ));
    rt.terminate(&boss).unwrap();

    // Reopen (a restart), then create agents: none may get a reserved id.
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    let mut rt = open(&sim);
    let a = rt.create_root("a", "").unwrap();
    let b = rt.create_root("b", "").unwrap();
    let handed_out: Vec<String> = [&a, &b]
        .iter()
        .flat_map(|id| {
            [
                id.to_string(),
                rt.session_id(id).map(ToString::to_string).unwrap_or_default(),
            ]
        })
        .collect();
    for reserved in [&reserved_agent, &reserved_session] {
        assert!(
            !handed_out.contains(reserved),
            "id {reserved}, reserved by a durable spawn result, was handed out again: {handed_out:?}"
        );
    }
}
