//! Loop checkpoints + messages (seeds 000/003), the tool-call ledger
//! (seed 004), token usage, errors numbered by attempt (seed 000).

use durable_agent::canary::{Canaries, Canary};
use durable_agent::store::checkpoints::*;
use durable_agent::store::schema::migrate;
use durable_agent::store::tool_calls::*;
use durable_agent::store::usage::*;
use durable_agent::store::StoreError;
use rusqlite::Connection;
use serde_json::json;

fn db() -> Connection {
    let c = Connection::open_in_memory().unwrap();
    migrate(&c, "mem").unwrap();
    c
}

fn round(store: &CheckpointStore, conn: &Connection, turn: u64) {
    for (role, text) in [("assistant", "call tool"), ("tool", "result")] {
        store
            .append_message(
                conn,
                "s1",
                turn,
                &Message::new(role, &format!("{text} {turn}")),
                turn,
            )
            .unwrap();
    }
}

fn input(turn: u64) -> CheckpointInput {
    CheckpointInput {
        run_id: "run-1".into(),
        session_id: "s1".into(),
        turn,
        total_usage: TokenUsage {
            input_tokens: 10 * turn,
            output_tokens: turn,
        },
        tool_calls_count: turn,
    }
}

#[test]
fn checkpoint_captures_boundary_and_messages_of_its_session() {
    let conn = db();
    let store = CheckpointStore::default();
    store
        .append_message(&conn, "other", 0, &Message::new("user", "noise"), 0)
        .unwrap();
    store
        .append_message(&conn, "s1", 0, &Message::new("user", "hi"), 0)
        .unwrap();
    round(&store, &conn, 1);
    let cp = store.write_checkpoint(&conn, &input(1), 7).unwrap();
    assert_eq!(cp.last_msg_id, 4);
    assert_eq!(cp.messages.len(), 3);
    assert!(cp.messages.iter().all(|m| m.session_id == "s1"));
    let loaded = store.latest_checkpoint(&conn, "run-1").unwrap().unwrap();
    assert_eq!(loaded, cp);
    assert_eq!(loaded.schema_version, LOOP_CHECKPOINT_SCHEMA_VERSION);
}

#[test]
fn resume_rolls_back_the_partial_round_past_the_checkpoint() {
    let conn = db();
    let store = CheckpointStore::default();
    store
        .append_message(&conn, "s1", 0, &Message::new("user", "hi"), 0)
        .unwrap();
    round(&store, &conn, 1);
    let cp = store.write_checkpoint(&conn, &input(1), 1).unwrap();
    store
        .append_message(&conn, "s1", 2, &Message::new("assistant", "half a round"), 2)
        .unwrap();
    let r = store.resume(&conn, "run-1", "s1").unwrap();
    assert_eq!(r.rolled_back, 1);
    assert_eq!(r.messages, cp.messages);
    assert_eq!(
        store.messages_up_to(&conn, "s1", i64::MAX).unwrap(),
        cp.messages,
        "partial row deleted"
    );
    assert_eq!(r.checkpoint.unwrap().turn, 1);
}

#[test]
fn canary_checkpoint_rollback_skipped_reloads_the_partial_round() {
    let conn = db();
    let store = CheckpointStore::new(Canaries::only(Canary::CheckpointRollbackSkipped));
    round(&store, &conn, 1);
    let cp = store.write_checkpoint(&conn, &input(1), 1).unwrap();
    store
        .append_message(&conn, "s1", 2, &Message::new("assistant", "half"), 2)
        .unwrap();
    let r = store.resume(&conn, "run-1", "s1").unwrap();
    assert_eq!(r.rolled_back, 0);
    assert_ne!(r.messages, cp.messages);
}

#[test]
fn resume_without_checkpoint_loads_every_message() {
    let conn = db();
    let store = CheckpointStore::default();
    round(&store, &conn, 1);
    let r = store.resume(&conn, "run-1", "s1").unwrap();
    assert!(r.checkpoint.is_none());
    assert_eq!(r.messages.len(), 2);
}

