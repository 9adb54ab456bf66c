//! Keeping a root tidy: one GC pass ([`collect`]) — settled triggers,
//! ledger rows (activities, tool calls with their attempts, runs) and
//! usage and error rows deleted after the TTL ([`System::gc`]), bodies of
//! settled ledger rows stripped after the shorter payload TTL
//! ([`System::strip_payloads`]) — run by `serve` on a schedule
//! ([`Ticker`]) and by `durable-agent gc` by hand (`POST /gc`, or on the
//! root directly when no daemon holds it).
//!
//! Invariant: a pass never collects or strips what recovery or a human
//! needs — INTENT and NEEDS_CONFIRMATION rows, in-flight tool calls,
//! PENDING and CLAIMED triggers, FAILED triggers blocked on a
//! confirmation, runs not settled (running, waiting for a human), and any
//! row of an agent with an open turn, a parked turn or unfinished work
//! (the system decides; see `durable_agent::system` admin docs). In `serve` it runs on the worker,
//! between requests, so no runtime step interleaves with it; the calls of
//! a turn in flight on another thread commit under the same connection
//! lock each pass transaction holds, and that turn's agent is kept.
//! Each table is one transaction: a crash leaves it all done or not done,
//! and the next pass finishes (every step is idempotent).

use std::time::{Duration, Instant};

use durable_agent::system::{System, SystemError, SystemGcReport, SystemStripReport};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::GcConfig;
use crate::ops::OpError;

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

impl GcRequest {
    /// The config's TTLs, `ttl_ms` overriding the row TTL (the payload
    /// TTL then capped by it).
    pub fn from_config(gc: &GcConfig, ttl_ms: Option<u64>) -> GcRequest {
        let ttl_ms = ttl_ms.unwrap_or(gc.ttl_ms);
        GcRequest {
            ttl_ms,
            payload_ttl_ms: gc.payload_ttl_ms.min(ttl_ms),
        }
    }
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

/// When `serve`'s next pass is due: soon after boot, then every period.
#[derive(Debug)]
pub struct Ticker {
    request: Option<GcRequest>,
    period: Duration,
    next: Instant,
}

impl Ticker {
    /// The schedule `gc` asks for, starting at `now` (off if disabled).
    pub fn new(gc: &GcConfig, now: Instant) -> Ticker {
        Ticker {
            request: gc.enabled.then(|| GcRequest::from_config(gc, None)),
            period: Duration::from_millis(gc.period_ms),
            next: now,
        }
    }

    /// The pass to run now, if one is due (and the next one scheduled).
    pub fn due(&mut self, now: Instant) -> Option<GcRequest> {
        let request = self.request?;
        if now < self.next {
            return None;
        }
        self.next = now + self.period;
        Some(request)
    }

    /// How long until the next pass (the worker's wait is no longer).
    pub fn until_next(&self, now: Instant) -> Option<Duration> {
        self.request.map(|_| self.next.saturating_duration_since(now))
    }
}

/// A duration as the CLI takes it: milliseconds, or a number with a unit
/// (`ms`, `s`, `m`, `h`, `d`): `90000`, `90s`, `24h`.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 90000, 90s, 30m, 24h, 7d)"))?;
    let scale: u64 = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("unknown unit {other:?} in {text:?} (ms, s, m, h or d)")),
    };
    match number.checked_mul(scale) {
        Some(0) => Err("a TTL must be > 0".into()),
        Some(ms) => Ok(ms),
        None => Err(format!("{text:?} is too long")),
    }
}

/// The CLI's table of a pass's answer (the JSON of [`GcOutcome::answer`]).
pub fn table(answer: &Value) -> String {
    let count = |group: &str, table: &str| {
        answer[group][table]
            .as_u64()
            .map_or("-".to_string(), |n| n.to_string())
    };
    let mut out = format!(
        "gc: rows settled over {} ms ago collected, bodies over {} ms ago stripped\n{:<20}{:>10}{:>10}\n",
        answer["ttl_ms"], answer["payload_ttl_ms"], "table", "collected", "stripped"
    );
    for table in COLLECTED_TABLES {
        out.push_str(&format!(
            "{table:<20}{:>10}{:>10}\n",
            count("collected", table),
            count("stripped", table)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_ms_or_a_unit_and_refuse_zero_and_garbage() {
        assert_eq!(parse_duration_ms("1500"), Ok(1_500));
        assert_eq!(parse_duration_ms("1500ms"), Ok(1_500));
        assert_eq!(parse_duration_ms("90s"), Ok(90_000));
        assert_eq!(parse_duration_ms("30m"), Ok(1_800_000));
        assert_eq!(parse_duration_ms("24h"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        for bad in ["", "0", "0s", "h", "12x", "-5", "99999999999999999999d"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_ticker_runs_soon_after_boot_then_every_period_and_never_when_off() {
        let t0 = Instant::now();
        let gc = GcConfig {
            period_ms: 1_000,
            ..GcConfig::default()
        };
        let mut ticker = Ticker::new(&gc, t0);
        assert!(ticker.due(t0).is_some(), "first pass at once");
        assert!(ticker.due(t0 + Duration::from_millis(999)).is_none());
        assert_eq!(
            ticker.until_next(t0 + Duration::from_millis(400)),
            Some(Duration::from_millis(600))
        );
        assert!(ticker.due(t0 + Duration::from_millis(1_000)).is_some());
        let mut off = Ticker::new(&GcConfig { enabled: false, ..gc }, t0);
        assert!(off.due(t0 + Duration::from_secs(3_600)).is_none());
        assert_eq!(off.until_next(t0), None);
    }

    #[test]
    fn the_table_prints_every_collected_table_in_the_counts_order() {
        let outcome = GcOutcome {
            ttl_ms: 10,
            payload_ttl_ms: 5,
            collected: SystemGcReport::default(),
            stripped: SystemStripReport::default(),
        };
        let tables: Vec<&str> = outcome.collected_counts().iter().map(|(t, _)| *t).collect();
        assert_eq!(tables, COLLECTED_TABLES);
        let printed = table(&outcome.answer());
        let rows: Vec<&str> = printed
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(rows, COLLECTED_TABLES, "{printed}");
        assert!(outcome.is_empty());
    }

    #[test]
    fn a_ttl_override_caps_the_payload_ttl() {
        let gc = GcConfig::default();
        let r = GcRequest::from_config(&gc, Some(1_000));
        assert_eq!((r.ttl_ms, r.payload_ttl_ms), (1_000, 1_000));
        let r = GcRequest::from_config(&gc, None);
        assert_eq!((r.ttl_ms, r.payload_ttl_ms), (gc.ttl_ms, gc.payload_ttl_ms));
    }
}
