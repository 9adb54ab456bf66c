//! The daemon, once: the worker that owns a booted [`System`] and turns
//! events into actions, with no thread, socket or clock of its own — a
//! sans-IO core in the manner of quinn-proto's `Connection` or rustls's
//! `ConnectionCommon`. Two drivers run it: `durable-agent serve` (real
//! threads, the HTTP API, the host clock) and the madsim simulation
//! (simulated clients, latency, time and crashes). Neither holds any
//! scheduling logic of its own.
//!
//! Events in:
//! - [`Worker::handle_request`]: an API request ([`Request`]) with the
//!   driver's id for it;
//! - [`Worker::handle_result`]: the result of a call the worker handed out;
//! - [`Worker::handle_timeout`]: a scheduler pass — schedule ticks
//!   ([`schedule`]), wake-ups for pending messages (a recipient's one at a
//!   time, in enqueue order: `crate::system::WakeUps`), due-trigger claims with
//!   a lease (RESUME triggers included), busy agents' claims waiting, and a
//!   GC pass when one is due ([`gc`]); the driver calls it after every
//!   event and whenever [`Worker::poll_timeout_ms`] has passed;
//! - [`Worker::stop`]: SIGTERM — no new work; the calls out still come back.
//!
//! Actions out ([`Worker::poll_action`]): a [`Call`] to perform (provider or
//! tool, in the turn's [`TurnScope`]) or a reply to a request.
//!
//! Time is the system's [`crate::system::LogicalClock`], an input like any
//! other: fire times, leases, backoff and GC periods are read from it and
//! nothing else, so simulated time drives the same code as the host clock.
//!
//! Invariants: the system is used by the worker only, one step at a time;
//! an operation with an unknown outcome stops the worker for good (every
//! later event is refused with that error: fail-stop) — the driver boots
//! again and boot recovers. A turn's next call goes out only after its
//! previous result is durable. A trigger's turn is keyed by the work id
//! `trigger:{dedup_key}` ([`System::trigger_work`]), so a re-claimed trigger
//! never runs a completed turn again.

pub mod effects;
pub mod gc;
pub mod ops;
pub mod schedule;
#[cfg(all(test, feature = "fakes"))]
mod tests;
pub mod turns;

use std::marker::PhantomData;

use serde_json::Value;

use crate::runtime::{AgentId, CallResult};
use crate::system::{System, WakeUps};

use self::gc::{GcRequest, Ticker};
use self::ops::{Begun, OpError, Request, View};
use self::schedule::Schedules;
use self::turns::{End, Turns};

pub use self::turns::Call;

/// The provider error a driver's interruptible provider answers with when
/// a stop abandons a completion: the turn resumes after the restart.
pub const INTERRUPTED: &str = "interrupted by a stop signal before the completion arrived";

/// The driver's name for one request, echoed in its reply.
pub type RequestId = u64;

/// Plain ids (schedule ids, run ids): they end up in keys and paths.
pub fn check_plain_id(id: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("{id:?}: use 1-64 characters from A-Z a-z 0-9 . _ -"))
    }
}

/// The agent, session and work of a turn in progress: what its `turn_end`
/// and its calls' events are attributed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnScope {
    pub agent: String,
    pub session: Option<String>,
    pub work: String,
}

impl TurnScope {
    /// The scope of a turn of `agent` performing `work`.
    pub fn of(system: &System, agent: &AgentId, work: &str) -> TurnScope {
        TurnScope {
            agent: agent.to_string(),
            session: session_of(system, agent),
            work: work.to_string(),
        }
    }
}

/// `agent`'s session id (its session directory's name), if live.
pub fn session_of(system: &System, agent: &AgentId) -> Option<String> {
    let dir = system.runtime().session_dir(agent)?;
    Some(dir.file_name()?.to_string_lossy().into_owned())
}