#[test]
fn future_checkpoint_schema_is_refused_with_run_and_versions() {
    let conn = db();
    let store = CheckpointStore::default();
    store.write_checkpoint(&conn, &input(1), 1).unwrap();
    conn.execute(
        "UPDATE loop_checkpoints SET schema_version = 9, messages_json = '{new format'",
        [],
    )
    .unwrap();
    let err = store.latest_checkpoint(&conn, "run-1").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::FutureCheckpoint {
                found: 9,
                supported: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("run-1"));
    assert!(store.resume(&conn, "run-1", "s1").is_err(), "resume refuses too");
    // An older checkpoint (pre-v1 = 0) still loads.
    conn.execute(
        "UPDATE loop_checkpoints SET schema_version = 0, messages_json = '[]'",
        [],
    )
    .unwrap();
    assert_eq!(
        store
            .latest_checkpoint(&conn, "run-1")
            .unwrap()
            .unwrap()
            .schema_version,
        0
    );
}

fn call(id: &str, seq: u32) -> NewToolCall {
    NewToolCall {
        id: id.into(),
        run_id: "run-1".into(),
        tool_name: "write_file".into(),
        raw_tool_name: "mcp__fs__write_file".into(),
        input: json!({"path": "a.txt", "seq": seq}),
        idempotency_key: format!("run-1:{seq}"),
        side_effect: SideEffect::Reversible,
    }
}

#[test]
fn in_flight_calls_are_returned_for_replay_in_order_and_success_updates_original_row() {
    let conn = db();
    let ledger = ToolCallStore { max_replays: 2 };
    ledger.create_run(&conn, "run-1", "s1", 0).unwrap();
    ledger.prepare(&conn, &call("c1", 1), 1).unwrap();
    ledger.mark_running(&conn, "c1", 2).unwrap();
    ledger.mark_succeeded(&conn, "c1", &json!("ok"), 3).unwrap();
    ledger.prepare(&conn, &call("c2", 2), 4).unwrap();
    ledger.mark_running(&conn, "c2", 5).unwrap();
    ledger.prepare(&conn, &call("c3", 3), 6).unwrap();
    let ids: Vec<String> = ledger
        .in_flight(&conn, "run-1")
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["c2", "c3"]);
    // Re-preparing the same key returns the existing row, no second row.
    let again = ledger
        .prepare(
            &conn,
            &NewToolCall {
                id: "c2-dup".into(),
                ..call("c2", 2)
            },
            7,
        )
        .unwrap();
    assert_eq!((again.id.as_str(), again.status), ("c2", ToolCallStatus::Running));
    assert_eq!(
        ledger
            .record_replay(&conn, "c2", Ok(&json!({"bytes": 3})), 8)
            .unwrap(),
        ReplayOutcome::Succeeded
    );
    let c2 = ledger.get(&conn, "c2").unwrap().unwrap();
    assert_eq!(
        (c2.status, c2.result),
        (ToolCallStatus::Succeeded, Some(json!({"bytes": 3})))
    );
    assert_eq!(ledger.calls_of(&conn, "run-1").unwrap().len(), 3);
    assert_eq!(c2.raw_tool_name, "mcp__fs__write_file");
    assert_eq!(ledger.run_status(&conn, "run-1").unwrap(), RunStatus::Running);
}

