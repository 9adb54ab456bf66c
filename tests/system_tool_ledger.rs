//! The tool-call ledger's replay accounting and stripping, through
//! `System::boot` on SimFs and on the store alone: five bugs a review
//! proved (2026-11-28), each test failing before its fix.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use durable_agent::fs::{SimConfig, SimFs};
use durable_agent::runtime::{
    AgentId, FakeProvider, SessionId, ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest,
};
use durable_agent::store::schema::migrate;
use durable_agent::store::tool_calls::{
    NewToolCall, ReplayOf, RunStatus, SideEffect, ToolCallStatus, ToolCallStore,
};
use durable_agent::system::{parked_answer, session_run, Deps, LogicalClock, System, SystemConfig};
use durable_agent::world::World;
use serde_json::json;

const SEED: u64 = 7;
/// FakeProvider answers it with one `lookup` (reversible).
const LOOKUP: &str = "lookup the weather";

/// A clock the test moves.
#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl LogicalClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A reversible tool: its first `dies` runs never answer (the process
/// died inside the tool: the executor returns an error and nothing after
/// it runs), every later run answers a failure the model reads.
#[derive(Debug, Default)]
struct Dying {
    dies: AtomicU32,
    runs: AtomicU32,
}

impl ToolExecutor for Dying {
    fn execute(&self, _ctx: &ToolContext<'_>, _call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let left = self.dies.load(Ordering::SeqCst);
        if left > 0 {
            self.dies.store(left - 1, Ordering::SeqCst);
            return Err(ToolError::Failed("the process died inside the tool".into()));
        }
        Ok(ToolOutput {
            ok: false,
            output: "disk quota exceeded".into(),
        })
    }
}

fn boot(fs: &SimFs, tools: Arc<dyn ToolExecutor>, clock: Arc<Clock>) -> System {
    let deps = Deps {
        provider: Arc::new(FakeProvider::new(SEED)),
        tools,
        outbox: Arc::new(World::without_dedup()),
        clock,
    };
    System::boot(Arc::new(fs.clone()), SystemConfig::new("/root", SEED), deps)
        .expect("boot")
        .0
}

fn session_of(system: &System, agent: &AgentId) -> SessionId {
    system.runtime().state().agents[agent].session_id.clone()
}

/// A reversible call in flight at a crash, replayed on resume, answers
/// a failure: the model reads it and the turn completes. Before, the
/// ledger row stayed `running` for ever: the turn never asks for it
/// again (its result is logged), yet the ledger listed it in flight, `gc`
/// never collected it and `strip_payloads` never stripped it.
#[test]
fn a_failed_replay_the_model_read_is_settled_not_left_in_flight_for_ever() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let clock = Arc::new(Clock::default());
    let tool = Arc::new(Dying::default());
    tool.dies.store(1, Ordering::SeqCst);
    let mut system = boot(&fs, tool.clone(), clock.clone());
    let agent = system.runtime_mut().create_root("a", "").expect("agent");
    let died = system.runtime_mut().run_turn(&agent, LOOKUP);
    assert!(died.is_err(), "{died:?}");
    drop(system);

    let mut system = boot(&fs, tool.clone(), clock.clone());
    let outcome = system
        .runtime_mut()
        .run_turn(&agent, LOOKUP)
        .expect("resumed turn");
    let (call_id, _, output) = &outcome.tool_calls[0];
    assert!(!output.ok, "{output:?}");
    assert_eq!(tool.runs.load(Ordering::SeqCst), 2, "run, then one replay");
    assert!(
        system.runtime().open_turn(&agent).unwrap().is_none(),
        "the turn completed"
    );

    let store = ToolCallStore::default();
    let run = session_run(session_of(&system, &agent).as_str());
    let row = store.get(system.db().conn(), call_id).unwrap().unwrap();
    let in_flight = store.in_flight(system.db().conn(), &run).unwrap();
    // Long after, a GC pass: the turn is complete, nothing can resume.
    clock.0.store(10 * 24 * 3600 * 1000, Ordering::SeqCst);
    let gc = system.gc(1000).expect("gc");
    assert_eq!(
        (row.status, in_flight.len(), gc.tool_calls.calls.len()),
        (ToolCallStatus::Failed, 0, 1),
        "the answered call is left {:?} (in flight: {:?}), never collected: {:?}",
        row.status,
        in_flight.iter().map(|c| &c.id).collect::<Vec<_>>(),
        gc.tool_calls
    );
}

