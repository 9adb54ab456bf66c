//! `durable-agent serve`: one driver of the daemon core
//! ([`durable_agent::worker::Worker`]), the other being the madsim
//! simulation. One worker thread boots and owns the worker — every runtime
//! and store call happens on it — and feeds it events: the requests the
//! HTTP API (see [`crate::api`]) hands over a channel, the results of the
//! calls it asked for, and a scheduler pass whenever the worker's timeout
//! has passed (and after each event). The worker's actions go out from
//! here: a provider or tool call runs on a thread of its own and its
//! result comes back over the same channel, so a completion that takes
//! seconds stalls no other request, agent or trigger; a reply goes to the
//! request's waiting HTTP thread.
//!
//! What the worker does (scheduler, leases, busy agents, backoff,
//! schedules, wake-ups, GC, fail-stop) is documented in
//! [`durable_agent::worker`]; nothing of it is decided here.
//!
//! Invariant: the worker is driven by the worker thread only; an event
//! with an unknown outcome stops the daemon (fail-stop, exit 1) —
//! restarting `serve` boots, and boot recovers. Shutdown on
//! SIGINT/SIGTERM: the worker stops taking work, this thread waits for the
//! calls still out (a completion is abandoned at once, see
//! [`crate::interrupt`]; a tool finishes its step) and hands their results
//! to the worker, which persists them, then stops; the API answers 503
//! until it is closed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use std::collections::BTreeMap;

use durable_agent::runtime::{CallResult, OutsideCall, ProviderError, ToolError};
use durable_agent::system::{BootReport, System};
use durable_agent::worker::{Action, Call, Settings, Worker};
use serde_json::{json, Value};

use crate::access::{self, Gate, Token};
use crate::api::{self, Refused};
use crate::boot::{boot_watched, ApiKey, BootError};
use crate::config::Config;
use crate::inspect::View;
use crate::interrupt::Stop;
use crate::lifecycle::Lifecycle;
use crate::ops::{OpError, Request};
use crate::progress::Progress;
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

/// A call's result, on its way back to the worker.
#[derive(Debug)]
struct Finished {
    turn: u64,
    result: CallResult,
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

/// Requests waiting for their answer at once; more get 503.
const MAX_WAITING_REQUESTS: usize = 64;

/// How long a stopping worker waits for the calls still out (a tool in
/// progress finishes its step; a completion is abandoned at once).
const DRAIN: Duration = Duration::from_secs(30);

/// The worker thread: boot, report it, then drive the worker with
/// requests, call results and scheduler passes until a stop.
/// Returns the fatal error that stopped it, if any.
fn worker(
    config: &Config,
    stop: &Stop,
    settings: ServeSettings,
    (rx, back): (&mpsc::Receiver<Msg>, mpsc::Sender<Msg>),
    boot_tx: mpsc::SyncSender<Result<BootReport, BootError>>,
    progress: &Arc<Progress>,
) -> Result<(), OpError> {
    let (system, lifecycle): (System, _) = match boot_watched(config, stop, ApiKey::Required, Some(progress))
    {
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
    let schedules = match Schedules::load(Arc::new(fs), &config.runtime.root) {
        Ok(schedules) => schedules,
        Err(e) => {
            // The boot was reported good; a bad schedules file stops the daemon.
            return Err(OpError::UnknownOutcome(format!("cannot load the schedules: {e}")));
        }
    };
    let outside = system.runtime().outside();
    let core_settings = Settings {
        poll_ms: settings.poll_ms,
        lease_ms: settings.lease_ms,
        slots: config.runtime.slots,
        wake: config.wakes_agents(),
        gc: config
            .gc
            .enabled
            .then(|| crate::gc::request_from_config(&config.gc, None)),
        gc_period_ms: config.gc.period_ms,
    };
    let mut core: Worker<View> = Worker::new(system, schedules, Box::new(lifecycle), core_settings);
    let mut driver = Driver {
        replies: BTreeMap::new(),
        next_request: 1,
        back,
        outside,
    };
    while !stop.requested() {
        let pass = core.handle_timeout();
        driver.act(&mut core);
        pass?;
        let wait = Duration::from_millis(core.poll_timeout_ms());
        let event = match rx.recv_timeout(wait) {
            Ok(msg) => driver.feed(&mut core, msg),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(()),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        driver.act(&mut core);
        event?;
    }
    // Stopping: no new work; the calls still out come back (a completion
    // is abandoned at once, a tool finishes its step) and are persisted,
    // so their turns stop at a durable boundary. What is left is resumed
    // by the next boot, as after a crash.
    core.stop();
    let deadline = std::time::Instant::now() + DRAIN;
    while core.in_flight() > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let event = match rx.recv_timeout(left) {
            Ok(msg) => driver.feed(&mut core, msg),
            Err(_) => {
                tracing::warn!(
                    in_flight = core.in_flight(),
                    "calls still out at shutdown; the next boot resumes their turns"
                );
                break;
            }
        };
        driver.act(&mut core);
        event?;
    }
    tracing::info!("worker stopped");
    Ok(())
}

/// The worker thread's side of the worker's events and actions.
struct Driver {
    /// Requests waiting for their reply, by the id the worker echoes.
    replies: BTreeMap<u64, mpsc::SyncSender<Result<Value, OpError>>>,
    next_request: u64,
    back: mpsc::Sender<Msg>,
    outside: durable_agent::runtime::Outside,
}

impl Driver {
    /// Hand one message to the worker.
    fn feed(&mut self, core: &mut Worker<View>, msg: Msg) -> Result<(), OpError> {
        match msg {
            Msg::Request(envelope) => {
                let id = self.next_request;
                self.next_request += 1;
                self.replies.insert(id, envelope.reply);
                core.handle_request(id, envelope.request)
            }
            Msg::Called(done) => core.handle_result(done.turn, done.result),
        }
    }

    /// Carry out what the worker asks: replies to their requests, calls on
    /// threads of their own.
    fn act(&mut self, core: &mut Worker<View>) {
        while let Some(action) = core.poll_action() {
            match action {
                Action::Reply(id, result) => {
                    if let Some(reply) = self.replies.remove(&id) {
                        // The client may have gone away; the operation stands.
                        let _ = reply.send(result);
                    }
                }
                Action::Call(call) => self.spawn(call),
            }
        }
    }

    fn spawn(&self, Call { turn, call, scope }: Call) {
        let outside = self.outside.clone();
        let back = self.back.clone();
        let name = match &call {
            OutsideCall::Provider(_) => "provider-call",
            OutsideCall::Tool(_) => "tool-call",
        };
        let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
            let result = Lifecycle::in_scope(&scope, || outside.perform(&call));
            // The worker may be gone (stopped): the result is dropped, the
            // turn stays open for the next boot.
            let _ = back.send(Msg::Called(Finished { turn, result }));
        });
        if let Err(e) = spawned {
            // Nothing ran: the call fails as it would have without a thread.
            let failure = format!("cannot start a thread for the call: {e}");
            let result = match name {
                "provider-call" => CallResult::Provider(Err(ProviderError(failure))),
                _ => CallResult::Tool(Err(ToolError::Failed(failure))),
            };
            let _ = self.back.send(Msg::Called(Finished { turn, result }));
        }
    }
}
