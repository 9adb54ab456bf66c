//! Garbage collection of settled rows with a TTL (seed 001 §7, §9 phase 5):
//! `TriggerStore::gc` collects DONE/FAILED/DEAD triggers and
//! `ActivityStore::gc_keeping` (nothing kept) DONE/FAILED ledger rows last updated more than the
//! TTL ago — never a PENDING/CLAIMED trigger, never an INTENT or
//! NEEDS_CONFIRMATION row, never the newest trigger (ids derive from
//! `MAX(rowid)`) — each in one transaction, so a crash at any I/O point
//! leaves all or nothing collected.

mod store_crash_common;

use std::collections::BTreeSet;

use durable_agent::canary::Canaries;
use durable_agent::sqlite::Db;
use durable_agent::store::activities::{ActivityOutcome, ActivityStatus, ActivityStore, IrreversibleCall};
use durable_agent::store::schema::migrate;
use durable_agent::store::triggers::*;
use durable_agent::store::StoreError;
use durable_agent::world::{Scripted, World};
use rusqlite::Connection;
use serde_json::json;
use store_crash_common::{sweep, KILLS};

/// Settled rows of the fixture are last updated at this instant.
const OLD_MS: u64 = 10;
/// The young settled rows.
const YOUNG_MS: u64 = 500;
const TTL_MS: u64 = 1_000;
/// A `now` at which OLD rows are past the TTL and YOUNG ones are not.
const NOW_MS: u64 = OLD_MS + TTL_MS + 1;
const LEASE_MS: u64 = 1_000_000;

fn db() -> Connection {
    let c = Connection::open_in_memory().expect("in-memory db");
    migrate(&c, "mem").expect("migrate");
    c
}

fn triggers() -> TriggerStore {
    let policy = TriggerPolicy {
        max_attempts: 1,
        backoff_base_ms: 100,
        backoff_cap_ms: 1_000,
        overdue_grace_ms: 0,
    };
    TriggerStore::new(policy, Canaries::none())
}

fn spec(key: &str, fire_at_ms: u64) -> TriggerSpec {
    TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: Some(key.to_string()),
        session_id: None,
        fire_at_ms,
        priority: 0,
        description: key.to_string(),
        payload: json!({ "key": key }),
    }
}

/// How a fixture trigger ends.
#[derive(Clone, Copy)]
enum End {
    Done,
    Failed,
    Dead,
    Claimed,
    Pending,
}

/// Emit `key` and take it to `end`, its last update at `at_ms`.
fn trigger(c: &Connection, s: &TriggerStore, key: &str, end: End, at_ms: u64) -> String {
    if let End::Pending = end {
        // Due far in the future: no claim below picks it.
        return s
            .emit(c, &spec(key, u64::MAX >> 2), at_ms)
            .expect("emit")
            .id()
            .to_string();
    }
    let id = s.emit(c, &spec(key, 0), 0).expect("emit").id().to_string();
    let claim = s.claim(c, at_ms, LEASE_MS).expect("claim").expect("due");
    assert_eq!(claim.id, id, "fixture claims in emit order");
    match end {
        End::Done => s.ack_done(c, &claim, at_ms).expect("ack"),
        End::Failed => {
            s.ack_failed(c, &claim, at_ms, "permanent", false).expect("ack");
        }
        End::Dead => {
            let st = s.ack_failed(c, &claim, at_ms, "transient", true).expect("ack");
            assert_eq!(st, TriggerStatus::Dead);
        }
        End::Claimed | End::Pending => {}
    }
    id
}

/// The trigger fixture: which ids GC at [`NOW_MS`] must collect, and which
/// it must keep.
struct Fixture {
    collectable: BTreeSet<String>,
    kept: BTreeSet<String>,
}

