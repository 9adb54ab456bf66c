//! The soak's checks — the oracle's guarantees, seen from outside the
//! process: after every restart through the API, on the sink's record of
//! effects at any time, and after each root's final clean stop on disk
//! through the library (the product's own boot, as the oracle opens a
//! root).
//!
//! Invariant: every check reads the ledger's promises ([`Expect`]) and an
//! observation, and reports each broken promise as one line naming the
//! guarantee, the op and what was seen; nothing here changes the root
//! except the library boot of the final check, which runs the same
//! recovery the binary runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use durable_agent::log::{Event, LogEntry};
use durable_agent::runtime::ConversationItem;
use durable_agent_cli::webhook_sink::Delivery;
use serde_json::Value;

use super::expect::{Expect, Presence};
use super::workload::{action_marker, logical_action, Op, Outcome, Workload};
use crate::model::{Agent, State, Status};
use crate::oracle;

/// How many promises a check verified.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    pub promises: u64,
}

/// A trigger as `/status` lists it.
#[derive(Debug, Clone)]
pub struct TriggerSeen {
    pub status: String,
    pub last_error: Option<String>,
}

/// The parts of `GET /status` the checks read.
#[derive(Debug, Clone, Default)]
pub struct StatusView {
    /// name -> (parent name, turns)
    pub agents: BTreeMap<String, (Option<String>, u64)>,
    pub triggers: BTreeMap<String, TriggerSeen>,
    pub schedules: BTreeSet<String>,
    pub needs_confirmation: Vec<String>,
}

impl StatusView {
    pub fn parse(status: &Value) -> StatusView {
        let mut v = StatusView::default();
        let empty = Vec::new();
        let agents = status["agents"].as_array().unwrap_or(&empty);
        let name_of: BTreeMap<&str, &str> = agents
            .iter()
            .filter_map(|a| Some((a["id"].as_str()?, a["name"].as_str()?)))
            .collect();
        for a in agents {
            let name = a["name"].as_str().unwrap_or("?").to_string();
            let parent = a["parent"]
                .as_str()
                .map(|p| name_of.get(p).map_or_else(|| format!("?{p}"), |n| n.to_string()));
            v.agents.insert(name, (parent, a["turns"].as_u64().unwrap_or(0)));
        }
        if let Some(map) = status["triggers"].as_object() {
            for (state, list) in map {
                for t in list.as_array().unwrap_or(&empty) {
                    let key = t["dedup_key"].as_str().unwrap_or("?");
                    // A RESUME key names its agent by id (`resume:{work}@{id}`),
                    // perhaps of an agent deleted since; the soak's work ids
                    // are unique across agents, so it keys them by work.
                    let key = match durable_agent::system::resume_key_parts(key) {
                        Some((work, _agent)) => format!("resume:{work}"),
                        None => key.to_string(),
                    };
                    let last_error = t["last_error"].as_str().map(str::to_string);
                    v.triggers.insert(
                        key,
                        TriggerSeen {
                            status: state.clone(),
                            last_error,
                        },
                    );
                }
            }
        }
        for s in status["schedules"].as_array().unwrap_or(&empty) {
            if let Some(id) = s["id"].as_str() {
                v.schedules.insert(id.to_string());
            }
        }
        for n in status["needs_confirmation"].as_array().unwrap_or(&empty) {
            if let Some(k) = n["idem_key"].as_str() {
                v.needs_confirmation.push(k.to_string());
            }
        }
        v
    }

    /// Every emitted trigger has settled: DONE, or FAILED/DEAD with a reason.
    pub fn unsettled(&self) -> Vec<String> {
        self.triggers
            .iter()
            .filter(|(_, t)| {
                !(t.status == "DONE"
                    || (t.last_error.is_some() && (t.status == "DEAD" || t.status == "FAILED")))
            })
            .map(|(k, t)| format!("{k} {}", t.status))
            .collect()
    }
}

