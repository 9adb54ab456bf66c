//! The runtime's operations on a healthy disk, and reopen (recovery) after a
//! clean stop: every acknowledged operation is visible after reopen.

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::recovery::check_invariants;
use durable_agent::runtime::{Runtime, RuntimeConfig, RuntimeError, TreeError};
use durable_agent::store::session::SessionState;

fn open(fs: &SimFs, slots: usize) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(fs.clone());
    let (rt, _) = Runtime::open(fs, Path::new("/data"), RuntimeConfig::new(7).with_slots(slots)).unwrap();
    rt
}

#[test]
fn acknowledged_operations_survive_reopen() {
    let sim = SimFs::new(SimConfig::new(1));
    let mut rt = open(&sim, 3);
    let root = rt.create_root("alpha", "be brief").unwrap();
    let child = rt.spawn_child(&root, "worker", "do work").unwrap();
    rt.run_turn(&root, "hello lookup").unwrap();
    rt.run_turn(&child, "send_email to bob").unwrap();
    let m1 = rt.send_message(&child, &root, "done").unwrap();
    let m2 = rt.send_message(&root, &child, "thanks").unwrap();
    let got = rt.deliver(&root).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, m1);
    assert!(rt.check_invariants().is_empty());
    let before = rt.state();
    drop(rt);

    let mut rt = open(&sim, 3);
    check_invariants(&sim, Path::new("/data")).unwrap();
    let after = rt.state();
    assert_eq!(after, before.normalized());
    assert_eq!(after.pending[&child][0].id, m2);
    assert!(after.delivered[&root].contains(&m1));
    // The conversation is rebuilt from the log, so the turn loop continues.
    let out = rt.run_turn(&root, "again").unwrap();
    let conv = &rt.state().conversations[&root];
    assert_eq!(
        conv[..before.conversations[&root].len()],
        before.conversations[&root][..]
    );
    assert_eq!(
        conv.last(),
        Some(&durable_agent::runtime::ConversationItem::Response { text: out.response })
    );
}

#[test]
fn lru_eviction_suspends_and_restores_on_next_use() {
    let sim = SimFs::new(SimConfig::new(2));
    let mut rt = open(&sim, 2);
    let a = rt.create_root("a", "").unwrap();
    let b = rt.create_root("b", "").unwrap();
    let c = rt.create_root("c", "").unwrap();
    let s = rt.state();
    assert_eq!(s.agents[&a].session_state, SessionState::Suspended);
    assert_eq!(s.agents[&b].session_state, SessionState::Active);
    assert_eq!(s.agents[&c].session_state, SessionState::Active);
    rt.run_turn(&a, "wake up").unwrap();
    let s = rt.state();
    assert_eq!(s.agents[&a].session_state, SessionState::Active);
    assert_eq!(s.agents[&b].session_state, SessionState::Suspended);
    assert!(rt.check_invariants().is_empty());
    let trace = sim.trace();
    assert!(trace
        .iter()
        .any(|t| t.label == "events.jsonl append suspend.result"));
    assert!(trace
        .iter()
        .any(|t| t.label == "events.jsonl append session.restored"));
}

#[test]
fn terminate_refuses_a_parent_with_children_and_removes_leaves() {
    let sim = SimFs::new(SimConfig::new(3));
    let mut rt = open(&sim, 3);
    let root = rt.create_root("root", "").unwrap();
    let child = rt.spawn_child(&root, "kid", "").unwrap();
    let err = rt.terminate(&root).unwrap_err();
    assert!(
        matches!(err, RuntimeError::Tree(TreeError::HasChildren { .. })),
        "{err}"
    );
    assert!(!rt.is_poisoned());
    rt.terminate(&child).unwrap();
    rt.terminate(&root).unwrap();
    assert!(rt.state().agents.is_empty());
    drop(rt);
    let rt = open(&sim, 3);
    assert!(rt.state().agents.is_empty());
    check_invariants(&sim, Path::new("/data")).unwrap();
}

#[test]
fn ids_and_logs_are_deterministic_for_a_seed() {
    let run = || {
        let sim = SimFs::new(SimConfig::new(9));
        let mut rt = open(&sim, 1);
        let r = rt.create_root("r", "i").unwrap();
        let c = rt.spawn_child(&r, "c", "j").unwrap();
        rt.run_turn(&c, "write_note please").unwrap();
        rt.send_message(&c, &r, "x").unwrap();
        (rt.state(), sim.disk_image())
    };
    assert_eq!(run(), run());
}
