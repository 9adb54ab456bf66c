//! A turn driven step by step (`start_turn` / `continue_turn`), its calls
//! performed outside the runtime: other agents' operations interleave
//! between its steps, the agent in flight is pinned (never evicted, no
//! second turn, no termination), a failed step ends the turn exactly as a
//! crash there would, and what interleaved is what recovery rebuilds.

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{CrashMode, Fs, SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, CallResult, OutsideCall, ProviderError, Runtime, RuntimeConfig, RuntimeError, Started, TurnKind,
    TurnStep, TurnTask,
};
use durable_agent::store::session::SessionState;

fn open(sim: &SimFs, slots: usize) -> Runtime {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    let config = RuntimeConfig::new(8).with_slots(slots);
    Runtime::open(fs, Path::new("/data"), config).unwrap().0
}

fn start(rt: &mut Runtime, agent: &AgentId, prompt: &str) -> (Box<TurnTask>, OutsideCall) {
    match rt.start_turn(agent, prompt, TurnKind::Plain).unwrap() {
        Started::Running(task, TurnStep::Call(call)) => (task, call),
        other => panic!("expected a provider call first, got {other:?}"),
    }
}

/// Perform `call` and every later call of `task` until the turn ends.
fn finish(rt: &mut Runtime, mut task: Box<TurnTask>, mut call: OutsideCall) -> String {
    let outside = rt.outside();
    loop {
        let result = outside.perform(&call);
        match rt.continue_turn(&mut task, result).unwrap() {
            TurnStep::Call(next) => call = next,
            TurnStep::Done(outcome) => return outcome.response,
        }
    }
}

#[test]
fn other_agents_run_whole_turns_while_a_turn_waits_for_its_provider_and_tool() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, 2);
    let a = rt.create_root("a", "").unwrap();
    let b = rt.create_root("b", "").unwrap();

    // a's turn: its provider call is out (the runtime is free meanwhile).
    let (mut task, call) = start(&mut rt, &a, "lookup the weather");
    assert!(matches!(call, OutsideCall::Provider(_)));
    let outside = rt.outside();
    let reply = outside.perform(&call);
    // b runs a whole turn and sends a message to a while a's reply is in hand.
    rt.run_turn(&b, "write_note about lunch").unwrap();
    rt.send_message(&b, &a, "hello from b").unwrap();
    let tool = match rt.continue_turn(&mut task, reply).unwrap() {
        TurnStep::Call(call @ OutsideCall::Tool(_)) => call,
        other => panic!("expected the lookup tool call, got {other:?}"),
    };
    // a's tool call is out: b runs another turn.
    rt.run_turn(&b, "write_note about dinner").unwrap();
    let response = finish(&mut rt, task, tool);
    assert!(response.contains("lookup the weather"), "{response}");

    let state = rt.state();
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    let rt = open(&sim, 2);
    assert_eq!(
        rt.state(),
        state.normalized(),
        "recovery rebuilds exactly what interleaved"
    );
    assert_eq!(state.conversations[&a].len(), 4, "prompt, call, result, response");
    assert_eq!(state.conversations[&b].len(), 8);
    assert_eq!(rt.pending(&a).len(), 1, "b's message still waits for a");
}

#[test]
fn the_agent_in_flight_is_pinned_to_its_slot_and_refuses_a_second_turn_eviction_and_termination() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, 1);
    let a = rt.create_root("a", "").unwrap();
    let b = rt.create_root("b", "").unwrap();
    let (task, call) = start(&mut rt, &a, "lookup x");

    assert!(matches!(
        rt.start_turn(&a, "lookup y", TurnKind::Plain),
        Err(RuntimeError::TurnInFlight(ref id)) if *id == a
    ));
    assert!(matches!(rt.evict(&a), Err(RuntimeError::TurnInFlight(_))));
    assert!(matches!(rt.terminate(&a), Err(RuntimeError::TurnInFlight(_))));
    // One slot, held by a's turn: b cannot take it (a is not evicted).
    assert!(matches!(
        rt.run_turn(&b, "write_note z"),
        Err(RuntimeError::SlotsBusy { limit: 1 })
    ));
    assert_eq!(rt.state().agents[&a].session_state, SessionState::Active);

    finish(&mut rt, task, call);
    // The turn ended: the pin is gone, b's turn evicts a as usual.
    rt.run_turn(&b, "write_note z").unwrap();
    assert_eq!(rt.state().agents[&a].session_state, SessionState::Suspended);
    rt.terminate(&a).unwrap();
}

