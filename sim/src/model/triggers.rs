//! The durable-trigger part of the model (seed 001): one row per dedup key,
//! `PENDING -claim-> CLAIMED -ack ok-> DONE`, `-ack fail-> PENDING | DEAD`,
//! a fire whose turn blocked on a confirmation `-> FAILED`
//! ([`Model::blocked`]), and an operator's retry `DEAD | FAILED -> PENDING`
//! with its attempts reset.
//!
//! Invariant: a dedup key has at most one row, whatever is emitted (the
//! first emit's `fire_at` stands); claim takes, among the PENDING rows
//! that are due (`fire_at` and the backoff floor `not_before` passed),
//! the one with the earliest `fire_at`, the oldest first among equals
//! (the priority is equal for every row) — a RESUME row is due at the
//! time of the boot that emitted it ([`Model::next_due`]); reaching DONE
//! is final.
//!
//! Time: the model's clock is the op's ([`Model::now`], the driver's
//! `OP_MS` per op), and a failed ack's backoff ([`backoff_ms`], the
//! harness's `TriggerPolicy`) spans ops, so a claim meets rows that are
//! not due yet and the row's floor is compared as it is stored.

use serde::{Deserialize, Serialize};

use super::{Action, Model};
use crate::op::{Op, ToolStep};

/// Claims before a failing trigger is dead-lettered: the harness's
/// `TriggerPolicy::max_attempts` (the store's default is 5). Low, so a
/// 30-op sequence reaches the dead-letter threshold and an operator's
/// retry of a DEAD trigger.
pub const MAX_ATTEMPTS: u32 = 2;

/// The harness's `TriggerPolicy::backoff_base_ms`: two and a half ops,
/// so a row a failed ack re-pends is not due at the next two ops and due
/// at the third.
pub const BACKOFF_BASE_MS: u64 = crate::driver::OP_MS * 5 / 2;
/// The harness's `TriggerPolicy::backoff_cap_ms`.
pub const BACKOFF_CAP_MS: u64 = crate::driver::OP_MS * 8;

/// The backoff floor after `attempts` failed claims, as the policy states
/// it (`base * 2^(attempts-1)`, capped): the model's own statement of the
/// rule, not the store's code.
pub fn backoff_ms(attempts: u32) -> u64 {
    let doublings = attempts.saturating_sub(1).min(16);
    (BACKOFF_BASE_MS << doublings).min(BACKOFF_CAP_MS)
}

/// Distinct dedup keys the generator uses: few, so re-emits collide.
pub const KEYS: u8 = 4;

/// Lifecycle state of a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerStatus {
    Pending,
    Claimed,
    Done,
    Dead,
    /// Given up without retries: a fire whose turn is blocked on a key
    /// that needs a human's confirmation (no human answers in the model).
    Failed,
}

/// One trigger as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TriggerRow {
    pub key: String,
    pub status: TriggerStatus,
    pub attempts: u32,
    /// The backoff floor (ms; 0: none): a row is not due before it. Set
    /// by a failed ack, kept through reclaims and GC, cleared by an
    /// operator's retry or a human's answer ([`TriggerRow::repend`]).
    #[serde(default)]
    pub not_before: u64,
    /// When the row is due (ms): an emit's op time plus its delay; a
    /// RESUME row's, the time of the boot that emitted it.
    #[serde(default)]
    pub fire_at: u64,
}

impl TriggerRow {
    /// PENDING again, as a human makes it (`TriggerStore::retry`, which
    /// both an operator's retry and `System::confirm` run): attempts
    /// reset, no backoff floor.
    pub fn repend(&mut self) {
        self.status = TriggerStatus::Pending;
        self.attempts = 0;
        self.not_before = 0;
    }
}

impl Model {
    /// The row a claim takes: the store orders the due rows by
    /// (`fire_at`, priority, rowid); the priority is equal for every row.
    pub fn next_due(&self) -> Option<&TriggerRow> {
        self.state
            .triggers
            .iter()
            .filter(|t| {
                t.status == TriggerStatus::Pending && t.not_before <= self.now && t.fire_at <= self.now
            })
            // `min_by_key` keeps the first of equal keys: the oldest row.
            .min_by_key(|t| t.fire_at)
    }