#[test]
fn replays_are_counted_as_they_begin_and_the_next_ask_after_the_limit_parks_the_run() {
    let conn = db();
    let ledger = ToolCallStore { max_replays: 2 };
    ledger.create_run(&conn, "run-1", "s1", 0).unwrap();
    ledger.prepare(&conn, &call("c1", 1), 1).unwrap();
    // Two replays begin and never answer (each process died in the tool).
    for n in 1..=2 {
        assert_eq!(
            ledger
                .begin_replay(&conn, "c1", ReplayOf::Crash, 1 + u64::from(n))
                .unwrap(),
            ReplayStart::Started { replay_attempts: n }
        );
        assert_eq!(ledger.run_status(&conn, "run-1").unwrap(), RunStatus::Running);
    }
    // The third ask: not run, and the run waits for a human.
    assert_eq!(
        ledger.begin_replay(&conn, "c1", ReplayOf::Crash, 4).unwrap(),
        ReplayStart::Parked { replay_attempts: 2 }
    );
    assert_eq!(
        ledger.run_status(&conn, "run-1").unwrap(),
        RunStatus::WaitingForHuman
    );
    // Another call of the parked run is not run either, whatever its count.
    ledger.prepare(&conn, &call("c2", 2), 5).unwrap();
    assert_eq!(
        ledger.begin_replay(&conn, "c2", ReplayOf::Crash, 6).unwrap(),
        ReplayStart::Parked { replay_attempts: 0 }
    );
    // A call a human approved runs though the run is parked, held to its
    // own count only.
    ledger.prepare(&conn, &call("c3", 3), 7).unwrap();
    assert_eq!(
        ledger.begin_replay(&conn, "c3", ReplayOf::Approval, 8).unwrap(),
        ReplayStart::Started { replay_attempts: 1 }
    );
    let c1 = ledger.get(&conn, "c1").unwrap().unwrap();
    assert_eq!((c1.status, c1.replay_attempts), (ToolCallStatus::Running, 2));
    assert_eq!(
        ledger.begin_replay(&conn, "c1", ReplayOf::Approval, 9).unwrap(),
        ReplayStart::Parked { replay_attempts: 2 },
        "its own count spent"
    );
    assert!(ledger.mark_running(&conn, "missing", 4).is_err());
}

#[test]
fn a_replays_answer_settles_its_call_and_a_settled_call_cannot_replay() {
    let conn = db();
    let ledger = ToolCallStore::default();
    ledger.create_run(&conn, "run-1", "s1", 0).unwrap();
    ledger.prepare(&conn, &call("c1", 1), 1).unwrap();
    ledger.prepare(&conn, &call("c2", 2), 1).unwrap();
    ledger.begin_replay(&conn, "c1", ReplayOf::Crash, 2).unwrap();
    ledger.begin_replay(&conn, "c1", ReplayOf::Crash, 3).unwrap();
    assert_eq!(
        ledger.record_replay(&conn, "c1", Err("eio"), 4).unwrap(),
        ReplayOutcome::Failed { replay_attempts: 2 }
    );
    let c1 = ledger.get(&conn, "c1").unwrap().unwrap();
    assert_eq!(
        (c1.status, c1.replay_attempts, c1.error.as_deref()),
        (ToolCallStatus::Failed, 2, Some("eio"))
    );
    // A success clears the count (seed 004: "removes the replay item").
    ledger.begin_replay(&conn, "c2", ReplayOf::Crash, 5).unwrap();
    assert_eq!(
        ledger.record_replay(&conn, "c2", Ok(&json!("ok")), 6).unwrap(),
        ReplayOutcome::Succeeded
    );
    let c2 = ledger.get(&conn, "c2").unwrap().unwrap();
    assert_eq!((c2.status, c2.replay_attempts), (ToolCallStatus::Succeeded, 0));
    assert!(ledger.in_flight(&conn, "run-1").unwrap().is_empty());
    assert_eq!(ledger.run_status(&conn, "run-1").unwrap(), RunStatus::Running);
    // Settled: neither begun nor settled again.
    for id in ["c1", "c2"] {
        assert!(
            ledger.begin_replay(&conn, id, ReplayOf::Crash, 7).is_err(),
            "{id}"
        );
        assert!(ledger.record_replay(&conn, id, Err("x"), 7).is_err(), "{id}");
        assert!(
            ledger.record_replay(&conn, id, Ok(&json!("x")), 7).is_err(),
            "{id}"
        );
    }
}

