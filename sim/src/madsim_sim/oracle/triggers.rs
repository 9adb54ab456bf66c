//! The daemon oracle's trigger guarantees.
//!
//! - **D4 triggers settle**: a trigger due more than `settle_ms` before
//!   the end is DONE, DEAD or FAILED (a human's retry or confirmation
//!   re-pends a trigger: its window restarts then); a DONE trigger's turn
//!   is durable (its effects before its ack); a one-time trigger whose
//!   turn an aimed crash killed in flight has its row, settles the same
//!   way after the crash, and its work completed once if it is DONE (never
//!   twice in any case).
//! - **D5 timing**: a trigger's turn never starts before its fire time,
//!   and starts within the plan's start bound of it unless the daemon was
//!   down meanwhile; a schedule bucket is emitted (and fires) once, never
//!   before its bucket, and a new schedule's first bucket at once, due
//!   when it was added (not late); after a failed attempt a trigger's turn starts
//!   again no sooner than the policy's backoff for that many failures.
//!
//! Invariant: pure; reads its inputs only.

use std::collections::BTreeMap;

use super::super::{Event, Op};
use super::{Bounds, FinalView, TriggerRow};

/// When a human last re-pended each trigger row (a retry, or a
/// confirmation of the key its turn was blocked on).
struct Repended {
    by_id: BTreeMap<String, u64>,
    /// A confirmation whose answer was lost re-pended rows nobody knows.
    unknown_at: u64,
}

impl Repended {
    fn of(events: &[(u64, Event)]) -> Repended {
        let mut r = Repended {
            by_id: BTreeMap::new(),
            unknown_at: 0,
        };
        for (at, e) in events {
            match e {
                // Sent, not acked: a lost answer may have re-pended it.
                Event::Sent {
                    op: Op::RetryTrigger { id, .. },
                    ..
                } => {
                    r.by_id.insert(id.clone(), *at);
                }
                Event::Acked {
                    op: Op::Confirm { .. },
                    reply,
                    ..
                } => {
                    let ids = reply["retried_triggers"].as_array().into_iter().flatten();
                    for id in ids.filter_map(|v| v.as_str()) {
                        r.by_id.insert(id.to_string(), *at);
                    }
                }
                Event::Lost {
                    op: Op::Confirm { .. },
                    ..
                } => r.unknown_at = *at,
                _ => {}
            }
        }
        r
    }

    /// When `row`'s current wait began at the latest: its fire time, or a
    /// later re-pend.
    fn due(&self, row: &TriggerRow) -> u64 {
        let by_human = self.by_id.get(&row.id).copied().unwrap_or(0);
        row.fire_at_ms.max(by_human).max(self.unknown_at)
    }
}

fn settled(row: &TriggerRow) -> bool {
    matches!(row.status.as_str(), "DONE" | "DEAD" | "FAILED")
}

/// D4 and D5.
pub(super) fn check(events: &[(u64, Event)], view: &FinalView, bounds: &Bounds, bad: &mut Vec<String>) {
    let repended = Repended::of(events);
    let mut emitted: BTreeMap<&str, u64> = BTreeMap::new();
    let mut emitted_at: BTreeMap<&str, u64> = BTreeMap::new();
    let mut first_start: BTreeMap<&str, u64> = BTreeMap::new();
    for (at, event) in events {
        match event {
            Event::Acked {
                op: Op::Emit { key, .. },
                reply,
                ..
            } => {
                let fire_at = reply["fire_at_ms"].as_u64().unwrap_or(*at);
                emitted.insert(key, fire_at);
                emitted_at.entry(key).or_insert(*at);
            }
            Event::TurnStarted { work, .. } => {
                first_start.entry(work).or_insert(*at);
            }
            _ => {}
        }
    }
    for (key, fire_at) in &emitted {
        let Some(row) = view.triggers.get(*key) else {
            bad.push(format!(
                "D1: trigger {key}: emit acknowledged but the row is gone (lost)"
            ));
            continue;
        };
        if !settled(row) && repended.due(row).saturating_add(bounds.settle_ms) <= view.end_ms {
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
            bad.push(format!(
                "D1: trigger key {key} has {n} rows (runs {n} times): its dedup key did not hold"
            ));
        }
    }
    first_buckets(events, view, bounds, bad);
    aimed(view, bounds, &repended, bad);
    check_backoff(events, bounds, bad);
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
}