#[test]
fn a_failed_step_ends_the_turn_as_a_crash_there_would_and_the_same_turn_resumes() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, 2);
    let a = rt.create_root("a", "").unwrap();
    let prompt = "lookup the tide";
    let (mut task, call) = start(&mut rt, &a, prompt);
    let outside = rt.outside();
    let tool = match rt.continue_turn(&mut task, outside.perform(&call)).unwrap() {
        TurnStep::Call(tool) => tool,
        other => panic!("{other:?}"),
    };
    let result = outside.perform(&tool);
    let round_two = match rt.continue_turn(&mut task, result).unwrap() {
        TurnStep::Call(call) => call,
        other => panic!("{other:?}"),
    };
    assert!(matches!(round_two, OutsideCall::Provider(ref p) if p.round == 1));
    // The second completion fails: the turn ends, kept open after round 0.
    let failed = CallResult::Provider(Err(ProviderError("503".into())));
    assert!(matches!(
        rt.continue_turn(&mut task, failed),
        Err(RuntimeError::Provider { .. })
    ));
    let open_turn = rt.open_turn(&a).unwrap().cloned().unwrap();
    assert_eq!(open_turn.round, 1);
    // The ended task cannot be advanced any more.
    let late = CallResult::Provider(Err(ProviderError("late".into())));
    assert!(matches!(
        rt.continue_turn(&mut task, late),
        Err(RuntimeError::TurnNotInFlight(_))
    ));

    // Running the same turn again resumes at round 1: the provider is asked
    // once (round 1), no tool runs again.
    let (task, call) = start(&mut rt, &a, prompt);
    assert!(matches!(call, OutsideCall::Provider(ref p) if p.round == 1));
    finish(&mut rt, task, call);

    // The log says the same after a crash.
    let state = rt.state();
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    assert_eq!(open(&sim, 2).state(), state.normalized());
}

#[test]
fn a_task_from_before_a_reopen_is_refused() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, 2);
    let a = rt.create_root("a", "").unwrap();
    let (mut task, call) = start(&mut rt, &a, "lookup q");
    let result = rt.outside().perform(&call);
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    let mut rt = open(&sim, 2);
    assert!(
        rt.open_turn(&a).unwrap().is_some(),
        "the interrupted turn is kept"
    );
    // Even with a turn of the same agent in flight in the new runtime.
    let (_new_task, _call) = start(&mut rt, &a, "lookup q");
    assert!(matches!(
        rt.continue_turn(&mut task, result),
        Err(RuntimeError::TurnNotInFlight(_))
    ));
}

/// A work turn that reads pending messages (the API's turn: they are in
/// its prompt) logs them in its `turn.start` and delivers them only with
/// its `turn.complete` (seed 002): cut short — a failed step, then a
/// crash — they stay pending; the retry of the work reads the very same
/// messages (not one that arrived since) and delivers them with the turn.
#[test]
fn a_work_turn_delivers_what_it_read_only_when_it_completes_and_its_retry_reads_the_same() {
    let sim = SimFs::new(SimConfig::new(8));
    let mut rt = open(&sim, 2);
    let a = rt.create_root("a", "").unwrap();
    let b = rt.create_root("b", "").unwrap();
    let m1 = rt.send_message(&b, &a, "first").unwrap();
    let reads = vec![m1.clone()];
    let started = rt
        .start_turn(
            &a,
            "write_note about first",
            TurnKind::WorkReading("api:w", &reads),
        )
        .unwrap();
    let Started::Running(mut task, TurnStep::Call(_)) = started else {
        panic!("expected a provider call first");
    };
    // The provider fails: the turn ends, nothing delivered.
    let failed = rt.continue_turn(&mut task, CallResult::Provider(Err(ProviderError("down".into()))));
    assert!(matches!(failed, Err(RuntimeError::Provider { .. })), "{failed:?}");
    assert_eq!(rt.pending(&a).len(), 1);
    assert_eq!(rt.started_work_reads(&a, "api:w").unwrap(), Some(&reads[..]));
    // A second message arrives; then the process dies.
    let m2 = rt.send_message(&b, &a, "second").unwrap();
    drop(rt);
    sim.restart(CrashMode::ProcessCrash);
    let mut rt = open(&sim, 2);
    let pending: Vec<_> = rt.pending(&a).iter().map(|m| m.id.clone()).collect();
    assert_eq!(
        pending,
        [m1.clone(), m2.clone()],
        "nothing delivered before the turn completed"
    );
    assert_eq!(rt.started_work_reads(&a, "api:w").unwrap(), Some(&reads[..]));
    // The retry passes no ids: it reads what the first attempt read.
    let started = rt
        .start_turn(&a, "write_note about first", TurnKind::WorkReading("api:w", &[]))
        .unwrap();
    let Started::Running(task, TurnStep::Call(call)) = started else {
        panic!("expected the turn to run");
    };
    finish(&mut rt, task, call);
    let pending: Vec<_> = rt.pending(&a).iter().map(|m| m.id.clone()).collect();
    assert_eq!(
        pending,
        std::slice::from_ref(&m2),
        "the retry delivered what it read, and only that"
    );
    assert_eq!(rt.started_work_reads(&a, "api:w").unwrap(), None);
    drop(rt);
    let rt = open(&sim, 2);
    let pending: Vec<_> = rt.pending(&a).iter().map(|m| m.id.clone()).collect();
    assert_eq!(pending, [m2], "after a reboot too");
}
