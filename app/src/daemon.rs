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
//! request's task on the API listener ([`crate::api::listen`], hyper on a
//! tokio runtime of its own), which awaits it on a one-shot channel.
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
//! to the worker, which persists them, then stops; until then the API
//! stays open and refuses what it is asked ("shutting down": 409 from
//! the draining worker, 503 once it has stopped). Then the API closes:
//! it stops accepting, lets each connection finish the response in hand
//! (every request waiting on the worker has its answer by now: a reply,
//! or 503 if the worker dropped it) for at most [`API_GRACE`], and stops
//! its runtime; `serve` exits 0, or 1 if the worker stopped on a fatal
//! error.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use std::collections::BTreeMap;

use durable_agent::runtime::{CallResult, OutsideCall, ProviderError, ToolError};
use durable_agent::system::{BootReport, System};
use durable_agent::worker::{Action, Call, Settings, Worker};

use crate::access::{self, Gate, Token};
use crate::api::listen::{Ask, Envelope, Exposure, ListenError, Listener, Reply, WorkerGone};
use crate::boot::{boot_watched, ApiKey, BootError};
use crate::config::Config;
use crate::inspect::View;
use crate::interrupt::Stop;
use crate::lifecycle::Lifecycle;
use crate::ops::OpError;
use crate::progress::Progress;
use crate::schedule::Schedules;

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
    Listen(#[from] ListenError),
    #[error("API token: {0}")]
    Access(access::AccessError),
    #[error("cannot start the worker thread: {0}")]
    Thread(std::io::Error),
    #[error("the worker thread panicked")]
    WorkerPanicked,
    #[error("stopped: {0}")]
    Fatal(OpError),
    /// `{root}/schedules.json` cannot be read (refused before listening).
    #[error("cannot load the schedules: {0}")]
    Schedules(durable_agent::worker::schedule::ScheduleError),
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
    listener: Listener,
    worker: std::thread::JoinHandle<Result<(), OpError>>,
    stop: Stop,
    pub report: BootReport,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("listener", &self.listener)
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
                return Err(e);
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
        let exposure = if config.api.allow_non_loopback {
            Exposure::Any
        } else {
            Exposure::Loopback
        };
        // Bound first: the gate needs the address (port 0 resolved)
        // before the first request is accepted.
        let listener = Listener::bind(listen, exposure).and_then(|bound| {
            let gate = Gate::new(token, bound.addr(), config.api.max_body_bytes)
                .with_allowed_hosts(&config.api.allowed_hosts);
            // The boot wrote root.json: requests meant for another root
            // (a config sharing this listen address) are refused.
            let gate = match root_store_id(&config.runtime.root) {
                Some(id) => gate.serving_root(id),
                None => gate,
            };
            // A request goes to the worker thread as one message; the
            // send never blocks (the channel is unbounded; the listener
            // bounds the requests in flight).
            let ask: Ask =
                Arc::new(move |envelope: Envelope| tx.send(Msg::Request(envelope)).map_err(|_| WorkerGone));
            bound.serve(gate, progress, ask)
        });
        let listener = match listener {
            Ok(listener) => listener,
            Err(e) => {
                stop.request();
                let _ = worker.join();
                return Err(e.into());
            }
        };
        Ok(Daemon {
            listener,
            worker,
            stop: stop.clone(),
            report,
        })
    }

    /// `http://<addr>` of the API.
    pub fn url(&self) -> String {
        format!("http://{}", self.listener.addr())
    }

    /// Serve until a stop is requested or the worker stops on its own
    /// (fail-stop); then shut down in order: worker, then API.
    pub fn run(self) -> Result<(), ServeError> {
        while !self.stop.requested() && !self.worker.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.request();
        let result = self.worker.join();
        // After the worker: every request it was answering has its reply
        // (or its 503), so the connections have only the writing left.
        self.listener.shutdown(API_GRACE);
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ServeError::Fatal(e)),
            Err(_) => Err(ServeError::WorkerPanicked),
        }
    }
}

/// The store id `{root}/root.json` names, if it reads.
pub fn root_store_id(root: &std::path::Path) -> Option<u32> {
    let fs = crate::boot::real_fs().ok()?;
    durable_agent::store::manifest::read(&fs, root)
        .ok()
        .flatten()
        .map(|m| m.store_id)
}

/// How long the API lets open connections finish at shutdown (a
/// streamed turn's last events, an answer being written) before cutting.
const API_GRACE: Duration = Duration::from_secs(5);

/// The least a stopping worker waits for the calls still out (a tool in
/// progress finishes its step; a completion is abandoned at once).
const DRAIN: Duration = Duration::from_secs(30);