/// D5 for a new schedule: it is due when added, so some bucket of it
/// from the add's request to `fire_bound_ms` after its answer has a
/// trigger row — unless the daemon was down meanwhile, the run ended
/// first, or another request on the id came within the bound. (A
/// schedule deleted and added again with a longer period once read the
/// old one's higher bucket numbers as its own, and stayed silent.)
fn first_buckets(events: &[(u64, Event)], view: &FinalView, bounds: &Bounds, bad: &mut Vec<String>) {
    let mut requests: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (at, event) in events {
        if let Event::Sent {
            op: Op::AddSchedule { id, .. } | Op::DeleteSchedule { id },
            ..
        } = event
        {
            requests.entry(id).or_default().push(*at);
        }
    }
    for (at, event) in events {
        let Event::Acked {
            op: Op::AddSchedule { id, period_ms, .. },
            ..
        } = event
        else {
            continue;
        };
        // The request this answer is for: the last one sent before it.
        let sent = requests
            .get(id.as_str())
            .and_then(|r| r.iter().rev().find(|t| **t <= *at).copied());
        let (Some(sent), true) = (sent, *period_ms > 0) else {
            continue;
        };
        let bound = at.saturating_add(bounds.fire_bound_ms);
        let changed = requests
            .get(id.as_str())
            .is_some_and(|r| r.iter().any(|t| *t > *at && *t <= bound));
        if view.end_ms <= bound || changed || bounds.down_between(sent, bound) {
            continue;
        }
        let first =
            (sent / period_ms..=bound / period_ms).find(|b| view.buckets.contains_key(&(id.clone(), *b)));
        // Due when added: a fire time at the bucket's start would have the
        // claim tell the agent its first firing is late (a catch-up note
        // for a restart or backlog that never happened).
        let due_early = first
            .and_then(|b| view.triggers.get(&format!("scheduled:{id}:{b}")))
            .filter(|row| row.fire_at_ms < sent);
        if let Some(row) = due_early {
            bad.push(format!(
                "D5: schedule {id} added at {at} ms: its first bucket's trigger is due at {} ms, before the add \
                 (its firing is told it is late)",
                row.fire_at_ms
            ));
        }
        if first.is_none() {
            bad.push(format!(
                "D5: schedule {id} (every {period_ms} ms) added at {at} ms fired none of its buckets {}..={} \
                 by {bound} ms (the daemon up): a new schedule is due when added",
                sent / period_ms,
                bound / period_ms
            ));
        }
    }
}

/// D4 for the one-time triggers an aimed crash killed mid-turn: the row
/// is there, settles after the crash, and the work completed exactly once
/// if DONE (at most once whatever the status).
fn aimed(view: &FinalView, bounds: &Bounds, repended: &Repended, bad: &mut Vec<String>) {
    for (killed_ms, hit) in &bounds.aimed {
        let key = hit.work.strip_prefix("trigger:").unwrap_or(&hit.work);
        let what = format!(
            "trigger {key} (agent {}), in flight at the crash at {killed_ms} ms ({:?})",
            hit.agent, hit.phase
        );
        let Some(row) = view.triggers.get(key) else {
            bad.push(format!("D4: {what}: its row is gone"));
            continue;
        };
        let since = repended.due(row).max(*killed_ms);
        if !settled(row) && since.saturating_add(bounds.settle_ms) <= view.end_ms {
            bad.push(format!(
                "D4: {what}: still {} at {} ms after {} attempts (never settled)",
                row.status, view.end_ms, row.attempts
            ));
        }
        let completions = view
            .completions
            .get(&(hit.agent.clone(), hit.work.clone()))
            .copied()
            .unwrap_or(0);
        if completions > 1 || (row.status == "DONE" && completions != 1) {
            bad.push(format!(
                "D4: {what}: {} with its work completed {completions} times (exactly once expected)",
                row.status
            ));
        }
    }
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
