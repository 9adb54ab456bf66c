//! The daemon oracle: the guarantees the kill soaks check, checked against
//! what the clients were told (the [`super::Recorder`] trace: `Acked` is a
//! 200) and what one more recovery finds on the disk at the end
//! ([`FinalView`]), plus timing only simulated time can check.
//!
//! - **D1 acknowledged ops present**: an agent whose creation was acked is
//!   alive (unless a delete of it was sent); an acked message is pending
//!   or delivered at its recipient, never both, never twice — and if
//!   delivered, a completed turn of the recipient read it (its payload is
//!   in that turn's prompt: a message counts as delivered only with the
//!   turn that read it); a recipient's messages are delivered in enqueue
//!   order — none before a message enqueued earlier to it, unless that
//!   one's wake-up was given up (DEAD or FAILED, at the end or when a
//!   human re-pended it): a wake-up that cannot run holds no later message
//!   back (`src/system/wake.rs`); an acked emit's trigger row exists, one row per
//!   dedup key, and a later acked emit of the same key is answered
//!   `duplicate`; a schedule id's last acked add or delete holds (an acked
//!   add is defined, an acked delete's is not), unless a later request on
//!   the id went unanswered.
//! - **D2 no duplicate irreversible effect**: no idempotency key reaches
//!   the world twice.
//! - **D3 each turn exactly once**: a work (`api:{id}`, `trigger:{key}`)
//!   runs to completion at most once across every crash and retry — in
//!   the trace, and in its agent's log (`turn.complete` once per work) —
//!   and never has two turns at once (a second holder: a lease taken over
//!   while its holder still runs); an acked turn's outcome is durable;
//!   once acked, every later ack of the same work id answers
//!   `already_done`.
//! - **D4 triggers settle**, **D5 timing**: see [`triggers`].
//! - **Invariants**: `Runtime::check_invariants`, the on-disk
//!   `recovery::check_invariants` and the fuzzer's log check are clean.
//!
//! Invariant: pure; reads its inputs only.

mod triggers;

use std::collections::{BTreeMap, BTreeSet};

use super::{AimedAt, Event, Op};

/// One live agent after the final recovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentMessages {
    pub parent: Option<String>,
    pub pending: Vec<String>,
    pub delivered: BTreeSet<String>,
    /// The prompts of its completed turns (the messages they read are
    /// quoted in them).
    pub prompts: Vec<String>,
    /// Its messages in enqueue order (its log's `message.enqueued`).
    pub enqueued: Vec<String>,
    /// Its deliveries in log order, each the messages one entry delivered
    /// (a `turn.complete`'s, or a `message.delivered`'s).
    pub deliveries: Vec<Vec<String>>,
}

/// One trigger row after the final recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerRow {
    pub id: String,
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
    /// Trigger rows by the dedup key their producer gave them (the last
    /// row, if a broken store kept several).
    pub triggers: BTreeMap<String, TriggerRow>,
    /// Activity-ledger status by idempotency key.
    pub ledger: BTreeMap<String, String>,
    /// World deliveries per idempotency key.
    pub deliveries: BTreeMap<String, usize>,
    /// (agent, work) pairs whose outcome is durable.
    pub completed: BTreeSet<(String, String)>,
    /// `turn.complete` entries per (agent, work) in the agents' logs.
    pub completions: BTreeMap<(String, String), u32>,
    /// Schedule ids defined.
    pub schedules: BTreeSet<String>,
    /// Trigger rows per (schedule, bucket), from their payloads.
    pub buckets: BTreeMap<(String, u64), usize>,
    /// Trigger rows per producer's dedup key (the store keeps one).
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
    /// One-time triggers' turns an aimed crash killed, with when.
    pub aimed: Vec<(u64, AimedAt)>,
}

impl Bounds {
    fn down_between(&self, from: u64, to: u64) -> bool {
        self.down.iter().any(|(a, b)| *a <= to && *b >= from)
    }
}

/// Every violation found (empty: the run kept every guarantee).
pub fn check(events: &[(u64, Event)], view: &FinalView, bounds: &Bounds) -> Vec<String> {
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
    acknowledged(events, view, &mut bad);
    schedules_defined(events, view, &mut bad);
    ran_once(events, view, &mut bad);
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
    delivery_order(events, view, &mut bad);
    triggers::check(events, view, bounds, &mut bad);
    bad
}

