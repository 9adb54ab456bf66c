//! What the ledger of answers promises: for each agent, trigger and
//! schedule the soak asked for, whether it must be there, must not, or
//! may be either way.
//!
//! Invariant: a pure function of the ledger. Only an acknowledged op makes
//! a promise ([`Presence::Must`] / [`Presence::MustNot`]); an op whose
//! answer was lost makes the thing [`Presence::May`]; a refused op
//! promises nothing.

use std::collections::BTreeMap;

use super::workload::{Op, Outcome, Workload};

/// What an answer promises about one thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Must,
    MustNot,
    May,
}

impl Presence {
    /// After an op that removes it, with `acked` or unknown outcome.
    fn removed(self, acked: bool) -> Presence {
        match (self, acked) {
            (_, true) => Presence::MustNot,
            (Presence::MustNot, false) => Presence::MustNot,
            (_, false) => Presence::May,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AgentExpect {
    pub parent: Option<String>,
    pub presence: Presence,
    /// API turns acknowledged on it.
    pub acked_turns: u64,
}

/// The promises of a whole ledger.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    pub agents: BTreeMap<String, AgentExpect>,
    /// Trigger dedup key -> (agent, must exist).
    pub triggers: BTreeMap<String, (String, Presence)>,
    pub schedules: BTreeMap<String, Presence>,
}

impl Expect {
    pub fn of(workload: &Workload) -> Expect {
        let mut e = Expect::default();
        for r in &workload.ledger {
            let acked = matches!(r.outcome, Outcome::Acked(_));
            if matches!(r.outcome, Outcome::Refused { .. }) {
                continue;
            }
            let sure = if acked { Presence::Must } else { Presence::May };
            match &r.op {
                Op::CreateAgent { name, parent } => {
                    e.agents.insert(
                        name.clone(),
                        AgentExpect {
                            parent: parent.clone(),
                            presence: sure,
                            acked_turns: 0,
                        },
                    );
                }
                Op::DeleteAgent { name } => {
                    if let Some(a) = e.agents.get_mut(name) {
                        a.presence = a.presence.removed(acked);
                    }
                }
                Op::Turn { agent, work_id, .. } => {
                    if let (true, Some(a)) = (acked, e.agents.get_mut(agent)) {
                        a.acked_turns += 1;
                    }
                    // A turn cut by a crash is resumed by the RESUME trigger
                    // the next boot emits for its work (`resume:api:{id}@{agent}`,
                    // keyed by work alone as `StatusView` reads it: the soak's
                    // work ids are unique); a later retry may still be acked.
                    e.triggers
                        .entry(format!("resume:api:{work_id}"))
                        .or_insert((agent.clone(), Presence::May));
                }
                Op::Message { .. } => {}
                Op::Emit { key, agent, .. } => {
                    e.triggers.insert(key.clone(), (agent.clone(), sure));
                }
                Op::AddSchedule { id, .. } => {
                    e.schedules.insert(id.clone(), sure);
                }
                Op::DeleteSchedule { id } => {
                    if let Some(p) = e.schedules.get_mut(id) {
                        *p = p.removed(acked);
                    }
                }
            }
        }
        e
    }

    /// Whether `agent` certainly lives (acknowledged, not deleted).
    pub fn must_live(&self, agent: &str) -> bool {
        self.agents
            .get(agent)
            .is_some_and(|a| a.presence == Presence::Must)
    }
}