/// How long a stop waits for the calls still out: the longest a
/// configured tool call can take — each attempt bounded by its
/// `timeout_ms`, with its retries and their backoff, and every command
/// hook around it — plus a margin, and at least [`DRAIN`]. A tool call in
/// progress is never cut (app/README.md, Stopping): found by a review, a
/// fixed 30 s cut an email whose answer came later, and the next boot
/// parked its key for a human after a stop said to be clean.
fn drain_bound(config: &Config) -> Duration {
    use crate::config::{default_max_retries, ToolConfig};
    let r = &config.retries;
    let longest_call = config
        .tools
        .iter()
        .map(|tool| {
            let timeout = match tool {
                ToolConfig::Http(t) => t.timeout_ms,
                ToolConfig::HttpGet(t) => t.timeout_ms,
                _ => 0,
            };
            let own = r.tools.get(tool.name());
            let no_dedup = tool.irreversible() && !matches!(tool, ToolConfig::Http(h) if h.dedup);
            let retries = match no_dedup {
                true => 0,
                false => own
                    .and_then(|o| o.max_retries)
                    .unwrap_or(default_max_retries(tool.irreversible())),
            };
            let backoff = own.and_then(|o| o.backoff_max_ms).unwrap_or(r.backoff_max_ms);
            let attempts = u64::from(retries).saturating_add(1);
            timeout
                .saturating_mul(attempts)
                .saturating_add(backoff.saturating_mul(u64::from(retries)))
        })
        .max()
        .unwrap_or(0);
    let hooks: u64 = config.hooks.iter().map(|h| h.timeout_ms).sum();
    let ms = longest_call.saturating_add(hooks).saturating_add(5_000);
    Duration::from_millis(ms).max(DRAIN)
}

/// The worker thread: boot, report it, then drive the worker with
/// requests, call results and scheduler passes until a stop.
/// Returns the fatal error that stopped it, if any.
fn worker(
    config: &Config,
    stop: &Stop,
    settings: ServeSettings,
    (rx, back): (&mpsc::Receiver<Msg>, mpsc::Sender<Msg>),
    boot_tx: mpsc::SyncSender<Result<BootReport, ServeError>>,
    progress: &Arc<Progress>,
) -> Result<(), OpError> {
    // The boot, then the schedules, before the report: a root whose
    // schedules cannot be read is refused before the API listens (found
    // by a review: the URL was printed, then the daemon stopped).
    let booted = boot_watched(config, stop, ApiKey::Required, Some(progress))
        .map_err(ServeError::Boot)
        .and_then(|booted| {
            let fs = crate::boot::real_fs().map_err(ServeError::Boot)?;
            Schedules::load(Arc::new(fs), &config.runtime.root)
                .map(|schedules| (booted, schedules))
                .map_err(ServeError::Schedules)
        });
    let ((system, lifecycle), schedules): ((System, _), _) = match booted {
        Ok(((system, report, lifecycle), schedules)) => {
            // The receiver waits for exactly this message.
            let _ = boot_tx.send(Ok(report));
            ((system, lifecycle), schedules)
        }
        Err(e) => {
            let _ = boot_tx.send(Err(e));
            return Ok(());
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
    let bound = drain_bound(config);
    let deadline = std::time::Instant::now() + bound;
    while core.in_flight() > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let event = match rx.recv_timeout(left) {
            Ok(msg) => driver.feed(&mut core, msg),
            Err(_) => {
                // Not a clean stop: said so, and the exit code says it too.
                return Err(OpError::UnknownOutcome(format!(
                    "{} call(s) still out after {bound:?} of a graceful stop (longer than any configured tool call can take); the next boot resumes their turns, and an irreversible call's key may wait for a human (see `status`)",
                    core.in_flight()
                )));
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
    replies: BTreeMap<u64, tokio::sync::oneshot::Sender<Reply>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_waits_for_the_longest_a_configured_tool_call_can_take() -> Result<(), String> {
        let config = |tools: &str| {
            let text = format!("[provider]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n{tools}");
            Config::parse(std::path::Path::new("/x/agent.toml"), &text).map_err(|e| e.to_string())
        };
        assert_eq!(drain_bound(&config("")?), DRAIN);
        // Irreversible without dedup: one attempt, never retried.
        let email = "[[tools]]\nkind = \"http\"\nname = \"send\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/s\"\nirreversible = true\ntimeout_ms = 60000\n";
        assert_eq!(drain_bound(&config(email)?), Duration::from_millis(65_000));
        // Reversible, 2 retries of up to 1 s backoff each, and a hook.
        let lookup = "[[tools]]\nkind = \"http\"\nname = \"look\"\ndescription = \"d\"\nurl = \"http://127.0.0.1:9/l\"\ntimeout_ms = 20000\n[retries]\nbackoff_max_ms = 1000\n[retries.tools.look]\nmax_retries = 2\n[[hooks]]\naction = \"command\"\ncommand = [\"/bin/true\"]\ntimeout_ms = 3000\n";
        assert_eq!(
            drain_bound(&config(lookup)?),
            Duration::from_millis(60_000 + 2_000 + 3_000 + 5_000)
        );
        Ok(())
    }
}