/// D1 order: no message is delivered before one enqueued earlier to the
/// same recipient (in an earlier delivery, or while that one is still
/// pending), unless the earlier one's wake-up was given up at some point:
/// DEAD or FAILED at the end, or re-pended by a human (a retry of its row,
/// a confirmation of a key of its turn) — a given-up wake-up holds no
/// later message back, by design.
fn delivery_order(events: &[(u64, Event)], view: &FinalView, bad: &mut Vec<String>) {
    let mut repended_rows = BTreeSet::new();
    let mut confirmed_keys = Vec::new();
    for (_, e) in events {
        match e {
            Event::Sent {
                op: Op::RetryTrigger { id, .. },
                ..
            } => {
                repended_rows.insert(id.as_str());
            }
            Event::Sent {
                op: Op::Confirm { key, .. },
                ..
            } => confirmed_keys.push(key.as_str()),
            _ => {}
        }
    }
    let given_up = |message: &str| {
        let work = format!("trigger:wake:{message}-");
        let row = view.triggers.get(&format!("wake:{message}"));
        row.is_some_and(|r| {
            matches!(r.status.as_str(), "DEAD" | "FAILED") || repended_rows.contains(r.id.as_str())
        }) || confirmed_keys.iter().any(|k| k.starts_with(&work))
    };
    for (name, a) in &view.agents {
        // Each message's first delivery (an index into `deliveries`).
        let mut first: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, batch) in a.deliveries.iter().enumerate() {
            for id in batch {
                first.entry(id).or_insert(i);
            }
        }
        for (k, later) in a.enqueued.iter().enumerate() {
            let Some(&at) = first.get(later.as_str()) else {
                continue;
            };
            let ahead = a.enqueued[..k]
                .iter()
                .find(|earlier| first.get(earlier.as_str()).is_none_or(|e| *e > at) && !given_up(earlier));
            if let Some(earlier) = ahead {
                let when = match first.get(earlier.as_str()) {
                    Some(e) => format!("delivered only later (delivery {e})"),
                    None => "still pending".to_string(),
                };
                bad.push(format!(
                    "D1: agent {name}: message {later} was delivered (delivery {at}) ahead of {earlier}, \
                     enqueued before it and {when}: reordered"
                ));
            }
        }
    }
}

/// D1 for schedules: each id's last answered add or delete holds at the
/// end, unless a later request on it went unanswered (its outcome is
/// unknown). One client adds, changes and deletes an id, one request at
/// a time, so the trace orders them.
fn schedules_defined(events: &[(u64, Event)], view: &FinalView, bad: &mut Vec<String>) {
    let mut last: BTreeMap<&str, Option<(u64, bool)>> = BTreeMap::new();
    for (at, event) in events {
        match event {
            Event::Acked { op, .. } => match op {
                Op::AddSchedule { id, .. } => {
                    last.insert(id, Some((*at, true)));
                }
                Op::DeleteSchedule { id } => {
                    last.insert(id, Some((*at, false)));
                }
                _ => {}
            },
            Event::Lost {
                op: Op::AddSchedule { id, .. } | Op::DeleteSchedule { id },
                ..
            } => {
                last.insert(id, None);
            }
            _ => {}
        }
    }
    for (id, answered) in last {
        match answered {
            Some((at, true)) if !view.schedules.contains(id) => {
                bad.push(format!("D1: schedule {id} added (acked at {at} ms) is gone"));
            }
            Some((at, false)) if view.schedules.contains(id) => {
                bad.push(format!("D1: schedule {id} deleted (acked at {at} ms) is back"));
            }
            _ => {}
        }
    }
}

