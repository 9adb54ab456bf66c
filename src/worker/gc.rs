//! One GC pass ([`collect`]) — settled triggers, ledger rows (activities,
//! tool calls with their attempts, runs) and usage and error rows deleted
//! after the TTL ([`System::gc`]), bodies of settled ledger rows stripped
//! after the shorter payload TTL ([`System::strip_payloads`]) — run by the
//! worker on a schedule ([`Ticker`]) and by `durable-agent gc` by hand
//! (`POST /gc`, or on the root directly when no daemon holds it).
//!
//! Invariant: a pass never collects or strips what recovery or a human
//! needs — INTENT and NEEDS_CONFIRMATION rows, in-flight tool calls,
//! PENDING and CLAIMED triggers, FAILED triggers blocked on a
//! confirmation, runs not settled (running, waiting for a human), and any
//! row of an agent with an open turn, a parked turn or unfinished work
//! (the system decides; see `crate::system` admin docs). The worker runs
//! it between its steps, so no runtime step interleaves with it; the calls
//! of a turn in flight elsewhere commit under the same connection lock each
//! pass transaction holds, and that turn's agent is kept. Each table is one
//! transaction: a crash leaves it all done or not done, and the next pass
//! finishes (every step is idempotent).

use crate::system::{System, SystemError, SystemGcReport, SystemStripReport};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::ops::OpError;

/// The TTLs of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    /// Settled rows older than this are deleted.
    pub ttl_ms: u64,
    /// Bodies of settled rows older than this are stripped (capped at
    /// `ttl_ms`: a body never outlives its row's deletion by asking).
    pub payload_ttl_ms: u64,
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcOutcome {
    pub ttl_ms: u64,
    pub payload_ttl_ms: u64,
    pub collected: SystemGcReport,
    pub stripped: SystemStripReport,
}

/// The tables a pass collects from, in the order the CLI prints them.
pub const COLLECTED_TABLES: [&str; 7] = [
    "triggers",
    "activity_log",
    "tool_calls",
    "tool_call_attempts",
    "runs",
    "token_usage",
    "errors",
];

/// The tables whose settled bodies a pass strips.
pub const STRIPPED_TABLES: [&str; 2] = ["activity_log", "tool_calls"];

impl GcOutcome {
    /// Rows deleted per table (in [`COLLECTED_TABLES`] order).
    pub fn collected_counts(&self) -> [(&'static str, u64); 7] {
        let c = &self.collected;
        [
            ("triggers", c.triggers.deleted.len() as u64),
            ("activity_log", c.activities.deleted.len() as u64),
            ("tool_calls", c.tool_calls.calls.len() as u64),
            ("tool_call_attempts", c.tool_calls.attempts),
            ("runs", c.tool_calls.runs.len() as u64),
            ("token_usage", c.usage.token_usage),
            ("errors", c.usage.errors),
        ]
    }

    /// Rows whose bodies were stripped per table.
    pub fn stripped_counts(&self) -> [(&'static str, u64); 2] {
        [
            ("activity_log", self.stripped.activities.stripped.len() as u64),
            ("tool_calls", self.stripped.tool_calls.stripped.len() as u64),
        ]
    }

    /// The API's answer: the counts per table, then the keys.
    pub fn answer(&self) -> Value {
        let counts = |c: &[(&str, u64)]| c.iter().map(|(t, n)| (t.to_string(), json!(n))).collect();
        json!({
            "ttl_ms": self.ttl_ms,
            "payload_ttl_ms": self.payload_ttl_ms,
            "collected": Value::Object(counts(&self.collected_counts())),
            "stripped": Value::Object(counts(&self.stripped_counts())),
            "detail": {"collected": self.collected, "stripped": self.stripped},
        })
    }

    /// Whether the pass changed anything.
    pub fn is_empty(&self) -> bool {
        self.collected_counts().iter().all(|(_, n)| *n == 0)
            && self.stripped_counts().iter().all(|(_, n)| *n == 0)
    }
}

/// One pass: collect, then strip (each store's step one transaction).
pub fn collect(system: &System, request: GcRequest) -> Result<GcOutcome, OpError> {
    if request.ttl_ms == 0 || request.payload_ttl_ms == 0 {
        return Err(OpError::BadRequest(
            "`ttl_ms` and `payload_ttl_ms` must be > 0".into(),
        ));
    }
    let payload_ttl_ms = request.payload_ttl_ms.min(request.ttl_ms);
    let collected = system.gc(request.ttl_ms).map_err(system_error)?;
    let stripped = system.strip_payloads(payload_ttl_ms).map_err(system_error)?;
    let outcome = GcOutcome {
        ttl_ms: request.ttl_ms,
        payload_ttl_ms,
        collected,
        stripped,
    };
    if outcome.is_empty() {
        tracing::debug!(ttl_ms = request.ttl_ms, payload_ttl_ms, "gc: nothing to collect");
    } else {
        let [(_, triggers), (_, activities), (_, tool_calls), (_, attempts), (_, runs), (_, token_usage), (_, errors)] =
            outcome.collected_counts();
        let [(_, stripped_activities), (_, stripped_calls)] = outcome.stripped_counts();
        tracing::info!(
            triggers,
            activities,
            tool_calls,
            attempts,
            runs,
            token_usage,
            errors,
            stripped_activities,
            stripped_calls,
            ttl_ms = request.ttl_ms,
            payload_ttl_ms,
            "gc: collected settled rows and stripped settled bodies"
        );
    }
    Ok(outcome)
}

fn system_error(e: SystemError) -> OpError {
    match e {
        // A SQLite failure's commit may have happened: unknown.
        SystemError::Store(e) => e.into(),
        SystemError::Runtime(e) => e.into(),
        e => OpError::UnknownOutcome(e.to_string()),
    }
}

/// When the worker's next pass is due: soon after boot, then every
/// period, in the system clock's milliseconds.
#[derive(Debug)]
pub struct Ticker {
    request: Option<GcRequest>,
    period_ms: u64,
    next_ms: u64,
}

impl Ticker {
    /// Passes of `request` every `period_ms` from `now_ms` (`None`: off).
    pub fn new(request: Option<GcRequest>, period_ms: u64, now_ms: u64) -> Ticker {
        Ticker {
            request,
            period_ms,
            next_ms: now_ms,
        }
    }

    /// The pass to run now, if one is due (and the next one scheduled).
    pub fn due(&mut self, now_ms: u64) -> Option<GcRequest> {
        let request = self.request?;
        if now_ms < self.next_ms {
            return None;
        }
        self.next_ms = now_ms.saturating_add(self.period_ms);
        Some(request)
    }

    /// Milliseconds until the next pass (the worker's wait is no longer).
    pub fn until_next_ms(&self, now_ms: u64) -> Option<u64> {
        self.request.map(|_| self.next_ms.saturating_sub(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ticker_runs_soon_after_boot_then_every_period_and_never_when_off() {
        let t0 = 5_000;
        let request = GcRequest {
            ttl_ms: 10,
            payload_ttl_ms: 5,
        };
        let mut ticker = Ticker::new(Some(request), 1_000, t0);
        assert!(ticker.due(t0).is_some(), "first pass at once");
        assert!(ticker.due(t0 + 999).is_none());
        assert_eq!(ticker.until_next_ms(t0 + 400), Some(600));
        assert!(ticker.due(t0 + 1_000).is_some());
        let mut off = Ticker::new(None, 1_000, t0);
        assert!(off.due(t0 + 3_600_000).is_none());
        assert_eq!(off.until_next_ms(t0), None);
    }
}