fn trigger_fixture(c: &Connection, s: &TriggerStore) -> Fixture {
    let mut collectable = BTreeSet::new();
    let mut kept = BTreeSet::new();
    collectable.insert(trigger(c, s, "done-old", End::Done, OLD_MS));
    collectable.insert(trigger(c, s, "failed-old", End::Failed, OLD_MS));
    collectable.insert(trigger(c, s, "dead-old", End::Dead, OLD_MS));
    kept.insert(trigger(c, s, "claimed-old", End::Claimed, OLD_MS));
    kept.insert(trigger(c, s, "done-young", End::Done, YOUNG_MS));
    kept.insert(trigger(c, s, "pending-old", End::Pending, 0));
    // Old and DONE, but the newest row: kept so its id is never reused.
    kept.insert(trigger(c, s, "newest-done-old", End::Done, OLD_MS));
    Fixture { collectable, kept }
}

fn activity(key: &str) -> IrreversibleCall {
    IrreversibleCall::with_key(key, "task-a", "send_email", json!({ "to": "bob", "key": key }))
}

fn activity_fixture(c: &Connection, a: &ActivityStore) -> Fixture {
    let world = World::without_dedup();
    let exec = |key: &str, at_ms: u64| a.execute_irreversible(c, &world, &activity(key), at_ms);
    // NEEDS_CONFIRMATION first: recovery settles every INTENT there is.
    world.script([Scripted::DropSilently]);
    assert!(exec("nc-old", OLD_MS).is_err(), "outcome unknown");
    a.recover(c, &world, OLD_MS).expect("recover");
    world.script([Scripted::DropSilently]);
    assert!(exec("intent-old", OLD_MS).is_err(), "outcome unknown");
    world.script([Scripted::Reject]);
    assert!(matches!(
        exec("failed-old", OLD_MS),
        Ok(ActivityOutcome::Failed { .. })
    ));
    assert!(matches!(
        exec("done-old", OLD_MS),
        Ok(ActivityOutcome::Done { .. })
    ));
    assert!(matches!(
        exec("done-young", YOUNG_MS),
        Ok(ActivityOutcome::Done { .. })
    ));
    let status = |k: &str| a.get(c, k).expect("get").expect("row").status;
    assert_eq!(status("nc-old"), ActivityStatus::NeedsConfirmation);
    assert_eq!(status("intent-old"), ActivityStatus::Intent);
    Fixture {
        collectable: ["done-old", "failed-old"].map(String::from).into(),
        kept: ["nc-old", "intent-old", "done-young"].map(String::from).into(),
    }
}

fn trigger_ids(c: &Connection, s: &TriggerStore) -> BTreeSet<String> {
    s.all(c, 0).expect("all").into_iter().map(|t| t.id).collect()
}

fn activity_keys(c: &Connection) -> Result<BTreeSet<String>, rusqlite::Error> {
    let mut stmt = c.prepare("SELECT idem_key FROM activity_log")?;
    let keys = stmt.query_map([], |r| r.get::<_, String>(0))?;
    keys.collect()
}

#[test]
fn trigger_gc_collects_only_settled_triggers_older_than_the_ttl() {
    let c = db();
    let s = triggers();
    let f = trigger_fixture(&c, &s);
    let report = s.gc(&c, NOW_MS, TTL_MS).expect("gc");
    assert_eq!(report.cutoff_ms, NOW_MS - TTL_MS);
    assert_eq!(
        report.deleted.iter().cloned().collect::<BTreeSet<_>>(),
        f.collectable
    );
    assert_eq!(trigger_ids(&c, &s), f.kept);
}

#[test]
fn activity_gc_collects_done_and_failed_but_never_intent_or_needs_confirmation() {
    let c = db();
    let a = ActivityStore::default();
    let f = activity_fixture(&c, &a);
    // However late: INTENT and NEEDS_CONFIRMATION stay.
    let report = a.gc_keeping(&c, u64::MAX >> 2, TTL_MS, &[]).expect("gc");
    assert_eq!(
        report.deleted.iter().cloned().collect::<BTreeSet<_>>(),
        &f.collectable | &["done-young".to_string()].into()
    );
    assert_eq!(
        activity_keys(&c).expect("keys"),
        ["nc-old", "intent-old"].map(String::from).into()
    );
}

