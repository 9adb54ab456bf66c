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
//! until a human answers the key (`System::confirm`) and the turn resumes.
//!
//! A call the ledger already holds (the same key, asked again after a
//! crash) is a replay: a finished one answers from the ledger; an
//! in-flight reversible one runs again, counted before it runs, and its
//! answer settles it; one asked again after `max_replays` replays that
//! never answered (each process replaying it died) is not run: its run
//! waits for a human, and until they release it no call of the run is
//! replayed — each is answered [`parked_answer`] and settled failed; an
//! in-flight irreversible one is decided by the activity ledger, never
//! blindly re-run.
//!
//! Retries (seed 000's `call_tool_with_retry`): a hard failure
//! ([`ToolError::Transient`]: not reached, or a server error) is recorded as
//! a numbered failed attempt and tried again as the [`ToolRetries`] plan
//! says, with the same call id and the same idempotency key; an answer that
//! says the call failed is the model's to read, never retried. An
//! irreversible call is retried only through the activity ledger (its
//! INTENT stands; a re-send happens only where the endpoint deduplicates by
//! key, otherwise the key becomes NEEDS_CONFIRMATION), and when its retries
//! run out its fate stays unknown (a `ToolError::Failed`: recovery decides),
//! never a failed answer. A call a hook parked for a human
//! ([`ToolExecutor::execute_after_confirmation`]) runs only after
//! `System::confirm` released its key, a reversible one counted on each
//! such run like a replay (bounded by `max_replays` the same way).

use std::sync::{Arc, Mutex};

use crate::canary::Canary;
use crate::runtime::{ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest, ToolRetries};
use crate::sqlite::Db;
use crate::store::activities::{
    ActivityError, ActivityGate, ActivityOutcome, ActivityStatus, IrreversibleCall,
};
use crate::store::tool_calls::{
    NewToolCall, Parked, ReplayOf, ReplayStart, SideEffect, ToolCall, ToolCallStatus, ToolCallStore,
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
    /// How hard failures are retried (none: [`crate::runtime::NoRetries`]).
    pub retries: Arc<dyn ToolRetries>,
}

