//! Every call of a turn, for the run summary and the API's turn answer:
//! the turn's outcome where it has one, completed from the ledgers — the
//! tool-call ledger (every call, `prepared → running → succeeded|failed`,
//! keyed by its idempotency key) and the activity ledger (the fate of each
//! irreversible side effect: DONE, FAILED, INTENT, NEEDS_CONFIRMATION).
//!
//! A turn that did not complete (a crash, a stop, a failed provider, a
//! call blocked on a human) has no outcome, yet the calls it made before
//! stopping may have changed the world: those are read from the ledgers,
//! so what a run or an API turn reports lists every effect that happened,
//! or may have.
//!
//! Invariant: read-only (store reads under the connection's lock, never
//! across a runtime call); a work turn's ledger rows are recognised by
//! their idempotency key (`{work}-r{round}-c{index}…@{session}`, see
//! `crate::runtime::work_idempotency_key`), so another work's
//! calls are never listed — and each ledger row is listed once.

use crate::runtime::{AgentId, TurnOutcome};
use crate::store::activities::{ActivityRecord, ActivityStatus, ActivityStore};
use crate::store::tool_calls::{SideEffect, ToolCall, ToolCallStatus, ToolCallStore};
use crate::store::StoreError;
use crate::system::{session_run, System};
use serde::Serialize;

/// One call of a turn, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallSummary {
    /// The call's id in the agent's log and in the tool-call ledger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub tool: String,
    pub irreversible: bool,
    pub ok: bool,
    pub output: String,
    /// The tool-call ledger's state: `succeeded`, `failed`, or
    /// `running`/`prepared` — in flight when the process stopped, or
    /// blocked on a human's confirmation (see `effect`).
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idem_key: Option<String>,
    /// Irreversible calls: the activity ledger's word on the side effect —
    /// `DONE` (it happened), `FAILED` (it did not), `INTENT` (sent or about
    /// to be; the next boot decides) or `NEEDS_CONFIRMATION` (it may have
    /// happened; `durable-agent confirm` answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<String>,
}

/// Whether `key` is the idempotency key of a call of work `work` in
/// `session`: `{work}-r{digits}-c{digits}` then `-{16 hex digits}` (the
/// call's content hash) or nothing, then `@{session}`. Exactly that: a
/// looser tail took the keys of work `w-r0-c0` for work `w`'s, and the
/// answer to `w` listed an email it never sent.
pub fn key_of_work(key: &str, work: &str, session: &str) -> bool {
    let Some(rest) = key
        .strip_prefix(work)
        .and_then(|k| k.strip_prefix("-r"))
        .and_then(|k| k.strip_suffix(session))
        .and_then(|k| k.strip_suffix('@'))
    else {
        return false;
    };
    let digits = |s: &str| -> usize { s.bytes().take_while(u8::is_ascii_digit).count() };
    let round = digits(rest);
    let Some(after) = rest[round..].strip_prefix("-c").filter(|_| round > 0) else {
        return false;
    };
    let index = digits(after);
    let hash = &after[index..];
    let hashed = hash
        .strip_prefix('-')
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    index > 0 && (hash.is_empty() || hashed)
}

/// The tool-call ledger rows of work turn `work` of `agent`, oldest first
/// (none if the agent is gone).
fn work_rows(system: &System, agent: &AgentId, work: &str) -> Result<Vec<ToolCall>, StoreError> {
    let Some(session) = system.runtime().session_id(agent).map(|s| s.to_string()) else {
        return Ok(Vec::new());
    };
    let rows = ToolCallStore::default().calls_of(system.db().conn(), &session_run(&session))?;
    Ok(rows
        .into_iter()
        .filter(|r| key_of_work(&r.idempotency_key, work, &session))
        .collect())
}

/// The calls of `agent`'s turn: `outcome`'s calls in order, each completed
/// from its ledger rows, then — for a work turn — every ledger row of the
/// work the outcome lacks (the calls of a turn that stopped before it
/// completed, or of a round a crash rolled back).
pub fn turn_calls(
    system: &System,
    agent: &AgentId,
    work: Option<&str>,
    outcome: Option<&TurnOutcome>,
) -> Result<Vec<CallSummary>, StoreError> {
    let store = ToolCallStore::default();
    let mut rows = match work {
        Some(work) => work_rows(system, agent, work)?,
        None => Vec::new(),
    };
    let mut out = Vec::new();
    for (call_id, call, output) in outcome.map_or(&[][..], |o| &o.tool_calls[..]) {
        let matched = rows
            .iter()
            .position(|r| &r.id == call_id)
            .or_else(|| {
                // A call asked again after a crash keeps its first row.
                rows.iter()
                    .position(|r| r.raw_tool_name == call.tool && r.input == call.args)
            })
            .map(|i| rows.remove(i));
        let row = match (matched, work) {
            (Some(row), _) => Some(row),
            (None, None) => store.get(system.db().conn(), call_id)?,
            (None, Some(_)) => None,
        };
        let activity = match row.as_ref().filter(|r| r.side_effect == SideEffect::Irreversible) {
            Some(r) => activity(system, &r.idempotency_key)?,
            None => None,
        };
        out.push(CallSummary {
            call_id: Some(call_id.clone()),
            tool: call.tool.clone(),
            irreversible: call.irreversible,
            ok: output.ok,
            output: output.output.clone(),
            status: if output.ok { "succeeded" } else { "failed" }.to_string(),
            idem_key: row.as_ref().map(|r| r.idempotency_key.clone()),
            effect: activity.as_ref().map(|a| a.status.as_str().to_string()),
            provider_ref: activity.and_then(|a| a.provider_ref),
        });
    }
    for row in rows {
        let activity = match row.side_effect {
            SideEffect::Irreversible => activity(system, &row.idempotency_key)?,
            _ => None,
        };
        out.push(from_ledger(row, activity));
    }
    Ok(out)
}

