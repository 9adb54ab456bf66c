//! `durable-agent serve`: the daemon on a root. One worker thread boots and
//! owns the [`System`] — every runtime and store call happens on it — and
//! runs the scheduler between requests; the HTTP API (see [`crate::api`])
//! hands each request to the worker over a channel and waits for its reply.
//!
//! Scheduler: every `poll_ms` (and after each request) the worker claims
//! the due triggers one at a time with a lease and fires each with
//! [`System::fire`] (its turn keyed by the work id `trigger:{dedup_key}`,
//! then acked DONE); a provider failure is acked failed, retried with the
//! trigger policy's backoff. A claim left by a crash or a stop is reclaimed
//! by the next boot, which holds the root lock, and its turn re-runs under
//! the same work id: a completed turn is not run again, and the activity
//! ledger decides every irreversible call it repeats.
//!
//! Recurring schedules ([`crate::schedule`]) are loaded after boot and
//! ticked before each scheduler pass: each due bucket becomes a trigger
//! (dedup key `scheduled:{id}:{bucket}`) that this same pass fires.
//!
//! Invariant: the system is used by the worker thread only, one operation
//! at a time; an operation with an unknown outcome stops the daemon
//! (fail-stop, exit 1) — restarting `serve` boots, and boot recovers.
//! Shutdown on SIGINT/SIGTERM: the worker finishes the operation in hand
//! (a provider call in flight is abandoned, see [`crate::interrupt`]),
//! stops, and the API answers 503 until it is closed.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use durable_agent::system::{BootReport, System};
use serde_json::{json, Value};

use crate::api;
use crate::boot::{boot, BootError};
use crate::config::Config;
use crate::interrupt::Stop;
use crate::ops::{self, OpError, Request};
use crate::schedule::Schedules;
use crate::server::{json_response, respond, LoopbackServer, Recorded, ServerError};

/// Scheduler timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeSettings {
    /// How often the worker looks for due triggers when idle.
    pub poll_ms: u64,
    /// A claim's lease: longer than any turn (the root lock already keeps
    /// other processes out; the lease only matters to the next boot).
    pub lease_ms: u64,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            poll_ms: 100,
            lease_ms: 15 * 60_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Boot(#[from] BootError),
    #[error("API: {0}")]
    Server(#[from] ServerError),
    #[error("cannot start the worker thread: {0}")]
    Thread(std::io::Error),
    #[error("the worker thread panicked")]
    WorkerPanicked,
    #[error("stopped: {0}")]
    Fatal(OpError),
}

struct Envelope {
    request: Request,
    reply: mpsc::SyncSender<Result<Value, OpError>>,
}

/// A running daemon.
pub struct Daemon {
    server: LoopbackServer,
    worker: std::thread::JoinHandle<Result<(), OpError>>,
    stop: Stop,
    pub report: BootReport,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Boot on the worker thread, then open the API. Fails with the boot's
    /// error (e.g. the root is locked by another process) before listening.
    pub fn start(config: &Config, stop: &Stop, settings: ServeSettings) -> Result<Daemon, ServeError> {
        let (tx, rx) = mpsc::channel::<Envelope>();
        let (boot_tx, boot_rx) = mpsc::sync_channel(1);
        let worker = {
            let (config, stop) = (config.clone(), stop.clone());
            std::thread::Builder::new()
                .name("worker".into())
                .spawn(move || worker(&config, &stop, settings, &rx, boot_tx))
                .map_err(ServeError::Thread)?
        };
        let report = match boot_rx.recv() {
            Ok(Ok(report)) => report,
            Ok(Err(e)) => {
                let _ = worker.join();
                return Err(ServeError::Boot(e));
            }
            Err(_) => {
                let _ = worker.join();
                return Err(ServeError::WorkerPanicked);
            }
        };
        let handler = move |mut request: tiny_http::Request| {
            let recorded = Recorded::read(&mut request);
            let (status, body) = answer(&tx, &recorded);
            respond(request, json_response(status, &body.to_string()));
        };
        let listen = config.api.listen;
        let server = if config.api.allow_non_loopback {
            LoopbackServer::start_exposed(listen, "api", handler)
        } else {
            LoopbackServer::start(listen, "api", handler)
        };
        let server = match server {
            Ok(server) => server,
            Err(e) => {
                stop.request();
                let _ = worker.join();
                return Err(e.into());
            }
        };
        Ok(Daemon {
            server,
            worker,
            stop: stop.clone(),
            report,
        })
    }

    /// `http://<addr>` of the API.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Serve until a stop is requested or the worker stops on its own
    /// (fail-stop); then shut down in order: worker, then API.
    pub fn run(self) -> Result<(), ServeError> {
        while !self.stop.requested() && !self.worker.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.request();
        let result = self.worker.join();
        // After the worker: a request it was answering got its reply first.
        drop(self.server);
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ServeError::Fatal(e)),
            Err(_) => Err(ServeError::WorkerPanicked),
        }
    }
}