/// What a replay is answered when it may not run
/// ([`ReplayStart::Parked`]): `replay_attempts` replays of the call began
/// and none answered (the last one that parked the run had
/// `max_replays`), or another call of its run parked it.
pub fn parked_answer(tool: &str, replay_attempts: u32) -> String {
    format!(
        "{tool}: not run again; its run waits for a human to release it \
         ({replay_attempts} replays of this call never answered)"
    )
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
        let outcome = match self.gate.execute(&request, self.clock.now_ms()) {
            Ok(outcome) => outcome,
            // Sent, answer lost: retryable only through the ledger (see
            // `attempts`), else an unknown outcome.
            Err(e @ ActivityError::DeliveryUnknown { .. }) => {
                return Err(ToolError::Transient(format!(
                    "{} {}: {e}",
                    call.tool, ctx.idempotency_key
                )))
            }
            Err(e) => {
                return Err(ToolError::Failed(format!(
                    "{} {}: {e}",
                    call.tool, ctx.idempotency_key
                )))
            }
        };
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

impl SystemTools {
    /// [`Self::perform`] until it answers or the retry plan gives up:
    /// every hard failure is a numbered attempt in the ledger (row `id`),
    /// every attempt carries the call's one idempotency key. Out of
    /// retries, a reversible call answers with its last failure (the
    /// model reads it); an irreversible one keeps its unknown fate.
    fn attempts(&self, ctx: &ToolContext<'_>, call: &ToolRequest, id: &str) -> Result<ToolOutput, ToolError> {
        let mut tries: u32 = 1;
        loop {
            let reason = match self.perform(ctx, call) {
                Err(ToolError::Transient(reason)) => reason,
                other => return other,
            };
            tries = tries.saturating_add(1);
            let delay = self.retries.delay_before(call, tries);
            if call.irreversible && delay.is_none() {
                // Its fate is unknown, not failed: the INTENT is its record
                // and recovery decides it (no attempt row: nothing failed).
                tracing::warn!(tool = %call.tool, call_id = id, reason, "irreversible call's outcome unknown; no retries left");
                return Err(ToolError::Failed(reason));
            }
            let attempt = self.ledger(|db| {
                self.calls
                    .record_attempt(db.conn(), id, &reason, self.clock.now_ms())
            })?;
            let Some(delay_ms) = delay else {
                tracing::warn!(tool = %call.tool, call_id = id, attempt, reason, "tool failed; no retries left");
                return Ok(ToolOutput {
                    ok: false,
                    output: format!("{reason} (failed {attempt} time(s))"),
                });
            };
            tracing::warn!(tool = %call.tool, call_id = id, attempt, delay_ms, reason, "tool failed; retrying with the same key");
            self.retries.wait(delay_ms);
        }
    }
}

impl SystemTools {
    /// The call's ledger row (prepared now if new), and whether this is
    /// its first run (its own row, never started).
    fn enter(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<(ToolCall, bool), ToolError> {
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
        Ok((row, fresh))
    }

    /// Run reversible call `id` again, counted before it runs (a replay
    /// the process dies in counts too), and settle it with its answer —
    /// or, once its replays are spent or its run waits for a human, do
    /// not run it: answered [`parked_answer`] and settled, so the model
    /// goes on knowing it did not run and the row is not left in flight
    /// for ever.
    fn replay(
        &self,
        ctx: &ToolContext<'_>,
        call: &ToolRequest,
        id: &str,
        of: ReplayOf,
    ) -> Result<ToolOutput, ToolError> {
        let now = self.clock.now_ms();
        let start = self.ledger(|db| self.calls.begin_replay(db.conn(), id, of, now))?;
        if let ReplayStart::Parked { replay_attempts } = start {
            let output = ToolOutput {
                ok: false,
                output: parked_answer(&call.tool, replay_attempts),
            };
            return self.settle(id, output);
        }
        let output = self.attempts(ctx, call, id)?;
        let now = self.clock.now_ms();
        let result = serde_json::Value::String(output.output.clone());
        let outcome = if output.ok {
            Ok(&result)
        } else {
            Err(output.output.as_str())
        };
        self.ledger(|db| self.calls.record_replay(db.conn(), id, outcome, now))?;
        Ok(output)
    }

    /// Record the answer of a call: settled as it says.
    fn settle(&self, id: &str, output: ToolOutput) -> Result<ToolOutput, ToolError> {
        let now = self.clock.now_ms();
        let result = serde_json::Value::String(output.output.clone());
        self.ledger(|db| match output.ok {
            true => self.calls.mark_succeeded(db.conn(), id, &result, now),
            false => self.calls.mark_failed(db.conn(), id, &output.output, now),
        })?;
        Ok(output)
    }
}

impl ToolExecutor for SystemTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let now = self.clock.now_ms();
        let (row, fresh) = self.enter(ctx, call)?;
        match row.status {
            // Asked again after a crash (a rolled-back round): answered
            // from the ledger, not run twice.
            ToolCallStatus::Succeeded | ToolCallStatus::Failed if !fresh => return Ok(recorded(&row)),
            _ => {}
        }
        if fresh {
            self.ledger(|db| self.calls.mark_running(db.conn(), &row.id, now))?;
        } else if !call.irreversible {
            // A reversible call in flight at a crash: a replay.
            return self.replay(ctx, call, &row.id, ReplayOf::Crash);
        }
        // A first run, or an irreversible call the activity ledger
        // decides: settled with its answer.
        let output = self.attempts(ctx, call, &row.id)?;
        self.settle(&row.id, output)
    }

    /// Park the call for a human the first time (its key NEEDS_CONFIRMATION
    /// in the activity ledger, the way an unknown-fate call waits); after
    /// their answer: `--not-delivered` released the key, so the call runs
    /// (once: an irreversible one through the activity ledger as always);
    /// `--delivered` and `--abandon` answer it from the ledger, not run.
    fn execute_after_confirmation(
        &self,
        ctx: &ToolContext<'_>,
        call: &ToolRequest,
        reason: &str,
    ) -> Result<ToolOutput, ToolError> {
        let (row, fresh) = self.enter(ctx, call)?;
        let blocked = || ToolError::NeedsConfirmation {
            tool: call.tool.clone(),
            idem_key: ctx.idempotency_key.to_string(),
        };
        match row.status {
            ToolCallStatus::Succeeded | ToolCallStatus::Failed if !fresh => return Ok(recorded(&row)),
            ToolCallStatus::Prepared => {
                let parked = Parked {
                    idem_key: ctx.idempotency_key,
                    task_id: ctx.agent.as_str(),
                    action: &call.tool,
                    payload: &call.args,
                    reason,
                };
                let now = self.clock.now_ms();
                self.ledger(|db| self.calls.park_for_confirmation(db.conn(), &row.id, &parked, now))?;
                tracing::warn!(tool = %call.tool, idem_key = ctx.idempotency_key, reason, "call parked: a hook requires a human's confirmation");
                return Err(blocked());
            }
            _ => {}
        }
        // Parked before: the activity ledger holds the human's answer.
        if call.irreversible {
            // The ledger's own rules: waiting, DONE, FAILED — or released,
            // and then sent once under its INTENT.
            let output = self.attempts(ctx, call, &row.id)?;
            return self.settle(&row.id, output);
        }
        let answer = self.ledger(|db| self.gate.store().get(db.conn(), ctx.idempotency_key))?;
        let output = match answer {
            // Released (`--not-delivered`): every run from now on is
            // counted like a replay, so a tool that kills the process is
            // not run at every boot for ever (found by a review).
            None => return self.replay(ctx, call, &row.id, ReplayOf::Approval),
            Some(a) => match a.status {
                ActivityStatus::Done => ToolOutput {
                    ok: true,
                    output: format!(
                        "done {} (a human confirmed it; not run here)",
                        a.provider_ref.unwrap_or_default()
                    ),
                },
                ActivityStatus::Failed => ToolOutput {
                    ok: false,
                    output: format!("not run: {}", a.error.unwrap_or_default()),
                },
                ActivityStatus::Intent | ActivityStatus::NeedsConfirmation => return Err(blocked()),
            },
        };
        self.settle(&row.id, output)
    }
}