fn activity(system: &System, key: &str) -> Result<Option<ActivityRecord>, StoreError> {
    ActivityStore::default().get(system.db().conn(), key)
}

/// A call the outcome lacks, as its ledger rows tell it.
fn from_ledger(row: ToolCall, activity: Option<ActivityRecord>) -> CallSummary {
    let recorded = match (&row.result, &row.error) {
        (Some(serde_json::Value::String(s)), _) => Some(s.clone()),
        (Some(v), _) => Some(v.to_string()),
        (None, Some(e)) => Some(e.clone()),
        (None, None) => None,
    };
    let output = match (&row.status, activity.as_ref().map(|a| a.status)) {
        (ToolCallStatus::Succeeded | ToolCallStatus::Failed, _) => recorded.unwrap_or_default(),
        (_, Some(ActivityStatus::NeedsConfirmation)) => format!(
            "its fate is unknown and the endpoint cannot deduplicate: `durable-agent confirm {} --delivered|--not-delivered|--abandon`",
            row.idempotency_key
        ),
        (_, Some(ActivityStatus::Done)) => format!(
            "delivered ({}); the turn had not read the answer yet",
            activity
                .as_ref()
                .and_then(|a| a.provider_ref.as_deref())
                .unwrap_or("no reference")
        ),
        (_, Some(ActivityStatus::Failed)) => format!(
            "not delivered: {}",
            activity
                .as_ref()
                .and_then(|a| a.error.as_deref())
                .unwrap_or("failed")
        ),
        _ => "in flight when the turn stopped; resuming the work decides it".to_string(),
    };
    CallSummary {
        call_id: Some(row.id),
        tool: row.raw_tool_name,
        irreversible: row.side_effect == SideEffect::Irreversible,
        ok: row.status == ToolCallStatus::Succeeded,
        output,
        status: row.status.as_str().to_string(),
        idem_key: Some(row.idempotency_key),
        effect: activity.as_ref().map(|a| a.status.as_str().to_string()),
        provider_ref: activity.and_then(|a| a.provider_ref),
    }
}

/// The keys of `agent`'s irreversible calls a human must confirm.
pub fn needs_confirmation(system: &System, agent: &AgentId) -> Result<Vec<String>, StoreError> {
    Ok(ActivityStore::default()
        .with_status(system.db().conn(), ActivityStatus::NeedsConfirmation)?
        .into_iter()
        .filter(|a| a.task_id == agent.as_str())
        .map(|a| a.idem_key)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_work_key_is_recognised_and_no_other() {
        let s = "ee23863900000002";
        assert!(key_of_work(
            "run:job-1-r0-c0-dbd52cc47c28319f@ee23863900000002",
            "run:job-1",
            s
        ));
        assert!(key_of_work("api:w1-r12-c3@ee23863900000002", "api:w1", s));
        for other in [
            // Another work whose id extends this one's.
            "run:job-10-r0-c0-dbd52cc47c28319f@ee23863900000002",
            "run:job-1-r0-r0-c0-dbd52cc47c28319f@ee23863900000002",
            // Work `run:job-1-r0-c0`'s call: its key extends a key's tail.
            "run:job-1-r0-c0-r0-c0-dbd52cc47c28319f@ee23863900000002",
            // A tail that is not the content hash.
            "run:job-1-r0-c0-dbd52cc47c2831@ee23863900000002",
            // Another session.
            "run:job-1-r0-c0-dbd52cc47c28319f@ee23863900000003",
            // Not a call key.
            "run:job-1-rx-c0@ee23863900000002",
            "run:job-1-r0-c@ee23863900000002",
            "run:job-1-r0-c0x@ee23863900000002",
            "run:job-1@ee23863900000002",
        ] {
            assert!(!key_of_work(other, "run:job-1", s), "{other}");
        }
        // A work id that itself looks like a key's tail stays apart.
        assert!(key_of_work(
            "run:job-1-r0-r0-c0-dbd52cc47c28319f@ee23863900000002",
            "run:job-1-r0",
            s
        ));
    }
}
