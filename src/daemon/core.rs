//! [`Daemon`]: boot (the one [`System::boot`], then agents and one-time
//! triggers) and run (spawn the agent tasks and the
//! scheduler, wait until one of them stops the daemon).
//!
//! Invariant: every task reaches the runtime and stores only through
//! [`Shared::lock`], which refuses once the daemon stopped, so nothing is
//! written after an unknown-outcome error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use crate::fs::Fs;
use crate::runtime::{AgentId, PureTools, Runtime};
use crate::sqlite::Db;
use crate::store::triggers::{EmitOutcome, TriggerSource, TriggerSpec};
use crate::system::{Deps, System, SystemConfig};
use crate::world::Outbox;

use super::tools::FlakyProvider;
use super::{agents, scheduler, DaemonClock, DaemonConfig, DaemonError, DaemonEvent, Observer};

/// The single owner of the system.
#[derive(Debug)]
pub(super) struct Core {
    pub(super) system: System,
    /// Worker `i`'s id.
    pub(super) agents: Vec<AgentId>,
    pub(super) stopped: Option<String>,
}

/// What every task shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) core: tokio::sync::Mutex<Core>,
    pub(super) config: DaemonConfig,
    pub(super) clock: DaemonClock,
    pub(super) observer: Observer,
    /// Wakes the scheduler (a new trigger, a failed one to back off).
    pub(super) wake: tokio::sync::Notify,
    /// Wakes [`Daemon::run`] when a task stopped the daemon.
    pub(super) stop: tokio::sync::Notify,
}

/// The daemon stopped; the task that sees this returns.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stopped;

impl Shared {
    pub(super) fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(super) fn record(&self, event: DaemonEvent) {
        self.observer.record(self.now(), event);
    }

    /// The core, unless the daemon stopped.
    pub(super) async fn lock(&self) -> Result<tokio::sync::MutexGuard<'_, Core>, Stopped> {
        let core = self.core.lock().await;
        if core.stopped.is_some() {
            return Err(Stopped);
        }
        Ok(core)
    }

    /// Stop the daemon after an unknown-outcome error.
    pub(super) fn fail(&self, core: &mut Core, cause: String) -> Stopped {
        if core.stopped.is_none() {
            tracing::warn!(%cause, "daemon stopping: outcome unknown, boot again to recover");
            self.record(DaemonEvent::Stopped { cause: cause.clone() });
            core.stopped = Some(cause);
            self.stop.notify_one();
        }
        Stopped
    }

    /// A seeded random stream for task `task` of this boot.
    pub(super) fn rng(&self, task: u64) -> rand_chacha::ChaCha8Rng {
        use rand::SeedableRng;
        let mixed = self.config.seed
            ^ (u64::from(self.config.boot)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ task.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        rand_chacha::ChaCha8Rng::seed_from_u64(mixed)
    }
}

/// A booted daemon, ready to [`run`](Daemon::run).
#[derive(Debug)]
pub struct Daemon {
    shared: Arc<Shared>,
    db_watch: Weak<Mutex<Db>>,
}

