//! A spawn refused because every provider slot is held by a turn in
//! flight (`RuntimeError::SlotsBusy`: a refusal, not an unknown outcome,
//! so the runtime is not poisoned) changes nothing — the agent tree
//! included: no child without a session is left in the tree to pin its
//! parent, which can still be terminated once its turn ends, and memory
//! equals what recovery rebuilds.
//!
//! Held to:
//! - docs/GUARANTEES.md #9: "The agent tree has no orphans or dangling
//!   parents." — checked by "`Runtime::check_invariants` (in memory)".
//! - src/runtime/orchestrator.rs (the `Runtime` invariant): "the in-memory
//!   tree, agents and inboxes equal what recovery would rebuild from disk
//!   after the last acknowledged operation".
//! - docs/GUARANTEES.md #8: "An agent with live children cannot be
//!   terminated" — and one without live children can.

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{CrashMode, Fs, SimConfig, SimFs};
use durable_agent::runtime::{Runtime, RuntimeConfig, RuntimeError, Started, TurnKind, TurnStep};

fn open(sim: &SimFs, slots: usize) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let config = RuntimeConfig::new(8).with_slots(slots);
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

#[test]
fn a_spawn_refused_for_busy_slots_leaves_no_phantom_child_and_the_parent_can_still_be_terminated() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, 1);
    let parent = rt.create_root("parent", "").unwrap();
    // The parent's turn is in flight: it holds the one slot.
    let (task, call) = match rt.start_turn(&parent, "lookup x", TurnKind::Plain).unwrap() {
        Started::Running(task, TurnStep::Call(call)) => (task, call),
        other => panic!("expected a provider call, got {other:?}"),
    };
    let refused = rt.spawn_child(&parent, "child", "");
    assert!(
        matches!(refused, Err(RuntimeError::SlotsBusy { .. })),
        "the spawn is refused: {refused:?}"
    );
    assert!(!rt.is_poisoned(), "SlotsBusy is not an unknown outcome");

    // The refused spawn must leave nothing behind.
    assert_eq!(
        rt.check_invariants(),
        Vec::<String>::new(),
        "in-memory invariants after a refused spawn"
    );
    assert_eq!(
        rt.tree().get(&parent).unwrap().children.len(),
        0,
        "the parent has no child: the spawn was refused"
    );

    // Finish the parent's turn, then terminate it: it has no live children.
    let outside = rt.outside();
    let mut task = task;
    let mut call = call;
    while let TurnStep::Call(next) = rt.continue_turn(&mut task, outside.perform(&call)).unwrap() {
        call = next;
    }
    let terminated = rt.terminate(&parent);
    assert!(
        terminated.is_ok(),
        "a parent without live children can be terminated, got {terminated:?}"
    );

    // And memory agrees with what recovery rebuilds.
    let state = rt.state();
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    let rt = open(&sim, 1);
    assert_eq!(rt.state(), state.normalized());
}