/// After a restart: every acknowledged op is visible through the API, and
/// nothing the soak never asked for is.
pub fn after_restart(workload: &Workload, seen: &StatusView) -> (Checked, Vec<String>) {
    let e = Expect::of(workload);
    let mut checked = Checked::default();
    let mut out = Vec::new();
    for (name, a) in &e.agents {
        let got = seen.agents.get(name);
        match (a.presence, got) {
            (Presence::Must, None) => out.push(format!("acknowledged agent {name} is missing")),
            (Presence::MustNot, Some(_)) => out.push(format!(
                "agent {name} is back although its deletion was acknowledged"
            )),
            (Presence::Must, Some((parent, turns))) => {
                if parent != &a.parent {
                    out.push(format!(
                        "agent {name}: parent {:?} acknowledged, {parent:?} seen",
                        a.parent
                    ));
                }
                if *turns < a.acked_turns {
                    out.push(format!(
                        "agent {name}: {} turns acknowledged, {turns} recovered",
                        a.acked_turns
                    ));
                }
            }
            _ => {}
        }
        checked.promises += u64::from(a.presence != Presence::May);
    }
    for name in seen.agents.keys() {
        if !e.agents.contains_key(name) {
            out.push(format!("agent {name} exists but the soak never created it"));
        }
    }
    for (key, (_, presence)) in &e.triggers {
        if *presence == Presence::Must && !seen.triggers.contains_key(key) {
            out.push(format!("acknowledged trigger {key} is lost"));
        }
        checked.promises += u64::from(*presence == Presence::Must);
    }
    for key in seen.triggers.keys() {
        let scheduled = key
            .strip_prefix("scheduled:")
            .and_then(|k| k.split(':').next())
            .is_some_and(|id| e.schedules.contains_key(id));
        if !e.triggers.contains_key(key) && !scheduled {
            out.push(format!("trigger {key} exists but the soak never emitted it"));
        }
    }
    for (id, presence) in &e.schedules {
        match (presence, seen.schedules.contains(id)) {
            (Presence::Must, false) => out.push(format!("acknowledged schedule {id} is missing")),
            (Presence::MustNot, true) => out.push(format!(
                "schedule {id} is back although its deletion was acknowledged"
            )),
            _ => {}
        }
        checked.promises += u64::from(*presence != Presence::May);
    }
    (checked, out)
}

/// A refusal that contradicts an acknowledgement: "no live agent named X"
/// for an agent whose creation was acknowledged and never deleted.
pub fn refusal(workload: &Workload, op: &Op, outcome: &Outcome) -> Option<String> {
    let Outcome::Refused { status: 404, message } = outcome else {
        return None;
    };
    let e = Expect::of(workload);
    let names: Vec<&str> = match op {
        Op::Turn { agent, .. } | Op::Emit { agent, .. } | Op::AddSchedule { agent, .. } => vec![agent],
        Op::Message { from, to, .. } => vec![from, to],
        Op::DeleteAgent { name } => vec![name],
        Op::CreateAgent { parent, .. } => parent.iter().map(String::as_str).collect(),
        Op::DeleteSchedule { .. } => Vec::new(),
    };
    names
        .into_iter()
        .find(|n| e.must_live(n) && message.contains(&format!("{n:?}")))
        .map(|n| {
            format!("{op:?} was refused ({message}) although agent {n} was acknowledged and never deleted")
        })
}

