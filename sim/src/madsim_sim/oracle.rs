//! The daemon oracle: the guarantees the kill soaks check, checked against
//! what the clients were told (the [`super::Recorder`] trace: `Acked` is a
//! 200) and what one more recovery finds on the disk at the end
//! ([`FinalView`]), plus timing only simulated time can check.
//!
//! - **D1 acknowledged ops present**: an agent whose creation was acked is
//!   alive (unless a delete of it was sent); an acked message is pending
//!   or delivered at its recipient, never both, never twice; an acked
//!   emit's trigger row exists; an acked schedule is defined (unless a
//!   delete of it was sent), an acked delete's is not.
//! - **D2 no duplicate irreversible effect**: no idempotency key reaches
//!   the world twice.
//! - **D3 each turn exactly once**: a work (`api:{id}`, `trigger:{key}`)
//!   runs to completion at most once across every crash and retry; an
//!   acked turn's outcome is durable; once acked, every later ack of the
//!   same work id answers `already_done`.
//! - **D4 triggers settle**: a trigger due more than `settle_ms` before the
//!   end is DONE, DEAD or FAILED; a DONE trigger's turn is durable (its
//!   effects before its ack).
//! - **D5 timing**: a trigger's turn never starts before its fire time,
//!   and starts within `poll_ms + lease_ms` of it unless the daemon was
//!   down meanwhile; a schedule bucket is emitted (and fires) once, never
//!   before its bucket; after a failed attempt a trigger's turn starts
//!   again no sooner than the policy's backoff for that many failures.
//! - **Invariants**: `Runtime::check_invariants`, the on-disk
//!   `recovery::check_invariants` and the fuzzer's log check are clean.
//!
//! Invariant: pure; reads its inputs only.

use std::collections::{BTreeMap, BTreeSet};

use super::{Event, Op};

/// One live agent after the final recovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentMessages {
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
    /// The agent its payload names, and its work (`trigger:{key}`, or
    /// the interrupted work a RESUME trigger continues).
    pub agent: Option<String>,
    pub work: String,
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
    /// (agent, work) pairs whose outcome is durable.
    pub completed: BTreeSet<(String, String)>,
    /// Schedule ids defined.
    pub schedules: BTreeSet<String>,
    /// Trigger rows per (schedule, bucket), from their payloads.
    pub buckets: BTreeMap<(String, u64), usize>,
    /// Trigger rows per dedup key (the store keeps one).
    pub rows_per_key: BTreeMap<String, usize>,
    pub runtime_violations: Vec<String>,
    pub disk_violations: Vec<String>,
    /// Logical time of the final crash.
    pub end_ms: u64,
}

/// The (agent, work) pairs whose durability the oracle asks about.
pub fn works_to_check(events: &[(u64, Event)]) -> BTreeSet<(String, String)> {
    let mut works = BTreeSet::new();
    for (_, e) in events {
        match e {
            Event::Acked {
                op: Op::Turn { agent, work_id },
                ..
            } => {
                works.insert((agent.clone(), format!("api:{work_id}")));
            }
            Event::TurnStarted { agent, work } => {
                works.insert((agent.clone(), work.clone()));
            }
            _ => {}
        }
    }
    works
}

/// What the oracle needs to know of the plan and the run.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub settle_ms: u64,
    /// A due trigger's turn starts within this much of its fire time.
    pub fire_bound_ms: u64,
    /// When the daemon was down (killed or stopped .. restarted).
    pub down: Vec<(u64, u64)>,
    pub policy: durable_agent::store::triggers::TriggerPolicy,
}

impl Bounds {
    fn down_between(&self, from: u64, to: u64) -> bool {
        self.down.iter().any(|(a, b)| *a <= to && *b >= from)
    }
}

