//! The operator's lists (`GET /triggers`, `/runs`, `/usage`;
//! `durable-agent inspect …`) are newest first even among rows written in
//! one millisecond: a boot emits every RESUME trigger with one `now`, a
//! scheduler pass its buckets and wake-ups, and a host clock's burst of
//! emits shares a millisecond too. Ties in the clock go by insertion
//! order, never by a text id, where `trg-9` sorts before `trg-10` and
//! `trg-1` after `trg-19` (found by review: the first page hid the newest
//! triggers behind older ones).
//!
//! Held to README.md, "Inspecting a root": "Lists are pages, newest first",
//! and docs/STORES.md: "ids are `trg-{MAX(rowid)+1}`" (so `trg-10` was
//! emitted after `trg-9`).

use durable_agent::store::inspect::{trigger_ids, usage_by_session, user_runs, Page};
use durable_agent::store::schema::migrate;
use durable_agent::store::tool_calls::ToolCallStore;
use durable_agent::store::triggers::{EmitOutcome, TriggerSource, TriggerSpec, TriggerStore};
use durable_agent::store::usage::{TurnRef, UsageStore};
use rusqlite::Connection;
use serde_json::json;

const NOW: u64 = 5_000;

fn store() -> Connection {
    let conn = Connection::open_in_memory().expect("db");
    migrate(&conn, "mem").expect("migrate");
    conn
}

#[test]
fn triggers_emitted_in_one_millisecond_are_listed_newest_first() {
    let conn = store();
    let triggers = TriggerStore::default();
    let mut emitted = Vec::new();
    for i in 1..=11 {
        let spec = TriggerSpec {
            source: TriggerSource::Scheduled,
            dedup_key: Some(format!("job-{i}")),
            session_id: None,
            fire_at_ms: NOW,
            priority: 0,
            description: String::new(),
            payload: json!({"agent": "ada", "prompt": "p"}),
        };
        match triggers.emit(&conn, &spec, NOW).expect("emit") {
            EmitOutcome::Inserted(id) => emitted.push(id),
            other => panic!("{other:?}"),
        }
    }
    let newest_first: Vec<String> = emitted.iter().rev().cloned().collect();
    let (ids, total) = trigger_ids(&conn, None, Page::new(50, 0)).expect("list");
    assert_eq!(total, 11);
    assert_eq!(ids, newest_first, "the trigger list is not newest first");
    // Paging walks the same order: two pages of 6 and 5, no row twice.
    let (first, _) = trigger_ids(&conn, None, Page::new(6, 0)).expect("page 1");
    let (second, _) = trigger_ids(&conn, None, Page::new(6, 6)).expect("page 2");
    assert_eq!([first, second].concat(), newest_first);
}

#[test]
fn runs_created_in_one_millisecond_are_listed_newest_first() {
    let conn = store();
    let ledger = ToolCallStore::default();
    // Ids whose text order is not their creation order.
    let created = ["run-b", "run-a", "run-10", "run-9"];
    for id in created {
        ledger.create_run(&conn, id, "s1", NOW).expect("run");
    }
    let (rows, total) = user_runs(&conn, Page::new(50, 0)).expect("list");
    assert_eq!(total, 4);
    let listed: Vec<&str> = rows.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(listed, ["run-9", "run-10", "run-a", "run-b"]);
}

#[test]
fn sessions_last_active_in_one_millisecond_are_listed_most_recent_first() {
    let conn = store();
    let usage = UsageStore;
    // `s-b` and then `s-a` record in the same millisecond, `s-c` a
    // millisecond earlier: `s-a` was active last.
    for (session, at) in [("s-b", NOW), ("s-a", NOW), ("s-c", NOW - 1)] {
        let turn = TurnRef {
            session_id: session.into(),
            agent_id: "ada".into(),
            turn: 0,
        };
        usage
            .persist_token_usage(&conn, &turn, "m", 1, 1, at)
            .expect("usage");
    }
    let (rows, total) = usage_by_session(&conn, Page::new(50, 0)).expect("list");
    assert_eq!(total, 3);
    let listed: Vec<&str> = rows.iter().map(|r| r.session_id.as_str()).collect();
    assert_eq!(listed, ["s-a", "s-b", "s-c"]);
}
