//! Activity ledger + simulated world (seed 001 §6.4): INTENT before the
//! side effect, key to the provider, no blind re-run on recovery.

use durable_agent::canary::{Canaries, Canary};
use durable_agent::store::activities::*;
use durable_agent::store::schema::migrate;
use durable_agent::world::{Outbox, Scripted, World};
use rusqlite::Connection;
use serde_json::json;

fn db() -> Connection {
    let c = Connection::open_in_memory().unwrap();
    migrate(&c, "mem").unwrap();
    c
}

/// Action number `seq` of one task, keyed stably (the same action after
/// a restart carries the same key; the runtime derives its keys from its
/// event log instead).
fn mint_key(task_id: &str, seq: u64) -> String {
    format!("activity:{task_id}:{seq}")
}

fn email(seq: u64) -> IrreversibleCall {
    IrreversibleCall::with_key(
        &mint_key("task-1", seq),
        "task-1",
        "send_email",
        json!({"to": "a@b.c", "seq": seq}),
    )
}

#[test]
fn a_call_carries_the_key_it_was_given() {
    let own = IrreversibleCall::with_key("s1-42", "task-1", "send_email", json!({}));
    assert_eq!(own.idem_key, "s1-42");
    assert_eq!(email(3).idem_key, "activity:task-1:3");
}

#[test]
fn execute_records_done_with_provider_ref_and_carries_key_to_provider() {
    let conn = db();
    let world = World::without_dedup();
    let store = ActivityStore::default();
    let out = store.execute_irreversible(&conn, &world, &email(1), 5).unwrap();
    let ActivityOutcome::Done {
        provider_ref,
        from_ledger: false,
        ..
    } = &out
    else {
        panic!("{out:?}")
    };
    let d = world.deliveries();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].idem_key.as_str(), d[0].provider_ref.as_str()),
        ("activity:task-1:1", provider_ref.as_str())
    );
    let rec = store.get(&conn, "activity:task-1:1").unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.provider_ref.as_deref()),
        (ActivityStatus::Done, Some(provider_ref.as_str()))
    );
    // Executing the same action again answers from the ledger; no new delivery.
    let again = store.execute_irreversible(&conn, &world, &email(1), 6).unwrap();
    assert!(matches!(
        again,
        ActivityOutcome::Done {
            from_ledger: true,
            ..
        }
    ));
    assert_eq!(world.deliveries().len(), 1);
}

/// An Outbox that, at the moment of the side effect, reads the ledger
/// through a *second* connection: it sees only committed rows.
#[derive(Debug)]
struct Spy {
    world: World,
    reader: std::sync::Mutex<Connection>,
    saw: std::sync::Mutex<Option<Option<ActivityStatus>>>,
}
impl Outbox for Spy {
    fn supports_dedup(&self, _action: &str) -> bool {
        false
    }
    fn send(
        &self,
        key: &str,
        action: &str,
        payload: &serde_json::Value,
    ) -> Result<String, durable_agent::world::DeliveryError> {
        let rec = ActivityStore::default()
            .get(&self.reader.lock().unwrap(), key)
            .unwrap();
        *self.saw.lock().unwrap() = Some(rec.map(|r| r.status));
        self.world.send(key, action, payload)
    }
}