/// Every violation found (empty: the run kept every guarantee).
pub fn check(events: &[(u64, Event)], view: &FinalView, bounds: &Bounds) -> Vec<String> {
    let settle_ms = bounds.settle_ms;
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
    let maybe_deleted: BTreeSet<&str> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Sent {
                op: Op::DeleteAgent { name },
                ..
            } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    let schedule_deletes: BTreeSet<&str> = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Sent {
                op: Op::DeleteSchedule { id },
                ..
            } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let mut ran: BTreeMap<(&str, &str), Vec<u64>> = BTreeMap::new();
    let mut acked_works: BTreeMap<(&str, String), u64> = BTreeMap::new();
    let mut emitted: BTreeMap<&str, u64> = BTreeMap::new();
    let mut emitted_at: BTreeMap<&str, u64> = BTreeMap::new();
    let mut first_start: BTreeMap<&str, u64> = BTreeMap::new();
    for (at, event) in events {
        match event {
            Event::Acked { op, reply, .. } => match op {
                Op::CreateAgent { name, .. }
                    if !maybe_deleted.contains(name.as_str()) && !view.agents.contains_key(name) =>
                {
                    bad.push(format!("D1: agent {name} created (acked at {at} ms) is gone"));
                }
                Op::Message { from, to } => {
                    let id = reply["message_id"].as_str().unwrap_or_default();
                    match view.agents.get(to) {
                        None => bad.push(format!("D1: message {id} ({from} -> {to}): recipient gone")),
                        Some(a) if !a.delivered.contains(id) && !a.pending.iter().any(|p| p == id) => {
                            bad.push(format!(
                                "D1: message {id} ({from} -> {to}) acknowledged at {at} ms is lost: neither pending nor delivered"
                            ))
                        }
                        Some(_) => {}
                    }
                }
                Op::Emit { key, .. } => {
                    let fire_at = reply["fire_at_ms"].as_u64().unwrap_or(*at);
                    emitted.insert(key, fire_at);
                    emitted_at.entry(key).or_insert(*at);
                }
                Op::AddSchedule { id, .. }
                    if !schedule_deletes.contains(id.as_str()) && !view.schedules.contains(id) =>
                {
                    bad.push(format!("D1: schedule {id} added (acked at {at} ms) is gone"));
                }
                Op::DeleteSchedule { id } if view.schedules.contains(id) => {
                    bad.push(format!("D1: schedule {id} deleted (acked at {at} ms) is back"));
                }
                Op::Turn { agent, work_id } => {
                    let work = format!("api:{work_id}");
                    let key = (agent.as_str(), work.clone());
                    if let Some(first) = acked_works.get(&key) {
                        if reply.get("already_done").is_none() {
                            bad.push(format!(
                                "D3: turn {work} of {agent} acknowledged at {first} ms ran again for the retry acked at {at} ms"
                            ));
                        }
                    } else {
                        acked_works.insert(key, *at);
                    }
                    if !view.completed.contains(&(agent.clone(), work.clone())) {
                        bad.push(format!(
                            "D3: turn {work} of {agent} acknowledged at {at} ms is not durable after recovery"
                        ));
                    }
                }
                _ => {}
            },
            Event::TurnEnded {
                agent,
                work,
                ran: true,
                ..
            } => ran.entry((agent, work)).or_default().push(*at),
            Event::TurnStarted { work, .. } => {
                first_start.entry(work).or_insert(*at);
            }
            _ => {}
        }
    }
    for ((agent, work), times) in &ran {
        if times.len() > 1 {
            bad.push(format!(
                "D3: {work} of {agent} ran to completion {} times (at {times:?} ms)",
                times.len()
            ));
        }
    }
    for (key, n) in &view.deliveries {
        if *n > 1 {
            bad.push(format!("D2: side effect {key} reached the world {n} times"));
        }
    }
    for (name, a) in &view.agents {
        let distinct: BTreeSet<&String> = a.pending.iter().collect();
        if distinct.len() != a.pending.len() {
            bad.push(format!(
                "D1: agent {name}: a message is pending twice: {:?}",
                a.pending
            ));
        }
        for id in a.pending.iter().filter(|id| a.delivered.contains(*id)) {
            bad.push(format!(
                "D1: agent {name}: message {id} is both delivered and pending"
            ));
        }
    }
    for (key, fire_at) in &emitted {
        let Some(row) = view.triggers.get(*key) else {
            bad.push(format!(
                "D1: trigger {key}: emit acknowledged but the row is gone (lost)"
            ));
            continue;
        };
        let settled = matches!(row.status.as_str(), "DONE" | "DEAD" | "FAILED");
        if !settled && row.fire_at_ms.saturating_add(settle_ms) <= view.end_ms {
            bad.push(format!(
                "D4: trigger {key}: due at {} ms but still {} at {} ms after {} attempts (delayed or lost)",
                row.fire_at_ms, row.status, view.end_ms, row.attempts
            ));
        }
        let work = format!("trigger:{key}");
        let due = (*fire_at).max(emitted_at.get(key).copied().unwrap_or(0));
        match first_start.get(work.as_str()) {
            Some(started) if started < fire_at => {
                bad.push(format!("D5: trigger {key} due at {fire_at} ms started at {started} ms"))
            }
            Some(started)
                if *started > due + bounds.fire_bound_ms && !bounds.down_between(due, *started) =>
            {
                bad.push(format!(
                    "D5: trigger {key} due at {due} ms started only at {started} ms (bound {} ms, the daemon up)",
                    bounds.fire_bound_ms
                ))
            }
            None if view.end_ms > due + bounds.fire_bound_ms
                && !bounds.down_between(due, due + bounds.fire_bound_ms) =>
            {
                bad.push(format!(
                    "D5: trigger {key} due at {due} ms never started (bound {} ms, the daemon up)",
                    bounds.fire_bound_ms
                ))
            }
            _ => {}
        }
    }
    for ((schedule, bucket), n) in &view.buckets {
        if *n > 1 {
            bad.push(format!(
                "D5: schedule {schedule} bucket {bucket} was emitted {n} times (fires twice)"
            ));
        }
    }
    for (key, n) in &view.rows_per_key {
        if *n > 1 {
            bad.push(format!("D1: trigger key {key} has {n} rows (runs {n} times)"));
        }
    }
    check_backoff(events, bounds, &mut bad);
    for (key, row) in &view.triggers {
        let Some(agent) = &row.agent else { continue };
        // A wake-up whose message another turn read meanwhile runs no turn
        // (acked as already done): its message delivered is its effect.
        let read_elsewhere = key
            .strip_prefix("wake:")
            .is_some_and(|id| view.agents.get(agent).is_some_and(|a| a.delivered.contains(id)));
        if row.status == "DONE"
            && !read_elsewhere
            && view.agents.contains_key(agent)
            && !view.completed.contains(&(agent.clone(), row.work.clone()))
        {
            bad.push(format!(
                "D4: trigger {key} is DONE but its turn ({}) is not durable: acked before its effects",
                row.work
            ));
        }
        if let Some(bucket) = key
            .strip_prefix("scheduled:")
            .and_then(|rest| rest.rsplit_once(':'))
            .and_then(|(_, b)| b.parse::<u64>().ok())
        {
            let work = format!("trigger:{key}");
            if let Some(started) = first_start.get(work.as_str()) {
                if *started < row.fire_at_ms {
                    bad.push(format!(
                        "D5: schedule bucket {bucket} ({key}) due at {} ms started at {started} ms",
                        row.fire_at_ms
                    ));
                }
            }
        }
    }
    bad
}

