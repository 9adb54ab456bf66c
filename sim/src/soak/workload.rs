//! The soak's workload: seeded random API operations against the daemon,
//! and the ledger of what each one's answer was.
//!
//! Invariant: every choice comes from the soak's seed (the next op depends
//! only on the seed and the answers so far); an op's outcome is exactly
//! what the API said — [`Outcome::Acked`] only for a 2xx answer,
//! [`Outcome::Refused`] for a 4xx (nothing happened), and
//! [`Outcome::Unknown`] for anything else (the process died or failed
//! mid-request: the op may or may not have happened). The prompt of every
//! turn and trigger carries a unique marker (`[soak:t12]`) and names the
//! tool it wants, so each effect at the sink names the logical action it
//! belongs to.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

/// The irreversible tool (non-deduplicating sink path `/send`).
pub const IRREVERSIBLE_TOOL: &str = "send_email";
/// The reversible tool (sink path `/note`): re-running it is allowed.
pub const REVERSIBLE_TOOL: &str = "note";

/// Bounds on the workload (each restart replays every log, so the root's
/// size is the soak's speed).
const MAX_LIVE_AGENTS: usize = 10;
const MAX_SCHEDULES: usize = 2;
/// An agent takes no more API turns past this (its history is in every
/// provider request).
const MAX_TURNS_PER_AGENT: u32 = 25;

/// One API operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    CreateAgent {
        name: String,
        parent: Option<String>,
    },
    DeleteAgent {
        name: String,
    },
    Turn {
        agent: String,
        marker: String,
        tool: &'static str,
        work_id: String,
    },
    Message {
        from: String,
        to: String,
        payload: String,
    },
    Emit {
        key: String,
        agent: String,
        marker: String,
        tool: &'static str,
        delay_ms: u64,
    },
    AddSchedule {
        id: String,
        agent: String,
        marker: String,
        tool: &'static str,
        period_ms: u64,
    },
    DeleteSchedule {
        id: String,
    },
}

impl Op {
    /// The prompt a turn, trigger or schedule sends.
    pub fn prompt(marker: &str, tool: &str) -> String {
        format!("{marker} please use {tool}")
    }

    /// `(method, path, body)`.
    pub fn request(&self) -> (&'static str, String, Option<Value>) {
        use durable_agent_cli::api::encode;
        match self {
            Op::CreateAgent { name, parent } => (
                "POST",
                "/agents".into(),
                Some(json!({"name": name, "instructions": "soak agent", "parent": parent})),
            ),
            Op::DeleteAgent { name } => ("DELETE", format!("/agents/{}", encode(name)), None),
            Op::Turn {
                agent,
                marker,
                tool,
                work_id,
            } => (
                "POST",
                format!("/agents/{}/turn", encode(agent)),
                Some(json!({"prompt": Op::prompt(marker, tool), "work_id": work_id})),
            ),
            Op::Message { from, to, payload } => (
                "POST",
                "/messages".into(),
                Some(json!({"from": from, "to": to, "payload": payload})),
            ),
            Op::Emit {
                key,
                agent,
                marker,
                tool,
                delay_ms,
            } => (
                "POST",
                "/triggers".into(),
                Some(
                    json!({"dedup_key": key, "agent": agent, "prompt": Op::prompt(marker, tool), "delay_ms": delay_ms}),
                ),
            ),
            Op::AddSchedule {
                id,
                agent,
                marker,
                tool,
                period_ms,
            } => (
                "POST",
                "/schedules".into(),
                Some(
                    json!({"id": id, "agent": agent, "prompt": Op::prompt(marker, tool), "period_ms": period_ms}),
                ),
            ),
            Op::DeleteSchedule { id } => ("DELETE", format!("/schedules/{}", encode(id)), None),
        }
    }

    /// An API turn (runs the model and its tools while the request waits).
    pub fn runs_a_turn(&self) -> bool {
        matches!(self, Op::Turn { .. })
    }
}