    pub(super) fn resolve_trigger(&self, op: &Op) -> Option<Action> {
        let rows = &self.state.triggers;
        match op {
            Op::EmitTrigger { key, due_in } => Some(Action::Emit {
                key: format!("k{}", key % KEYS),
                fire_at: self.now + u64::from(due_in % 4) * crate::driver::OP_MS,
            }),
            Op::ClaimTrigger => match self.next_due() {
                Some(t) => Some(Action::Claim { key: t.key.clone() }),
                // Only where rows exist: with none, a claim proves little.
                None => (!rows.is_empty()).then_some(Action::ClaimNothing),
            },
            Op::AckTrigger { trigger, ok } => {
                let claimed: Vec<&TriggerRow> = rows
                    .iter()
                    .filter(|t| t.status == TriggerStatus::Claimed)
                    .collect();
                if claimed.is_empty() {
                    return None;
                }
                let t = claimed[*trigger as usize % claimed.len()];
                Some(Action::Ack {
                    key: t.key.clone(),
                    ok: *ok,
                })
            }
            Op::FireTrigger { agent, tools } => {
                // Nothing due: the fire's claim must hand out nothing.
                let Some(due) = self.next_due() else {
                    return (!rows.is_empty()).then_some(Action::ClaimNothing);
                };
                let key = &due.key;
                if let Some(work) = self.fire_work.get(key) {
                    // The work a trigger was first given: its agent must
                    // still be live (else the op is skipped).
                    let Action::Fire { agent, .. } = work else {
                        return None;
                    };
                    return self.state.agents.contains_key(agent).then(|| work.clone());
                }
                // A RESUME row runs its work: the turn that started it, or
                // (the work completed since) only the ack.
                if let Some(Action::WorkTurn {
                    agent,
                    prompt,
                    tools,
                    response,
                    ..
                }) = self.works.get(key)
                {
                    return self.state.agents.contains_key(agent).then(|| Action::Fire {
                        key: key.clone(),
                        agent: agent.clone(),
                        prompt: prompt.clone(),
                        tools: tools.clone(),
                        response: response.clone(),
                    });
                }
                if let Some(agent) = self.works_done.get(key) {
                    return self.state.agents.contains_key(agent).then(|| Action::Fire {
                        key: key.clone(),
                        agent: agent.clone(),
                        prompt: String::new(),
                        tools: Vec::new(),
                        response: String::new(),
                    });
                }
                let names: Vec<&String> = self.state.agents.keys().collect();
                if names.is_empty() {
                    return None;
                }
                let n = self.counter;
                let tools: &[ToolStep] = &super::normalized(tools);
                let agent = names[agent.0 as usize % names.len()];
                Some(Action::Fire {
                    key: key.clone(),
                    agent: agent.clone(),
                    prompt: super::script_prompt(n, tools, &names, &[], 0),
                    tools: self.within_depth(agent, tools),
                    response: format!("r{n}"),
                })
            }
            Op::RetryTrigger { trigger } => {
                let given_up: Vec<&TriggerRow> = rows
                    .iter()
                    .filter(|t| matches!(t.status, TriggerStatus::Dead | TriggerStatus::Failed))
                    .collect();
                let t = given_up.get(*trigger as usize % given_up.len().max(1))?;
                Some(Action::Retry { key: t.key.clone() })
            }
            Op::StaleAck { trigger } => {
                let stale: Vec<&String> = self.stale_claims.iter().collect();
                if stale.is_empty() {
                    return None;
                }
                Some(Action::StaleAck {
                    key: stale[*trigger as usize % stale.len()].clone(),
                })
            }
            _ => None,
        }
    }

    pub(super) fn apply_trigger(&mut self, action: &Action) {
        let now = self.now;
        let rows = &mut self.state.triggers;
        match action {
            Action::Emit { key, fire_at } if !rows.iter().any(|t| &t.key == key) => {
                rows.push(TriggerRow {
                    key: key.clone(),
                    status: TriggerStatus::Pending,
                    attempts: 0,
                    not_before: 0,
                    fire_at: *fire_at,
                });
            }
            Action::Claim { key } => {
                if let Some(t) = rows.iter_mut().find(|t| &t.key == key) {
                    t.status = TriggerStatus::Claimed;
                    t.attempts += 1;
                }
            }
            Action::Fire { key, .. } => {
                if let Some(t) = rows.iter_mut().find(|t| &t.key == key) {
                    t.status = TriggerStatus::Done;
                    t.attempts += 1;
                }
            }
            Action::Retry { key } => {
                self.blocked_on.remove(key);
                // One transaction (`TriggerStore::retry`): all or nothing.
                if let Some(t) = rows.iter_mut().find(|t| &t.key == key) {
                    t.repend();
                }
            }
            Action::StaleAck { key } => {
                // Refused; the zombie acks once.
                self.stale_claims.remove(key);
            }
            Action::Ack { key, ok } => {
                if let Some(t) = rows.iter_mut().find(|t| &t.key == key) {
                    t.status = match (ok, t.attempts >= MAX_ATTEMPTS) {
                        (true, _) => TriggerStatus::Done,
                        (false, true) => TriggerStatus::Dead,
                        (false, false) => {
                            t.not_before = now + backoff_ms(t.attempts);
                            TriggerStatus::Pending
                        }
                    };
                }
            }
            _ => {}
        }
    }
}
