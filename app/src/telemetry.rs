//! Telemetry: a JSONL event exporter with seed 000's envelope
//! (`event_type`, `timestamp_ms`, `session_id`, `agent_id`, `payload`), and
//! the `tracing` subscriber set-up.
//!
//! Invariant: each event is one complete line, written with a single
//! `write_all` on a file opened in append mode and flushed before `emit`
//! returns, so concurrent emitters never interleave within a line and a
//! reader sees whole lines. This is observability, not runtime state: it
//! goes through `std::fs`, not the system crate's `Fs` seam, is never
//! fsynced, and a failure to write it must not stop an agent (callers log
//! and continue).
//!
//! [`Telemetry`] is every configured sink of the envelopes: the JSONL file
//! and seed 000's HTTP POST ([`HttpSink`]). The POST never holds the
//! caller: an envelope is queued (bounded, `http_queue_events`) for one
//! thread that posts it with a total timeout; a full queue drops it and
//! counts the drop (said at exit).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::config::TelemetryConfig;

/// The lifecycle events exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    AgentStart,
    AgentStop,
    TurnStart,
    TurnEnd,
    PreToolUse,
    PostToolUse,
    ToolFailure,
    Retry,
    /// One provider attempt: model, attempt, tokens, elapsed, outcome.
    ProviderCall,
}

/// One exported line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Envelope<'a> {
    pub event_type: EventType,
    pub timestamp_ms: u64,
    /// None (`null`) for events outside a session (a provider retry).
    pub session_id: Option<&'a str>,
    pub agent_id: &'a str,
    /// The turn's OpenTelemetry trace id (hex; `crate::otel::trace_id`),
    /// the same whether or not traces are exported; absent outside a turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    pub payload: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("{path}: cannot open telemetry file: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot append telemetry event: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode telemetry event: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Appends events to one JSONL file.
#[derive(Debug)]
pub struct JsonlExporter {
    path: PathBuf,
    file: Mutex<File>,
}