/// A replay that never returns (the process dies inside the replayed
/// tool, e.g. the tool itself brings the process down) counts: the
/// tool runs once and is replayed `max_replays` times, then the next ask
/// is not run, the run waits for a human and the turn reads why. Before,
/// a replay was counted after it returned, so every restart replayed the
/// call again with its count stuck at 0 — the one loop the limit exists
/// to stop.
#[test]
fn replays_the_process_died_in_count_toward_max_replays() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let clock = Arc::new(Clock::default());
    let tool = Arc::new(Dying::default());
    tool.dies.store(u32::MAX, Ordering::SeqCst);
    let mut system = boot(&fs, tool.clone(), clock.clone());
    let agent = system.runtime_mut().create_root("a", "").expect("agent");
    let max = ToolCallStore::default().max_replays;
    let mut answered = None;
    for _ in 0..=(max + 3) {
        match system.runtime_mut().run_turn(&agent, LOOKUP) {
            Ok(outcome) => {
                answered = Some(outcome);
                break;
            }
            Err(_) => {
                drop(system);
                system = boot(&fs, tool.clone(), clock.clone());
            }
        }
    }
    let run = session_run(session_of(&system, &agent).as_str());
    let store = ToolCallStore::default();
    let status = store.run_status(system.db().conn(), &run).unwrap();
    let calls = store.calls_of(system.db().conn(), &run).unwrap();
    let runs = tool.runs.load(Ordering::SeqCst);
    assert!(
        runs == 1 + max && status == RunStatus::WaitingForHuman,
        "the tool ran {runs} times (first run + {} replays, limit {max}); run {status:?}; \
         replay count in the ledger: {:?}",
        runs - 1,
        calls.iter().map(|c| c.replay_attempts).collect::<Vec<_>>()
    );
    let outcome = answered.expect("the turn was answered once the call was refused");
    let (_, _, output) = &outcome.tool_calls[0];
    assert_eq!(
        (output.ok, output.output.as_str()),
        (false, parked_answer("lookup", max).as_str())
    );
    assert_eq!(
        (calls[0].status, calls[0].replay_attempts),
        (ToolCallStatus::Failed, max),
        "the refused call is settled with the answer the model read"
    );
}

/// Once a run waits for a human, a call of it in flight is not replayed
/// before the human's release: before, nothing checked the run's status,
/// so the "limit" only relabelled the run while the tool went on running.
/// After the release, it runs again.
#[test]
fn a_call_of_a_run_parked_waiting_for_human_is_not_replayed_before_its_release() {
    let fs = SimFs::new(SimConfig::new(SEED));
    let clock = Arc::new(Clock::default());
    let tool = Arc::new(Dying::default());
    let mut system = boot(&fs, tool.clone(), clock);
    let agent = system.runtime_mut().create_root("a", "").expect("agent");
    let session = session_of(&system, &agent);
    let run = session_run(session.as_str());
    let store = ToolCallStore::default();
    let call = ToolRequest {
        tool: "lookup".into(),
        args: json!({ "key": "k0" }),
        irreversible: false,
        invalid_args: None,
    };
    {
        // Two calls the crashed processes had started; c-1's replays all
        // died, and the last ask parked the run.
        let db = system.db();
        store.create_run(db.conn(), &run, session.as_str(), 0).unwrap();
        for id in ["c-1", "c-2"] {
            let new = NewToolCall {
                id: id.into(),
                run_id: run.clone(),
                tool_name: "lookup".into(),
                raw_tool_name: "lookup".into(),
                input: json!({ "key": id }),
                idempotency_key: format!("key-{id}"),
                side_effect: SideEffect::Reversible,
            };
            store.prepare(db.conn(), &new, 0).unwrap();
            store.mark_running(db.conn(), id, 0).unwrap();
        }
        for _ in 0..=store.max_replays {
            store.begin_replay(db.conn(), "c-1", ReplayOf::Crash, 0).unwrap();
        }
    }
    assert_eq!(
        store.run_status(system.db().conn(), &run).unwrap(),
        RunStatus::WaitingForHuman
    );
    let tools = system.runtime().config().tools.clone();
    let ctx = |call_id| ToolContext {
        agent: &agent,
        session: &session,
        call_id,
        idempotency_key: if call_id == "c-1" { "key-c-1" } else { "key-c-2" },
        now: 0,
    };
    let out = tools.execute(&ctx("c-2"), &call).expect("answered");
    assert_eq!(
        tool.runs.load(Ordering::SeqCst),
        0,
        "a parked run's call ran ({out:?})"
    );
    assert_eq!((out.ok, out.output), (false, parked_answer("lookup", 0)));
    let row = store.get(system.db().conn(), "c-2").unwrap().unwrap();
    assert_eq!(
        row.status,
        ToolCallStatus::Failed,
        "settled with the answer the model read"
    );

    // Released, the stuck call runs again (a replay, counted).
    system.release_run(&run).expect("release");
    let out = tools.execute(&ctx("c-1"), &call).expect("replayed");
    assert_eq!(tool.runs.load(Ordering::SeqCst), 1, "{out:?}");
    let row = store.get(system.db().conn(), "c-1").unwrap().unwrap();
    assert_eq!((row.status, row.replay_attempts), (ToolCallStatus::Failed, 1));
}

