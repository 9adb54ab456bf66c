//! The daemon node: the simulation's driver of the worker core, the twin of
//! `serve`'s worker thread (`app/src/daemon.rs`). It boots the one system
//! on the SimFs, loads the schedules, and feeds the worker its events —
//! requests from the clients' channel, call results, a scheduler pass
//! whenever [`Worker::poll_timeout_ms`] has passed and after each event —
//! and carries out its actions: a reply to its client, a call performed by
//! a task of its own after a seeded latency.
//!
//! Invariants: like `serve`, the driver decides nothing — every scheduling
//! choice is the worker's; the worker's unknown outcome ends the node
//! (fail-stop) until the supervisor restarts it; a stop (SIGTERM) stops
//! the worker, waits for the calls still out and persists their results.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use durable_agent::fs::{Fs, SimFs};
use durable_agent::runtime::{AgentId, CallResult, PureTools};
use durable_agent::sqlite::Db;
use durable_agent::system::{Deps, System, SystemConfig};
use durable_agent::worker::ops::{OpError, Request};
use durable_agent::worker::schedule::Schedules;
use durable_agent::worker::{Action, Lifecycle, Settings, TurnScope, Worker};
use durable_agent::world::World;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::target::Sights;
use super::{Event, FlakyProvider, Recorder, SimClock, SimPlan};

/// A request on its way to the worker, with where its answer goes.
pub(super) type Envelope = (Request, oneshot::Sender<Result<Value, OpError>>);

/// What the node's init closure needs; survives restarts.
#[derive(Clone)]
pub(super) struct NodeCtx {
    pub fs: SimFs,
    pub world: World,
    pub recorder: Recorder,
    pub clock: SimClock,
    pub plan: SimPlan,
    pub boots: Arc<AtomicU32>,
    /// The live worker's database: gone once a killed node's tasks are.
    pub watch: Arc<Mutex<Weak<Mutex<Db>>>>,
    /// The live node's request channel (`None` while it is down).
    pub inbox: Arc<Mutex<Option<mpsc::Sender<Envelope>>>>,
    /// SIGTERM, and whether the node has drained and ended.
    pub stop: Arc<AtomicBool>,
    pub ended: Arc<AtomicBool>,
    /// The clients' set-up (agents, schedules) is acknowledged.
    pub ready: Arc<AtomicBool>,
    /// The supervisor's aim at a one-time trigger's turn, if it has one.
    pub sights: Sights,
    pub errors: Arc<Mutex<Vec<String>>>,
}

impl NodeCtx {
    pub fn note(&self, e: String) {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }

    pub fn record(&self, event: Event) {
        self.recorder.record(self.clock.now_ms(), event);
    }

    /// Wait (1 ms steps of simulated time, at most 1 s) until the last
    /// worker's database is closed, so nothing of a dead process writes
    /// while the next boots. Whether it closed in time.
    pub async fn database_released(&self) -> bool {
        for _ in 0..1_000 {
            if self
                .watch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .upgrade()
                .is_none()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        false
    }

    fn set_inbox(&self, inbox: Option<mpsc::Sender<Envelope>>) {
        *self.inbox.lock().unwrap_or_else(|p| p.into_inner()) = inbox;
    }

    /// The system configuration every boot uses (the final look too).
    pub fn system_config(&self) -> SystemConfig {
        let plan = &self.plan;
        let mut sc = SystemConfig::new(plan.root.clone(), plan.seed);
        sc.slots = plan.slots;
        sc.trigger_policy = plan.trigger_policy;
        sc.canaries = plan.canaries.clone();
        sc
    }

    /// The system's stand-ins for boot `boot`.
    pub fn deps(&self, boot: u32, provider_failure: f64) -> Deps {
        Deps {
            provider: Arc::new(FlakyProvider::new(self.plan.seed, boot, provider_failure)),
            tools: Arc::new(PureTools),
            outbox: Arc::new(self.world.clone()),
            clock: Arc::new(self.clock),
        }
    }
}

/// The worker's lifecycle reports, into the trace (and the sights).
struct Observed {
    recorder: Recorder,
    clock: SimClock,
    sights: Sights,
    fs: SimFs,
}

impl Lifecycle for Observed {
    fn turn_started(&self, system: &System, agent: &AgentId, work: &str) -> TurnScope {
        let scope = TurnScope::of(system, agent, work);
        let name = name_of(system, agent);
        self.recorder.record(
            self.clock.now_ms(),
            Event::TurnStarted {
                agent: name.clone(),
                work: work.to_string(),
            },
        );
        self.sights.turn_started(work, &name, &self.fs);
        // The scope carries the name: the trace speaks in names.
        TurnScope { agent: name, ..scope }
    }

