//! Tool execution behind the [`ToolExecutor`] trait, so the activity ledger
//! (INTENT before an irreversible side effect) can be plugged in without
//! touching the turn loop.
//!
//! Invariant: [`PureTools`] has no side effect at all; its output is a pure
//! function of the request. An executor tells a hard failure
//! ([`ToolError::Transient`]: retry may help) from an answer that says the
//! call failed (`ToolOutput { ok: false }`: the model's to read); how hard
//! failures are retried is a [`ToolRetries`] plan, whose waits the host
//! performs — nothing here reads a clock or sleeps.

use super::ids::{AgentId, SessionId};
use super::provider::ToolRequest;

/// Where a tool call happens.
#[derive(Debug, Clone, Copy)]
pub struct ToolContext<'a> {
    pub agent: &'a AgentId,
    pub session: &'a SessionId,
    /// `<session>-<seq of the tool.call entry>`: stable across restarts.
    pub call_id: &'a str,
    /// Key to hand to a dedup-capable external service, see
    /// [`idempotency_key`]: unlike `call_id` it is the same when a turn lost
    /// in a crash is run again and asks for the same call.
    pub idempotency_key: &'a str,
    /// Logical time (runtime clock ticks) of the `tool.call` entry: the only
    /// clock a ledger may use (no wall-clock time).
    pub now: u64,
}

/// The idempotency key of the `index`-th call of provider round `round`
/// in the turn of `session` identified by `turn` ([`turn_identity`]), for
/// `call`. A turn lost in a crash is not in the conversation, so running
/// it again — even after other turns completed — has the same identity;
/// if it asks for the same call (same tool, same arguments) it gets the
/// same key and the activity ledger performs the side effect at most
/// once. A different call gets a different key.
pub fn idempotency_key(
    session: &SessionId,
    turn: &str,
    round: u32,
    index: usize,
    call: &ToolRequest,
) -> String {
    let content = format!("{}\n{}", call.tool, call.args);
    format!(
        "{session}-t{turn}-r{round}-c{index}-{:016x}",
        super::ids::fnv1a(content.as_bytes())
    )
}

/// A turn's identity within its session: its prompt (hashed) and how many
/// completed turns had that prompt before. Not the turn count: a lost turn
/// retried after the agent did other turns must keep its keys (else its
/// irreversible calls could happen twice); two completed turns with the
/// same prompt are two turns, with different keys.
pub fn turn_identity(prompt: &str, completed_with_same_prompt: usize) -> String {
    format!(
        "{:016x}.{completed_with_same_prompt}",
        super::ids::fnv1a(prompt.as_bytes())
    )
}

/// The idempotency key of the `index`-th call of round `round` in the turn
/// of `session` performing `work` (see [`super::Runtime::run_work_turn`]):
/// independent of the session's turn count, so a trigger re-claimed after
/// a crash — whose turn may now be the agent's n-th instead of its m-th —
/// presents the same keys for the same calls. The session is in the key
/// because work ids are scoped to their agent (the API's `work_id` is the
/// caller's): without it, a second agent's call in a work of the same id
/// was answered from the first agent's ledger entry and never sent.
pub fn work_idempotency_key(
    session: &SessionId,
    work: &str,
    round: u32,
    index: usize,
    call: &ToolRequest,
) -> String {
    let content = format!("{}\n{}", call.tool, call.args);
    format!(
        "{work}-r{round}-c{index}-{:016x}@{session}",
        super::ids::fnv1a(content.as_bytes())
    )
}

/// A tool's result (a failed tool is a normal result with `ok: false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub ok: bool,
    pub output: String,
}

/// A tool call that produced no result for the turn.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The executor itself failed (e.g. its ledger I/O): outcome unknown.
    #[error("{0}")]
    Failed(String),
    /// An irreversible call whose earlier attempt (a turn lost in a crash)
    /// has an unknown fate, at an endpoint that cannot deduplicate: only a
    /// human can say whether it happened, so the work that depends on it
    /// stops here until they do (seed 001: confirm, never re-send blindly).
    /// Nothing is unknown about the runtime's own state: not an I/O error.
    #[error("{tool} {idem_key}: its earlier attempt's fate is unknown and the endpoint cannot deduplicate; it needs confirmation by a human")]
    NeedsConfirmation { tool: String, idem_key: String },
    /// A hard failure of the tool itself — it could not be reached, or
    /// answered with a server error — as opposed to an answer that says the
    /// call failed (`ToolOutput { ok: false }`, which goes to the model).
    /// The executor may try again ([`ToolRetries`]); nothing about the
    /// runtime's state is unknown, so a turn that gets one answers the
    /// model with it as the call's failed result.
    #[error("{0}")]
    Transient(String),
}

/// Runs tool calls for the turn loop.
pub trait ToolExecutor: Send + Sync + std::fmt::Debug {
    fn execute(&self, ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError>;

    /// Run a call whose logged decision says a human must confirm it
    /// first (a `require_confirmation` hook, `reason` says which): an
    /// executor with a ledger a human answers (`System::confirm`) parks it
    /// there and runs it once they approve. One without refuses, so the
    /// call never runs unconfirmed: the turn stops at it.
    fn execute_after_confirmation(
        &self,
        ctx: &ToolContext<'_>,
        call: &ToolRequest,
        reason: &str,
    ) -> Result<ToolOutput, ToolError> {
        tracing::warn!(tool = %call.tool, idem_key = ctx.idempotency_key, reason, "a call that needs confirmation reached an executor with nowhere to park it");
        Err(ToolError::NeedsConfirmation {
            tool: call.tool.clone(),
            idem_key: ctx.idempotency_key.to_string(),
        })
    }
}

/// How a tool's hard failures ([`ToolError::Transient`]) are retried: the
/// plan comes from configuration, the wait from the host (no clock is read
/// and nothing sleeps in the core).
///
/// Invariant for implementations: an irreversible call is retried only at
/// an endpoint that deduplicates by the call's idempotency key — every
/// attempt carries the same key — and even then the activity ledger
/// decides each re-send (an INTENT without dedup becomes
/// NEEDS_CONFIRMATION, never a second blind send).
pub trait ToolRetries: Send + Sync + std::fmt::Debug {
    /// The wait in milliseconds before attempt `next_attempt` (2 for the
    /// first retry) of `call` after a hard failure; `None`: no more.
    fn delay_before(&self, call: &ToolRequest, next_attempt: u32) -> Option<u64>;
    /// Wait `delay_ms` before the next attempt.
    fn wait(&self, delay_ms: u64);
}

/// Never retries: a hard failure is the call's result at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRetries;

impl ToolRetries for NoRetries {
    fn delay_before(&self, _call: &ToolRequest, _next_attempt: u32) -> Option<u64> {
        None
    }
    fn wait(&self, _delay_ms: u64) {}
}

/// The default executor: answers deterministically, touches nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct PureTools;

impl ToolExecutor for PureTools {
    fn execute(&self, _ctx: &ToolContext<'_>, call: &ToolRequest) -> Result<ToolOutput, ToolError> {
        let arg = |k: &str| {
            call.args
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string()
        };
        let (ok, output) = match call.tool.as_str() {
            "lookup" => (true, format!("value of {}", arg("key"))),
            "write_note" => (true, "noted".to_string()),
            "send_email" => (true, format!("sent to {}", arg("to"))),
            other => (false, format!("unknown tool {other}")),
        };
        Ok(ToolOutput { ok, output })
    }
}