/// Store level: `record_replay` with a failure on a call that is not in
/// flight (already settled) changes nothing on the call — its guard
/// matches no row — yet counts a replay and parks the run.
#[test]
fn a_failed_replay_recorded_for_a_settled_call_neither_counts_nor_parks_the_run() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    migrate(&conn, "mem").unwrap();
    let ledger = ToolCallStore { max_replays: 1 };
    ledger.create_run(&conn, "run-1", "s1", 0).unwrap();
    let new = NewToolCall {
        id: "c1".into(),
        run_id: "run-1".into(),
        tool_name: "t".into(),
        raw_tool_name: "t".into(),
        input: json!({}),
        idempotency_key: "k1".into(),
        side_effect: SideEffect::Reversible,
    };
    ledger.prepare(&conn, &new, 1).unwrap();
    ledger.mark_succeeded(&conn, "c1", &json!("ok"), 2).unwrap();
    let replay = ledger.record_replay(&conn, "c1", Err("eio"), 3);
    let status = ledger.run_status(&conn, "run-1").unwrap();
    let in_flight = ledger.in_flight(&conn, "run-1").unwrap();
    assert!(
        replay.is_err() && status == RunStatus::Running,
        "replay of a settled call: {replay:?}; run {status:?} with {} call(s) in flight",
        in_flight.len()
    );
    // (The success path refuses it: WrongState.)
    assert!(ledger.record_replay(&conn, "c1", Ok(&json!("x")), 4).is_err());
}

/// Store level: a settled call whose arguments happen to be exactly
/// `{"stripped":true}` is taken for stripped already, so its result and
/// error text are kept for ever (strip.rs: "their input_json and
/// result_json become STRIPPED_JSON and a failed call's error …").
#[test]
fn a_call_whose_arguments_look_stripped_still_has_its_result_stripped() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    migrate(&conn, "mem").unwrap();
    let ledger = ToolCallStore::default();
    ledger.create_run(&conn, "run-1", "s1", 0).unwrap();
    let new = NewToolCall {
        id: "c1".into(),
        run_id: "run-1".into(),
        tool_name: "t".into(),
        raw_tool_name: "t".into(),
        input: json!({ "stripped": true }),
        idempotency_key: "k1".into(),
        side_effect: SideEffect::Reversible,
    };
    ledger.prepare(&conn, &new, 1).unwrap();
    ledger
        .mark_succeeded(&conn, "c1", &json!("the user's secret answer"), 2)
        .unwrap();
    let report = ledger.strip_payloads(&conn, 1000, 10, &[]).unwrap();
    let row = ledger.get(&conn, "c1").unwrap().unwrap();
    assert_eq!(
        row.result,
        Some(json!({ "stripped": true })),
        "result kept after the strip TTL: {report:?}"
    );
}