/// What the API answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Acked(Value),
    Refused { status: u16, message: String },
    Unknown(String),
}

/// One op and its outcome, in issue order.
#[derive(Debug, Clone)]
pub struct Record {
    pub op: Op,
    pub outcome: Outcome,
    /// Crash epoch it was issued in (for the report).
    pub epoch: u64,
}

/// The seeded op generator and the ledger of answers.
#[derive(Debug)]
pub struct Workload {
    rng: ChaCha8Rng,
    next_id: u64,
    pub ledger: Vec<Record>,
    /// Agents the last `/status` showed: an agent whose creation's answer
    /// was lost is targeted only once seen (else every op on it is a 404).
    seen: std::collections::BTreeSet<String>,
}

impl Workload {
    pub fn new(seed: u64) -> Workload {
        Workload {
            rng: ChaCha8Rng::seed_from_u64(seed),
            next_id: 0,
            ledger: Vec::new(),
            seen: std::collections::BTreeSet::new(),
        }
    }

    fn fresh(&mut self, kind: char) -> String {
        self.next_id += 1;
        format!("{kind}{}", self.next_id)
    }

    /// What the last `/status` after a restart showed (see `seen`).
    pub fn observe(&mut self, agents: impl IntoIterator<Item = String>) {
        self.seen = agents.into_iter().collect();
    }

    /// Agents that may be live: created (acknowledged, or with a lost
    /// answer and seen since) and not deleted with an ack.
    pub fn maybe_live_agents(&self) -> Vec<String> {
        let mut live: BTreeMap<String, bool> = BTreeMap::new();
        for r in &self.ledger {
            match (&r.op, &r.outcome) {
                (Op::CreateAgent { name, .. }, Outcome::Acked(_)) => {
                    live.insert(name.clone(), true);
                }
                (Op::CreateAgent { name, .. }, Outcome::Unknown(_)) if self.seen.contains(name) => {
                    live.insert(name.clone(), true);
                }
                (Op::DeleteAgent { name }, Outcome::Acked(_)) => {
                    live.remove(name);
                }
                _ => {}
            }
        }
        live.into_keys().collect()
    }

    fn maybe_live_schedules(&self) -> Vec<String> {
        let mut live = std::collections::BTreeSet::new();
        for r in &self.ledger {
            match (&r.op, &r.outcome) {
                (Op::AddSchedule { id, .. }, Outcome::Acked(_) | Outcome::Unknown(_)) => {
                    live.insert(id.clone());
                }
                (Op::DeleteSchedule { id }, Outcome::Acked(_)) => {
                    live.remove(id);
                }
                _ => {}
            }
        }
        live.into_iter().collect()
    }

    fn turns_on(&self, agent: &str) -> u32 {
        let n = self
            .ledger
            .iter()
            .filter(|r| matches!(&r.op, Op::Turn { agent: a, .. } if a == agent))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn has_children(&self, agent: &str) -> bool {
        let live = self.maybe_live_agents();
        self.ledger.iter().any(|r| {
            matches!(&r.op, Op::CreateAgent { name, parent: Some(p) } if p == agent && live.contains(name))
        })
    }

    fn tool(&mut self) -> &'static str {
        if self.rng.random_bool(0.5) {
            IRREVERSIBLE_TOOL
        } else {
            REVERSIBLE_TOOL
        }
    }

    fn pick(&mut self, from: &[String]) -> String {
        from[self.rng.random_range(0..from.len())].clone()
    }

