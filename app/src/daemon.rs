//! `durable-agent serve`: the daemon on a root. One worker thread boots and
//! owns the [`System`] — every runtime and store call happens on it — and
//! runs the scheduler between requests; the HTTP API (see [`crate::api`])
//! hands each request to the worker over a channel and waits for its reply.
//! A turn's provider and tool calls do not run on the worker: each goes out
//! on a thread of its own and its result comes back over the same channel
//! ([`crate::turns`]), so a completion that takes seconds stalls no other
//! request, agent or trigger.
//!
//! Scheduler: every `poll_ms` (and after each request or call result) the
//! worker claims the due triggers with a lease and starts each one's turn
//! with [`System::start_fire`] (keyed by the work id `trigger:{dedup_key}`);
//! when the turn ends the trigger is acked DONE, or — the provider failed —
//! acked failed and retried with the trigger policy's backoff. A trigger
//! whose agent is in another turn keeps its claim and waits for it. A
//! claim left by a crash or a stop is reclaimed by the next boot, which
//! holds the root lock, and its turn re-runs under the same work id: a
//! completed turn is not run again, and the activity ledger decides every
//! irreversible call it repeats.
//!
//! Wake-ups (config `[orchestration] wake`, on whenever the model can
//! `send_message`): before each pass, every pending message the worker
//! has not yet emitted one for gets a MESSAGE trigger keyed by the
//! message id (`wake:{id}`), whose turn reads that message
//! ([`System::emit_wakeups`]): a crash neither loses a wake-up (the
//! message stays pending and the next boot's first pass emits again) nor
//! doubles one (the key deduplicates, the work runs once).
//!
//! Recurring schedules ([`crate::schedule`]) are loaded after boot and
//! ticked before each scheduler pass: each due bucket becomes a trigger
//! (dedup key `scheduled:{id}:{bucket}`) that this same pass fires.
//!
//! GC ([`crate::gc`], config `[gc]`): soon after boot and then every
//! `period_ms`, the worker runs one GC pass between requests — settled
//! rows collected after `ttl_ms`, settled bodies stripped after
//! `payload_ttl_ms` — so no runtime step interleaves with it; what a turn
//! still in flight may read back is kept by the system (its agent has an
//! open turn), and its calls' ledger writes wait on the connection lock
//! each pass transaction holds. A pass that fails with an unknown outcome
//! stops the daemon like any other step; another failure is logged and
//! the next period tries again.
//!
//! Invariant: the system is used by the worker thread only, one step at a
//! time; an operation with an unknown outcome stops the daemon (fail-stop,
//! exit 1) — restarting `serve` boots, and boot recovers. Shutdown on
//! SIGINT/SIGTERM: the worker stops taking work, waits for the calls still
//! out (a completion is abandoned at once, see [`crate::interrupt`]; a
//! tool finishes its step) and persists their results, then stops; the
//! API answers 503 until it is closed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use durable_agent::system::{BootReport, System, WakeUps};
use serde_json::{json, Value};

use crate::access::{self, Gate, Token};
use crate::api::{self, Refused};
use crate::boot::{boot_watched, ApiKey, BootError};
use crate::config::Config;
use crate::gc::Ticker;
use crate::interrupt::Stop;
use crate::ops::{self, Begun, OpError, Request};
use crate::progress::Progress;
use crate::schedule::Schedules;
use crate::server::{json_response, respond, LoopbackServer, Recorded, ServerError};
use crate::turns::{End, Finished, Turns};

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
    #[error("API token: {0}")]
    Access(access::AccessError),
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

