//! Property test of the trigger store: random op sequences (emit with
//! repeated keys, claim, ack done/failed, reclaim, time passing) keep the
//! invariants — one row per dedup key, claim picks the earliest due trigger
//! by (fire_at, priority), nothing runs before `not_before`, terminal states
//! never change, attempts never exceed the limit.

use std::collections::BTreeMap;

use durable_agent::canary::Canaries;
use durable_agent::store::schema::migrate;
use durable_agent::store::triggers::*;
use proptest::prelude::*;
use rusqlite::Connection;
use serde_json::json;

const MAX_ATTEMPTS: u32 = 3;

#[derive(Debug, Clone)]
enum Op {
    Emit {
        key: Option<u8>,
        fire_at: u64,
        priority: i64,
    },
    Claim,
    AckDone(usize),
    AckFailed(usize, bool),
    Reclaim,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (proptest::option::weighted(0.8, 0u8..4), 0u64..200, 0i64..3)
            .prop_map(|(key, fire_at, priority)| Op::Emit { key, fire_at, priority }),
        3 => Just(Op::Claim),
        2 => (0usize..4).prop_map(Op::AckDone),
        2 => ((0usize..4), any::<bool>()).prop_map(|(i, r)| Op::AckFailed(i, r)),
        1 => Just(Op::Reclaim),
        2 => (1u64..300).prop_map(Op::Advance),
    ]
}

fn due(t: &Trigger, now: u64) -> bool {
    t.status == TriggerStatus::Pending && t.fire_at_ms <= now && t.not_before_ms.is_none_or(|nb| nb <= now)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_trigger_histories_keep_the_store_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn, "mem").unwrap();
        let policy = TriggerPolicy { max_attempts: MAX_ATTEMPTS, backoff_base_ms: 50, backoff_cap_ms: 400, overdue_grace_ms: 0 };
        let store = TriggerStore::new(policy, Canaries::none());
        let lease_ms = 100;
        let mut now = 0u64;
        let mut claimed: Vec<Trigger> = Vec::new();
        let mut terminal: BTreeMap<String, TriggerStatus> = BTreeMap::new();
        for op in ops {
            let before = store.all(&conn, now).unwrap();
            match op {
                Op::Emit { key, fire_at, priority } => {
                    let spec = TriggerSpec {
                        source: TriggerSource::System,
                        dedup_key: key.map(|k| format!("k{k}")),
                        session_id: None,
                        fire_at_ms: fire_at,
                        priority,
                        description: String::new(),
                        payload: json!(null),
                    };
                    let out = store.emit(&conn, &spec, now).unwrap();
                    let existing = spec.dedup_key.as_ref().and_then(|k| before.iter().find(|t| t.dedup_key.as_ref() == Some(k)));
                    match existing {
                        Some(t) => prop_assert_eq!(out, EmitOutcome::Duplicate(t.id.clone())),
                        None => prop_assert!(matches!(out, EmitOutcome::Inserted(_))),
                    }
                }
                Op::Claim => {
                    let expect = before.iter().filter(|t| due(t, now)).min_by_key(|t| (t.fire_at_ms, t.priority));
                    let got = store.claim(&conn, now, lease_ms).unwrap();
                    match (expect, &got) {
                        (None, None) => {}
                        (Some(e), Some(g)) => {
                            prop_assert_eq!((e.fire_at_ms, e.priority), (g.fire_at_ms, g.priority));
                            prop_assert_eq!(g.attempts, e.attempts + 1);
                            claimed.push(g.clone());
                        }
                        (e, g) => prop_assert!(false, "expected {:?}, claimed {:?}", e, g),
                    }
                }
                Op::AckDone(_) | Op::AckFailed(..) if claimed.is_empty() => {}
                Op::AckDone(i) => {
                    let claim = claimed[i % claimed.len()].clone();
                    let row = before.iter().find(|t| t.id == claim.id).unwrap();
                    let res = store.ack_done(&conn, &claim, now);
                    // Only the claim that still holds the lease may ack.
                    let owns = row.status == TriggerStatus::Claimed && row.attempts == claim.attempts;
                    prop_assert_eq!(res.is_ok(), owns);
                }
                Op::AckFailed(i, retryable) => {
                    let claim = claimed[i % claimed.len()].clone();
                    let row = before.iter().find(|t| t.id == claim.id).unwrap().clone();
                    let owns = row.status == TriggerStatus::Claimed && row.attempts == claim.attempts;
                    match store.ack_failed(&conn, &claim, now, "err", retryable) {
                        Ok(next) => {
                            prop_assert!(owns, "a stale claim acked {}", claim.id);
                            let want = if !retryable { TriggerStatus::Failed }
                                else if row.attempts >= MAX_ATTEMPTS { TriggerStatus::Dead }
                                else { TriggerStatus::Pending };
                            prop_assert_eq!(next, want);
                        }
                        Err(_) => prop_assert!(!owns, "the owning claim's ack failed"),
                    }
                }
                Op::Reclaim => {
                    let ids = store.reclaim_expired(&conn, now).unwrap();
                    for id in ids {
                        let t = before.iter().find(|t| t.id == id).unwrap();
                        prop_assert!(t.status == TriggerStatus::Claimed && t.lease_until_ms.unwrap() <= now);
                    }
                }
                Op::Advance(ms) => now += ms,
            }
            let after = store.all(&conn, now).unwrap();
            let mut keys = std::collections::BTreeSet::new();
            for t in &after {
                if let Some(k) = &t.dedup_key {
                    prop_assert!(keys.insert(k.clone()), "two rows for key {}", k);
                }
                prop_assert!(t.attempts <= MAX_ATTEMPTS, "attempts {} for {}", t.attempts, t.id);
                if t.status == TriggerStatus::Dead {
                    prop_assert!(t.attempts >= MAX_ATTEMPTS);
                }
                if let Some(s) = terminal.get(&t.id) {
                    prop_assert_eq!(*s, t.status, "terminal {} changed", t.id);
                }
                if matches!(t.status, TriggerStatus::Done | TriggerStatus::Failed | TriggerStatus::Dead) {
                    terminal.insert(t.id.clone(), t.status);
                }
            }
        }
    }
}
