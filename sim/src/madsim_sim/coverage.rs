//! What a run exercised, by name: every kind of acknowledged API operation
//! (refined where the answer or the op's branch matters — a confirmation
//! delivered, not delivered or abandoned, a retry of a DEAD or a FAILED
//! trigger, an emit answered `duplicate`, a turn answered `already_done`),
//! every way the node went down, and the daemon paths only a run reaches
//! (triggers, schedule buckets and wake-ups that ran, a turn lost to a
//! crash and asked again, a crash inside a one-time trigger's turn in each
//! [`TurnPhase`], a trigger acked after its lease expired).
//!
//! The fixed-seed gate asserts that the union over its seeds covers
//! [`REQUIRED`]; the clients steer toward the kinds a run has not
//! acknowledged yet (see `clients`), so that union does not hang on the
//! luck of one seed.
//!
//! Invariant: pure; a kind is counted only from what the trace shows
//! happened (an `Acked` answer, a crash record, a turn that ran).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{op_name, Event, Op, SimOutcome, TurnPhase};

/// Kinds every fixed-seed run set must cover.
pub const REQUIRED: &[&str] = &[
    "create_agent",
    "delete_agent",
    "turn",
    "turn already done",
    "turn asked again after a lost answer",
    "message",
    "emit",
    "emit duplicate",
    "add_schedule",
    "delete_schedule",
    "confirm delivered",
    "confirm not delivered",
    "confirm abandoned",
    "retry DEAD",
    "retry FAILED",
    "status",
    "gc",
    "crash ProcessCrash",
    "crash PowerLoss(Strict)",
    "crash PowerLoss(Eager)",
    "crash mid-I/O",
    "stop",
    "turn lost to a crash",
    "trigger ran",
    "schedule bucket ran",
    "wake-up ran",
    "crash in a trigger's turn: Started",
    "crash in a trigger's turn: CallOut",
    "crash in a trigger's turn: Persisting",
    "crash in a trigger's turn: Completing",
];

/// Acknowledged-op kinds the clients can steer toward, in the order they
/// try them.
pub const STEERABLE: &[&str] = &[
    "delete_agent",
    "delete_schedule",
    "retry DEAD",
    "retry FAILED",
    "confirm abandoned",
    "confirm delivered",
    "confirm not delivered",
    "emit duplicate",
    "turn already done",
    "gc",
];

/// The coverage kind of an acknowledged `op` answered with `reply`.
pub fn op_kind(op: &Op, reply: &Value) -> &'static str {
    match op {
        Op::Turn { .. } if reply.get("already_done").is_some() => "turn already done",
        Op::Emit { .. } if reply["duplicate"] == Value::Bool(true) => "emit duplicate",
        Op::Confirm { abandon: true, .. } => "confirm abandoned",
        Op::Confirm { delivered: true, .. } => "confirm delivered",
        Op::Confirm { .. } => "confirm not delivered",
        Op::RetryTrigger { status, .. } if status == "DEAD" => "retry DEAD",
        Op::RetryTrigger { .. } => "retry FAILED",
        op => op_name(op),
    }
}

/// The kind of a crash inside a one-time trigger's turn in `phase`.
pub fn aimed_kind(phase: TurnPhase) -> &'static str {
    match phase {
        TurnPhase::Started => "crash in a trigger's turn: Started",
        TurnPhase::CallOut => "crash in a trigger's turn: CallOut",
        TurnPhase::Persisting => "crash in a trigger's turn: Persisting",
        TurnPhase::Completing => "crash in a trigger's turn: Completing",
    }
}

/// How often each kind happened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage(pub BTreeMap<String, usize>);

impl Coverage {
    fn add(&mut self, kind: impl Into<String>) {
        *self.0.entry(kind.into()).or_insert(0) += 1;
    }

    /// How often `kind` happened.
    pub fn count(&self, kind: &str) -> usize {
        self.0.get(kind).copied().unwrap_or(0)
    }

    /// Add `other`'s counts to these.
    pub fn merge(&mut self, other: &Coverage) {
        for (k, n) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) += n;
        }
    }

    /// The kinds of `required` that never happened.
    pub fn missing<'a>(&self, required: &[&'a str]) -> Vec<&'a str> {
        required.iter().copied().filter(|k| self.count(k) == 0).collect()
    }

    /// What `out` exercised.
    pub fn of(out: &SimOutcome) -> Coverage {
        let mut c = Coverage::default();
        for crash in &out.crashes {
            match crash.mode {
                Some(mode) => c.add(format!("crash {mode:?}")),
                None => c.add("stop"),
            }
            if crash.point.is_some() {
                c.add("crash mid-I/O");
            }
            if let Some(aimed) = &crash.aimed {
                c.add(aimed_kind(aimed.phase));
            }
        }
        let mut lost_turns = BTreeSet::new();
        // Trigger turns in flight in this boot: work -> start.
        let mut running: BTreeMap<&str, u64> = BTreeMap::new();
        for (at, e) in &out.events {
            match e {
                Event::Booted { .. } => running.clear(),
                Event::Acked { op, reply, .. } => {
                    c.add(op_kind(op, reply));
                    if let Op::Turn { work_id, .. } = op {
                        if lost_turns.contains(work_id) {
                            c.add("turn asked again after a lost answer");
                        }
                    }
                }
                Event::Lost {
                    op: Op::Turn { work_id, .. },
                    ..
                } => {
                    c.add("turn lost to a crash");
                    lost_turns.insert(work_id.clone());
                }
                Event::TurnStarted { work, .. } if work.starts_with("trigger:") => {
                    running.insert(work, *at);
                }
                Event::TurnEnded { work, ran, error, .. } => {
                    if *ran {
                        match work.strip_prefix("trigger:") {
                            Some(k) if k.starts_with("scheduled:") => c.add("schedule bucket ran"),
                            Some(k) if k.starts_with("wake:") => c.add("wake-up ran"),
                            Some(_) => c.add("trigger ran"),
                            None => {}
                        }
                    }
                    // The trigger's claim is as old as its turn's start
                    // (or older, if it waited for its agent): acked with
                    // no error after more than a lease, it outlived it.
                    let started = running.remove(work.as_str());
                    if let Some(started) = started.filter(|_| error.is_none()) {
                        if at.saturating_sub(started) > out.plan.lease_ms {
                            c.add("trigger acked after its lease expired");
                        }
                    }
                }
                _ => {}
            }
        }
        c
    }
}