/// I4 on the sink: no logical irreversible action delivered twice (nor one
/// idempotency key), and every effect belongs to a turn the soak asked for.
/// Counted per key AND per logical action because the mock rewords: a
/// re-send of one decision that a re-asked model worded differently has a
/// new key, but the same action (its turn's marker).
pub fn sink(deliveries: &[Delivery], issued: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_action: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut by_key: BTreeMap<&str, u32> = BTreeMap::new();
    for d in deliveries {
        let key = d.idempotency_key();
        let Some(action) = logical_action(&d.request.body, key) else {
            out.push(format!(
                "delivery {} ({}) names no soak turn: {}",
                d.id, d.request.path, d.request.body
            ));
            continue;
        };
        let marker = action_marker(&action);
        if !issued.contains(marker) {
            out.push(format!(
                "delivery {} belongs to {action}, which the soak never issued",
                d.id
            ));
        }
        if d.request.path != "/send" {
            continue; // reversible: re-running it is allowed
        }
        by_action
            .entry(action)
            .or_default()
            .push(format!("{} key={}", d.id, key.unwrap_or("-")));
        if let Some(k) = key {
            *by_key.entry(k).or_default() += 1;
        }
    }
    for (action, ids) in by_action {
        if ids.len() > 1 {
            out.push(format!(
                "I4 duplicate side effect: irreversible action {action} reached the non-deduplicating sink {} times ({})",
                ids.len(),
                ids.join(", ")
            ));
        }
    }
    for (key, n) in by_key {
        if n > 1 {
            out.push(format!(
                "I4 duplicate side effect: idempotency key {key} delivered {n} times"
            ));
        }
    }
    out
}

/// Every irreversible effect has a durable decision behind it: the key of
/// each delivery to `/send` is the idempotency key of a call some
/// `round.decided` entry of the root's logs holds (the runtime logs the
/// model's whole decision for a round, with its keys, before any call of
/// it starts; logs are append-only and a terminated agent's stays). Lines
/// that do not parse are I3's to report. Returns the deliveries checked.
pub fn decided_effects(
    logs: &BTreeMap<std::path::PathBuf, Vec<u8>>,
    deliveries: &[Delivery],
) -> (u64, Vec<String>) {
    let mut decided = BTreeSet::new();
    for bytes in logs.values() {
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if let Ok(LogEntry {
                event: Event::RoundDecided { calls, .. },
                ..
            }) = LogEntry::parse(line)
            {
                decided.extend(calls.into_iter().map(|c| c.idempotency_key));
            }
        }
    }
    let mut checked = 0;
    let mut out = Vec::new();
    for d in deliveries.iter().filter(|d| d.request.path == "/send") {
        checked += 1;
        match d.idempotency_key() {
            Some(key) if decided.contains(key) => {}
            key => out.push(format!(
                "I4 effect without a durable decision: delivery {} (key {}) is no call of any logged round.decided: {}",
                d.id,
                key.unwrap_or("-"),
                d.request.body
            )),
        }
    }
    (checked, out)
}

/// Every `events.jsonl` under `root`, as bytes (I3 reads them).
pub fn event_logs(root: &Path) -> Result<BTreeMap<std::path::PathBuf, Vec<u8>>, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == "events.jsonl") {
                let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                out.insert(path, bytes);
            }
        }
    }
    Ok(out)
}

