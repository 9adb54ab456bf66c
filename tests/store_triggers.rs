//! Durable trigger store: emit dedup, claim order, leases, backoff, dead
//! letters, overdue notes (seed 001 §6.2).

use durable_agent::canary::{Canaries, Canary};
use durable_agent::store::schema::migrate;
use durable_agent::store::triggers::*;
use rusqlite::Connection;
use serde_json::json;

fn db() -> Connection {
    let c = Connection::open_in_memory().unwrap();
    migrate(&c, "mem").unwrap();
    c
}

fn spec(key: Option<&str>, fire_at_ms: u64, priority: i64) -> TriggerSpec {
    TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: key.map(str::to_string),
        session_id: Some("s1".into()),
        fire_at_ms,
        priority,
        description: key.unwrap_or("one-off").to_string(),
        payload: json!({"k": key}),
    }
}

fn policy() -> TriggerPolicy {
    TriggerPolicy {
        max_attempts: 3,
        backoff_base_ms: 100,
        backoff_cap_ms: 10_000,
        overdue_grace_ms: 1_000,
    }
}

#[test]
fn emit_same_dedup_key_twice_keeps_one_row_and_reports_duplicate() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    let a = store
        .emit(&conn, &spec(Some("scheduled-once:7"), 10, 1), 0)
        .unwrap();
    let b = store
        .emit(&conn, &spec(Some("scheduled-once:7"), 99, 5), 1)
        .unwrap();
    let EmitOutcome::Inserted(id) = &a else {
        panic!("{a:?}")
    };
    assert_eq!(b, EmitOutcome::Duplicate(id.clone()));
    assert_eq!(store.all(&conn, 0).unwrap().len(), 1);
    // Keyless one-offs are never deduplicated.
    store.emit(&conn, &spec(None, 1, 1), 0).unwrap();
    store.emit(&conn, &spec(None, 1, 1), 0).unwrap();
    assert_eq!(store.all(&conn, 0).unwrap().len(), 3);
}

#[test]
fn canary_trigger_without_dedup_inserts_duplicates() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::only(Canary::TriggerWithoutDedup));
    store.emit(&conn, &spec(Some("k"), 10, 1), 0).unwrap();
    let b = store.emit(&conn, &spec(Some("k"), 10, 1), 0).unwrap();
    assert!(matches!(b, EmitOutcome::Inserted(_)));
    assert_eq!(store.all(&conn, 0).unwrap().len(), 2);
}

#[test]
fn claim_takes_due_triggers_by_fire_at_then_priority_and_skips_future() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    store.emit(&conn, &spec(Some("late"), 50, 0), 0).unwrap();
    store.emit(&conn, &spec(Some("lowprio"), 10, 9), 0).unwrap();
    store.emit(&conn, &spec(Some("highprio"), 10, 1), 0).unwrap();
    store.emit(&conn, &spec(Some("future"), 1_000, 0), 0).unwrap();
    let order: Vec<String> = std::iter::from_fn(|| store.claim(&conn, 100, 500).unwrap())
        .map(|t| t.dedup_key.unwrap())
        .collect();
    assert_eq!(order, ["highprio", "lowprio", "late"]);
    let t = store.claim(&conn, 1_000, 500).unwrap().unwrap();
    assert_eq!(t.dedup_key.as_deref(), Some("future"));
    assert_eq!(
        (t.status, t.attempts, t.lease_until_ms),
        (TriggerStatus::Claimed, 1, Some(1_500))
    );
    assert_eq!(
        store.get(&conn, &t.id, 1_000).unwrap().unwrap().status,
        TriggerStatus::Claimed
    );
}

#[test]
fn failed_ack_backs_off_exponentially_then_dead_letters() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    let id = store
        .emit(&conn, &spec(Some("k"), 0, 0), 0)
        .unwrap()
        .id()
        .to_string();
    let mut now = 0;
    let mut not_befores = Vec::new();
    for attempt in 1..=3u32 {
        let t = store.claim(&conn, now, 50).unwrap().expect("due");
        assert_eq!(t.attempts, attempt);
        let next = store.ack_failed(&conn, &t, now, "boom", true).unwrap();
        let row = store.get(&conn, &id, now).unwrap().unwrap();
        if attempt < 3 {
            assert_eq!(next, TriggerStatus::Pending);
            let nb = row.not_before_ms.unwrap();
            not_befores.push(nb - now);
            assert!(
                store.claim(&conn, nb - 1, 50).unwrap().is_none(),
                "claimed before not_before"
            );
            now = nb;
        } else {
            assert_eq!(next, TriggerStatus::Dead);
            assert_eq!(row.last_error.as_deref(), Some("boom"));
        }
    }
    assert_eq!(not_befores, [100, 200]);
    assert!(store.claim(&conn, u64::MAX / 2, 50).unwrap().is_none());
}