impl Daemon {
    /// Boot the system ([`System::boot`]: root lock, stores, the one
    /// recovery procedure), then create missing agents and emit the
    /// one-time triggers.
    pub fn boot(
        fs: Arc<dyn Fs>,
        outbox: Arc<dyn Outbox>,
        config: DaemonConfig,
        clock: DaemonClock,
        observer: Observer,
    ) -> Result<Daemon, DaemonError> {
        let now = clock.now_ms();
        let mut sc = SystemConfig::new(config.root.clone(), config.seed);
        sc.slots = config.slots;
        sc.trigger_policy = config.trigger_policy;
        sc.canaries = config.canaries.clone();
        let deps = Deps {
            provider: Arc::new(FlakyProvider::new(
                config.seed,
                config.boot,
                config.provider_failure,
            )),
            tools: Arc::new(PureTools),
            outbox,
            clock: Arc::new(clock),
        };
        let (mut system, report) = System::boot(fs, sc, deps)?;
        let db_watch = system.db_watch();
        let record = |event| observer.record(clock.now_ms(), event);
        let agents = ensure_agents(system.runtime_mut(), config.agents, &record)?;
        let mut core = Core {
            system,
            agents,
            stopped: None,
        };
        for once in &config.one_time {
            let key = DaemonConfig::once_key(&once.id);
            let spec = TriggerSpec {
                source: TriggerSource::Scheduled,
                payload: DaemonConfig::trigger_payload(&key, once.agent),
                dedup_key: Some(key),
                session_id: None,
                fire_at_ms: once.fire_at_ms,
                priority: 0,
                description: format!("one-time task {}", once.id),
            };
            emit(&mut core, &spec, now, &record)?;
        }
        record(DaemonEvent::Booted {
            boot: config.boot,
            agents_recovered: report.runtime.agents_recovered,
            messages_reinjected: report.runtime.reinjected_count(),
            leases_reclaimed: report.stores.reclaimed_triggers.len(),
            intents_settled: report.stores.activities.len(),
        });
        let shared = Arc::new(Shared {
            core: tokio::sync::Mutex::new(core),
            config,
            clock,
            observer,
            wake: tokio::sync::Notify::new(),
            stop: tokio::sync::Notify::new(),
        });
        Ok(Daemon { shared, db_watch })
    }

    /// Watches the database handle: once it cannot be upgraded, every
    /// connection of this daemon is closed (a simulated crash must drop
    /// them before the disk reboots).
    pub fn db_watch(&self) -> Weak<Mutex<Db>> {
        self.db_watch.clone()
    }

    /// Run until an unknown-outcome error stops the daemon; returns it.
    pub async fn run(self) -> DaemonError {
        let sh = self.shared;
        let mut tasks = Vec::new();
        for i in 0..sh.config.agents {
            tasks.push(tokio::spawn(agents::agent_loop(sh.clone(), i)));
        }
        tasks.push(tokio::spawn(scheduler::scheduler_loop(sh.clone())));
        sh.stop.notified().await;
        for t in &tasks {
            t.abort();
        }
        let cause = sh.core.lock().await.stopped.clone().unwrap_or_default();
        DaemonError::Stopped(cause)
    }
}

/// Emit through the trigger store's front door and record it.
pub(super) fn emit(
    core: &mut Core,
    spec: &TriggerSpec,
    now: u64,
    record: &dyn Fn(DaemonEvent),
) -> Result<(), DaemonError> {
    let system = &core.system;
    let outcome = system.triggers().emit(system.db().conn(), spec, now)?;
    record(DaemonEvent::TriggerEmitted {
        key: spec.dedup_key.clone().unwrap_or_default(),
        fire_at_ms: spec.fire_at_ms,
        inserted: matches!(outcome, EmitOutcome::Inserted(_)),
    });
    Ok(())
}

/// The `lead` root and workers `agent-0..n` under it, created if missing
/// (a crash may have interrupted their creation). Returns worker ids.
fn ensure_agents(
    runtime: &mut Runtime,
    n: usize,
    record: &dyn Fn(DaemonEvent),
) -> Result<Vec<AgentId>, DaemonError> {
    let by_name: BTreeMap<(String, bool), AgentId> = runtime
        .tree()
        .nodes()
        .iter()
        .rev() // the first id wins below, should two share a name
        .map(|(id, node)| ((node.name.clone(), node.parent.is_none()), id.clone()))
        .collect();
    let lead = match by_name.get(&("lead".to_string(), true)) {
        Some(id) => id.clone(),
        None => {
            let id = runtime.create_root("lead", "coordinate the workers")?;
            record(DaemonEvent::AgentCreated { name: "lead".into() });
            id
        }
    };
    let mut workers = Vec::with_capacity(n);
    for i in 0..n {
        let name = DaemonConfig::agent_name(i);
        let id = match by_name.get(&(name.clone(), false)) {
            Some(id) => id.clone(),
            None => {
                let id = runtime.spawn_child(&lead, &name, "work, talk to peers, keep reminders")?;
                record(DaemonEvent::AgentCreated { name });
                id
            }
        };
        workers.push(id);
    }
    Ok(workers)
}
