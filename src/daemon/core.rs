//! [`Daemon`]: boot (recovery, store open, lease reclaim, ledger recovery,
//! agents, one-time triggers) and run (spawn the agent tasks and the
//! scheduler, wait until one of them stops the daemon).
//!
//! Invariant: every task reaches the runtime and stores only through
//! [`Shared::lock`], which refuses once the daemon stopped, so nothing is
//! written after an unknown-outcome error.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::fs::Fs;
use crate::recovery::recover_stores;
use crate::runtime::{AgentId, Runtime, RuntimeConfig};
use crate::sqlite::{Db, SqliteOptions};
use crate::store::activities::{ActivityGate, ActivityStore};
use crate::store::schema::open_store;
use crate::store::triggers::{EmitOutcome, TriggerSource, TriggerSpec, TriggerStore};
use crate::world::World;

use super::tools::{FlakyProvider, LedgerTools};
use super::{agents, scheduler, DaemonClock, DaemonConfig, DaemonError, DaemonEvent, Observer};

/// The single owner of the runtime and the stores.
#[derive(Debug)]
pub(super) struct Core {
    pub(super) runtime: Runtime,
    pub(super) db: Arc<Mutex<Db>>,
    pub(super) triggers: TriggerStore,
    /// The activity ledger (its own connection), shared with the tools.
    pub(super) gate: ActivityGate,
    /// Worker `i`'s id.
    pub(super) agents: Vec<AgentId>,
    pub(super) stopped: Option<String>,
}

impl Core {
    pub(super) fn db(&self) -> MutexGuard<'_, Db> {
        // Each store call is one transaction: a panic elsewhere cannot leave
        // the connection mid-transaction, so a poisoned lock is usable.
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }
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
    /// Recover and get ready: open the stores and recover them (step 0 of
    /// [`crate::recovery`]: settle INTENTs, reclaim leases — every lease, as
    /// one daemon owns the database), open the runtime (which runs the rest
    /// of recovery), create missing agents, emit the one-time triggers.
    pub fn boot(
        fs: Arc<dyn Fs>,
        world: World,
        config: DaemonConfig,
        clock: DaemonClock,
        observer: Observer,
    ) -> Result<Daemon, DaemonError> {
        let now = clock.now_ms();
        let opts = SqliteOptions {
            seed: config.seed,
            ..SqliteOptions::default()
        };
        durable_parent(&*fs, &config.db_path)?;
        let db = Arc::new(Mutex::new(open_store(fs.clone(), &config.db_path, &opts)?));
        let db_watch = Arc::downgrade(&db);
        let gate = ActivityGate::new(
            open_store(fs.clone(), &config.db_path, &opts)?,
            Arc::new(world),
            ActivityStore::new(config.canaries.clone()),
        );
        let triggers = TriggerStore::new(config.trigger_policy, config.canaries.clone());
        // Step 0 of the one recovery procedure: the stores, before any turn.
        let (stores, reclaimed_all) = {
            let stores = recover_stores(&gate, &triggers, &db, now)?;
            let db = db.lock().unwrap_or_else(|e| e.into_inner());
            // One daemon owns the database, so every lease still held at
            // boot belongs to the dead process: reclaim it now instead of
            // letting the trigger wait out its lease. (WORKAROUND: the store
            // has no "reclaim all" call; any such lease ends by now + lease.)
            let all = triggers.reclaim_expired(db.conn(), now.saturating_add(config.lease_ms))?;
            (stores, all)
        };
        let mut rc = RuntimeConfig::new(config.seed)
            .with_slots(config.slots)
            .with_canaries(config.canaries.clone());
        rc.provider = Arc::new(FlakyProvider::new(
            config.seed,
            config.boot,
            config.provider_failure,
        ));
        rc.tools = Arc::new(LedgerTools {
            gate: gate.clone(),
            clock,
        });
        let (mut runtime, report) = Runtime::open(fs, &config.root, rc)?;
        let violations = runtime.check_invariants();
        if !violations.is_empty() {
            return Err(DaemonError::Invariants(violations));
        }
        let record = |event| observer.record(clock.now_ms(), event);
        let agents = ensure_agents(&mut runtime, config.agents, &record)?;
        let mut core = Core {
            runtime,
            db,
            triggers,
            gate,
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
            agents_recovered: report.agents_recovered,
            messages_reinjected: report.reinjected_count(),
            leases_reclaimed: stores.reclaimed_triggers.len() + reclaimed_all.len(),
            intents_settled: stores.activities.len(),
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

/// Create `path`'s directory and fsync every directory on the way up, so
/// the database file's entry can be made durable (SQLite syncs only the
/// file's own directory).
fn durable_parent(fs: &dyn Fs, path: &Path) -> Result<(), DaemonError> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    let io = |source| DaemonError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs.create_dir_all(dir, "daemon db dir mkdir").map_err(io)?;
    for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        fs.sync_dir(d, "daemon db dir chain fsync").map_err(io)?;
    }
    Ok(())
}

/// Emit through the trigger store's front door and record it.
pub(super) fn emit(
    core: &mut Core,
    spec: &TriggerSpec,
    now: u64,
    record: &dyn Fn(DaemonEvent),
) -> Result<(), DaemonError> {
    let outcome = core.triggers.emit(core.db().conn(), spec, now)?;
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
