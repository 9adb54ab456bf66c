//! The `[telemetry]` section: the JSONL event file, the HTTP POST sink of
//! the same envelopes, and `[telemetry.otlp]`, OpenTelemetry traces over
//! OTLP/HTTP (see `crate::otel`).
//!
//! Invariant: a section that passed [`validate_telemetry`] has every URL
//! an `http://`/`https://` URL, every duration and queue bound positive,
//! an export batch no larger than its queue, and header names and values
//! an HTTP request can carry; every error names its key path
//! (`telemetry.otlp.timeout_ms`). Durations are milliseconds.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// Largest span queue accepted: spans are a few hundred bytes each, and a
/// queue that holds more than this is a memory leak when the receiver is
/// down, not a buffer.
pub const MAX_OTLP_QUEUE_SPANS: usize = 65_536;

/// Largest envelope queue of the HTTP sink (same reasoning).
pub const MAX_HTTP_QUEUE_EVENTS: usize = 65_536;

/// `[telemetry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Append one JSON event per line here (see `telemetry`).
    #[serde(default)]
    pub events_jsonl: Option<PathBuf>,
    /// POST each envelope (seed 000's `telemetry.http_endpoint`), from a
    /// bounded queue on a thread of its own.
    #[serde(default)]
    pub http_endpoint: Option<String>,
    /// Per POST, connect to answer.
    #[serde(default = "defaults::http_timeout_ms")]
    pub http_timeout_ms: u64,
    /// Envelopes waiting for the POST thread; a full queue drops (counted).
    #[serde(default = "defaults::http_queue_events")]
    pub http_queue_events: usize,
    /// OpenTelemetry traces: present (even empty) means on.
    #[serde(default)]
    pub otlp: Option<OtlpConfig>,
}

/// `[telemetry.otlp]`: where spans go and how much may wait for it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The traces URL (`…/v1/traces`, used as given). Unset: the standard
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`, else
    /// `http://localhost:4318/v1/traces`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Extra request headers. Secrets (an `Authorization`) belong in the
    /// standard `OTEL_EXPORTER_OTLP_HEADERS` variable, which is added to
    /// these (`k=v,k2=v2`), not in a config file that gets committed.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// One export request, connect to answer: the longest a slow or dead
    /// receiver holds the export thread (never a turn).
    #[serde(default = "defaults::otlp_timeout_ms")]
    pub timeout_ms: u64,
    /// Ended spans waiting for export; a full queue drops (counted).
    #[serde(default = "defaults::max_queue_spans")]
    pub max_queue_spans: usize,
    /// Spans per export request.
    #[serde(default = "defaults::max_export_batch_spans")]
    pub max_export_batch_spans: usize,
    /// How long an ended span may wait before its batch goes.
    #[serde(default = "defaults::scheduled_delay_ms")]
    pub scheduled_delay_ms: u64,
    /// At exit, the longest the last flush may take.
    #[serde(default = "defaults::shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// `service.name` of the spans' resource.
    #[serde(default = "defaults::service_name")]
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            events_jsonl: None,
            http_endpoint: None,
            http_timeout_ms: defaults::http_timeout_ms(),
            http_queue_events: defaults::http_queue_events(),
            otlp: None,
        }
    }
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: None,
            headers: BTreeMap::new(),
            timeout_ms: defaults::otlp_timeout_ms(),
            max_queue_spans: defaults::max_queue_spans(),
            max_export_batch_spans: defaults::max_export_batch_spans(),
            scheduled_delay_ms: defaults::scheduled_delay_ms(),
            shutdown_timeout_ms: defaults::shutdown_timeout_ms(),
            service_name: defaults::service_name(),
        }
    }
}

impl TelemetryConfig {
    /// One line for `check-config`: the sinks that are on.
    pub fn summary(&self) -> String {
        let mut on = Vec::new();
        if let Some(p) = &self.events_jsonl {
            on.push(format!("jsonl {}", p.display()));
        }
        if let Some(url) = &self.http_endpoint {
            on.push(format!("http {url}"));
        }
        if let Some(o) = &self.otlp {
            on.push(format!(
                "otlp {}",
                o.endpoint.as_deref().unwrap_or("(from OTEL_EXPORTER_OTLP_*)")
            ));
        }
        if on.is_empty() {
            "off".into()
        } else {
            on.join(", ")
        }
    }
}

mod defaults {
    pub fn http_timeout_ms() -> u64 {
        2_000
    }
    pub fn http_queue_events() -> usize {
        1_024
    }
    pub fn otlp_timeout_ms() -> u64 {
        2_000
    }
    pub fn max_queue_spans() -> usize {
        2_048
    }
    pub fn max_export_batch_spans() -> usize {
        512
    }
    pub fn scheduled_delay_ms() -> u64 {
        1_000
    }
    pub fn shutdown_timeout_ms() -> u64 {
        2_000
    }
    pub fn service_name() -> String {
        "durable-agent".into()
    }
}