/// D1 for every acked op, and D3 for acked turns.
fn acknowledged(events: &[(u64, Event)], view: &FinalView, bad: &mut Vec<String>) {
    let sent = |f: fn(&Op) -> Option<&str>| -> BTreeSet<&str> {
        events
            .iter()
            .filter_map(|(_, e)| match e {
                Event::Sent { op, .. } => f(op),
                _ => None,
            })
            .collect()
    };
    let maybe_deleted = sent(|op| match op {
        Op::DeleteAgent { name } => Some(name),
        _ => None,
    });
    let mut acked_works: BTreeMap<(&str, String), u64> = BTreeMap::new();
    let mut acked_keys: BTreeMap<&str, u64> = BTreeMap::new();
    for (at, event) in events {
        let Event::Acked { op, reply, .. } = event else {
            continue;
        };
        match op {
            Op::CreateAgent { name, .. }
                if !maybe_deleted.contains(name.as_str()) && !view.agents.contains_key(name) =>
            {
                bad.push(format!("D1: agent {name} created (acked at {at} ms) is gone"));
            }
            Op::Message { from, to, payload } => {
                let id = reply["message_id"].as_str().unwrap_or_default();
                match view.agents.get(to) {
                    None => bad.push(format!("D1: message {id} ({from} -> {to}): recipient gone")),
                    Some(a) if a.delivered.contains(id) => {
                        if !a.prompts.iter().any(|p| p.contains(payload.as_str())) {
                            bad.push(format!(
                                "D1: message {id} ({from} -> {to}) acknowledged at {at} ms is delivered, but no \
                                 completed turn of {to} read it: lost with the turn that collected it"
                            ));
                        }
                    }
                    Some(a) if !a.pending.iter().any(|p| p == id) => bad.push(format!(
                        "D1: message {id} ({from} -> {to}) acknowledged at {at} ms is lost: neither pending nor delivered"
                    )),
                    Some(_) => {}
                }
            }
            Op::Emit { key, .. } => {
                let duplicate = reply["duplicate"].as_bool().unwrap_or(false);
                match acked_keys.get(key.as_str()) {
                    Some(first) if !duplicate => bad.push(format!(
                        "D1: trigger {key} emitted again at {at} ms (first acked at {first} ms) was inserted \
                         again, not answered `duplicate`: its dedup key did not hold"
                    )),
                    Some(_) => {}
                    None => {
                        acked_keys.insert(key, *at);
                    }
                }
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
        }
    }
}

/// D3: each work runs to completion at most once — in the trace and in
/// its agent's log — and never has two turns at once in one boot.
fn ran_once(events: &[(u64, Event)], view: &FinalView, bad: &mut Vec<String>) {
    let mut ran: BTreeMap<(&str, &str), Vec<u64>> = BTreeMap::new();
    // Turns in flight in this boot: (agent, work) -> start.
    let mut running: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for (at, e) in events {
        match e {
            // The turns of a process that died die with it.
            Event::Booted { .. } => running.clear(),
            Event::TurnStarted { agent, work } => {
                if let Some(since) = running.insert((agent, work), *at) {
                    bad.push(format!(
                        "D3: {work} of {agent} started at {at} ms while its turn started at {since} ms \
                         was still running: two holders (a lease taken over from a live turn)"
                    ));
                }
            }
            Event::TurnEnded {
                agent,
                work,
                ran: completed,
                ..
            } => {
                running.remove(&(agent.as_str(), work.as_str()));
                if *completed {
                    ran.entry((agent, work)).or_default().push(*at);
                }
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
    for ((agent, work), n) in &view.completions {
        if *n > 1 {
            bad.push(format!(
                "D3: {work} of {agent} completed {n} times in its log (durable {n} times)"
            ));
        }
    }
}

/// The checks no canary of the daemon can reach (a second holder needs a
/// lease taken over, which the one-writer daemon never does), shown
/// failing on a hand-made trace, and passing on its repaired twin.
#[cfg(test)]
mod tests {
    use super::*;
    use durable_agent::store::triggers::TriggerPolicy;

    fn bounds() -> Bounds {
        Bounds {
            settle_ms: 180_000,
            fire_bound_ms: 61_000,
            down: Vec::new(),
            policy: TriggerPolicy::default(),
            aimed: Vec::new(),
        }
    }

    fn started(at: u64) -> (u64, Event) {
        let (agent, work) = ("w0".to_string(), "trigger:c0e1".to_string());
        (at, Event::TurnStarted { agent, work })
    }

    fn ended(at: u64) -> (u64, Event) {
        let (agent, work) = ("w0".to_string(), "trigger:c0e1".to_string());
        (
            at,
            Event::TurnEnded {
                agent,
                work,
                ran: false,
                error: None,
            },
        )
    }

    #[test]
    fn a_work_started_while_its_turn_runs_has_two_holders() {
        let view = FinalView::default();
        let events = [(0, Event::Booted { boot: 0 }), started(10), started(20)];
        let bad = check(&events, &view, &bounds());
        assert!(bad.iter().any(|v| v.contains("two holders")), "{bad:?}");
        // Ended before the second start, or cut by a crash: one holder.
        for events in [
            vec![started(10), ended(15), started(20)],
            vec![started(10), (15, Event::Booted { boot: 1 }), started(20)],
        ] {
            assert_eq!(check(&events, &view, &bounds()), Vec::<String>::new());
        }
    }

    /// w0 got m1 then m2; m2 was delivered while m1 was still pending.
    fn reordered() -> FinalView {
        let mut view = FinalView::default();
        let agent = AgentMessages {
            pending: vec!["m1".into()],
            delivered: ["m2".to_string()].into(),
            enqueued: vec!["m1".into(), "m2".into()],
            deliveries: vec![vec!["m2".into()]],
            prompts: vec!["Message m2".into()],
            ..AgentMessages::default()
        };
        view.agents.insert("w0".into(), agent);
        view
    }

    fn wake_row(status: &str) -> TriggerRow {
        TriggerRow {
            id: "trg-1".into(),
            status: status.into(),
            fire_at_ms: 0,
            attempts: 1,
            agent: Some("w0".into()),
            work: "trigger:wake:m1".into(),
        }
    }

    #[test]
    fn a_message_delivered_ahead_of_an_earlier_one_is_reported() {
        let mut view = reordered();
        let bad = check(&[], &view, &bounds());
        assert!(bad.iter().any(|v| v.contains("ahead of m1")), "{bad:?}");
        // The earlier one's wake-up backing off holds it back all the same.
        view.triggers.insert("wake:m1".into(), wake_row("PENDING"));
        let bad = check(&[], &view, &bounds());
        assert!(bad.iter().any(|v| v.contains("ahead of m1")), "{bad:?}");
        // Delivered later: reordered too.
        let a = view.agents.get_mut("w0").expect("w0");
        a.pending.clear();
        a.deliveries.push(vec!["m1".into()]);
        let bad = check(&[], &view, &bounds());
        assert!(bad.iter().any(|v| v.contains("delivered only later")), "{bad:?}");
        // In one delivery, or in order: fine.
        let a = view.agents.get_mut("w0").expect("w0");
        a.deliveries = vec![vec!["m1".into(), "m2".into()]];
        assert_eq!(check(&[], &view, &bounds()), Vec::<String>::new());
    }

    #[test]
    fn a_message_may_pass_an_earlier_one_whose_wake_up_was_given_up() {
        let mut view = reordered();
        view.triggers.insert("wake:m1".into(), wake_row("DEAD"));
        assert_eq!(check(&[], &view, &bounds()), Vec::<String>::new());
        // Given up, then retried by a human: it was given up meanwhile.
        view.triggers.insert("wake:m1".into(), wake_row("DONE"));
        let retry = Op::RetryTrigger {
            id: "trg-1".into(),
            status: "DEAD".into(),
        };
        let events = [(5, Event::Sent { client: 0, op: retry })];
        let bad = check(&events, &view, &bounds());
        assert!(bad.iter().all(|v| !v.contains("reordered")), "{bad:?}");
    }

    #[test]
    fn a_work_completed_twice_in_its_log_is_reported() {
        let mut view = FinalView::default();
        let key = ("w0".to_string(), "trigger:c0e1".to_string());
        view.completions.insert(key.clone(), 2);
        let bad = check(&[], &view, &bounds());
        assert!(
            bad.iter().any(|v| v.contains("completed 2 times in its log")),
            "{bad:?}"
        );
        view.completions.insert(key, 1);
        assert_eq!(check(&[], &view, &bounds()), Vec::<String>::new());
    }
}