/// What the worker waits for: a request, or a turn's call coming back.
enum Msg {
    Request(Envelope),
    Called(Finished),
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
        let (tx, rx) = mpsc::channel::<Msg>();
        let (boot_tx, boot_rx) = mpsc::sync_channel(1);
        // Watches the turns for the API's streamed turns (prints nothing).
        let progress = Progress::quiet();
        let worker = {
            let (config, stop, back) = (config.clone(), stop.clone(), tx.clone());
            let progress = progress.clone();
            std::thread::Builder::new()
                .name("worker".into())
                .spawn(move || worker(&config, &stop, settings, (&rx, back), boot_tx, &progress))
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
        let token = match Token::for_serve(config) {
            Ok(token) => token,
            Err(e) => {
                stop.request();
                let _ = worker.join();
                return Err(ServeError::Access(e));
            }
        };
        let listen = config.api.listen;
        if !listen.ip().is_loopback() {
            eprintln!(
                "warning: the API listens on {listen}, beyond loopback: anyone who can reach it and holds the token (from ${}) drives this daemon; put TLS in front of it",
                config.api.token_env.as_deref().unwrap_or("?")
            );
        }
        // The gate needs the bound address (port 0 resolved): set once the
        // server is up; a request before that is answered 503.
        let gate: Arc<OnceLock<Gate>> = Arc::new(OnceLock::new());
        // Each request waits for its answer on a thread of its own: a turn
        // request waits for its turn, and must not hold up the requests
        // behind it (the worker answers them meanwhile).
        let waiting = Arc::new(AtomicUsize::new(0));
        let handler = {
            let gate = Arc::clone(&gate);
            move |request: tiny_http::Request| {
                if waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING_REQUESTS {
                    waiting.fetch_sub(1, Ordering::AcqRel);
                    let body = json!({"error": "too many requests in progress; try again"});
                    respond(request, json_response(503, &body.to_string()));
                    return;
                }
                let (tx, left, gate) = (tx.clone(), waiting.clone(), Arc::clone(&gate));
                let progress = progress.clone();
                let spawned = std::thread::Builder::new()
                    .name("api-request".into())
                    .spawn(move || {
                        serve_request(&tx, gate.get(), request, &progress);
                        left.fetch_sub(1, Ordering::AcqRel);
                    });
                if let Err(e) = spawned {
                    // The request went with the closure; its client sees the
                    // connection close.
                    waiting.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(error = %e, "cannot start a request thread; request dropped");
                }
            }
        };
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
        // Only this thread sets it, once.
        let _ = gate.set(Gate::new(token, server.addr(), config.api.max_body_bytes));
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

/// Check `request`'s head at the gate (before its body is read), read the
/// body within the limit, and answer it.
fn serve_request(
    tx: &mpsc::Sender<Msg>,
    gate: Option<&Gate>,
    mut request: tiny_http::Request,
    progress: &Arc<Progress>,
) {
    let refuse = |request: tiny_http::Request, refused: Refused| {
        let response = json_response(refused.status, &json!({"error": refused.message}).to_string());
        // A refused client's connection is not kept: what it sends next
        // (the rest of a refused body) is not a request.
        let response = match tiny_http::Header::from_bytes("Connection", "close") {
            Ok(h) => response.with_header(h),
            Err(()) => response,
        };
        respond(request, response);
    };
    let Some(gate) = gate else {
        let refused = Refused {
            status: 503,
            message: "the API is starting; try again".into(),
        };
        return refuse(request, refused);
    };
    let head = Recorded::head(&request);
    if let Err(refused) = gate.check(&head.method, &head.headers, request.body_length()) {
        tracing::info!(
            status = refused.status,
            method = head.method,
            path = head.path,
            "API request refused"
        );
        return refuse(request, refused);
    }
    let recorded = match Recorded::read_limited(&mut request, gate.max_body_bytes()) {
        Ok(recorded) => recorded,
        Err(_) => return refuse(request, access::too_large(gate.max_body_bytes())),
    };
    if let Some(agent) = api::stream::requested(&recorded) {
        return api::stream::serve(request, &recorded, &agent, progress, &|r| answer(tx, r));
    }
    let (status, body) = answer(tx, &recorded);
    respond(request, json_response(status, &body.to_string()));
}

/// Route a request to the worker and wait for its answer.
fn answer(tx: &mpsc::Sender<Msg>, recorded: &Recorded) -> (u16, Value) {
    let request = match api::route(&recorded.method, &recorded.path, &recorded.body) {
        Ok(request) => request,
        Err(refused) => return (refused.status, json!({"error": refused.message})),
    };
    let (reply, replied) = mpsc::sync_channel(1);
    if tx.send(Msg::Request(Envelope { request, reply })).is_err() {
        return (503, json!({"error": "the daemon is shutting down"}));
    }
    match replied.recv() {
        Ok(Ok(value)) => (200, value),
        Ok(Err(e)) => (e.http_status(), e.body()),
        Err(_) => (
            503,
            json!({"error": "the daemon stopped before answering; the outcome is unknown (check /status after a restart)"}),
        ),
    }
}

/// Wake-ups ([`System::emit_wakeups`]): a trigger per pending message,
/// keyed by its id, which this same pass fires. A failed emit has an
/// unknown outcome: the daemon stops (the next boot emits them again,
/// deduplicated by key).
fn wake(system: &System, wakeups: &mut WakeUps) -> Result<(), OpError> {
    let emitted = system
        .emit_wakeups(wakeups)
        .map_err(|e| OpError::UnknownOutcome(format!("emitting wake-up triggers: {e}")))?;
    for key in emitted {
        tracing::debug!(key, "wake-up");
    }
    Ok(())
}

/// Requests waiting for their answer at once; more get 503.
const MAX_WAITING_REQUESTS: usize = 64;

/// How long a stopping worker waits for the calls still out (a tool in
/// progress finishes its step; a completion is abandoned at once).
const DRAIN: Duration = Duration::from_secs(30);

/// The worker: boot, report it, then requests, the scheduler and the
/// results of the calls of the turns in flight until a stop.
/// Returns the fatal error that stopped it, if any.
fn worker(
    config: &Config,
    stop: &Stop,
    settings: ServeSettings,
    (rx, back): (&mpsc::Receiver<Msg>, mpsc::Sender<Msg>),
    boot_tx: mpsc::SyncSender<Result<BootReport, BootError>>,
    progress: &Arc<Progress>,
) -> Result<(), OpError> {
    let (mut system, lifecycle): (System, _) =
        match boot_watched(config, stop, ApiKey::Required, Some(progress)) {
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
    let back = std::sync::Mutex::new(back);
    let back: Arc<dyn Fn(Finished) + Send + Sync> = Arc::new(move |done| {
        // The worker may be gone (stopped): the result is dropped, the
        // turn stays open for the next boot.
        let _ = back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Msg::Called(done));
    });
    let mut turns = Turns::new(&system, config.runtime.slots, back);
    let mut wakeups = config.wakes_agents().then(WakeUps::default);
    let poll = Duration::from_millis(settings.poll_ms);
    let mut gc = Ticker::new(&config.gc, std::time::Instant::now());
    while !stop.requested() {
        for key in schedules.tick(&system)? {
            tracing::debug!(key, "schedule");
        }
        if let Some(wakeups) = wakeups.as_mut() {
            wake(&system, wakeups)?;
        }
        turns.fire_due(&mut system, &lifecycle, settings.lease_ms, stop)?;
        if let Some(request) = gc.due(std::time::Instant::now()) {
            match crate::gc::collect(&system, request) {
                Ok(_) => {}
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => tracing::warn!(error = %e, "gc pass failed; the next period tries again"),
            }
        }
        let wait = gc
            .until_next(std::time::Instant::now())
            .map_or(poll, |next| next.min(poll));
        match rx.recv_timeout(wait) {
            Ok(Msg::Request(envelope)) => {
                match ops::begin(&mut system, &mut schedules, &lifecycle, envelope.request) {
                    Begun::Turn(begun) => {
                        let (started, prepared) = *begun;
                        turns.launch(
                            started,
                            End::Api {
                                prepared,
                                reply: envelope.reply,
                            },
                        )
                    }
                    Begun::Answered(result) => {
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
                }
            }
            Ok(Msg::Called(done)) => turns.finished(&mut system, &lifecycle, done)?,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Stopping: no new work; the calls still out come back (a completion
    // is abandoned at once, a tool finishes its step) and are persisted,
    // so their turns stop at a durable boundary. What is left is resumed
    // by the next boot, as after a crash.
    let deadline = std::time::Instant::now() + DRAIN;
    while turns.in_flight() > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Msg::Called(done)) => turns.finished(&mut system, &lifecycle, done)?,
            Ok(Msg::Request(envelope)) => {
                let _ = envelope
                    .reply
                    .send(Err(OpError::Conflict("the daemon is shutting down".into())));
            }
            Err(_) => {
                tracing::warn!(
                    in_flight = turns.in_flight(),
                    "calls still out at shutdown; the next boot resumes their turns"
                );
                break;
            }
        }
    }
    tracing::info!("worker stopped");
    Ok(())
}
