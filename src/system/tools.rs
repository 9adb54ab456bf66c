//! [`SystemTools`]: the agent loop's tool executor. Every call is first
//! recorded in the tool-call ledger (seed 004: `prepared → running →
//! succeeded/failed`, its side-effect class, idempotency key and raw tool
//! name; the run is the agent's session). Irreversible calls then go
//! through the activity ledger ([`ActivityGate`]) under the idempotency key
//! the runtime derived; reversible ones straight to the tools the system
//! was booted with.
//!
//! Invariants: an irreversible side effect reaches the outside world only
//! through [`ActivityGate::execute`] — INTENT committed first, the key
//! carried to the provider, DONE/FAILED after — so it happens at most once
//! per key whatever crashes in between; an INTENT whose fate is unknown and
//! whose provider cannot deduplicate is never re-sent: the call fails
//! with [`ToolError::NeedsConfirmation`], which ends the turn at that call
//! (its ledger row stays `running`), so the work that depends on it waits
//! until a human answers the key (`System::confirm`) and the turn resumes. A call the ledger already holds (the same key, asked
//! again after a crash) is a replay: a finished one answers from the
//! ledger; an in-flight reversible one runs again and is recorded as a
//! replay, and after `max_replays` failed replays the run waits for a human
//! instead of retrying forever; an in-flight irreversible one is decided by
//! the activity ledger, never blindly re-run.

use std::sync::{Arc, Mutex};

use crate::canary::Canary;
use crate::runtime::{ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest};
use crate::sqlite::Db;
use crate::store::activities::{ActivityGate, ActivityOutcome, IrreversibleCall};
use crate::store::tool_calls::{
    NewToolCall, ReplayOutcome, SideEffect, ToolCall, ToolCallStatus, ToolCallStore,
};
use crate::store::StoreError;

use super::LogicalClock;

/// The executor [`super::System::boot`] gives the runtime.
#[derive(Debug, Clone)]
pub struct SystemTools {
    pub gate: ActivityGate,
    pub reversible: Arc<dyn ToolExecutor>,
    pub clock: Arc<dyn LogicalClock>,
    /// The stores' connection (the tool-call ledger's).
    pub db: Arc<Mutex<Db>>,
    pub calls: ToolCallStore,
}

/// The tool-call ledger's run of an agent's calls: its session.
pub fn session_run(session: &str) -> String {
    format!("session:{session}")
}

impl SystemTools {
    fn ledger<T>(&self, f: impl FnOnce(&Db) -> Result<T, StoreError>) -> Result<T, ToolError> {
        f(&super::lock_db(&self.db)).map_err(|e| ToolError::Failed(format!("tool-call ledger: {e}")))
    }

    /// The call as the side effect it has (irreversible ones via the
    /// activity ledger).
    fn perform(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        if let Some(detail) = &call.invalid_args {
            // The model's mistake, for the model to correct: never run.
            return Ok(ToolOutput {
                ok: false,
                output: format!(
                    "{}: the arguments are not usable ({detail}); the call was not run",
                    call.tool
                ),
            });
        }
        if !call.irreversible {
            return self.reversible.execute(ctx, call);
        }
        let request = IrreversibleCall::with_key(
            ctx.idempotency_key,
            ctx.agent.as_str(),
            &call.tool,
            call.args.clone(),
        );
        let outcome = self
            .gate
            .execute(&request, self.clock.now_ms())
            .map_err(|e| ToolError::Failed(format!("{} {}: {e}", call.tool, ctx.idempotency_key)))?;
        Ok(match outcome {
            ActivityOutcome::Done { provider_ref, .. } => ToolOutput {
                ok: true,
                output: format!("done {provider_ref}"),
            },
            ActivityOutcome::Failed { error, .. } => ToolOutput {
                ok: false,
                output: format!("failed: {error}"),
            },
            ActivityOutcome::NeedsConfirmation { idem_key }
                if self.gate.store().canaries.has(Canary::ConfirmationNotBlocking) =>
            {
                // Canary: answer and go on, as if the call had failed.
                ToolOutput {
                    ok: false,
                    output: format!("{idem_key} needs confirmation by a human"),
                }
            }
            ActivityOutcome::NeedsConfirmation { idem_key } => {
                return Err(ToolError::NeedsConfirmation {
                    tool: call.tool.clone(),
                    idem_key,
                })
            }
        })
    }
}

fn recorded(row: &ToolCall) -> ToolOutput {
    let output = match (&row.result, &row.error) {
        (Some(serde_json::Value::String(s)), _) => s.clone(),
        (Some(v), _) => v.to_string(),
        (None, Some(e)) => e.clone(),
        (None, None) => String::new(),
    };
    ToolOutput {
        ok: row.status == ToolCallStatus::Succeeded,
        output,
    }
}

impl ToolExecutor for SystemTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let now = self.clock.now_ms();
        let run = session_run(ctx.session.as_str());
        let new = NewToolCall {
            id: ctx.call_id.to_string(),
            run_id: run.clone(),
            tool_name: call.tool.to_lowercase(),
            raw_tool_name: call.tool.clone(),
            input: call.args.clone(),
            idempotency_key: ctx.idempotency_key.to_string(),
            side_effect: if call.irreversible {
                SideEffect::Irreversible
            } else {
                SideEffect::Reversible
            },
        };
        let row = self.ledger(|db| {
            self.calls
                .create_run(db.conn(), &run, ctx.session.as_str(), now)?;
            self.calls.prepare(db.conn(), &new, now)
        })?;
        // This call's own row, never started (a crash between `prepare`
        // and `mark_running` performed nothing): a first attempt. A row
        // of the same call id that is running was in flight at a crash
        // (the decision gives every attempt of a call the same id).
        let fresh = row.id == new.id && row.status == ToolCallStatus::Prepared;
        match row.status {
            // Asked again after a crash (a rolled-back round): answered
            // from the ledger, not run twice.
            ToolCallStatus::Succeeded | ToolCallStatus::Failed if !fresh => return Ok(recorded(&row)),
            _ => {}
        }
        if fresh {
            self.ledger(|db| self.calls.mark_running(db.conn(), &row.id, now))?;
        }
        let output = self.perform(ctx, call)?;
        let now = self.clock.now_ms();
        let result = serde_json::Value::String(output.output.clone());
        if fresh || call.irreversible {
            // Irreversible: the activity ledger decided; record its answer.
            self.ledger(|db| match output.ok {
                true => self.calls.mark_succeeded(db.conn(), &row.id, &result, now),
                false => self.calls.mark_failed(db.conn(), &row.id, &output.output, now),
            })?;
            return Ok(output);
        }
        // A reversible call in flight at a crash, run again: a replay.
        let outcome = if output.ok {
            Ok(&result)
        } else {
            Err(output.output.as_str())
        };
        let replay = self.ledger(|db| self.calls.record_replay(db.conn(), &row.id, outcome, now))?;
        Ok(match replay {
            ReplayOutcome::WaitingForHuman => ToolOutput {
                ok: false,
                output: format!(
                    "{}: failed again on replay ({}); the run waits for a human",
                    call.tool, output.output
                ),
            },
            ReplayOutcome::Succeeded | ReplayOutcome::WillRetry { .. } => output,
        })
    }
}