/// Route a request to the worker and wait for its answer.
fn answer(tx: &mpsc::Sender<Envelope>, recorded: &Recorded) -> (u16, Value) {
    let request = match api::route(&recorded.method, &recorded.path, &recorded.body) {
        Ok(request) => request,
        Err(refused) => return (refused.status, json!({"error": refused.message})),
    };
    let (reply, replied) = mpsc::sync_channel(1);
    if tx.send(Envelope { request, reply }).is_err() {
        return (503, json!({"error": "the daemon is shutting down"}));
    }
    match replied.recv() {
        Ok(Ok(value)) => (200, value),
        Ok(Err(e)) => (e.http_status(), json!({"error": e.to_string()})),
        Err(_) => (
            503,
            json!({"error": "the daemon stopped before answering; the outcome is unknown (check /status after a restart)"}),
        ),
    }
}

/// The worker: boot, report it, then requests and the scheduler until a
/// stop. Returns the fatal error that stopped it, if any.
fn worker(
    config: &Config,
    stop: &Stop,
    settings: ServeSettings,
    rx: &mpsc::Receiver<Envelope>,
    boot_tx: mpsc::SyncSender<Result<BootReport, BootError>>,
) -> Result<(), OpError> {
    let (mut system, lifecycle): (System, _) = match boot(config, stop) {
        Ok((system, report, lifecycle)) => {
            // The receiver waits for exactly this message.
            let _ = boot_tx.send(Ok(report));
            (system, lifecycle)
        }
        Err(e) => {
            let _ = boot_tx.send(Err(e));
            return Ok(());
        }
    };
    let fs = match crate::boot::real_fs() {
        Ok(fs) => fs,
        Err(e) => return Err(OpError::UnknownOutcome(e.to_string())),
    };
    let mut schedules = match Schedules::load(Arc::new(fs), &config.runtime.root) {
        Ok(schedules) => schedules,
        Err(e) => {
            // The boot was reported good; a bad schedules file stops the daemon.
            return Err(OpError::UnknownOutcome(format!("cannot load the schedules: {e}")));
        }
    };
    let poll = Duration::from_millis(settings.poll_ms);
    while !stop.requested() {
        for key in schedules.tick(&system)? {
            tracing::debug!(key, "schedule");
        }
        for fired in ops::fire_due(&mut system, &lifecycle, settings.lease_ms, stop)? {
            tracing::debug!(?fired, "scheduler");
        }
        match rx.recv_timeout(poll) {
            Ok(envelope) => {
                let result = ops::apply(&mut system, &mut schedules, &lifecycle, envelope.request);
                let fatal = match &result {
                    Err(OpError::UnknownOutcome(message)) => Some(message.clone()),
                    _ => None,
                };
                // The client may have gone away; the operation stands.
                let _ = envelope.reply.send(result);
                if let Some(message) = fatal {
                    return Err(OpError::UnknownOutcome(message));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    tracing::info!("worker stopped");
    Ok(())
}
