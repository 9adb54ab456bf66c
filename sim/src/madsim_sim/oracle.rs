//! The daemon-level oracle: the project's guarantees checked against what
//! the daemon acknowledged (the [`super::Recorder`] trace) and what
//! recovery finds on the disk at the end ([`FinalView`]).
//!
//! - **Acked messages survive**: every `MessageAcked` id is pending or
//!   delivered at its recipient, and no id is pending twice or both.
//! - **Triggers are never lost**: every key whose `emit` returned has a row;
//!   a trigger due more than `settle_ms` before the end has been handled
//!   (DONE, or dead-lettered/failed after its retries), not left PENDING or
//!   CLAIMED.
//! - **At most once**: a task's trigger runs to DONE at most once (the
//!   daemon reports `TriggerFired` only after `ack_done`); no idempotency key reaches the world twice (trigger
//!   firings `fire:{key}` and irreversible tools alike); a DONE trigger's
//!   firing is settled in the ledger (DONE with exactly one delivery, or
//!   NEEDS_CONFIRMATION: a crash between INTENT and the answer, surfaced to
//!   a human because the world cannot dedup).
//! - **Tree and runtime invariants**: `Runtime::check_invariants` and the
//!   on-disk `recovery::check_invariants` are clean; the `lead` root and
//!   every worker are alive under it.
//!
//! - **Delivered only with a turn that read them** (seed 002's gap,
//!   closed): every message recovery shows as delivered was read by a turn
//!   that completed — or by the attempt in flight when the node died (its
//!   `turn.complete` may have landed) — never by an attempt that failed
//!   ([`delivered_without_a_turn`]).
//!
//! Invariant: pure; reads its inputs only.

use std::collections::{BTreeMap, BTreeSet};

use durable_agent::daemon::{DaemonConfig, DaemonEvent};

/// One live agent after the final recovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentMessages {
    /// Parent agent's name.
    pub parent: Option<String>,
    pub pending: Vec<String>,
    pub delivered: BTreeSet<String>,
}

/// One trigger row after the final recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerRow {
    pub status: String,
    pub fire_at_ms: u64,
    pub attempts: u32,
}

/// Everything the final recovery found.
#[derive(Debug, Clone, Default)]
pub struct FinalView {
    /// Live agents by name.
    pub agents: BTreeMap<String, AgentMessages>,
    /// Trigger rows by dedup key.
    pub triggers: BTreeMap<String, TriggerRow>,
    /// Activity-ledger status by idempotency key.
    pub ledger: BTreeMap<String, String>,
    /// World deliveries per idempotency key.
    pub deliveries: BTreeMap<String, usize>,
    pub runtime_violations: Vec<String>,
    pub disk_violations: Vec<String>,
    /// Workers the daemon was configured with.
    pub workers: usize,
    /// Logical time of the final crash.
    pub end_ms: u64,
}