#[test]
fn intent_is_committed_before_the_side_effect_and_canary_reverses_it() {
    for (canaries, expected) in [
        (Canaries::none(), Some(ActivityStatus::Intent)),
        (Canaries::only(Canary::SideEffectBeforeIntent), None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.db");
        let conn = Connection::open(&path).unwrap();
        migrate(&conn, "sessions.db").unwrap();
        let spy = Spy {
            world: World::without_dedup(),
            reader: std::sync::Mutex::new(Connection::open(&path).unwrap()),
            saw: Default::default(),
        };
        ActivityStore::new(canaries)
            .execute_irreversible(&conn, &spy, &email(1), 0)
            .unwrap();
        assert_eq!(*spy.saw.lock().unwrap(), Some(expected));
        assert_eq!(spy.world.deliveries().len(), 1);
    }
}

#[test]
fn rejected_send_is_failed_and_unknown_answer_keeps_intent() {
    let conn = db();
    let world = World::without_dedup();
    world.script([Scripted::Reject, Scripted::DeliverLoseReply]);
    let store = ActivityStore::default();
    let out = store.execute_irreversible(&conn, &world, &email(1), 0).unwrap();
    assert!(matches!(out, ActivityOutcome::Failed { .. }), "{out:?}");
    let err = store
        .execute_irreversible(&conn, &world, &email(2), 0)
        .unwrap_err();
    assert!(matches!(err, ActivityError::DeliveryUnknown { .. }), "{err:?}");
    assert_eq!(
        store.get(&conn, "activity:task-1:2").unwrap().unwrap().status,
        ActivityStatus::Intent
    );
    assert_eq!(world.deliveries().len(), 1, "the lost-reply send did deliver");
}

#[test]
fn recovery_without_dedup_surfaces_needs_confirmation_and_never_resends() {
    let conn = db();
    let world = World::without_dedup();
    world.script([Scripted::DeliverLoseReply]);
    let store = ActivityStore::default();
    store
        .execute_irreversible(&conn, &world, &email(1), 0)
        .unwrap_err();
    let outs = store.recover(&conn, &world, 10).unwrap();
    assert_eq!(
        outs,
        vec![ActivityOutcome::NeedsConfirmation {
            idem_key: "activity:task-1:1".into()
        }]
    );
    // The runtime re-asking does not re-run it either.
    let again = store.execute_irreversible(&conn, &world, &email(1), 11).unwrap();
    assert!(matches!(again, ActivityOutcome::NeedsConfirmation { .. }));
    assert_eq!(world.deliveries().len(), 1);
    assert_eq!(world.sends(), 1);
    // A human confirms it happened.
    let delivered = Resolution::Delivered {
        provider_ref: "ref-1".into(),
    };
    store.confirm(&conn, "activity:task-1:1", &delivered, 12).unwrap();
    let rec = store.get(&conn, "activity:task-1:1").unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.provider_ref.as_deref()),
        (ActivityStatus::Done, Some("ref-1"))
    );
    assert!(
        store
            .confirm(&conn, "activity:task-1:1", &Resolution::NotDelivered, 13)
            .is_err(),
        "confirm twice"
    );
}

#[test]
fn recovery_with_dedup_resends_same_key_and_provider_delivers_once() {
    let conn = db();
    let world = World::with_dedup();
    world.script([Scripted::DeliverLoseReply]);
    let store = ActivityStore::default();
    store
        .execute_irreversible(&conn, &world, &email(1), 0)
        .unwrap_err();
    let outs = store.recover(&conn, &world, 10).unwrap();
    assert_eq!(outs.len(), 1);
    let ActivityOutcome::Done {
        provider_ref,
        from_ledger: false,
        ..
    } = &outs[0]
    else {
        panic!("{outs:?}")
    };
    assert_eq!(
        provider_ref, "ref-1",
        "dedup provider answers with the original ref"
    );
    assert_eq!((world.sends(), world.deliveries().len()), (2, 1));
    assert!(world.duplicates().is_empty());
}

#[test]
fn recovery_with_silent_dedup_provider_keeps_intent_for_next_boot() {
    let conn = db();
    let world = World::with_dedup();
    world.script([Scripted::DropSilently, Scripted::DropSilently]);
    let store = ActivityStore::default();
    store
        .execute_irreversible(&conn, &world, &email(1), 0)
        .unwrap_err();
    assert!(store.recover(&conn, &world, 10).unwrap().is_empty());
    assert_eq!(store.with_status(&conn, ActivityStatus::Intent).unwrap().len(), 1);
    assert_eq!(world.deliveries().len(), 0);
}

#[test]
fn world_without_dedup_counts_every_resend_as_a_duplicate() {
    let world = World::without_dedup();
    let p = json!({});
    world.send("k", "post", &p).unwrap();
    world.send("k", "post", &p).unwrap();
    assert_eq!(world.deliveries_for("k"), 2);
    assert_eq!(world.duplicates().get("k"), Some(&2));
    let shared = world.clone();
    shared.send("j", "post", &p).unwrap();
    assert_eq!(world.deliveries().len(), 3, "clones share one world");
}

#[test]
fn gate_is_shareable_across_threads_and_sends_each_key_once() {
    use durable_agent::fs::{Fs, SimConfig, SimFs};
    use durable_agent::sqlite::SqliteOptions;
    use durable_agent::store::schema::open_store;
    use std::sync::Arc;

    let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(1)));
    fs.create_dir_all(std::path::Path::new("/data"), "test mkdir")
        .unwrap();
    let db = open_store(fs, std::path::Path::new("/data/s.db"), &SqliteOptions::default()).unwrap();
    let world = World::without_dedup();
    let gate = ActivityGate::new(db, Arc::new(world.clone()), ActivityStore::default());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let gate = gate.clone();
            // Two threads per key: the second must answer from the ledger.
            std::thread::spawn(move || gate.execute(&email(i % 2), i).unwrap())
        })
        .collect();
    for h in handles {
        assert!(matches!(h.join().unwrap(), ActivityOutcome::Done { .. }));
    }
    assert_eq!(world.deliveries().len(), 2);
    assert!(world.duplicates().is_empty());
    assert!(gate.recover(10).unwrap().is_empty());
}
