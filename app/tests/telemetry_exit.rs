//! Every envelope the HTTP telemetry sink was handed is accounted for at
//! exit (app/README.md, Telemetry: "lost lines are logged"). Found by a
//! review: `Drop for HttpSink` waited about two `http_timeout_ms` and then
//! detached the POST thread with what was still queued, counted nowhere,
//! and the thread's own warning never ran; with a collector that accepts
//! connections and never answers, a `run` lost its events and said
//! nothing.

use std::io::Write;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durable_agent_cli::telemetry::HttpSink;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn envelopes_abandoned_at_exit_are_said_lost() -> Result<(), Box<dyn std::error::Error>> {
    // A collector that never answers: a loopback listener that is never
    // accepted from (the kernel completes the handshake; no reply comes).
    let collector = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/events", collector.local_addr()?);

    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let started = Instant::now();
    let dropped = tracing::subscriber::with_default(subscriber, || {
        let sink = HttpSink::start(&url, Duration::from_millis(300), 64);
        for i in 0..10 {
            sink.post(format!("{{\"event_type\":\"turn_end\",\"n\":{i}}}").into_bytes());
        }
        let dropped = sink.dropped();
        drop(sink); // what a `run` does at exit
        dropped
    });
    let waited = started.elapsed();
    assert_eq!(dropped, 0, "the queue (64) was never full");
    assert!(waited < Duration::from_secs(3), "drop took {waited:?}");
    let text = String::from_utf8_lossy(&logs.0.lock().map(|v| v.clone()).unwrap_or_default()).to_string();
    // 10 queued for a collector that never answers: at most 2 attempted
    // (each bounded by 300 ms) before the sink gives up; all are said.
    let count = |name: &str| {
        text.split(&format!("{name}="))
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    assert!(text.contains("WARN"), "nothing was logged: {text:?}");
    let (failed, abandoned) = (count("failed"), count("abandoned"));
    assert_eq!(count("landed"), Some(0), "{text}");
    assert_eq!(failed.zip(abandoned).map(|(f, a)| f + a), Some(10), "{text}");
    assert!(abandoned.is_some_and(|a| a >= 8), "{text}");
    drop(collector);
    Ok(())
}

/// A full queue's drops are said at exit, with their count.
#[test]
fn a_full_queue_is_said_at_exit() -> Result<(), Box<dyn std::error::Error>> {
    let collector = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/events", collector.local_addr()?);
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let sink = HttpSink::start(&url, Duration::from_millis(300), 1);
        for _ in 0..10 {
            sink.post(b"{}".to_vec());
        }
        drop(sink);
    });
    let text = String::from_utf8_lossy(&logs.0.lock().map(|v| v.clone()).unwrap_or_default()).to_string();
    assert!(text.contains("WARN") && text.contains("dropped="), "{text:?}");
    drop(collector);
    Ok(())
}