/// After its k-th failed attempt in this boot a trigger's turn starts again
/// no sooner than `backoff_ms(k)` (attempts ≥ failures seen: a lower bound), unless
/// a crash, stop, human retry or confirmation came in between (those
/// re-pend or reclaim it at once, by design).
fn check_backoff(events: &[(u64, Event)], bounds: &Bounds, bad: &mut Vec<String>) {
    let mut failures: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    let mut human_at = 0u64;
    for (at, e) in events {
        match e {
            Event::Sent {
                op: Op::RetryTrigger { .. } | Op::Confirm { .. },
                ..
            } => {
                // A human's retry resets the attempts it re-pends.
                human_at = *at;
                failures.clear();
            }
            // Failures a crash cut before their ack reached the store do
            // not count there: count each boot's own.
            Event::Booted { .. } => failures.clear(),
            Event::TurnEnded {
                work,
                error: Some(error),
                ..
            } if work.starts_with("trigger:") && error.contains("provider") => {
                let entry = failures.entry(work).or_insert((0, 0));
                *entry = (entry.0 + 1, *at);
            }
            Event::TurnStarted { work, .. } => {
                let Some((n, failed_at)) = failures.get(work.as_str()).copied() else {
                    continue;
                };
                let earliest = failed_at + bounds.policy.backoff_ms(n);
                if *at < earliest && human_at < failed_at && !bounds.down_between(failed_at, *at) {
                    bad.push(format!(
                        "D5: {work} started again at {at} ms, {} ms after failure {n} (backoff {} ms)",
                        at - failed_at,
                        bounds.policy.backoff_ms(n)
                    ));
                }
            }
            _ => {}
        }
    }
}