    fn turn_ended(&self, scope: &TurnScope, result: Result<Value, String>) {
        let (ran, error) = match &result {
            Ok(v) => (v.get("already_done").is_none(), None),
            Err(e) => (false, Some(e.clone())),
        };
        self.recorder.record(
            self.clock.now_ms(),
            Event::TurnEnded {
                agent: scope.agent.clone(),
                work: scope.work.clone(),
                ran,
                error,
            },
        );
    }
}

fn name_of(system: &System, agent: &AgentId) -> String {
    system
        .runtime()
        .tree()
        .nodes()
        .get(agent)
        .map_or_else(|| agent.to_string(), |n| n.name.clone())
}

fn draw(rng: &mut ChaCha8Rng, (lo, hi): (u64, u64)) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

/// How a run of the worker ended.
enum Exit {
    /// An unknown outcome stopped it (the process exits 1).
    Failed,
    /// A stop drained it, or boot refused the root.
    Ended,
}

/// How long the service manager waits before restarting a daemon that
/// exited on an unknown outcome (systemd's `RestartSec`).
const RESTART_MS: u64 = 5_000;

/// The daemon process under a service manager: boot and drive the worker;
/// when an unknown outcome stops it (fail-stop, exit 1), the process is
/// gone — its call tasks with it — and is started again, which boots and
/// recovers. A stop, or a crash the supervisor armed, ends it for good.
pub(super) async fn boot_and_run(ctx: NodeCtx) {
    loop {
        match run_once(&ctx).await {
            Exit::Failed if !ctx.fs.crashed() && !ctx.stop.load(Ordering::SeqCst) => {
                tokio::time::sleep(Duration::from_millis(RESTART_MS)).await;
            }
            Exit::Failed => {
                // Dying anyway (a crash is armed) or asked to stop: idle
                // until the supervisor's kill or stop.
                while !ctx.stop.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                ctx.ended.store(true, Ordering::SeqCst);
                return;
            }
            Exit::Ended => return,
        }
    }
}

/// Boot and drive the worker until it fails, or a stop drained it.
async fn run_once(ctx: &NodeCtx) -> Exit {
    let boot = ctx.boots.fetch_add(1, Ordering::SeqCst);
    let fs: Arc<dyn Fs> = Arc::new(ctx.fs.clone());
    let booted = System::boot(
        fs.clone(),
        ctx.system_config(),
        ctx.deps(boot, ctx.plan.provider_failure),
    );
    let system = match booted {
        Ok((system, _report)) => system,
        // The process died booting (a crash the supervisor armed).
        Err(_) if ctx.fs.crashed() => return Exit::Failed,
        Err(e) => {
            // The process exits with the boot's error.
            ctx.ended.store(true, Ordering::SeqCst);
            ctx.note(format!("boot {boot} failed: {e}"));
            return Exit::Ended;
        }
    };
    *ctx.watch.lock().unwrap_or_else(|p| p.into_inner()) = system.db_watch();
    ctx.record(Event::Booted { boot });
    let schedules = match Schedules::load(fs, &ctx.plan.root) {
        Ok(s) => s,
        // The process died reading them (a crash the supervisor armed).
        Err(_) if ctx.fs.crashed() => return Exit::Failed,
        Err(e) => {
            // A crash can leave no schedules file, never a broken one.
            ctx.ended.store(true, Ordering::SeqCst);
            ctx.note(format!("boot {boot}: schedules: {e}"));
            return Exit::Ended;
        }
    };
    let plan = &ctx.plan;
    let settings = Settings {
        poll_ms: plan.poll_ms,
        lease_ms: plan.lease_ms,
        slots: plan.slots,
        // Wake-ups on: a pending message gets its MESSAGE trigger and the
        // turn that reads it (what `[orchestration] wake` does in serve).
        wake: plan.wake,
        gc: None,
        gc_period_ms: 60_000,
    };
    let outside = system.runtime().outside();
    let lifecycle = Observed {
        recorder: ctx.recorder.clone(),
        clock: ctx.clock,
        sights: ctx.sights.clone(),
        fs: ctx.fs.clone(),
    };
    let mut worker: Worker = Worker::new(system, schedules, Box::new(lifecycle), settings);
    let (tx, mut requests) = mpsc::channel::<Envelope>(64);
    ctx.set_inbox(Some(tx));
    let (back, mut results) = mpsc::unbounded_channel::<(u64, CallResult)>();
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed ^ u64::from(boot).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut replies: BTreeMap<u64, oneshot::Sender<Result<Value, OpError>>> = BTreeMap::new();
    let mut next_request = 1u64;
    // The call tasks of this process: gone with it if it exits.
    let calls = std::cell::RefCell::new(Vec::new());
    // Each worker turn's (work, agent), for the sights.
    let works = std::cell::RefCell::new(BTreeMap::<u64, (String, String)>::new());
    let result_in = |turn: u64, result: &CallResult| {
        if let Some((work, agent)) = works.borrow().get(&turn) {
            ctx.sights.result_in(work, agent, result, &ctx.fs);
        }
    };
    let act = |worker: &mut Worker, replies: &mut BTreeMap<u64, _>, rng: &mut ChaCha8Rng| {
        while let Some(action) = worker.poll_action() {
            match action {
                Action::Reply(id, result) => {
                    if let Some(reply) = replies.remove(&id) {
                        let reply: oneshot::Sender<Result<Value, OpError>> = reply;
                        let _ = reply.send(result);
                    }
                }
                Action::Call(call) => {
                    ctx.sights.call_out(&call.scope.work, &call.scope.agent);
                    let scope = (call.scope.work.clone(), call.scope.agent.clone());
                    works.borrow_mut().insert(call.turn, scope);
                    let latency = draw(rng, plan.latency_ms);
                    let (outside, back) = (outside.clone(), back.clone());
                    calls.borrow_mut().push(tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(latency)).await;
                        let result = outside.perform(&call.call);
                        let _ = back.send((call.turn, result));
                    }));
                }
            }
        }
    };
    let failed = loop {
        if ctx.stop.load(Ordering::SeqCst) {
            break None;
        }
        let pass = worker.handle_timeout();
        act(&mut worker, &mut replies, &mut rng);
        if let Err(e) = pass {
            break Some(e);
        }
        let wait = Duration::from_millis(worker.poll_timeout_ms());
        let event = tokio::select! {
            Some((request, reply)) = requests.recv() => {
                let id = next_request;
                next_request += 1;
                replies.insert(id, reply);
                worker.handle_request(id, request)
            }
            Some((turn, result)) = results.recv() => {
                result_in(turn, &result);
                worker.handle_result(turn, result)
            }
            _ = tokio::time::sleep(wait) => Ok(()),
        };
        act(&mut worker, &mut replies, &mut rng);
        if let Err(e) = event {
            break Some(e);
        }
    };
    ctx.set_inbox(None);
    if let Some(e) = failed {
        ctx.record(Event::Failed { cause: e.to_string() });
        // Fail-stop: the process exits; its calls die with it, and its
        // database is closed before anything boots again.
        for call in calls.borrow_mut().drain(..) {
            call.abort();
        }
        drop(worker);
        ctx.database_released().await;
        return Exit::Failed;
    }
    // SIGTERM: no new work; the calls out come back and are persisted.
    ctx.record(Event::Stopping);
    worker.stop();
    requests.close();
    while let Ok((request, reply)) = requests.try_recv() {
        let _ = request;
        let _ = reply.send(Err(OpError::Conflict("the daemon is shutting down".into())));
    }
    while worker.in_flight() > 0 {
        let Some((turn, result)) = results.recv().await else {
            break;
        };
        result_in(turn, &result);
        let done = worker.handle_result(turn, result);
        act(&mut worker, &mut replies, &mut rng);
        if let Err(e) = done {
            ctx.record(Event::Failed { cause: e.to_string() });
            break;
        }
    }
    ctx.record(Event::Drained {
        in_flight: worker.in_flight(),
    });
    drop(worker);
    ctx.ended.store(true, Ordering::SeqCst);
    Exit::Ended
}