#[test]
fn token_usage_totals_sum_per_session() {
    let conn = db();
    let usage = UsageStore;
    let at = TurnRef {
        session_id: "s1".into(),
        agent_id: "a".into(),
        turn: 2,
    };
    usage.persist_token_usage(&conn, &at, "m", 100, 7, 1).unwrap();
    usage.persist_token_usage(&conn, &at, "m", 50, 3, 2).unwrap();
    assert_eq!(usage.total_token_usage(&conn, "s1").unwrap(), (150, 10));
    assert_eq!(usage.total_token_usage(&conn, "none").unwrap(), (0, 0));
}

#[test]
fn each_calls_failures_are_numbered_from_zero_in_the_errors_rows() {
    let conn = db();
    let usage = UsageStore;
    let at = TurnRef {
        session_id: "s1".into(),
        agent_id: "a".into(),
        turn: 1,
    };
    let numbered: Vec<u32> = (0..4)
        .map(|i| {
            usage
                .persist_failed_attempt(&conn, &at, "llm_complete", &format!("overloaded #{i}"), i)
                .unwrap()
        })
        .collect();
    assert_eq!(numbered, [0, 1, 2, 3]);
    // Another context of the same turn counts its own failures.
    assert_eq!(
        usage.persist_failed_attempt(&conn, &at, "tool", "x", 9).unwrap(),
        0
    );
    let attempts: Vec<u32> = usage
        .errors(&conn, "s1")
        .unwrap()
        .iter()
        .filter(|e| e.context == "llm_complete")
        .map(|e| e.attempt)
        .collect();
    assert_eq!(attempts, [0, 1, 2, 3]);
}

#[test]
fn a_job_run_records_its_job_and_parent_and_create_is_idempotent() {
    let conn = db();
    let store = ToolCallStore::default();
    let parent = RunRecord {
        run_id: "run-a".into(),
        session_id: "s1".into(),
        status: RunStatus::Running,
        parent_run_id: None,
        job_json: Some(r#"{"prompt":"p"}"#.into()),
    };
    store.create_job_run(&conn, &parent, 1).unwrap();
    let fork = RunRecord {
        run_id: "run-b".into(),
        parent_run_id: Some("run-a".into()),
        ..parent.clone()
    };
    store.create_job_run(&conn, &fork, 2).unwrap();
    // A second create (a crash after the first one's commit) changes nothing.
    let changed = RunRecord {
        job_json: Some("{}".into()),
        ..fork.clone()
    };
    store.create_job_run(&conn, &changed, 3).unwrap();
    assert_eq!(store.get_run(&conn, "run-b").unwrap(), Some(fork));
    assert_eq!(store.get_run(&conn, "run-a").unwrap(), Some(parent));
    assert_eq!(store.get_run(&conn, "run-zz").unwrap(), None);
    assert_eq!(store.run_ids(&conn).unwrap(), ["run-a", "run-b"]);
}

#[test]
fn a_version_1_database_migrates_to_version_2_keeping_its_runs() {
    let conn = Connection::open_in_memory().unwrap();
    // A version-1 database as the previous build left it (the tables the
    // later migrations alter, `runs` and `token_usage`).
    conn.execute_batch(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, \
         status TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL); \
         CREATE TABLE token_usage (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, \
         agent_id TEXT NOT NULL, turn INTEGER NOT NULL, input_tokens INTEGER NOT NULL, \
         output_tokens INTEGER NOT NULL, created_at INTEGER NOT NULL); \
         INSERT INTO runs VALUES ('old', 's0', 'running', 1, 1); PRAGMA user_version = 1;",
    )
    .unwrap();
    assert_eq!(migrate(&conn, "mem").unwrap(), 1);
    let old = ToolCallStore::default().get_run(&conn, "old").unwrap().unwrap();
    assert_eq!((old.parent_run_id, old.job_json), (None, None));
}