/// Every violation found (empty: the run kept every guarantee).
pub fn check(events: &[(u64, DaemonEvent)], view: &FinalView, settle_ms: u64) -> Vec<String> {
    let mut bad = Vec::new();
    bad.extend(
        view.runtime_violations
            .iter()
            .map(|v| format!("runtime invariant: {v}")),
    );
    bad.extend(
        view.disk_violations
            .iter()
            .map(|v| format!("disk invariant: {v}")),
    );
    check_tree(view, &mut bad);
    let mut emitted: BTreeSet<&str> = BTreeSet::new();
    let mut fired: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (at, event) in events {
        match event {
            DaemonEvent::MessageAcked { id, from, to } => match view.agents.get(to) {
                None => bad.push(format!("message {id} ({from} -> {to}, acked at {at} ms): recipient gone")),
                Some(a) if !a.delivered.contains(id) && !a.pending.contains(id) => bad.push(format!(
                    "message {id} ({from} -> {to}) acknowledged at {at} ms is lost: neither pending nor delivered"
                )),
                Some(_) => {}
            },
            DaemonEvent::TriggerEmitted { key, .. } => {
                emitted.insert(key);
            }
            DaemonEvent::TriggerFired { key, .. } => fired.entry(key).or_default().push(*at),

            _ => {}
        }
    }
    for (key, times) in &fired {
        if times.len() > 1 {
            bad.push(format!(
                "trigger task {key} ran to DONE {} times (at {times:?} ms)",
                times.len()
            ));
        }
    }
    for (name, a) in &view.agents {
        let distinct: BTreeSet<&String> = a.pending.iter().collect();
        if distinct.len() != a.pending.len() {
            bad.push(format!(
                "agent {name}: a message is pending twice: {:?}",
                a.pending
            ));
        }
        for id in a.pending.iter().filter(|id| a.delivered.contains(*id)) {
            bad.push(format!(
                "agent {name}: message {id} is both delivered and pending"
            ));
        }
    }
    for key in &emitted {
        let Some(row) = view.triggers.get(*key) else {
            bad.push(format!("trigger {key}: emit returned but the row is gone (lost)"));
            continue;
        };
        let handled = matches!(row.status.as_str(), "DONE" | "DEAD" | "FAILED");
        if !handled && row.fire_at_ms.saturating_add(settle_ms) <= view.end_ms {
            bad.push(format!(
                "trigger {key}: due at {} ms but still {} at {} ms after {} attempts (delayed or lost)",
                row.fire_at_ms, row.status, view.end_ms, row.attempts
            ));
        }
    }
    for (key, n) in &view.deliveries {
        if *n > 1 {
            bad.push(format!("side effect {key} reached the world {n} times"));
        }
    }
    bad.extend(delivered_without_a_turn(events, view));
    for (key, row) in &view.triggers {
        let fire = DaemonConfig::fire_key(key);
        let sent = view.deliveries.get(&fire).copied().unwrap_or(0);
        match (row.status.as_str(), view.ledger.get(&fire).map(String::as_str)) {
            ("DONE", Some("DONE")) if sent == 1 => {}
            ("DONE", Some("NEEDS_CONFIRMATION")) => {}
            ("DONE", ledger) => bad.push(format!(
                "trigger {key} is DONE but its firing is {ledger:?} in the ledger with {sent} deliveries"
            )),
            _ => {}
        }
    }
    bad
}

/// Messages shown delivered that no completed turn read. A turn's read
/// counts when its `Delivered` event was recorded (the turn completed), or
/// when its attempt was in flight at a crash (`Reading` with no outcome
/// before the next boot: its `turn.complete` may be durable); an attempt
/// that failed (`TurnRetry`, `TurnGaveUp`) read nothing durable.
pub fn delivered_without_a_turn(events: &[(u64, DaemonEvent)], view: &FinalView) -> Vec<String> {
    let mut read: BTreeSet<&str> = BTreeSet::new();
    let mut in_flight: BTreeMap<&str, &Vec<String>> = BTreeMap::new();
    for (_, event) in events {
        match event {
            DaemonEvent::Reading { agent, ids } => {
                in_flight.insert(agent, ids);
            }
            DaemonEvent::Delivered { agent, ids } => {
                read.extend(ids.iter().map(String::as_str));
                in_flight.remove(agent.as_str());
            }
            DaemonEvent::TurnRetry { agent, .. } | DaemonEvent::TurnGaveUp { agent, .. } => {
                in_flight.remove(agent.as_str());
            }
            DaemonEvent::Booted { .. } => {
                for ids in std::mem::take(&mut in_flight).into_values() {
                    read.extend(ids.iter().map(String::as_str));
                }
            }
            _ => {}
        }
    }
    for ids in in_flight.into_values() {
        read.extend(ids.iter().map(String::as_str));
    }
    let mut out = Vec::new();
    for (name, a) in &view.agents {
        for id in a.delivered.iter().filter(|id| !read.contains(id.as_str())) {
            out.push(format!(
                "agent {name}: message {id} is recorded delivered but no completed turn read it (lost to its agent)"
            ));
        }
    }
    out
}

