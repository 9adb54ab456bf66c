//! The daemon's provider and tool executor.
//!
//! - [`FlakyProvider`]: the deterministic fake LLM, failing a seeded share
//!   of completions (a timeout, a 5xx): the turn is abandoned and retried.
//! - [`LedgerTools`]: irreversible tools go through the activity ledger
//!   (INTENT committed before the side effect, the runtime's stable call id
//!   as idempotency key), pure tools answer directly.
//!
//! Invariant: an irreversible side effect reaches the world only through
//! [`ActivityGate::execute`], so it happens at most once per
//! key whatever crashes in between.

use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::runtime::{
    FakeProvider, Provider, ProviderError, ProviderReply, ProviderRequest, PureTools, ToolContext, ToolError,
    ToolExecutor, ToolOutput, ToolRequest,
};
use crate::store::activities::{ActivityGate, ActivityOutcome, IrreversibleCall};

use super::DaemonClock;

/// The fake provider, failing each completion with probability `failure`.
#[derive(Debug)]
pub struct FlakyProvider {
    inner: FakeProvider,
    failure: f64,
    rng: Mutex<ChaCha8Rng>,
}

impl FlakyProvider {
    pub fn new(seed: u64, boot: u32, failure: f64) -> Self {
        FlakyProvider {
            inner: FakeProvider::new(seed),
            failure: failure.clamp(0.0, 1.0),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed ^ (u64::from(boot) << 48) ^ 0xf1a4)),
        }
    }
}

impl Provider for FlakyProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        // The rng is plain data: a poisoned lock (panic elsewhere) is usable.
        let fail = self
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random_bool(self.failure);
        if fail {
            return Err(ProviderError("simulated provider timeout".into()));
        }
        self.inner.complete(request)
    }
}

/// Tool executor: irreversible tools through the activity ledger's gate
/// (its own connection to the daemon's database), against the world.
#[derive(Debug, Clone)]
pub struct LedgerTools {
    pub gate: ActivityGate,
    pub clock: DaemonClock,
}

impl ToolExecutor for LedgerTools {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        if !call.irreversible {
            return PureTools.execute(ctx, call);
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