#[test]
fn permanent_failure_is_failed_and_done_is_terminal() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    let a = store
        .emit(&conn, &spec(Some("a"), 0, 0), 0)
        .unwrap()
        .id()
        .to_string();
    let b = store
        .emit(&conn, &spec(Some("b"), 0, 1), 0)
        .unwrap()
        .id()
        .to_string();
    let ca = store.claim(&conn, 0, 10).unwrap().expect("a due");
    assert_eq!(ca.id, a);
    store.ack_done(&conn, &ca, 1).unwrap();
    let cb = store.claim(&conn, 0, 10).unwrap().expect("b due");
    assert_eq!(cb.id, b);
    assert_eq!(
        store.ack_failed(&conn, &cb, 1, "bad payload", false).unwrap(),
        TriggerStatus::Failed
    );
    // A second ack of a DONE trigger is refused with a typed error.
    let err = store.ack_done(&conn, &ca, 2).unwrap_err();
    assert!(err.to_string().contains("DONE"), "{err}");
    let mut missing = ca.clone();
    missing.id = "trg-404".into();
    assert!(store.ack_done(&conn, &missing, 2).is_err());
}

#[test]
fn an_ack_proves_the_lease_a_reclaimed_claim_cannot_ack() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    store.emit(&conn, &spec(Some("k"), 0, 0), 0).unwrap();
    let first = store.claim(&conn, 0, 10).unwrap().expect("due");
    // The lease runs out; the trigger is reclaimed and claimed again.
    assert_eq!(store.reclaim_expired(&conn, 10).unwrap(), vec![first.id.clone()]);
    let second = store.claim(&conn, 20, 10).unwrap().expect("due again");
    assert_eq!(second.attempts, first.attempts + 1);
    // The first holder comes back: both its acks are refused, naming why.
    let err = store.ack_done(&conn, &first, 21).unwrap_err();
    assert!(err.to_string().contains("lease was reclaimed"), "{err}");
    assert!(store.ack_failed(&conn, &first, 21, "late", true).is_err());
    let row = store.get(&conn, &first.id, 21).unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (TriggerStatus::Claimed, 2));
    // The current holder acks.
    store.ack_done(&conn, &second, 22).unwrap();
}

#[test]
fn a_released_claim_is_pending_uncounted_and_a_stale_one_cannot_release() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    store.emit(&conn, &spec(Some("k"), 0, 0), 0).unwrap();
    // Given back as many times as the policy allows attempts, and more:
    // a stop is no failure, so it never dead-letters.
    for now in 0..(policy().max_attempts as u64 + 2) {
        let claim = store.claim(&conn, now, 10).unwrap().expect("due at once");
        assert_eq!(claim.attempts, 1);
        store.release(&conn, &claim, now).unwrap();
        let row = store.get(&conn, &claim.id, now).unwrap().unwrap();
        assert_eq!(
            (row.status, row.attempts, row.lease_until_ms),
            (TriggerStatus::Pending, 0, None)
        );
        // A second release of the same claim is refused: it holds nothing.
        let err = store.release(&conn, &claim, now).unwrap_err();
        assert!(err.to_string().contains("lease was reclaimed"), "{err}");
    }
    // A claim whose lease was reclaimed and claimed again cannot give the
    // new claim back.
    let first = store.claim(&conn, 100, 10).unwrap().unwrap();
    store.reclaim_expired(&conn, 110).unwrap();
    let second = store.claim(&conn, 120, 10).unwrap().unwrap();
    assert!(store.release(&conn, &first, 121).is_err());
    let row = store.get(&conn, &second.id, 121).unwrap().unwrap();
    assert_eq!((row.status, row.attempts), (TriggerStatus::Claimed, 2));
}

