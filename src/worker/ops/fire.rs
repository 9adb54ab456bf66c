//! The scheduler's two halves of a firing: claiming the next due trigger
//! with a lease ([`claim_next`]) and settling its turn's end
//! ([`settle_fire`]): DONE, retried with the policy's backoff, or given up.
//!
//! Invariant: a claim is settled exactly once by the process that holds
//! it — acked, or given back uncounted when a stop interrupted its turn
//! (`TriggerStore::release`); only a process that died leaves it CLAIMED,
//! for the next boot to reclaim (counted); a lost lease changes nothing.

use crate::runtime::{AgentId, RuntimeError};
use crate::store::tool_calls::RunStatus;
use crate::store::triggers::{Trigger, TriggerSource, TriggerStatus};
use crate::store::StoreError;
use crate::system::{Fired, System, SystemError};
use serde_json::{json, Value};

use super::super::INTERRUPTED;
use super::{resolve, OpError};

/// What the scheduler did with one claimed trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FireResult {
    Fired {
        id: String,
        fired: Fired,
    },
    /// Acked failed (retried later with backoff, or given up).
    Failed {
        id: String,
        error: String,
    },
}

/// A due trigger this process claimed, with the agent and prompt its
/// payload names.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub claim: Trigger,
    pub agent: AgentId,
    pub prompt: String,
}

/// Claim the next due trigger whose payload names a live agent; a trigger
/// whose payload cannot run is acked failed (not retried) and reported in
/// `results`. `None`: nothing is due.
pub fn claim_next(
    system: &mut System,
    lease_ms: u64,
    results: &mut Vec<FireResult>,
) -> Result<Option<Claimed>, OpError> {
    loop {
        let now = system.now_ms();
        let claimed = system.triggers().claim(system.db().conn(), now, lease_ms)?;
        let Some(claim) = claimed else { return Ok(None) };
        let field = |name: &str| {
            claim
                .payload
                .get(name)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let target = match (field("agent"), field("prompt")) {
            (Some(target), Some(prompt)) => resolve(system, &target).map(|agent| (agent, prompt)),
            _ => Err(OpError::BadRequest(
                "payload has no `agent` and `prompt` strings".into(),
            )),
        };
        let (agent, mut prompt) = match target {
            Ok(target) => target,
            Err(e) => {
                let error = e.to_string();
                let now = system.now_ms();
                system
                    .triggers()
                    .ack_failed(system.db().conn(), &claim, now, &error, false)?;
                results.push(FireResult::Failed { id: claim.id, error });
                continue;
            }
        };
        // A RESUME trigger continues an interrupted turn: its prompt must
        // stay the turn's own (a note would make it another turn).
        if let Some(note) = claim
            .overdue_note()
            .filter(|_| claim.source != TriggerSource::Resume)
        {
            prompt.push_str(&format!("\n\n[{note}]"));
        }
        tracing::info!(id = %claim.id, key = ?claim.dedup_key, agent = %agent, attempt = claim.attempts, "firing trigger");
        return Ok(Some(Claimed { claim, agent, prompt }));
    }
}

/// Settle a claimed trigger's firing: DONE was acked by the fire (`Ok`);
/// a failed turn is acked failed here — retried with backoff if the
/// provider failed, else given up. `Ok(None)`: the claim is given back
/// (PENDING, the attempt not counted) — a stop interrupted the turn, or
/// the key it blocked on was answered while its call was out.
pub fn settle_fire(
    system: &mut System,
    claim: &Trigger,
    outcome: Result<Fired, SystemError>,
) -> Result<Option<FireResult>, OpError> {
    if let Err(SystemError::Runtime(RuntimeError::NeedsConfirmation { idem_key, .. })) = &outcome {
        // A human's answer may have come while the call that found the key
        // waiting was out (the daemon's calls run outside the worker):
        // `confirm` re-pends only FAILED triggers, and this one was still
        // CLAIMED, so marking it FAILED now would leave it blocked on a
        // key nobody can answer again (found by a review). It runs again
        // instead, and the ledger answers the call.
        if !system.waits_for_human(idem_key)? {
            tracing::info!(id = %claim.id, idem_key, "the key was answered while its call was out; the claim is given back");
            let now = system.now_ms();
            system.triggers().release(system.db().conn(), claim, now)?;
            return Ok(None);
        }
    }
    let blocked = matches!(
        outcome,
        Err(SystemError::Runtime(RuntimeError::NeedsConfirmation { .. }))
    );
    let (error, retryable) = match outcome {
        Ok(fired) => {
            // A job run's RESUME trigger: `System::ack_fire` settled its
            // run `succeeded` before the ack.
            tracing::info!(id = %claim.id, ?fired, "trigger done");
            return Ok(Some(FireResult::Fired {
                id: claim.id.clone(),
                fired,
            }));
        }
        Err(SystemError::Runtime(RuntimeError::Provider { source, .. })) if source.0 == INTERRUPTED => {
            // A stop is no failure of the trigger: its claim goes back
            // uncounted (`TriggerStore::release`), for the next boot.
            tracing::info!(id = %claim.id, "trigger turn interrupted by stop; its claim is given back");
            let now = system.now_ms();
            system.triggers().release(system.db().conn(), claim, now)?;
            return Ok(None);
        }
        Err(SystemError::Runtime(e @ RuntimeError::Provider { .. })) => (e.to_string(), true),
        Err(SystemError::Runtime(e @ (RuntimeError::TurnInFlight(_) | RuntimeError::SlotsBusy { .. }))) => {
            (e.to_string(), true)
        }
        Err(SystemError::Runtime(e @ RuntimeError::TooManyToolRounds { .. })) => (e.to_string(), false),
        // Blocked on a human: FAILED, not retried by itself (a retry would
        // block again); answering the key re-pends it (`System::confirm`).
        Err(SystemError::Runtime(e @ RuntimeError::NeedsConfirmation { .. })) => (e.to_string(), false),
        Err(SystemError::Runtime(e @ RuntimeError::UnknownAgent(_))) => (e.to_string(), false),
        Err(SystemError::Store(e @ StoreError::LeaseLost { .. })) => {
            tracing::warn!(id = %claim.id, error = %e, "lease lost; the newer claim owns the trigger");
            return Ok(Some(FireResult::Failed {
                id: claim.id.clone(),
                error: e.to_string(),
            }));
        }
        Err(e) => return Err(OpError::UnknownOutcome(format!("trigger {}: {e}", claim.id))),
    };
    let now = system.now_ms();
    let status = system
        .triggers()
        .ack_failed(system.db().conn(), claim, now, &error, retryable)?;
    tracing::warn!(id = %claim.id, error, next = status.as_str(), "trigger failed");
    if blocked {
        system.settle_resumed_run(claim, RunStatus::WaitingForHuman)?;
    } else if status != TriggerStatus::Pending {
        system.settle_resumed_run(claim, RunStatus::Failed)?;
    }
    Ok(Some(FireResult::Failed {
        id: claim.id.clone(),
        error,
    }))
}

/// The `turn_end` payload of a firing.
pub fn describe_fired(fired: &Fired) -> Value {
    match fired {
        Fired::Ran { tool_calls } => json!({"tool_calls": tool_calls}),
        Fired::AlreadyDone => json!({"already_done": true}),
    }
}