    /// The next op. `want_turn`: the kill plan wants a turn in flight.
    pub fn next_op(&mut self, want_turn: bool) -> Op {
        let live = self.maybe_live_agents();
        let turnable: Vec<String> = live
            .iter()
            .filter(|a| self.turns_on(a) < MAX_TURNS_PER_AGENT)
            .cloned()
            .collect();
        if turnable.is_empty() || (live.len() < 2 && !want_turn) {
            return self.create_agent(&live);
        }
        let roll = if want_turn {
            0
        } else {
            self.rng.random_range(0..100)
        };
        match roll {
            0..=39 => {
                let agent = self.pick(&turnable);
                let marker = format!("[soak:{}]", self.fresh('t'));
                let tool = self.tool();
                let work_id = marker.trim_matches(|c| c == '[' || c == ']').replace(':', "-");
                Op::Turn {
                    agent,
                    marker,
                    tool,
                    work_id,
                }
            }
            40..=54 => {
                let from = self.pick(&live);
                let to = self.pick(&live);
                let payload = format!("[soak:{}] hello", self.fresh('m'));
                Op::Message { from, to, payload }
            }
            55..=74 => {
                let agent = self.pick(&turnable);
                let key = self.fresh('e');
                let marker = format!("[soak:{key}]");
                let tool = self.tool();
                let delay_ms = self.rng.random_range(0..1_500);
                Op::Emit {
                    key,
                    agent,
                    marker,
                    tool,
                    delay_ms,
                }
            }
            75..=86 => self.create_agent(&live),
            87..=90 => {
                let leaves: Vec<String> = live.iter().filter(|a| !self.has_children(a)).cloned().collect();
                if leaves.len() < 3 {
                    return self.create_agent(&live);
                }
                Op::DeleteAgent {
                    name: self.pick(&leaves),
                }
            }
            91..=95 => {
                let schedules = self.maybe_live_schedules();
                if schedules.len() >= MAX_SCHEDULES {
                    let id = self.pick(&schedules);
                    return Op::DeleteSchedule { id };
                }
                let id = self.fresh('s');
                let marker = format!("[soak:{id}]");
                let agent = self.pick(&turnable);
                let tool = self.tool();
                let period_ms = self.rng.random_range(400..2_000);
                Op::AddSchedule {
                    id,
                    agent,
                    marker,
                    tool,
                    period_ms,
                }
            }
            _ => match self.maybe_live_schedules().as_slice() {
                [] => self.create_agent(&live),
                some => {
                    let id = some[self.rng.random_range(0..some.len())].clone();
                    Op::DeleteSchedule { id }
                }
            },
        }
    }

    fn create_agent(&mut self, live: &[String]) -> Op {
        let name = self.fresh('a');
        if live.len() >= MAX_LIVE_AGENTS {
            // Full: a root agent would grow the tree past the bound; make
            // room instead by retiring a leaf (refused if it has children).
            let victim = self.pick(live);
            return Op::DeleteAgent { name: victim };
        }
        let parent = if !live.is_empty() && self.rng.random_bool(0.5) {
            Some(self.pick(live))
        } else {
            None
        };
        Op::CreateAgent { name, parent }
    }

    /// Seeded draws for the driver (kill plans, probes).
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    pub fn record(&mut self, op: Op, outcome: Outcome, epoch: u64) {
        self.ledger.push(Record { op, outcome, epoch });
    }

    /// Turns whose answer was lost: re-asked after the restart with the
    /// same work id (the API's exactly-once retry).
    pub fn unknown_turns(&self) -> Vec<usize> {
        self.ledger
            .iter()
            .enumerate()
            .filter(|(_, r)| r.op.runs_a_turn() && matches!(r.outcome, Outcome::Unknown(_)))
            .map(|(i, _)| i)
            .collect()
    }
}

/// The API's answer as an [`Outcome`].
pub fn outcome(result: Result<Value, durable_agent_cli::api::ClientError>) -> Outcome {
    use durable_agent_cli::api::ClientError;
    match result {
        Ok(v) => Outcome::Acked(v),
        Err(ClientError::Api { status, message, .. }) if (400..500).contains(&status) => {
            Outcome::Refused { status, message }
        }
        Err(e) => Outcome::Unknown(e.to_string()),
    }
}

