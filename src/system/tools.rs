//! [`SystemTools`]: the agent loop's tool executor. Irreversible calls go
//! through the activity ledger ([`ActivityGate`]) under the idempotency key
//! the runtime derived for the call; reversible ones go straight to the
//! tools the system was booted with.
//!
//! Invariant: an irreversible side effect reaches the outside world only
//! through [`ActivityGate::execute`] — INTENT committed first, the key
//! carried to the provider, DONE/FAILED after — so it happens at most once
//! per key whatever crashes in between; an INTENT whose fate is unknown and
//! whose provider cannot deduplicate is reported as needing confirmation,
//! never re-sent.

use std::sync::Arc;

use crate::runtime::{ToolContext, ToolError, ToolExecutor, ToolOutput, ToolRequest};
use crate::store::activities::{ActivityGate, ActivityOutcome, IrreversibleCall};

use super::LogicalClock;

/// The executor [`super::System::boot`] gives the runtime.
#[derive(Debug, Clone)]
pub struct SystemTools {
    pub gate: ActivityGate,
    pub reversible: Arc<dyn ToolExecutor>,
    pub clock: Arc<dyn LogicalClock>,
}

impl ToolExecutor for SystemTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
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
            .map_err(|e| ToolError(format!("{} {}: {e}", call.tool, ctx.idempotency_key)))?;
        Ok(match outcome {
            ActivityOutcome::Done { provider_ref, .. } => ToolOutput {
                ok: true,
                output: format!("done {provider_ref}"),
            },
            ActivityOutcome::Failed { error, .. } => ToolOutput {
                ok: false,
                output: format!("failed: {error}"),
            },
            ActivityOutcome::NeedsConfirmation { idem_key } => ToolOutput {
                ok: false,
                output: format!("{idem_key} needs confirmation by a human"),
            },
        })
    }
}
