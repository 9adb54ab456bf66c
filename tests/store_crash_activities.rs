//! Activity ledger under crashes at every I/O point of `execute_irreversible`
//! (ProcessCrash, PowerLoss Strict/Eager), with the external world counting
//! deliveries: no side effect reaches the provider twice for one key; with a
//! deduplicating provider every action ends delivered exactly once; without
//! one an unsettled action is surfaced as needs-confirmation, never re-run.

mod store_crash_common;

use std::collections::BTreeMap;

use durable_agent::canary::{Canaries, Canary};
use durable_agent::sqlite::Db;
use durable_agent::store::activities::*;
use durable_agent::world::{Outbox, World};
use serde_json::json;
use store_crash_common::{sweep, Kill, Report, CRASHES, KILLS};

const ACTIONS: u64 = 3;

struct Model {
    world: World,
    /// Keys whose `execute_irreversible` returned Done, with the provider ref.
    acked: BTreeMap<String, String>,
}

/// Action number `seq` of one task, keyed stably across restarts.
fn mint_key(task_id: &str, seq: u64) -> String {
    format!("activity:{task_id}:{seq}")
}

fn call(seq: u64) -> IrreversibleCall {
    IrreversibleCall::with_key(
        &mint_key("task-1", seq),
        "task-1",
        "send_email",
        json!({ "to": "ops@example.com", "seq": seq }),
    )
}

fn run(db: &Db, m: &mut Model, store: &ActivityStore) -> Result<(), String> {
    for seq in 1..=ACTIONS {
        match store.execute_irreversible(db.conn(), &m.world, &call(seq), seq) {
            Ok(ActivityOutcome::Done {
                idem_key,
                provider_ref,
                ..
            }) => {
                m.acked.insert(idem_key, provider_ref);
            }
            Ok(other) => return Err(format!("unexpected outcome {other:?}")),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// Boot recovery, then the runtime re-issues every action of the task (it
/// cannot know which completed), then the invariants.
fn check(db: &Db, m: &Model, store: &ActivityStore) -> Vec<String> {
    let c = db.conn();
    let mut bad = Vec::new();
    for (key, provider_ref) in &m.acked {
        match store.get(c, key) {
            Ok(Some(r))
                if r.status == ActivityStatus::Done && r.provider_ref.as_ref() == Some(provider_ref) => {}
            other => bad.push(format!(
                "{key} acked DONE ({provider_ref}) but ledger has {other:?}"
            )),
        }
    }
    if let Err(e) = store.recover(c, &m.world, 100) {
        bad.push(format!("recover failed: {e}"));
        return bad;
    }
    for seq in 1..=ACTIONS {
        if let Err(e) = store.execute_irreversible(c, &m.world, &call(seq), 100 + seq) {
            bad.push(format!("resumed action {seq} failed: {e}"));
        }
    }
    for (key, n) in m.world.duplicates() {
        bad.push(format!("side effect {key} delivered {n} times"));
    }
    for seq in 1..=ACTIONS {
        let key = mint_key("task-1", seq);
        let delivered = m.world.deliveries_for(&key);
        let status = store.get(c, &key).ok().flatten().map(|r| r.status);
        let ok = match status {
            Some(ActivityStatus::Done) => delivered == 1,
            Some(ActivityStatus::NeedsConfirmation) => delivered <= 1 && !m.world.supports_dedup("send"),
            Some(ActivityStatus::Failed) => delivered == 0,
            Some(ActivityStatus::Intent) | None => false,
        };
        if !ok {
            bad.push(format!("{key}: ledger {status:?} with {delivered} deliveries"));
        }
    }
    bad
}

fn sweep_with(canaries: Canaries, dedup: bool, kills: &[Kill]) -> Report {
    let store = ActivityStore::new(canaries);
    let new_model = || Model {
        world: if dedup {
            World::with_dedup()
        } else {
            World::without_dedup()
        },
        acked: BTreeMap::new(),
    };
    sweep(
        kills,
        &new_model,
        &|_| {},
        &|db, m| run(db, m, &store),
        &|db, m| check(db, m, &store),
    )
}

#[test]
fn no_side_effect_twice_and_dedup_provider_completes_every_action_at_every_crash_point() {
    let report = sweep_with(Canaries::none(), true, &KILLS);
    report.assert_clean("activities (dedup provider)");
    assert!(
        report.points > 10,
        "suspiciously short run: {} points",
        report.points
    );
    eprintln!(
        "activities dedup: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}

#[test]
fn no_side_effect_twice_and_no_blind_rerun_without_provider_dedup_at_every_crash_point() {
    let report = sweep_with(Canaries::none(), false, &KILLS);
    report.assert_clean("activities (no dedup)");
    eprintln!(
        "activities no-dedup: {} points per run, {} faulted cases, 0 violations",
        report.points, report.cases
    );
}

#[test]
fn canary_side_effect_before_intent_is_caught_as_a_duplicate_delivery() {
    let report = sweep_with(Canaries::only(Canary::SideEffectBeforeIntent), false, &CRASHES);
    let dup = report
        .violations
        .iter()
        .find(|v| v.point > 0 && v.what.contains("delivered 2 times"));
    assert!(
        dup.is_some(),
        "canary not caught: {:?}",
        report.violations.first()
    );
    eprintln!(
        "SideEffectBeforeIntent caught in {} of {} crash cases (first: point {} [{}])",
        report.violating_crash_cases(),
        report.cases,
        dup.map_or(0, |v| v.point),
        dup.map_or("", |v| v.label.as_str())
    );
}