fn check_tree(view: &FinalView, bad: &mut Vec<String>) {
    match view.agents.get("lead") {
        Some(lead) if lead.parent.is_none() => {}
        other => bad.push(format!("the lead root is missing or not a root: {other:?}")),
    }
    for i in 0..view.workers {
        let name = DaemonConfig::agent_name(i);
        match view.agents.get(&name) {
            Some(a) if a.parent.as_deref() == Some("lead") => {}
            other => bad.push(format!("worker {name} is missing or not under lead: {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy_view() -> FinalView {
        let mut view = FinalView {
            workers: 1,
            end_ms: 1_000_000,
            ..FinalView::default()
        };
        view.agents.insert("lead".into(), AgentMessages::default());
        view.agents.insert(
            "agent-0".into(),
            AgentMessages {
                parent: Some("lead".into()),
                pending: vec!["m2".into()],
                delivered: BTreeSet::new(),
            },
        );
        view
    }

    fn acked(id: &str) -> (u64, DaemonEvent) {
        let event = DaemonEvent::MessageAcked {
            id: id.into(),
            from: "agent-0".into(),
            to: "agent-0".into(),
        };
        (5, event)
    }

    #[test]
    fn acked_messages_pending_or_delivered_pass_and_a_missing_one_fails() {
        let mut view = healthy_view();
        let agent = view.agents.get_mut("agent-0").unwrap();
        agent.delivered.insert("m1".into());
        let handed = (
            6,
            DaemonEvent::Delivered {
                agent: "agent-0".into(),
                ids: vec!["m1".into()],
            },
        );
        assert!(check(&[acked("m1"), acked("m2"), handed.clone()], &view, 0).is_empty());
        let mut twice = view.clone();
        twice.agents.get_mut("agent-0").unwrap().pending.push("m1".into());
        let bad = check(&[acked("m1")], &twice, 0);
        assert!(
            bad.iter().any(|b| b.contains("both delivered and pending")),
            "{bad:?}"
        );
        let bad = check(&[acked("m3"), handed], &view, 0);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("m3"));
        // Delivered on disk, but no completed turn read it.
        let bad = check(&[acked("m1")], &view, 0);
        assert!(
            bad.len() == 1 && bad[0].contains("m1") && bad[0].contains("no completed turn"),
            "{bad:?}"
        );
        // Read by an attempt that failed: still a violation.
        let reading = (
            6,
            DaemonEvent::Reading {
                agent: "agent-0".into(),
                ids: vec!["m1".into()],
            },
        );
        let retry = (
            7,
            DaemonEvent::TurnRetry {
                agent: "agent-0".into(),
                attempt: 0,
                backoff_ms: 1,
            },
        );
        assert_eq!(check(&[acked("m1"), reading.clone(), retry], &view, 0).len(), 1);
        // Read by the attempt in flight when the node died: allowed.
        assert!(check(&[acked("m1"), reading], &view, 0).is_empty());
    }

    #[test]
    fn emitted_trigger_must_exist_and_fire_at_most_once() {
        let mut view = healthy_view();
        let key = "scheduled-once:x".to_string();
        let emitted = (
            1,
            DaemonEvent::TriggerEmitted {
                key: key.clone(),
                fire_at_ms: 10,
                inserted: true,
            },
        );
        let bad = check(std::slice::from_ref(&emitted), &view, 1_000);
        assert!(bad.iter().any(|b| b.contains("lost")), "{bad:?}");
        let row = TriggerRow {
            status: "DONE".into(),
            fire_at_ms: 10,
            attempts: 1,
        };
        view.triggers.insert(key.clone(), row);
        view.ledger.insert(DaemonConfig::fire_key(&key), "DONE".into());
        view.deliveries.insert(DaemonConfig::fire_key(&key), 1);
        assert!(check(std::slice::from_ref(&emitted), &view, 1_000).is_empty());
        view.deliveries.insert(DaemonConfig::fire_key(&key), 2);
        let bad = check(&[emitted], &view, 1_000);
        assert!(bad.iter().any(|b| b.contains("2 times")), "{bad:?}");
    }

    #[test]
    fn a_task_fired_twice_is_reported() {
        let view = healthy_view();
        let fired = |at| {
            let event = DaemonEvent::TriggerFired {
                key: "scheduled-once:z".into(),
                overdue_note: false,
                from_ledger: true,
                needs_confirmation: false,
            };
            (at, event)
        };
        assert!(check(&[fired(1)], &view, 0).is_empty());
        let bad = check(&[fired(1), fired(2)], &view, 0);
        assert!(bad.iter().any(|b| b.contains("2 times")), "{bad:?}");
    }

    #[test]
    fn overdue_pending_trigger_is_reported_as_delayed() {
        let mut view = healthy_view();
        let row = TriggerRow {
            status: "PENDING".into(),
            fire_at_ms: 10,
            attempts: 0,
        };
        view.triggers.insert("scheduled-once:y".into(), row);
        let emitted = (
            1,
            DaemonEvent::TriggerEmitted {
                key: "scheduled-once:y".into(),
                fire_at_ms: 10,
                inserted: true,
            },
        );
        assert!(check(std::slice::from_ref(&emitted), &view, 1_000)
            .iter()
            .any(|b| b.contains("delayed")));
        view.end_ms = 500;
        assert!(check(&[emitted], &view, 1_000).is_empty());
    }
}
