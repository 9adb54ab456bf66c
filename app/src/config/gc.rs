//! The `[gc]` section: how `serve` keeps a root tidy — settled triggers
//! and ledger rows collected after `ttl_ms`, the bodies of settled ledger
//! rows stripped after the shorter `payload_ttl_ms`, every `period_ms`.
//!
//! Invariant: a section that passed [`validate_gc`] has every duration
//! positive, strips no later than it collects (`payload_ttl_ms <=
//! ttl_ms`), and ticks at least once per `ttl_ms`; every error names its
//! key path (`gc.ttl_ms`). Durations are milliseconds, like every other
//! duration in this file (`timeout_ms`, `backoff_base_ms`).

use durable_agent::system::DEFAULT_GC_TTL_MS;
use serde::Deserialize;

/// Seed 001's privacy note asks for bodies to go sooner than rows: an
/// hour after the row settled.
pub const DEFAULT_PAYLOAD_TTL_MS: u64 = 3_600_000;

/// How often `serve` runs the GC by default.
pub const DEFAULT_GC_PERIOD_MS: u64 = 10 * 60_000;

/// Shortest period accepted: a GC pass is a few transactions on the
/// worker, between requests; more often than this is busy work.
pub const MIN_GC_PERIOD_MS: u64 = 10;

/// `[gc]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcConfig {
    /// `false`: `serve` never collects (`durable-agent gc` still does).
    #[serde(default = "defaults::enabled")]
    pub enabled: bool,
    /// Settled rows older than this are deleted. Must outlive every retry
    /// and resume horizon: a collected key no longer deduplicates.
    #[serde(default = "defaults::ttl_ms")]
    pub ttl_ms: u64,
    /// Bodies (arguments, payloads, results) of settled rows older than
    /// this are replaced by `{"stripped": true}`.
    #[serde(default = "defaults::payload_ttl_ms")]
    pub payload_ttl_ms: u64,
    /// How often `serve` runs it (the first pass soon after boot).
    #[serde(default = "defaults::period_ms")]
    pub period_ms: u64,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig {
            enabled: defaults::enabled(),
            ttl_ms: defaults::ttl_ms(),
            payload_ttl_ms: defaults::payload_ttl_ms(),
            period_ms: defaults::period_ms(),
        }
    }
}

mod defaults {
    pub fn enabled() -> bool {
        true
    }
    pub fn ttl_ms() -> u64 {
        super::DEFAULT_GC_TTL_MS
    }
    pub fn payload_ttl_ms() -> u64 {
        super::DEFAULT_PAYLOAD_TTL_MS.min(ttl_ms())
    }
    pub fn period_ms() -> u64 {
        super::DEFAULT_GC_PERIOD_MS
    }
}

/// The rules of `[gc]`; the offending key path and what is wrong.
pub(super) fn validate_gc(gc: &GcConfig) -> Result<(), (String, String)> {
    let err = |key: &str, msg: String| Err((format!("gc.{key}"), msg));
    if gc.ttl_ms == 0 {
        return err(
            "ttl_ms",
            "must be > 0 (set `enabled = false` to stop collecting)".into(),
        );
    }
    if gc.payload_ttl_ms == 0 {
        return err("payload_ttl_ms", "must be > 0".into());
    }
    if gc.payload_ttl_ms > gc.ttl_ms {
        return err(
            "payload_ttl_ms",
            format!(
                "{} exceeds ttl_ms = {}: rows would be deleted before their bodies are stripped",
                gc.payload_ttl_ms, gc.ttl_ms
            ),
        );
    }
    if gc.period_ms < MIN_GC_PERIOD_MS {
        return err("period_ms", format!("must be >= {MIN_GC_PERIOD_MS}"));
    }
    if gc.period_ms > gc.ttl_ms {
        return err(
            "period_ms",
            format!(
                "{} exceeds ttl_ms = {}: rows would outlive their TTL by more than the TTL",
                gc.period_ms, gc.ttl_ms
            ),
        );
    }
    Ok(())
}