#[test]
fn boot_reclaim_returns_only_expired_leases_to_pending() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    store.emit(&conn, &spec(Some("short"), 0, 0), 0).unwrap();
    store.emit(&conn, &spec(Some("long"), 0, 1), 0).unwrap();
    let short = store.claim(&conn, 0, 10).unwrap().unwrap();
    let long = store.claim(&conn, 0, 1_000).unwrap().unwrap();
    assert_eq!(store.reclaim_expired(&conn, 100).unwrap(), vec![short.id.clone()]);
    assert_eq!(
        store.get(&conn, &short.id, 100).unwrap().unwrap().status,
        TriggerStatus::Pending
    );
    assert_eq!(
        store.get(&conn, &long.id, 100).unwrap().unwrap().status,
        TriggerStatus::Claimed
    );
    // Re-claimed, the attempt count keeps growing.
    assert_eq!(store.claim(&conn, 100, 10).unwrap().unwrap().attempts, 2);
}

#[test]
fn reclaim_dead_letters_a_trigger_that_used_all_attempts() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    let id = store
        .emit(&conn, &spec(Some("poison"), 0, 0), 0)
        .unwrap()
        .id()
        .to_string();
    // The first attempt fails (acked), the next two lose their lease.
    let first = store.claim(&conn, 0, 10).unwrap().unwrap();
    store.ack_failed(&conn, &first, 5, "HTTP 503", true).unwrap();
    let mut now = 1_000; // past the backoff
    for _ in 0..2 {
        store.claim(&conn, now, 10).unwrap().unwrap();
        now += 100; // the process "dies" holding the lease
        store.reclaim_expired(&conn, now).unwrap();
    }
    let dead = store.get(&conn, &id, now).unwrap().unwrap();
    assert_eq!(dead.status, TriggerStatus::Dead);
    // A dead letter always says why (found by the power-cut soak: a DEAD
    // row with no reason looked lost), and no more than is known: the
    // last attempt's process died; the earlier ones need not have (found
    // by review: it said "lost 3 times" of a trigger whose first attempt
    // failed at the provider).
    assert_eq!(
        dead.last_error.as_deref(),
        Some(
            "attempt 3 of 3 lost its lease (the process running it died); the last error before it: HTTP 503"
        )
    );
}

#[test]
fn rehydrated_overdue_trigger_of_any_source_carries_a_note() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    let mut s = spec(Some("proactive:daily:1"), 5_000, 0);
    s.source = TriggerSource::Proactive;
    store.emit(&conn, &s, 0).unwrap();
    store.emit(&conn, &spec(Some("on-time"), 9_500, 0), 0).unwrap();
    let pending = store.pending(&conn, 10_000).unwrap();
    assert_eq!(pending[0].overdue_by_ms, Some(5_000));
    let note = pending[0].overdue_note().unwrap();
    assert!(
        note.contains("PROACTIVE") && note.contains("5000 ms late"),
        "{note}"
    );
    assert_eq!(pending[1].overdue_by_ms, None, "within grace");
    let claimed = store.claim(&conn, 10_000, 10).unwrap().unwrap();
    assert_eq!(claimed.overdue_by_ms, Some(5_000));
}

#[test]
fn unknown_status_in_a_row_is_a_typed_error() {
    let conn = db();
    let store = TriggerStore::new(policy(), Canaries::none());
    let id = store
        .emit(&conn, &spec(Some("k"), 0, 0), 0)
        .unwrap()
        .id()
        .to_string();
    conn.execute("UPDATE triggers SET status = 'EXPLODED'", [])
        .unwrap();
    let err = store.get(&conn, &id, 0).unwrap_err();
    assert!(err.to_string().contains("EXPLODED"), "{err}");
}

#[test]
fn a_zombie_claim_from_before_a_human_retry_cannot_ack_the_new_claim() {
    let conn = db();
    let policy = TriggerPolicy {
        max_attempts: 1,
        ..policy()
    };
    let store = TriggerStore::new(policy, Canaries::none());
    store.emit(&conn, &spec(Some("k"), 0, 0), 0).unwrap();
    let zombie = store.claim(&conn, 0, 10).unwrap().expect("due");
    // Its holder hangs; the lease runs out and, out of attempts, the
    // trigger is dead-lettered. A human retries it (attempts restart).
    assert_eq!(store.reclaim_expired(&conn, 10).unwrap(), vec![zombie.id.clone()]);
    store.retry(&conn, &zombie.id, 20).unwrap();
    let fresh = store.claim(&conn, 30, 10).unwrap().expect("due again");
    assert_eq!(
        fresh.attempts, zombie.attempts,
        "the attempt number repeats after the retry"
    );
    // The zombie wakes up: same attempt number, but not its claim.
    let err = store.ack_done(&conn, &zombie, 31).unwrap_err();
    assert!(err.to_string().contains("lease was reclaimed"), "{err}");
    store.ack_done(&conn, &fresh, 32).unwrap();
}
