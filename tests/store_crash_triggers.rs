//! Trigger store under crashes at every I/O point of emit, claim and ack
//! (ProcessCrash, PowerLoss Strict/Eager): a trigger is never lost once
//! `emit` returned Ok, an acked DONE stays DONE, and no dedup key reaches
//! DONE twice — even though producers re-emit after every restart.

mod store_crash_common;

use std::collections::{BTreeMap, BTreeSet};

use durable_agent::canary::{Canaries, Canary};
use durable_agent::fs::{CrashMode, DirModel};
use durable_agent::sqlite::Db;
use durable_agent::store::triggers::*;
use serde_json::json;
use store_crash_common::{sweep, sweep_with_options, unsynced, Kill, Report, CRASHES, KILLS};

const KEYS: [&str; 3] = ["scheduled-once:a", "resume:task-b", "proactive:daily:c"];
const LEASE_MS: u64 = 1_000;

#[derive(Default)]
struct Model {
    emitted: BTreeSet<String>,
    acked_done: BTreeSet<String>,
}

fn spec(i: usize) -> TriggerSpec {
    TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: Some(KEYS[i].to_string()),
        session_id: None,
        fire_at_ms: 0,
        priority: i as i64,
        // The description carries the producer's key too, so the checker can
        // group rows even when a canary drops `dedup_key`.
        description: KEYS[i].to_string(),
        payload: json!({ "i": i }),
    }
}

fn store(canaries: &Canaries) -> TriggerStore {
    let policy = TriggerPolicy {
        max_attempts: 5,
        backoff_base_ms: 100,
        backoff_cap_ms: 1_000,
        overdue_grace_ms: 0,
    };
    TriggerStore::new(policy, canaries.clone())
}

fn run(db: &Db, m: &mut Model, store: &TriggerStore) -> Result<(), String> {
    let c = db.conn();
    let e = |e: durable_agent::store::StoreError| e.to_string();
    for i in [0, 1, 0] {
        store.emit(c, &spec(i), 1).map_err(e)?; // the second emit of 0 is a producer retry
        m.emitted.insert(KEYS[i].to_string());
    }
    let a = store.claim(c, 5, LEASE_MS).map_err(e)?.ok_or("nothing due")?;
    store.ack_done(c, &a, 6).map_err(e)?;
    m.acked_done.insert(a.description.clone());
    let b = store.claim(c, 7, LEASE_MS).map_err(e)?.ok_or("nothing due")?;
    store.ack_failed(c, &b, 8, "transient", true).map_err(e)?;
    store.emit(c, &spec(2), 9).map_err(e)?;
    m.emitted.insert(KEYS[2].to_string());
    for now in [300, 301] {
        let t = store.claim(c, now, LEASE_MS).map_err(e)?.ok_or("nothing due")?;
        store.ack_done(c, &t, now).map_err(e)?;
        m.acked_done.insert(t.description.clone());
    }
    Ok(())
}

/// Boot recovery + the producers' restart, then the invariants.
fn check(db: &Db, m: &Model, store: &TriggerStore) -> Vec<String> {
    let c = db.conn();
    let mut bad = Vec::new();
    let rows = match store.all(c, 0) {
        Ok(r) => r,
        Err(e) => return vec![format!("cannot read triggers after restart: {e}")],
    };
    for key in &m.emitted {
        if !rows.iter().any(|t| &t.description == key) {
            bad.push(format!("trigger {key} lost although emit returned Ok"));
        }
    }
    for key in &m.acked_done {
        if !rows
            .iter()
            .any(|t| &t.description == key && t.status == TriggerStatus::Done)
        {
            bad.push(format!("trigger {key} acked DONE but not DONE after restart"));
        }
    }
    // Recovery: reclaim orphaned leases, producers re-emit, consumer drains.
    let now = 1_000_000;
    let mut bad_rehydrate = Vec::new();
    let drained = (|| -> Result<(), durable_agent::store::StoreError> {
        store.reclaim_expired(c, now)?;
        // Rehydration: every trigger still due from before the crash is
        // overdue now and carries the catch-up note.
        for t in store.pending(c, now)? {
            if t.overdue_by_ms != Some(now - t.fire_at_ms) || t.overdue_note().is_none() {
                bad_rehydrate.push(format!("rehydrated {} without overdue note", t.description));
            }
        }
        for i in 0..KEYS.len() {
            store.emit(c, &spec(i), now)?;
        }
        for _ in 0..20 {
            let Some(t) = store.claim(c, now, LEASE_MS)? else {
                break;
            };
            store.ack_done(c, &t, now)?;
        }
        Ok(())
    })();
    bad.append(&mut bad_rehydrate);
    if let Err(e) = drained {
        bad.push(format!("recovery failed: {e}"));
        return bad;
    }
    let mut done: BTreeMap<String, usize> = BTreeMap::new();
    for t in store.all(c, now).unwrap_or_default() {
        if t.status == TriggerStatus::Done {
            *done.entry(t.description).or_default() += 1;
        }
    }
    for key in KEYS {
        match done.get(key).copied().unwrap_or(0) {
            1 => {}
            0 => bad.push(format!("trigger {key} never ran")),
            n => bad.push(format!(
                "trigger {key} ran {n} times (DONE rows for one dedup key)"
            )),
        }
    }
    bad
}

fn sweep_with(canaries: Canaries, kills: &[Kill]) -> Report {
    let store = store(&canaries);
    sweep(
        kills,
        &Model::default,
        &|_| {},
        &|db, m| run(db, m, &store),
        &|db, m| check(db, m, &store),
    )
}

#[test]
fn trigger_never_lost_after_emit_and_never_done_twice_at_every_crash_point() {
    let report = sweep_with(Canaries::none(), &KILLS);
    report.assert_clean("triggers");
    assert!(
        report.points > 20,
        "suspiciously short run: {} points",
        report.points
    );
    eprintln!(
        "triggers: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}

#[test]
fn canary_trigger_without_dedup_is_caught_at_a_crash_point() {
    let report = sweep_with(Canaries::only(Canary::TriggerWithoutDedup), &CRASHES);
    let crashed: Vec<_> = report.violations.iter().filter(|v| v.point > 0).collect();
    assert!(!crashed.is_empty(), "canary not caught");
    assert!(
        crashed.iter().any(|v| v.what.contains("times")),
        "{:?}",
        crashed[0]
    );
    eprintln!(
        "TriggerWithoutDedup caught in {} of {} crash cases",
        report.violating_crash_cases(),
        report.cases
    );
}

#[test]
fn sweep_sees_lost_triggers_when_sqlite_does_not_fsync() {
    // The harness proves itself: with synchronous=OFF power loss must lose
    // acknowledged emits, so a clean sweep above means something.
    let store = store(&Canaries::none());
    let report = sweep_with_options(
        &unsynced(),
        &[Kill::Crash(CrashMode::PowerLoss(DirModel::Strict))],
        &Model::default,
        &|_| {},
        &|db, m| run(db, m, &store),
        &|db, m| check(db, m, &store),
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.what.contains("lost although emit returned Ok")),
        "no loss seen with synchronous=OFF: {:?}",
        report.violations.first()
    );
    eprintln!(
        "synchronous=OFF: loss in {} of {} power-loss cases",
        report.violating_crash_cases(),
        report.cases
    );
}