#[test]
fn a_row_exactly_ttl_old_is_kept_and_one_ms_older_is_collected() {
    let c = db();
    let s = triggers();
    let a = ActivityStore::default();
    trigger_fixture(&c, &s);
    activity_fixture(&c, &a);
    let exactly = OLD_MS + TTL_MS;
    assert!(s.gc(&c, exactly, TTL_MS).expect("gc").deleted.is_empty());
    assert!(a
        .gc_keeping(&c, exactly, TTL_MS, &[])
        .expect("gc")
        .deleted
        .is_empty());
    assert_eq!(s.gc(&c, exactly + 1, TTL_MS).expect("gc").deleted.len(), 3);
    assert_eq!(
        a.gc_keeping(&c, exactly + 1, TTL_MS, &[])
            .expect("gc")
            .deleted
            .len(),
        2
    );
}

#[test]
fn gc_before_the_ttl_has_elapsed_since_time_zero_collects_nothing() {
    let c = db();
    let s = triggers();
    trigger_fixture(&c, &s);
    let report = s.gc(&c, TTL_MS - 1, TTL_MS).expect("gc");
    assert_eq!(report.cutoff_ms, 0);
    assert!(report.deleted.is_empty());
}

#[test]
fn gc_is_idempotent() {
    let c = db();
    let s = triggers();
    let a = ActivityStore::default();
    trigger_fixture(&c, &s);
    activity_fixture(&c, &a);
    assert!(!s.gc(&c, NOW_MS, TTL_MS).expect("gc").deleted.is_empty());
    assert!(!a
        .gc_keeping(&c, NOW_MS, TTL_MS, &[])
        .expect("gc")
        .deleted
        .is_empty());
    let (ids, keys) = (trigger_ids(&c, &s), activity_keys(&c).expect("keys"));
    assert!(s.gc(&c, NOW_MS, TTL_MS).expect("gc").deleted.is_empty());
    assert!(a
        .gc_keeping(&c, NOW_MS, TTL_MS, &[])
        .expect("gc")
        .deleted
        .is_empty());
    assert_eq!(
        (trigger_ids(&c, &s), activity_keys(&c).expect("keys")),
        (ids, keys)
    );
}

#[test]
fn trigger_ids_are_never_reused_after_gc() {
    let c = db();
    let s = triggers();
    let mut seen: BTreeSet<String> = trigger_fixture(&c, &s).collectable;
    seen.extend(trigger_ids(&c, &s));
    for round in 0..3u64 {
        let now = NOW_MS + round * TTL_MS * 2;
        s.gc(&c, now, TTL_MS).expect("gc");
        let id = trigger(&c, &s, &format!("later-{round}"), End::Done, now);
        assert!(seen.insert(id.clone()), "id {id} reused after gc");
    }
}

#[test]
fn after_gc_a_reemitted_dedup_key_is_a_new_trigger() {
    // The documented consequence: the TTL must outlive every re-emit.
    let c = db();
    let s = triggers();
    trigger_fixture(&c, &s);
    assert!(matches!(
        s.emit(&c, &spec("done-old", 0), 1).expect("emit"),
        EmitOutcome::Duplicate(_)
    ));
    s.gc(&c, NOW_MS, TTL_MS).expect("gc");
    assert!(matches!(
        s.emit(&c, &spec("done-old", 0), NOW_MS).expect("emit"),
        EmitOutcome::Inserted(_)
    ));
}

#[test]
fn after_gc_the_ledger_no_longer_deduplicates_the_key() {
    // The documented consequence: the TTL must outlive every re-run.
    let c = db();
    let a = ActivityStore::default();
    let world = World::without_dedup();
    let run = |now| {
        a.execute_irreversible(&c, &world, &activity("k"), now)
            .expect("execute")
    };
    run(OLD_MS);
    assert!(matches!(
        run(OLD_MS + 1),
        ActivityOutcome::Done {
            from_ledger: true,
            ..
        }
    ));
    a.gc_keeping(&c, NOW_MS, TTL_MS, &[]).expect("gc");
    assert!(matches!(
        run(NOW_MS),
        ActivityOutcome::Done {
            from_ledger: false,
            ..
        }
    ));
    assert_eq!(world.deliveries_for("k"), 2);
}