/// The rules of `[telemetry]`; the offending key path and what is wrong.
pub(super) fn validate_telemetry(t: &TelemetryConfig) -> Result<(), (String, String)> {
    let err = |key: &str, msg: String| Err((format!("telemetry.{key}"), msg));
    if let Some(url) = &t.http_endpoint {
        if !super::is_http_url(url) {
            return err(
                "http_endpoint",
                format!("{url:?} is not an http:// or https:// URL"),
            );
        }
    }
    if t.http_timeout_ms == 0 {
        return err("http_timeout_ms", "must be > 0".into());
    }
    if t.http_queue_events == 0 || t.http_queue_events > MAX_HTTP_QUEUE_EVENTS {
        return err(
            "http_queue_events",
            format!("{} is not in 1..={MAX_HTTP_QUEUE_EVENTS}", t.http_queue_events),
        );
    }
    let Some(o) = &t.otlp else { return Ok(()) };
    if let Some(url) = &o.endpoint {
        if !super::is_http_url(url) || url.parse::<http::Uri>().is_err() {
            return err(
                "otlp.endpoint",
                format!("{url:?} is not an http:// or https:// URL"),
            );
        }
    }
    for (name, value) in &o.headers {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return err("otlp.headers", format!("{name:?} is not an HTTP header name"));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return err(
                &format!("otlp.headers.{name}"),
                "is not a valid HTTP header value (visible ASCII only)".into(),
            );
        }
    }
    for (key, ms) in [
        ("timeout_ms", o.timeout_ms),
        ("scheduled_delay_ms", o.scheduled_delay_ms),
        ("shutdown_timeout_ms", o.shutdown_timeout_ms),
    ] {
        if ms == 0 {
            return err(&format!("otlp.{key}"), "must be > 0".into());
        }
    }
    if o.max_queue_spans == 0 || o.max_queue_spans > MAX_OTLP_QUEUE_SPANS {
        return err(
            "otlp.max_queue_spans",
            format!("{} is not in 1..={MAX_OTLP_QUEUE_SPANS}", o.max_queue_spans),
        );
    }
    if o.max_export_batch_spans == 0 || o.max_export_batch_spans > o.max_queue_spans {
        return err(
            "otlp.max_export_batch_spans",
            format!(
                "{} is not in 1..=max_queue_spans ({})",
                o.max_export_batch_spans, o.max_queue_spans
            ),
        );
    }
    if o.service_name.trim().is_empty() {
        return err("otlp.service_name", "must not be empty".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    fn parse(telemetry: &str) -> Result<Config, ConfigError> {
        let text = format!("[provider]\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\n\n{telemetry}");
        Config::parse(std::path::Path::new("/x/agent.toml"), &text)
    }

    fn bad_key(telemetry: &str) -> Option<String> {
        match parse(telemetry) {
            Err(ConfigError::Invalid { key, .. }) => Some(key),
            _ => None,
        }
    }

    #[test]
    fn an_otlp_table_turns_traces_on_with_defaults_and_bad_values_name_their_key() {
        let config = parse("[telemetry.otlp]\n").unwrap();
        let otlp = config.telemetry.otlp.unwrap();
        assert_eq!(otlp.max_queue_spans, 2_048);
        assert!(parse("").unwrap().telemetry.otlp.is_none());
        let cases = [
            (
                "[telemetry.otlp]\nendpoint = \"ftp://x\"\n",
                "telemetry.otlp.endpoint",
            ),
            ("[telemetry.otlp]\ntimeout_ms = 0\n", "telemetry.otlp.timeout_ms"),
            (
                "[telemetry.otlp]\nmax_queue_spans = 0\n",
                "telemetry.otlp.max_queue_spans",
            ),
            (
                "[telemetry.otlp]\nmax_queue_spans = 10\nmax_export_batch_spans = 11\n",
                "telemetry.otlp.max_export_batch_spans",
            ),
            (
                "[telemetry.otlp]\nheaders = { \"a b\" = \"x\" }\n",
                "telemetry.otlp.headers",
            ),
            (
                "[telemetry.otlp]\nheaders = { a = \"x\\ny\" }\n",
                "telemetry.otlp.headers.a",
            ),
            (
                "[telemetry]\nhttp_endpoint = \"nope\"\n",
                "telemetry.http_endpoint",
            ),
            (
                "[telemetry]\nhttp_queue_events = 0\n",
                "telemetry.http_queue_events",
            ),
        ];
        for (text, key) in cases {
            assert_eq!(bad_key(text).as_deref(), Some(key), "{text}");
        }
    }
}
