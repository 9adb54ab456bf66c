//! Tool-call ledger under faults at every I/O point (seed 004): acknowledged
//! transitions survive, exactly the unfinished calls come back for forced
//! replay, replay updates the original row (one row per key), a replay is
//! counted as it begins, and parking the run `waiting_for_human` is atomic
//! with the refused replay past the limit.

mod store_crash_common;

use durable_agent::sqlite::Db;
use durable_agent::store::tool_calls::*;
use durable_agent::store::StoreError;
use serde_json::json;
use store_crash_common::{sweep, KILLS};

const RUN: &str = "run-1";
const CALLS: u32 = 3;

#[derive(Default)]
struct Model {
    prepared: Vec<u32>,
    succeeded: Vec<u32>,
    /// Replays begun (and never answered) that were acknowledged.
    begun: u32,
    /// The refused replay past the limit was acknowledged.
    parked: bool,
}

fn call(seq: u32) -> NewToolCall {
    NewToolCall {
        id: format!("c{seq}"),
        run_id: RUN.into(),
        tool_name: "write_file".into(),
        raw_tool_name: "mcp__fs__write_file".into(),
        input: json!({ "path": format!("out/{seq}.txt") }),
        idempotency_key: format!("{RUN}:{seq}"),
        side_effect: SideEffect::Reversible,
    }
}

fn ledger() -> ToolCallStore {
    ToolCallStore { max_replays: 2 }
}

fn setup(db: &Db) {
    ledger().create_run(db.conn(), RUN, "s1", 0).unwrap();
}

fn run(db: &Db, m: &mut Model) -> Result<(), String> {
    let (c, l) = (db.conn(), ledger());
    let e = |e: StoreError| e.to_string();
    for seq in 1..=CALLS {
        l.prepare(c, &call(seq), 1).map_err(e)?;
        m.prepared.push(seq);
        l.mark_running(c, &format!("c{seq}"), 2).map_err(e)?;
        l.mark_succeeded(c, &format!("c{seq}"), &json!({ "bytes": seq }), 3)
            .map_err(e)?;
        m.succeeded.push(seq);
    }
    Ok(())
}

fn check(db: &Db, m: &Model) -> Vec<String> {
    let (c, l) = (db.conn(), ledger());
    let mut bad = Vec::new();
    let (calls, in_flight) = match (l.calls_of(c, RUN), l.in_flight(c, RUN)) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => return vec![format!("reading the ledger failed: {a:?} {b:?}")],
    };
    for seq in &m.prepared {
        if !calls.iter().any(|t| t.id == format!("c{seq}")) {
            bad.push(format!("prepared call c{seq} lost"));
        }
    }
    for seq in &m.succeeded {
        let id = format!("c{seq}");
        if !calls
            .iter()
            .any(|t| t.id == id && t.status == ToolCallStatus::Succeeded)
        {
            bad.push(format!("succeeded call {id} not succeeded after restart"));
        }
        if in_flight.iter().any(|t| t.id == id) {
            bad.push(format!("succeeded call {id} returned for replay"));
        }
    }
    let unfinished: Vec<&str> = calls
        .iter()
        .filter(|t| matches!(t.status, ToolCallStatus::Prepared | ToolCallStatus::Running))
        .map(|t| t.id.as_str())
        .collect();
    let replay: Vec<&str> = in_flight.iter().map(|t| t.id.as_str()).collect();
    if unfinished != replay {
        bad.push(format!(
            "replay queue {replay:?} != unfinished calls {unfinished:?}"
        ));
    }
    // Forced replay, then the run continues with the calls never prepared.
    for t in &in_flight {
        let replay = l
            .begin_replay(c, &t.id, ReplayOf::Crash, 10)
            .and_then(|_| l.record_replay(c, &t.id, Ok(&json!({ "replayed": true })), 10));
        if let Err(e) = replay {
            bad.push(format!("replay of {} failed: {e}", t.id));
        }
    }
    for seq in 1..=CALLS {
        if l.by_key(c, &format!("{RUN}:{seq}")).ok().flatten().is_none() {
            let ok = l
                .prepare(c, &call(seq), 11)
                .and_then(|t| l.mark_succeeded(c, &t.id, &json!({}), 12));
            if let Err(e) = ok {
                bad.push(format!("continuing c{seq} failed: {e}"));
            }
        }
    }
    match l.calls_of(c, RUN) {
        Ok(all) => {
            let ids: Vec<&str> = all.iter().map(|t| t.id.as_str()).collect();
            if ids != ["c1", "c2", "c3"] || all.iter().any(|t| t.status != ToolCallStatus::Succeeded) {
                bad.push(format!("after replay the ledger is {all:?}"));
            }
        }
        Err(e) => bad.push(format!("reading the ledger failed: {e}")),
    }
    bad
}

/// Setup for the replay sweep: one call left running by a crash.
fn setup_in_flight(db: &Db) {
    setup(db);
    ledger().prepare(db.conn(), &call(1), 1).unwrap();
    ledger().mark_running(db.conn(), "c1", 2).unwrap();
}

/// Two replays begin and never answer (the tool killed each process),
/// then the third ask is refused and parks the run.
fn run_dying_replays(db: &Db, m: &mut Model) -> Result<(), String> {
    for now in [10, 11] {
        ledger()
            .begin_replay(db.conn(), "c1", ReplayOf::Crash, now)
            .map_err(|e| e.to_string())?;
        m.begun += 1;
    }
    match ledger().begin_replay(db.conn(), "c1", ReplayOf::Crash, 12) {
        Ok(ReplayStart::Parked { .. }) => m.parked = true,
        Ok(other) => return Err(format!("the third ask after 2 replays: {other:?}")),
        Err(e) => return Err(e.to_string()),
    }
    Ok(())
}

fn check_parking(db: &Db, m: &Model) -> Vec<String> {
    let (c, l) = (db.conn(), ledger());
    let (Ok(Some(call)), Ok(status)) = (l.get(c, "c1"), l.run_status(c, RUN)) else {
        return vec!["cannot read c1 or the run after restart".into()];
    };
    let mut bad = Vec::new();
    if call.replay_attempts < m.begun {
        bad.push(format!(
            "{} replays begun and acked, {} recorded",
            m.begun, call.replay_attempts
        ));
    }
    let parked = status == RunStatus::WaitingForHuman;
    if (m.parked && !parked) || (parked && call.replay_attempts < 2) {
        bad.push(format!(
            "run {status:?} with {} replays begun (the refusal acked: {})",
            call.replay_attempts, m.parked
        ));
    }
    if call.status != ToolCallStatus::Running {
        bad.push(format!(
            "replays that never answered changed c1 to {:?}",
            call.status
        ));
    }
    bad
}

#[test]
fn unfinished_calls_and_only_they_are_replayed_once_at_every_fault_point() {
    let report = sweep(&KILLS, &Model::default, &setup, &run, &check);
    report.assert_clean("tool calls");
    eprintln!(
        "tool calls: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}

#[test]
fn waiting_for_human_is_atomic_with_the_last_failed_replay_at_every_fault_point() {
    let report = sweep(
        &KILLS,
        &Model::default,
        &setup_in_flight,
        &run_dying_replays,
        &check_parking,
    );
    report.assert_clean("replay parking");
    eprintln!(
        "replay parking: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}