/// The logical action a sink delivery belongs to: the last turn, trigger
/// or schedule marker in its body (the turn's own prompt comes after any
/// delivered messages), and for a schedule its bucket (the idempotency
/// key names it), since every bucket runs the same prompt. Rewording never
/// hides it: the mock keeps the prompt inside every reworded argument.
/// An extra call a rewording model added to its reply (`[extra call N]`
/// in its arguments) is an action of its own (`…#extra{N}`): the model
/// asked for one more effect, which is not a re-send of the first.
pub fn logical_action(body: &str, idem_key: Option<&str>) -> Option<String> {
    let action = turn_action(body, idem_key)?;
    let extra = body
        .find(EXTRA_CALL)
        .and_then(|i| body[i + EXTRA_CALL.len()..].split(']').next())
        .and_then(|n| n.parse::<u32>().ok());
    Some(match extra {
        Some(n) => format!("{action}#extra{n}"),
        None => action,
    })
}

/// How the rewording mock marks an extra call's arguments.
const EXTRA_CALL: &str = "[extra call ";

/// The marker of a logical action (`[soak:t7]` of `[soak:t7]#extra1`, of
/// `[soak:s4]@s4:2891`).
pub fn action_marker(action: &str) -> &str {
    action.split(['@', '#']).next().unwrap_or(action)
}

fn turn_action(body: &str, idem_key: Option<&str>) -> Option<String> {
    let marker = body
        .match_indices("[soak:")
        .filter_map(|(i, _)| {
            let rest = &body[i..];
            let end = rest.find(']')?;
            let m = &rest[..=end];
            matches!(m.as_bytes().get(6), Some(b't' | b'e' | b's')).then_some(m)
        })
        .last()?;
    if marker.as_bytes().get(6) == Some(&b's') {
        // trigger:scheduled:{id}:{bucket}-r0-c0-...: the bucket, not the call.
        let bucket = idem_key
            .and_then(|k| k.strip_prefix("trigger:scheduled:"))
            .and_then(|k| k.split('-').next())
            .unwrap_or("?");
        return Some(format!("{marker}@{bucket}"));
    }
    Some(marker.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_ops() {
        let ops = |seed| {
            let mut w = Workload::new(seed);
            (0..200)
                .map(|_| {
                    let op = w.next_op(false);
                    w.record(op.clone(), Outcome::Acked(Value::Null), 0);
                    op
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(ops(5), ops(5));
        assert_ne!(ops(5), ops(6));
    }

    #[test]
    fn logical_action_is_the_last_turn_marker_and_the_schedule_bucket() {
        let body =
            r#"{"to":"Messages for you:\n- from a1: [soak:m3] hello\n\n[soak:t7] please use send_email"}"#;
        assert_eq!(logical_action(body, None).as_deref(), Some("[soak:t7]"));
        let tick = r#"{"to":"[soak:s4] please use note\n\n[overdue: ...]"}"#;
        assert_eq!(
            logical_action(tick, Some("trigger:scheduled:s4:2891-r0-c0-ab")).as_deref(),
            Some("[soak:s4]@s4:2891")
        );
        assert_eq!(logical_action("no marker", None), None);
        // Rewording keeps the action; an extra call is one of its own.
        let reworded = r#"{"to":"Quick note: [soak:t7] please use send_email [ask 12]"}"#;
        assert_eq!(logical_action(reworded, None).as_deref(), Some("[soak:t7]"));
        let extra = r#"{"to":"Hi! [soak:t7] please use note [ask 3] [extra call 1]"}"#;
        let action = logical_action(extra, None);
        assert_eq!(action.as_deref(), Some("[soak:t7]#extra1"));
        assert_eq!(action_marker("[soak:t7]#extra1"), "[soak:t7]");
        assert_eq!(action_marker("[soak:s4]@s4:2891"), "[soak:s4]");
    }
}