/// What the worker reports of agents and turns (telemetry in `serve`;
/// nothing in the simulation). Every method defaults to doing nothing.
pub trait Lifecycle: Send + Sync {
    /// `agent` was created (its `agent.created` is durable).
    fn agent_start(&self, _system: &System, _agent: &AgentId, _name: &str, _parent: Option<&AgentId>) {}
    /// `agent` is about to be terminated: its session, looked up while live.
    fn agent_stopping(&self, system: &System, agent: &AgentId) -> Option<String> {
        session_of(system, agent)
    }
    fn agent_stopped(&self, _agent: &AgentId, _session: Option<&str>) {}
    /// A turn of `agent` performing `work` starts.
    fn turn_started(&self, system: &System, agent: &AgentId, work: &str) -> TurnScope {
        TurnScope::of(system, agent, work)
    }
    /// The turn of `scope` ended with `result`.
    fn turn_ended(&self, _scope: &TurnScope, _result: Result<Value, String>) {}
    /// Run `f` (a call of the turn `scope`, performed inline) in its scope.
    fn in_scope(&self, _scope: &TurnScope, f: &mut dyn FnMut()) {
        f()
    }
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Lifecycle for Silent {}

/// [`Lifecycle::in_scope`] for a closure that returns a value.
pub fn scoped<T>(lifecycle: &dyn Lifecycle, scope: &TurnScope, f: impl FnOnce() -> T) -> T {
    let mut f = Some(f);
    let mut out = None;
    lifecycle.in_scope(scope, &mut || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    match out {
        Some(out) => out,
        // `in_scope` did not run its closure: run it here (a broken hook
        // must not lose the call).
        None => match f.take() {
            Some(f) => f(),
            None => unreachable!("the closure ran or is still here"),
        },
    }
}

/// The worker's timing and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Longest wait between scheduler passes.
    pub poll_ms: u64,
    /// A claim's lease. It need not outlast a turn: the root lock keeps
    /// every other writer out, so nothing takes an expired lease over
    /// while this worker runs (the next boot reclaims every claim), and an
    /// ack checks whose claim it is, not the lease (the daemon
    /// simulation's short-lease plan, 400 ms against 0.6–3 s turns).
    pub lease_ms: u64,
    /// Turns in flight or waiting for their agent, at most.
    pub slots: usize,
    /// Emit a MESSAGE trigger per pending message (`[orchestration] wake`).
    pub wake: bool,
    /// GC passes with these TTLs every `gc_period_ms` (`None`: off).
    pub gc: Option<GcRequest>,
    pub gc_period_ms: u64,
}

/// Something for the driver to do.
#[derive(Debug)]
pub enum Action {
    /// Perform a provider or tool call; hand its result to
    /// [`Worker::handle_result`].
    Call(Call),
    /// Answer request `id`.
    Reply(RequestId, Result<Value, OpError>),
}

/// The daemon's state machine (see the module doc).
pub struct Worker<V: View = ops::NoView> {
    system: System,
    schedules: Schedules,
    lifecycle: Box<dyn Lifecycle>,
    settings: Settings,
    turns: Turns,
    wakeups: Option<WakeUps>,
    gc: Ticker,
    stopping: bool,
    /// The unknown outcome that stopped the worker, if one did.
    failed: Option<String>,
    views: PhantomData<fn(V)>,
}

impl<V: View> std::fmt::Debug for Worker<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("turns", &self.turns)
            .field("stopping", &self.stopping)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl<V: View> Worker<V> {
    /// A worker on a booted `system` with the root's `schedules`.
    pub fn new(
        system: System,
        schedules: Schedules,
        lifecycle: Box<dyn Lifecycle>,
        settings: Settings,
    ) -> Self {
        let gc = Ticker::new(settings.gc, settings.gc_period_ms, system.now_ms());
        Worker {
            turns: Turns::new(settings.slots),
            wakeups: settings.wake.then(WakeUps::default),
            system,
            schedules,
            lifecycle,
            settings,
            gc,
            stopping: false,
            failed: None,
            views: PhantomData,
        }
    }

    pub fn system(&self) -> &System {
        &self.system
    }

    pub fn schedules(&self) -> &Schedules {
        &self.schedules
    }

    /// Turns whose calls are out.
    pub fn in_flight(&self) -> usize {
        self.turns.in_flight()
    }

    /// Whether [`Self::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// The worker is done with `system` (the driver shuts down).
    pub fn into_system(self) -> System {
        self.system
    }

    fn alive(&self) -> Result<(), OpError> {
        match &self.failed {
            Some(e) => Err(OpError::UnknownOutcome(format!(
                "the worker stopped earlier: {e}"
            ))),
            None => Ok(()),
        }
    }

    /// Fail-stop: remember a fatal error so every later event is refused.
    fn check(&mut self, result: Result<(), OpError>) -> Result<(), OpError> {
        if let Err(e) = &result {
            if e.is_fatal() && self.failed.is_none() {
                self.failed = Some(e.to_string());
            }
        }
        result
    }

    /// An API request. A turn request starts its turn (answered when it
    /// ends); any other is answered now. `Err`: the outcome is unknown and
    /// the worker has stopped (the reply is queued first).
    pub fn handle_request(&mut self, id: RequestId, request: Request<V>) -> Result<(), OpError> {
        self.alive()?;
        if self.stopping {
            let refused = Err(OpError::Conflict("the daemon is shutting down".into()));
            self.turns.answers.push_back((id, refused));
            return Ok(());
        }
        let begun = ops::begin(&mut self.system, &mut self.schedules, &*self.lifecycle, request);
        let result = match begun {
            Begun::Turn(begun) => {
                let (started, prepared) = *begun;
                self.turns.launch(
                    started,
                    End::Api {
                        prepared,
                        request: id,
                    },
                );
                Ok(())
            }
            Begun::Answered(result) => {
                let fatal = match &result {
                    Err(OpError::UnknownOutcome(message)) => Some(message.clone()),
                    _ => None,
                };
                // The client may have gone away; the operation stands.
                self.turns.answers.push_back((id, result));
                fatal.map_or(Ok(()), |m| Err(OpError::UnknownOutcome(m)))
            }
        };
        self.check(result)
    }

    /// The result of call `turn` came back: persist it, send the turn's
    /// next call out or end the turn (answer its request, ack its trigger).
    pub fn handle_result(&mut self, turn: u64, result: CallResult) -> Result<(), OpError> {
        self.alive()?;
        let done = self
            .turns
            .finished(&mut self.system, &*self.lifecycle, turn, result);
        self.check(done)
    }

    /// One scheduler pass (nothing once stopping): schedule buckets due,
    /// wake-ups, due triggers, and a GC pass if one is due.
    pub fn handle_timeout(&mut self) -> Result<(), OpError> {
        self.alive()?;
        if self.stopping {
            return Ok(());
        }
        let pass = self.pass();
        self.check(pass)
    }

    fn pass(&mut self) -> Result<(), OpError> {
        for key in self.schedules.tick(&self.system)? {
            tracing::debug!(key, "schedule");
        }
        if let Some(wakeups) = self.wakeups.as_mut() {
            // A failed emit has an unknown outcome: the next boot emits
            // them again, deduplicated by key.
            let emitted = self
                .system
                .emit_wakeups(wakeups)
                .map_err(|e| OpError::UnknownOutcome(format!("emitting wake-up triggers: {e}")))?;
            for key in emitted {
                tracing::debug!(key, "wake-up");
            }
        }
        self.turns
            .fire_due(&mut self.system, &*self.lifecycle, self.settings.lease_ms)?;
        if let Some(request) = self.gc.due(self.system.now_ms()) {
            match gc::collect(&self.system, request) {
                Ok(_) => {}
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => tracing::warn!(error = %e, "gc pass failed; the next period tries again"),
            }
        }
        Ok(())
    }

    /// SIGTERM: take no new work. The calls still out come back through
    /// [`Self::handle_result`] and are persisted, so their turns stop at a
    /// durable boundary; what is left the next boot resumes. Claims the
    /// stop keeps from running (waiting for their agent now, interrupted
    /// later) go back uncounted: a stop is no failure of a trigger.
    pub fn stop(&mut self) {
        self.stopping = true;
        self.turns.release_waiting(&self.system);
    }

    /// The next thing for the driver to do: answers first, then calls.
    pub fn poll_action(&mut self) -> Option<Action> {
        if let Some((id, result)) = self.turns.answers.pop_front() {
            return Some(Action::Reply(id, result));
        }
        self.turns.calls.pop_front().map(Action::Call)
    }

    /// Milliseconds until the next pass is due, at most `poll_ms`.
    pub fn poll_timeout_ms(&self) -> u64 {
        let poll = self.settings.poll_ms;
        self.gc
            .until_next_ms(self.system.now_ms())
            .map_or(poll, |next| next.min(poll))
    }
}