#[test]
fn activity_gc_keeping_protects_the_rows_of_named_tasks() {
    let c = db();
    let a = ActivityStore::default();
    let world = World::without_dedup();
    for (key, task) in [("k1", "mid-turn"), ("k2", "idle"), ("k3", "also-mid-turn")] {
        let call = IrreversibleCall::with_key(key, task, "send_email", json!({}));
        a.execute_irreversible(&c, &world, &call, OLD_MS)
            .expect("execute");
    }
    let keep = ["mid-turn".to_string(), "also-mid-turn".to_string()];
    let report = a.gc_keeping(&c, NOW_MS, TTL_MS, &keep).expect("gc");
    assert_eq!(report.deleted, vec!["k2".to_string()]);
    assert_eq!(
        activity_keys(&c).expect("keys"),
        ["k1", "k3"].map(String::from).into()
    );
}

/// What the swept gc acknowledged.
#[derive(Default)]
struct Acked {
    triggers: bool,
    activities: bool,
}

/// Present and absent members of a fixture's collectable set, as a verdict.
fn all_or_nothing(what: &str, f: &Fixture, present: &BTreeSet<String>, acked: bool) -> Vec<String> {
    let mut bad = Vec::new();
    let left: Vec<_> = f.collectable.intersection(present).collect();
    if !left.is_empty() && left.len() != f.collectable.len() {
        bad.push(format!(
            "{what}: gc half applied, left {left:?} of {:?}",
            f.collectable
        ));
    }
    if acked && !left.is_empty() {
        bad.push(format!(
            "{what}: gc returned Ok but {left:?} survived the restart"
        ));
    }
    for k in f.kept.difference(present) {
        bad.push(format!("{what}: {k} was collected but must be kept"));
    }
    bad
}

#[test]
fn gc_crashed_at_every_io_point_collects_all_or_nothing_and_never_a_live_row() {
    let s = triggers();
    let a = ActivityStore::default();
    // The fixture is deterministic: learn its ids once, on a scratch db.
    let (tf, af) = {
        let c = db();
        (trigger_fixture(&c, &s), activity_fixture(&c, &a))
    };
    let setup = |db: &Db| {
        trigger_fixture(db.conn(), &s);
        activity_fixture(db.conn(), &a);
    };
    let run = |db: &Db, m: &mut Acked| -> Result<(), String> {
        let e = |e: StoreError| e.to_string();
        s.gc(db.conn(), NOW_MS, TTL_MS).map_err(e)?;
        m.triggers = true;
        a.gc_keeping(db.conn(), NOW_MS, TTL_MS, &[]).map_err(e)?;
        m.activities = true;
        Ok(())
    };
    let check = |db: &Db, m: &Acked| -> Vec<String> {
        let c = db.conn();
        let ids = match s.all(c, 0) {
            Ok(all) => all.into_iter().map(|t| t.id).collect(),
            Err(e) => return vec![format!("cannot read triggers after restart: {e}")],
        };
        let keys = match activity_keys(c) {
            Ok(k) => k,
            Err(e) => return vec![format!("cannot read the ledger after restart: {e}")],
        };
        let mut bad = all_or_nothing("triggers", &tf, &ids, m.triggers);
        bad.extend(all_or_nothing("activities", &af, &keys, m.activities));
        // The kept rows are still in their states (nothing rewritten).
        for (key, want) in [
            ("intent-old", ActivityStatus::Intent),
            ("nc-old", ActivityStatus::NeedsConfirmation),
        ] {
            match a.get(c, key) {
                Ok(Some(r)) if r.status == want => {}
                other => bad.push(format!("activity {key}: expected {want:?}, found {other:?}")),
            }
        }
        bad
    };
    let report = sweep(&KILLS, &Acked::default, &setup, &run, &check);
    report.assert_clean("gc");
    assert!(
        report.points > 10,
        "suspiciously short gc: {} points",
        report.points
    );
    eprintln!(
        "gc: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}