impl JsonlExporter {
    /// Open (create) `path` for appending; its directory is created too.
    pub fn open(path: &Path) -> Result<JsonlExporter, TelemetryError> {
        let open_err = |source| TelemetryError::Open {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(open_err)?;
        }
        // Events carry prompts and tool arguments: the owner's only.
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(open_err)?;
        Ok(JsonlExporter {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one event stamped with the wall clock.
    pub fn emit(
        &self,
        event_type: EventType,
        session_id: Option<&str>,
        agent_id: &str,
        payload: Value,
    ) -> Result<(), TelemetryError> {
        self.write(&Envelope {
            event_type,
            timestamp_ms: now_ms(),
            session_id,
            agent_id,
            trace_id: None,
            payload,
        })
    }

    /// Append `envelope` as one line.
    pub fn write(&self, envelope: &Envelope<'_>) -> Result<(), TelemetryError> {
        let mut line = serde_json::to_vec(envelope)?;
        line.push(b'\n');
        let mut file = self.lock();
        file.write_all(&line)
            .and_then(|()| file.flush())
            .map_err(|source| TelemetryError::Write {
                path: self.path.clone(),
                source,
            })
    }

    fn lock(&self) -> MutexGuard<'_, File> {
        // A panic mid-write leaves at worst a torn line, which a reader of
        // telemetry tolerates; the handle itself is fine.
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Every configured sink of the envelopes.
#[derive(Debug, Default)]
pub struct Telemetry {
    jsonl: Option<JsonlExporter>,
    http: Option<HttpSink>,
}

impl Telemetry {
    /// The sinks `config` turns on; None when it turns none on.
    pub fn open(config: &TelemetryConfig) -> Result<Option<Telemetry>, TelemetryError> {
        let jsonl = match &config.events_jsonl {
            Some(path) => Some(JsonlExporter::open(path)?),
            None => None,
        };
        let http = config.http_endpoint.as_ref().map(|url| {
            HttpSink::start(
                url,
                Duration::from_millis(config.http_timeout_ms),
                config.http_queue_events,
            )
        });
        Ok((jsonl.is_some() || http.is_some()).then_some(Telemetry { jsonl, http }))
    }

    /// Hand `envelope` to every sink (the POST is queued, not awaited).
    pub fn write(&self, envelope: &Envelope<'_>) -> Result<(), TelemetryError> {
        if let Some(http) = &self.http {
            http.post(serde_json::to_vec(envelope)?);
        }
        match &self.jsonl {
            Some(jsonl) => jsonl.write(envelope),
            None => Ok(()),
        }
    }
}

/// Seed 000's HTTP POST sink: one thread posts queued envelopes.
///
/// Invariant: every envelope handed to [`HttpSink::post`] is accounted
/// for when the sink is dropped: landed, refused or failed, dropped at a
/// full queue, or abandoned at exit; all but the landed are said in one
/// `warn` line with their counts.
#[derive(Debug)]
pub struct HttpSink {
    /// None once dropping: the thread drains what is queued and ends.
    tx: Option<mpsc::SyncSender<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dropped: AtomicU64,
    /// Queued, and what the thread made of them.
    counts: Arc<PostCounts>,
    url: String,
    timeout: Duration,
}

#[derive(Debug, Default)]
struct PostCounts {
    queued: AtomicU64,
    landed: AtomicU64,
    failed: AtomicU64,
}

impl HttpSink {
    /// POST each envelope to `url` (JSON), each within `timeout`; at most
    /// `queue` wait.
    pub fn start(url: &str, timeout: Duration, queue: usize) -> HttpSink {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(queue.max(1));
        let agent = crate::http::agent(url, timeout, 0);
        let counts = Arc::new(PostCounts::default());
        let thread = {
            let (url, counts) = (url.to_string(), counts.clone());
            std::thread::Builder::new()
                .name("telemetry-http".into())
                .spawn(move || {
                    for body in rx {
                        let sent = agent
                            .post(&url)
                            .header("Content-Type", "application/json")
                            .send(&body[..]);
                        let outcome = match sent {
                            Ok(r) if r.status().is_success() => &counts.landed,
                            Ok(r) => {
                                tracing::debug!(status = r.status().as_u16(), "telemetry POST refused");
                                &counts.failed
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "telemetry POST failed");
                                &counts.failed
                            }
                        };
                        outcome.fetch_add(1, Ordering::Relaxed);
                    }
                })
        };
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the telemetry POST thread; events are not posted");
                None
            }
        };
        HttpSink {
            tx: thread.as_ref().map(|_| tx),
            thread,
            dropped: AtomicU64::new(0),
            counts,
            url: url.to_string(),
            timeout,
        }
    }

    /// Queue `body`; a full queue drops it (counted), never waits.
    pub fn post(&self, body: Vec<u8>) {
        let queued = self.tx.as_ref().is_some_and(|tx| tx.try_send(body).is_ok());
        let count = match queued {
            true => &self.counts.queued,
            false => &self.dropped,
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// Envelopes dropped so far (queue full, or no thread).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for HttpSink {
    /// The queue drains, each POST bounded by its timeout; past about two
    /// timeouts the rest is abandoned (the thread is detached) and counted
    /// with the failed and the dropped in one warning (found by a review:
    /// abandoned envelopes were lost without a word).
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let deadline = std::time::Instant::now() + self.timeout * 2;
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        let c = &self.counts;
        let (landed, failed) = (c.landed.load(Ordering::Relaxed), c.failed.load(Ordering::Relaxed));
        let abandoned = c.queued.load(Ordering::Relaxed).saturating_sub(landed + failed);
        let dropped = self.dropped();
        if failed + abandoned + dropped > 0 {
            tracing::warn!(
                url = %self.url,
                landed,
                failed,
                abandoned,
                dropped,
                "telemetry POSTs that did not land (failed or refused; abandoned at exit; dropped at a full queue)"
            );
        }
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured only on a terminal, never with
    /// `NO_COLOR` set).
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields): for
    /// log shippers and `jq`.
    Json,
}

impl LogFormat {
    /// The variable that chooses the format when no flag does
    /// (`--log-format` wins).
    pub const ENV: &'static str = "DURABLE_AGENT_LOG_FORMAT";
}

/// Whether log lines may carry ANSI colour: only to a terminal, and never
/// when `NO_COLOR` is set to anything non-empty (no-color.org).
pub fn colour_allowed(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// Log to stderr in `format`, filtered by `RUST_LOG` (default `info`). A
/// second call (or a subscriber set elsewhere) is a no-op.
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{filter, EnvFilter, Layer};
    let env = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let no_color = std::env::var("NO_COLOR").ok();
    let ansi = colour_allowed(std::io::stderr().is_terminal(), no_color.as_deref());
    let wire = filter::filter_fn(|meta| !is_wire_dump(meta.target(), *meta.level()));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => layer.with_ansi(ansi).with_filter(env).with_filter(wire).boxed(),
        LogFormat::Json => layer
            .json()
            .with_ansi(false)
            .with_filter(env)
            .with_filter(wire)
            .boxed(),
    };
    let result = tracing_subscriber::registry().with(fmt).try_init();
    if result.is_err() {
        tracing::debug!("tracing subscriber already set");
    }
}

/// Events dropped whatever `RUST_LOG` says, because no log level may carry
/// a secret: the HTTP client's wire dump (`ureq_proto`'s `log_data`
/// hex-dumps every request at trace level, `Authorization` included) and
/// its protocol state at debug, and the TLS library below info. ureq's own
/// debug lines redact headers and stay.
pub fn is_wire_dump(target: &str, level: tracing::Level) -> bool {
    let below = |cap: tracing::Level| level > cap; // TRACE > DEBUG > INFO
    (target.starts_with("ureq_proto") && below(tracing::Level::INFO))
        || (target.starts_with("ureq") && below(tracing::Level::DEBUG))
        || (target.starts_with("rustls") && below(tracing::Level::INFO))
}

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        use super::colour_allowed;
        assert!(colour_allowed(true, None));
        assert!(colour_allowed(true, Some("")), "an empty NO_COLOR does not count");
        assert!(!colour_allowed(true, Some("1")));
        assert!(!colour_allowed(false, None), "a file or a pipe gets no escapes");
    }
    use super::*;

    #[test]
    fn events_are_whole_json_lines_with_the_envelope() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sub/events.jsonl");
        let exporter = JsonlExporter::open(&path)?;
        exporter.emit(
            EventType::PreToolUse,
            Some("s1"),
            "a1",
            serde_json::json!({"tool_name": "lookup"}),
        )?;
        exporter.write(&Envelope {
            event_type: EventType::AgentStop,
            timestamp_ms: 7,
            session_id: None,
            agent_id: "a1",
            trace_id: None,
            payload: Value::Null,
        })?;
        drop(exporter);
        // Reopening appends.
        JsonlExporter::open(&path)?.emit(EventType::TurnEnd, Some("s1"), "a1", Value::Null)?;
        let text = std::fs::read_to_string(&path)?;
        let lines: Vec<Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["event_type"], "pre_tool_use");
        assert_eq!(lines[0]["session_id"], "s1");
        assert_eq!(lines[0]["payload"]["tool_name"], "lookup");
        assert!(lines[0]["timestamp_ms"].as_u64().is_some_and(|t| t > 0));
        assert_eq!(
            lines[1],
            serde_json::json!({"event_type": "agent_stop", "timestamp_ms": 7, "session_id": null, "agent_id": "a1", "payload": null})
        );
        assert_eq!(lines[2]["event_type"], "turn_end");
        Ok(())
    }
}
