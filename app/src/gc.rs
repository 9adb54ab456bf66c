//! `durable-agent gc` and `[gc]`'s side of GC: the request the config asks
//! for, the CLI's duration syntax and table. The pass itself, and its
//! schedule in `serve`, are the worker core's ([`durable_agent::worker::gc`]).
//!
//! Invariant: nothing here touches a store; it only shapes requests and
//! answers.

use serde_json::Value;

use crate::config::GcConfig;

pub use durable_agent::worker::gc::{
    collect, GcOutcome, GcRequest, Ticker, COLLECTED_TABLES, STRIPPED_TABLES,
};

/// The config's TTLs, `ttl_ms` overriding the row TTL (the payload TTL
/// then capped by it).
pub fn request_from_config(gc: &GcConfig, ttl_ms: Option<u64>) -> GcRequest {
    let ttl_ms = ttl_ms.unwrap_or(gc.ttl_ms);
    GcRequest {
        ttl_ms,
        payload_ttl_ms: gc.payload_ttl_ms.min(ttl_ms),
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
    use durable_agent::system::{SystemGcReport, SystemStripReport};

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
        let r = request_from_config(&gc, Some(1_000));
        assert_eq!((r.ttl_ms, r.payload_ttl_ms), (1_000, 1_000));
        let r = request_from_config(&gc, None);
        assert_eq!((r.ttl_ms, r.payload_ttl_ms), (gc.ttl_ms, gc.payload_ttl_ms));
    }
}