/// The deep check after a clean stop: boot the root with the library (the
/// product's boot: RealFs, the whole recovery under the root lock), then
/// I1/I2/I4 and the runtime's own invariants on its state, I3 on the logs
/// (read before the boot, as the stopped binary left them), and every
/// acknowledged turn, message and trigger against the conversation.
pub fn final_state(
    workload: &Workload,
    config: &Path,
    root: &Path,
    deliveries: &[Delivery],
    settled: &StatusView,
) -> (Checked, Vec<String>) {
    let mut checked = Checked::default();
    let mut out = Vec::new();
    match event_logs(root) {
        Ok(logs) => {
            checked.promises += logs.len() as u64;
            out.extend(oracle::log_invariants(&logs));
            let (effects, undecided) = decided_effects(&logs, deliveries);
            checked.promises += effects;
            out.extend(undecided);
        }
        Err(e) => out.push(format!("cannot read the event logs: {e}")),
    }
    let config = match durable_agent_cli::config::Config::load(config) {
        Ok(c) => c,
        Err(e) => return (checked, vec![format!("config: {e}")]),
    };
    let stop = durable_agent_cli::interrupt::Stop::new();
    let (system, _report, _lifecycle) = match durable_agent_cli::boot::boot(&config, &stop) {
        Ok(booted) => booted,
        Err(e) => {
            return (
                checked,
                vec![format!("the library cannot boot the stopped root: {e}")],
            )
        }
    };
    let rt = system.runtime();
    out.extend(rt.check_invariants());
    let rs = rt.state();
    let by_name: BTreeMap<&str, &durable_agent::runtime::AgentId> =
        rs.agents.iter().map(|(id, v)| (v.name.as_str(), id)).collect();
    // The model's state, for the oracle's own invariant checks.
    let mut state = State::default();
    for view in rs.agents.values() {
        let parent = view.parent.as_ref().map(|p| {
            rs.agents
                .get(p)
                .map_or_else(|| format!("?{p}"), |v| v.name.clone())
        });
        let status = match view.session_state {
            durable_agent::store::session::SessionState::Active => Status::Resident,
            _ => Status::Suspended,
        };
        state.agents.insert(
            view.name.clone(),
            Agent {
                parent,
                status,
                turns: Vec::new(),
                pending: Vec::new(),
                delivered: Vec::new(),
            },
        );
    }
    state.outbox = deliveries
        .iter()
        .filter(|d| d.request.path == "/send")
        .filter_map(|d| logical_action(&d.request.body, d.idempotency_key()))
        .collect();
    out.extend(oracle::state_invariants(&state));
    out.extend(oracle::recovery_invariants(&state));

    let prompts = |agent: &str, marker: &str| -> Option<usize> {
        let id = by_name.get(agent)?;
        Some(rs.conversations.get(*id).map_or(0, |c| {
            c.iter()
                .filter(|i| matches!(i, ConversationItem::Prompt { text } if text.contains(marker)))
                .count()
        }))
    };
    let e = Expect::of(workload);
    for r in &workload.ledger {
        let acked = matches!(r.outcome, Outcome::Acked(_));
        match (&r.op, &r.outcome) {
            (Op::Turn { agent, marker, .. }, Outcome::Acked(_) | Outcome::Unknown(_)) => {
                let Some(n) = prompts(agent, marker) else { continue };
                if acked && n != 1 || n > 1 {
                    out.push(format!(
                        "turn {marker} on {agent} ({}) is in the conversation {n} times",
                        if acked { "acknowledged" } else { "outcome unknown" }
                    ));
                }
                checked.promises += u64::from(acked);
            }
            (Op::Message { to, .. }, Outcome::Acked(v)) => {
                let (Some(id), true) = (by_name.get(to.as_str()), e.must_live(to)) else {
                    continue;
                };
                let mid = v["message_id"].clone();
                let pending = rs.pending.get(*id).is_some_and(|ms| {
                    ms.iter()
                        .any(|m| serde_json::to_value(&m.id).ok().as_ref() == Some(&mid))
                });
                let delivered = rs.delivered.get(*id).is_some_and(|ids| {
                    ids.iter()
                        .any(|m| serde_json::to_value(m).ok().as_ref() == Some(&mid))
                });
                if !pending && !delivered {
                    out.push(format!(
                        "acknowledged message {mid} to {to} is neither pending nor delivered"
                    ));
                }
                checked.promises += 1;
            }
            (
                Op::Emit {
                    key, agent, marker, ..
                },
                Outcome::Acked(_) | Outcome::Unknown(_),
            ) => {
                let Some(n) = prompts(agent, marker) else { continue };
                let done = settled.triggers.get(key).is_some_and(|t| t.status == "DONE");
                if n > 1 || (done && n != 1) {
                    out.push(format!(
                        "trigger {key} ({}) ran {n} turns on {agent}",
                        settled.triggers.get(key).map_or("absent", |t| t.status.as_str())
                    ));
                }
                checked.promises += u64::from(acked);
            }
            _ => {}
        }
    }
    // The lock is released here; the next generation uses another root.
    drop(system);
    (checked, out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::soak::workload::REVERSIBLE_TOOL;

    fn ledger() -> Workload {
        let mut w = Workload::new(1);
        let acked = || Outcome::Acked(json!({}));
        w.record(
            Op::CreateAgent {
                name: "a1".into(),
                parent: None,
            },
            acked(),
            0,
        );
        w.record(
            Op::CreateAgent {
                name: "a2".into(),
                parent: Some("a1".into()),
            },
            acked(),
            0,
        );
        w.record(
            Op::CreateAgent {
                name: "a3".into(),
                parent: None,
            },
            Outcome::Unknown("cut".into()),
            0,
        );
        let emit = Op::Emit {
            key: "e4".into(),
            agent: "a1".into(),
            marker: "[soak:e4]".into(),
            tool: REVERSIBLE_TOOL,
            delay_ms: 0,
        };
        w.record(emit, acked(), 0);
        w
    }

    /// (name, parent) pairs as `/status` shows them.
    type Agents<'a> = &'a [(&'a str, Option<&'a str>)];

    fn seen(agents: Agents<'_>, triggers: &[&str]) -> StatusView {
        let mut v = StatusView::default();
        for (name, parent) in agents {
            v.agents.insert(name.to_string(), (parent.map(str::to_string), 0));
        }
        for key in triggers {
            let t = TriggerSeen {
                status: "PENDING".into(),
                last_error: None,
            };
            v.triggers.insert(key.to_string(), t);
        }
        v
    }

    #[test]
    fn restart_check_accepts_what_was_acknowledged_with_or_without_the_unknown_op() {
        let w = ledger();
        for agents in [
            &[("a1", None), ("a2", Some("a1"))][..],
            &[("a1", None), ("a2", Some("a1")), ("a3", None)][..],
        ] {
            let (checked, violations) = after_restart(&w, &seen(agents, &["e4"]));
            assert!(violations.is_empty(), "{violations:?}");
            assert_eq!(checked.promises, 3);
        }
    }

    #[test]
    fn restart_check_flags_lost_wrong_and_phantom_state() {
        let w = ledger();
        let cases: [(Agents<'_>, &[&str], &str); 4] = [
            (&[("a1", None)], &["e4"], "acknowledged agent a2 is missing"),
            (&[("a1", None), ("a2", None)], &["e4"], "agent a2: parent"),
            (
                &[("a1", None), ("a2", Some("a1"))],
                &[],
                "acknowledged trigger e4 is lost",
            ),
            (
                &[("a1", None), ("a2", Some("a1")), ("zz", None)],
                &["e4"],
                "never created it",
            ),
        ];
        for (agents, triggers, want) in cases {
            let (_, violations) = after_restart(&w, &seen(agents, triggers));
            assert!(
                violations.iter().any(|v| v.contains(want)),
                "{want}: {violations:?}"
            );
        }
    }

    /// A RESUME key names its agent by id, and the agent may be deleted
    /// since (the kill soak's seed 1 did): the view keys it by work.
    #[test]
    fn a_resume_trigger_of_a_deleted_agent_is_keyed_by_its_work() {
        let status = serde_json::json!({
            "agents": [],
            "triggers": {"PENDING": [{"dedup_key": "resume:api:soak-t67@ee23863900000006"}]},
        });
        let v = StatusView::parse(&status);
        assert_eq!(v.triggers.keys().collect::<Vec<_>>(), ["resume:api:soak-t67"]);
    }

    #[test]
    fn a_404_for_an_acknowledged_agent_is_a_violation() {
        let w = ledger();
        let op = Op::DeleteAgent { name: "a1".into() };
        let refused = Outcome::Refused {
            status: 404,
            message: "no live agent named \"a1\"".into(),
        };
        assert!(refusal(&w, &op, &refused).is_some());
        let op = Op::DeleteAgent { name: "a3".into() };
        let refused = Outcome::Refused {
            status: 404,
            message: "no live agent named \"a3\"".into(),
        };
        assert!(
            refusal(&w, &op, &refused).is_none(),
            "a3's creation was never acknowledged"
        );
    }

    fn delivery(id: &str, path: &str, key: &str, body: &str) -> Delivery {
        Delivery {
            id: id.into(),
            request: durable_agent_cli::server::Recorded {
                method: "POST".into(),
                path: path.into(),
                headers: vec![("Idempotency-Key".into(), key.into())],
                body: body.into(),
            },
        }
    }

    #[test]
    fn sink_check_flags_an_irreversible_action_sent_twice_under_any_key() {
        let issued: BTreeSet<String> = ["[soak:t1]".to_string()].into();
        let body = r#"{"to":"[soak:t1] please use send_email"}"#;
        let note = r#"{"text":"[soak:t1] please use note"}"#;
        let once = [
            delivery("dlv-1", "/send", "k1", body),
            delivery("dlv-2", "/note", "k2", note),
            delivery("dlv-3", "/note", "k2", note),
        ];
        assert!(sink(&once, &issued).is_empty(), "a reversible call may repeat");
        let twice = [
            delivery("dlv-1", "/send", "k1", body),
            delivery("dlv-2", "/send", "k9", body),
        ];
        let v = sink(&twice, &issued);
        assert!(
            v.iter().any(|v| v.contains("I4") && v.contains("[soak:t1]")),
            "{v:?}"
        );
        let phantom = [delivery("dlv-1", "/send", "k1", r#"{"to":"[soak:t7] x"}"#)];
        assert!(sink(&phantom, &issued).iter().any(|v| v.contains("never issued")));
        // A rewording model's extra call is an action of its own; the
        // first call's re-send, reworded under a new key, is not.
        let extra = [
            delivery(
                "dlv-1",
                "/send",
                "k1",
                r#"{"to":"[soak:t1] please use send_email [ask 0]"}"#,
            ),
            delivery(
                "dlv-2",
                "/send",
                "k2",
                r#"{"to":"Hi! [soak:t1] please use send_email [ask 0] [extra call 1]"}"#,
            ),
        ];
        assert!(sink(&extra, &issued).is_empty(), "{:?}", sink(&extra, &issued));
        let reworded = [
            delivery(
                "dlv-1",
                "/send",
                "k1",
                r#"{"to":"[soak:t1] please use send_email [ask 0]"}"#,
            ),
            delivery(
                "dlv-2",
                "/send",
                "k2",
                r#"{"to":"FYI - [soak:t1] please use send_email [ask 1]"}"#,
            ),
        ];
        assert!(sink(&reworded, &issued).iter().any(|v| v.contains("I4")));
    }

    #[test]
    fn an_effect_needs_a_logged_decision_behind_it() {
        use durable_agent::log::DecidedCall;
        use durable_agent::runtime::SessionId;
        let session = SessionId::from_hex("00000000000000b1").expect("id");
        let decided = LogEntry {
            schema_version: durable_agent::log::SCHEMA_VERSION,
            session_id: session,
            seq: 3,
            ts: 9,
            event: Event::RoundDecided {
                round: 0,
                calls: vec![DecidedCall {
                    call_id: "00000000000000b1-3.0".into(),
                    tool: "send_email".into(),
                    args: json!({"to": "x"}),
                    irreversible: true,
                    idempotency_key: "k1".into(),
                    invalid_args: None,
                    hook: None,
                }],
            },
        };
        let line = decided.to_line().expect("serialises").into_bytes();
        let logs = BTreeMap::from([(std::path::PathBuf::from("a/events.jsonl"), line)]);
        let body = r#"{"to":"[soak:t1] x"}"#;
        let (n, v) = decided_effects(&logs, &[delivery("dlv-1", "/send", "k1", body)]);
        assert_eq!((n, v.len()), (1, 0), "{v:?}");
        let (_, v) = decided_effects(
            &logs,
            &[
                delivery("dlv-1", "/send", "k1", body),
                delivery("dlv-2", "/send", "k9", body),
                delivery("dlv-3", "/note", "k8", body),
            ],
        );
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("dlv-2") && v[0].contains("without a durable decision"),
            "{v:?}"
        );
    }
}
