//! The system: the one composition of the runtime and its stores on one
//! root, and [`System::boot`], the only way to get one.
//!
//! Every entry point boots through here — the daemon ([`crate::daemon`]),
//! the harness's driver, the madsim simulation and the recovery fuzz
//! target — so what the harness proves is what production runs. Provider,
//! reversible tools, the outside world (irreversible side effects) and the
//! clock come in as trait objects ([`Deps`]); nothing here is a fake.
//!
//! Boot, in order (each step's failure is a typed [`SystemError`], and the
//! whole boot is idempotent: a crash during it is recovered by booting
//! again):
//! 1. make the root durable: create it, fsync every directory up the chain;
//! 2. take the root's exclusive lock ([`crate::fs::Fs::lock_exclusive`] on
//!    `{root}/LOCK`): a second process, or a second boot in this one, gets
//!    [`SystemError::Locked`] — never a second writer;
//! 3. open the stores' database (`{root}/store.db`, one connection shared
//!    by every store under one lock, so their transactions never
//!    interleave);
//! 4. the one recovery procedure ([`crate::recovery`]): the stores first
//!    (INTENTs decided, every lease reclaimed — the lock proves their
//!    holders dead), then the runtime (logs, records, tree, inboxes), then
//!    loop resume (every checkpointed run rolled back to its last completed
//!    round); the runtime's invariants must hold afterwards;
//! 5. every interrupted work turn (a job run, an API turn with a work id)
//!    gets a RESUME trigger keyed `resume:{work}` (`resume.rs`).
//!
//! Invariant: while a [`System`] lives it is the root's only writer, and
//! every irreversible tool call of its agent loop goes through the activity
//! ledger ([`tools::SystemTools`]) with the idempotency key the runtime
//! derives; every provider call's usage and every failure with its attempt
//! number is in the usage store ([`calls::StoreCallLog`]).

mod admin;
mod calls;
mod job_run;
mod outbox;
mod resume;
mod tools;
mod wake;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde::Serialize;

use crate::canary::Canaries;
use crate::fs::{Fs, FsLock};
use crate::recovery::{
    preflight, recover_stores, store_behind, DamageError, RecoveryReport, StoreRecovery, StoreRecoveryError,
};
use crate::runtime::context::ContextBudget;
use crate::runtime::{
    AgentId, Hooks, NoHooks, NoRetries, Orchestration, Provider, Runtime, RuntimeConfig, RuntimeError,
    Started, ToolExecutor, ToolRetries, TurnKind,
};
use crate::sqlite::{Db, SqliteOptions};
use crate::store::activities::{ActivityGate, ActivityStore};
use crate::store::checkpoints::CheckpointStore;
use crate::store::manifest::{self, Manifest, MANIFEST_FILE, MANIFEST_VERSION};
use crate::store::schema::open_store;
use crate::store::tool_calls::{RunStatus, ToolCallStore};
use crate::store::triggers::{Trigger, TriggerPolicy, TriggerStatus, TriggerStore};
use crate::store::StoreError;
use crate::world::Outbox;

pub use admin::{Confirmed, Resolution, SystemGcReport, SystemStripReport, WaitingRun, DEFAULT_GC_TTL_MS};
pub use calls::StoreCallLog;
pub use job_run::{job_work, settled_status, JobRunError, JobStart};
pub use outbox::OutboxRoutes;
pub use resume::{resume_key, resume_key_parts};
pub use tools::{parked_answer, session_run, SystemTools};
pub use wake::{wake_key, WakeUps};

/// The stores' database, inside the root.
pub const STORE_DB_FILE: &str = "store.db";
/// The root's lock file (its content is never read).
pub const LOCK_FILE: &str = "LOCK";

/// A clock in logical milliseconds: the only time the stores see (trigger
/// fire times, leases, backoff, ledger timestamps). Production reads the
/// host clock once at the edge; simulations supply their own.
pub trait LogicalClock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> u64;
}

/// What the system is made of, apart from the disk: everything the
/// system's behaviour depends on, with the disk and [`Deps`].
#[derive(Debug, Clone)]
pub struct SystemConfig {
    /// The root: sessions under it, the stores' database and the lock in it.
    pub root: PathBuf,
    /// Seed of ids and of SQLite's PRNG (determinism under simulation).
    pub seed: u64,
    /// Provider slots (LRU eviction beyond them).
    pub slots: usize,
    /// Bound on tool rounds per turn.
    pub max_tool_rounds: u32,
    pub trigger_policy: TriggerPolicy,
    /// Known bugs to re-introduce; only the harness's `canaries` build can
    /// set any (see [`crate::canary`]).
    pub canaries: Canaries,
    /// Hooks and policy on every tool call ([`crate::runtime::hooks`]).
    pub hooks: Arc<dyn Hooks>,
    /// How tools' hard failures are retried ([`ToolRetries`]).
    pub tool_retries: Arc<dyn ToolRetries>,
    /// What one provider request may carry ([`crate::runtime::context`]);
    /// default: no budget.
    pub context_budget: ContextBudget,
    /// The orchestration tools the runtime performs
    /// ([`crate::runtime::orchestration`]); default: none.
    pub orchestration: Option<Orchestration>,
}

impl SystemConfig {
    /// Defaults under `root`: 3 slots, 4 tool rounds, the default trigger
    /// policy, no canaries.
    pub fn new(root: impl Into<PathBuf>, seed: u64) -> Self {
        SystemConfig {
            root: root.into(),
            seed,
            slots: 3,
            max_tool_rounds: 4,
            trigger_policy: TriggerPolicy::default(),
            canaries: Canaries::none(),
            hooks: Arc::new(NoHooks),
            tool_retries: Arc::new(NoRetries),
            context_budget: ContextBudget::default(),
            orchestration: None,
        }
    }

    /// The stores' database.
    pub fn db_path(&self) -> PathBuf {
        self.root.join(STORE_DB_FILE)
    }
}

/// The outside world, handed in: production gets the real ones, the
/// harness its stand-ins.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The LLM.
    pub provider: Arc<dyn Provider>,
    /// Reversible tools (called directly; replay is harmless).
    pub tools: Arc<dyn ToolExecutor>,
    /// Where irreversible side effects go, through the activity ledger.
    pub outbox: Arc<dyn Outbox>,
    pub clock: Arc<dyn LogicalClock>,
}

/// What boot found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BootReport {
    /// Step 0: INTENT decisions and reclaimed leases.
    pub stores: StoreRecovery,
    /// The runtime's recovery.
    pub runtime: RecoveryReport,
    /// Checkpointed runs resumed: (run id, messages rolled back).
    pub loops_resumed: Vec<(String, usize)>,
    /// RESUME triggers emitted for interrupted work turns (their dedup
    /// keys, `resume:{work}`; see `resume.rs`).
    pub resumes_emitted: Vec<String>,
}

/// Boot failed, or a system operation did. Every variant but `Locked`,
/// `LeaseLost` and `Invariants` means "outcome unknown: boot again".
#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error("cannot make the root {root} durable: {source}")]
    Root {
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "root {root} is in use by another durable-agent (its lock {lock} is held); \
         stop it or use its API — two writers would corrupt the root"
    )]
    Locked {
        root: PathBuf,
        lock: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("stores: {0}")]
    Store(#[from] StoreError),
    #[error("store recovery: {0}")]
    StoreRecovery(#[from] StoreRecoveryError),
    #[error("runtime: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("loop resume: {0}")]
    LoopResume(StoreError),
    /// A release asked for a job run that waits for a confirmation
    /// (`System::release_run`).
    #[error(
        "run {run_id} waits for a human's answer to a call needing confirmation, \
         which a release cannot give: answer its key with `confirm` (`status` lists it), \
         and the run resumes"
    )]
    AwaitsConfirmation { run_id: String },
    #[error("after recovery the runtime breaks its invariants: {0:?}")]
    Invariants(Vec<String>),
    /// Damage outside the crash model (see [`crate::recovery::damage`]),
    /// a file a newer build wrote, or a preflight read that failed:
    /// refused before anything changed. The message is the cause's (it
    /// says which), not "damaged" for all three.
    #[error("root refused: {0}")]
    Damaged(#[from] DamageError),
}

/// Where a boot found damaged data: the file, and the line and byte offset
/// the damage begins at (a session record is one line: line 1, byte 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorruptLine {
    pub path: PathBuf,
    pub line: u64,
    pub offset: u64,
}

/// Why a boot refused a line ([`SystemError::damaged_line`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFault {
    /// Damage (a checksum mismatch, an unreadable line, a gap in `seq`):
    /// what an operator inspects or restores from a backup.
    Corrupt,
    /// Written by a newer version of durable-agent: not damage, so nothing
    /// is quarantined; an upgrade reads it.
    Newer,
}

impl SystemError {
    /// The line of an event log or session record this error refuses, and
    /// why; `None` for any other error. A session record is one line:
    /// line 1, byte 0.
    pub fn damaged_line(&self) -> Option<(CorruptLine, LineFault)> {
        use crate::log::LogError;
        use crate::store::session::SessionError;
        let at = |path: &std::path::Path, line: u64, offset: u64| CorruptLine {
            path: path.to_path_buf(),
            line,
            offset,
        };
        match self {
            SystemError::Runtime(RuntimeError::Log(LogError::Corrupt {
                path, line, offset, ..
            })) => Some((at(path, *line, *offset), LineFault::Corrupt)),
            SystemError::Runtime(RuntimeError::Session(SessionError::Corrupt { path, .. })) => {
                Some((at(path, 1, 0), LineFault::Corrupt))
            }
            SystemError::Runtime(RuntimeError::Log(LogError::NewerSchema {
                path, line, offset, ..
            })) => Some((at(path, *line, *offset), LineFault::Newer)),
            SystemError::Runtime(RuntimeError::Session(SessionError::NewerSchema { path, .. })) => {
                Some((at(path, 1, 0), LineFault::Newer))
            }
            _ => None,
        }
    }
}

/// The result of [`System::fire`]: what the trigger's turn did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fired {
    /// The turn ran now and the trigger is DONE.
    Ran { tool_calls: usize },
    /// The turn had completed before (a crash fell between it and the ack,
    /// or a lost lease's holder finished it): only the ack ran now.
    AlreadyDone,
}

/// The booted system: the root's one writer.
#[derive(Debug)]
pub struct System {
    runtime: Runtime,
    db: Arc<Mutex<Db>>,
    triggers: TriggerStore,
    gate: ActivityGate,
    checkpoints: CheckpointStore,
    clock: Arc<dyn LogicalClock>,
    config: SystemConfig,
    /// Declared last: released only after every store and log is closed.
    _lock: FsLock,
}

/// The stores' connection, shared by every store and the tools under one
/// lock.
pub(crate) fn lock_db(db: &Mutex<Db>) -> MutexGuard<'_, Db> {
    // Each store call is one transaction: a panic elsewhere cannot leave
    // the connection mid-transaction, so a poisoned lock is usable.
    db.lock().unwrap_or_else(|e| e.into_inner())
}

impl System {
    /// The one boot (see the module docs for its steps).
    pub fn boot(
        fs: Arc<dyn Fs>,
        config: SystemConfig,
        deps: Deps,
    ) -> Result<(System, BootReport), SystemError> {
        let root = config.root.clone();
        let lock = durable_root_locked(&*fs, &root)?;
        // Before anything changes: damage outside the crash model.
        let found = preflight(&*fs, &root, &config.db_path())?;
        let now = deps.clock.now_ms();
        let opts = SqliteOptions {
            seed: config.seed,
            canaries: config.canaries.clone(),
            ..SqliteOptions::default()
        };
        let db = open_store(fs.clone(), &config.db_path(), &opts)?;
        store_identity(&*fs, &root, &config, &db, found.manifest, now)?;
        // An older copy of this root's own store: the logs' settled calls
        // must have their ledger rows, or a resumed turn sends them again.
        let calls = ToolCallStore::default();
        store_behind(&config.db_path(), &found.settled, |call| {
            let known = |row: Result<Option<_>, StoreError>| {
                row.map(|r| r.is_some()).map_err(|e| DamageError::Io {
                    path: config.db_path(),
                    step: "tool-call ledger read",
                    source: io::Error::other(e.to_string()),
                })
            };
            Ok(known(calls.get(db.conn(), &call.call_id))?
                || known(calls.by_key(db.conn(), &call.idempotency_key))?)
        })?;
        let db = Arc::new(Mutex::new(db));
        let gate = ActivityGate::shared(
            db.clone(),
            deps.outbox.clone(),
            ActivityStore::new(config.canaries.clone()),
        );
        let triggers = TriggerStore::new(config.trigger_policy, config.canaries.clone());
        let checkpoints = CheckpointStore::new(config.canaries.clone());
        // Step 0: the stores, before any turn can run.
        let stores = recover_stores(&gate, &triggers, &db, now)?;
        let mut rc = RuntimeConfig::new(config.seed)
            .with_slots(config.slots)
            .with_canaries(config.canaries.clone());
        rc.max_tool_rounds = config.max_tool_rounds;
        rc.provider = deps.provider.clone();
        rc.tools = Arc::new(SystemTools {
            gate: gate.clone(),
            reversible: deps.tools.clone(),
            clock: deps.clock.clone(),
            db: db.clone(),
            calls: ToolCallStore::default(),
            retries: config.tool_retries.clone(),
        });
        rc.hooks = config.hooks.clone();
        rc.context_budget = config.context_budget;
        rc.orchestration = config.orchestration.clone();
        rc.calls = Arc::new(StoreCallLog {
            db: db.clone(),
            clock: deps.clock.clone(),
            model: deps.provider.model().to_string(),
        });
        // Steps 1-7: the runtime.
        let (runtime, runtime_report) = Runtime::open(fs, &root, rc)?;
        let violations = runtime.check_invariants();
        if !violations.is_empty() {
            return Err(SystemError::Invariants(violations));
        }
        // Last: loop resume, every checkpointed run back to its last round.
        let loops_resumed = {
            let db = lock_db(&db);
            checkpoints
                .resume_all(db.conn())
                .map_err(SystemError::LoopResume)?
                .into_iter()
                .map(|(run, resume)| (run, resume.rolled_back))
                .collect()
        };
        // Then every interrupted work turn gets its RESUME trigger.
        let resumes_emitted = resume::emit_resumes(&runtime, &triggers, &db, now)?;
        let report = BootReport {
            stores,
            runtime: runtime_report,
            loops_resumed,
            resumes_emitted,
        };
        tracing::info!(
            root = %root.display(),
            agents = report.runtime.agents_recovered,
            leases_reclaimed = report.stores.reclaimed_triggers.len(),
            intents_settled = report.stores.activities.len(),
            "system booted"
        );
        let system = System {
            runtime,
            db,
            triggers,
            gate,
            checkpoints,
            clock: deps.clock,
            config,
            _lock: lock,
        };
        Ok((system, report))
    }

    /// The agent runtime (sessions, tree, messages, turns).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn runtime_mut(&mut self) -> &mut Runtime {
        &mut self.runtime
    }

    /// The stores' connection. Never hold it across a runtime call or a
    /// gate call: the activity ledger takes it for every irreversible tool.
    pub fn db(&self) -> MutexGuard<'_, Db> {
        lock_db(&self.db)
    }

    /// Watches the stores' connection: once it cannot be upgraded, this
    /// system's database is closed (a simulated crash must see that before
    /// the disk reboots).
    pub fn db_watch(&self) -> Weak<Mutex<Db>> {
        Arc::downgrade(&self.db)
    }

    pub fn triggers(&self) -> &TriggerStore {
        &self.triggers
    }

    /// The activity ledger, with the outbox it guards.
    pub fn gate(&self) -> &ActivityGate {
        &self.gate
    }

    pub fn checkpoints(&self) -> &CheckpointStore {
        &self.checkpoints
    }

    pub fn config(&self) -> &SystemConfig {
        &self.config
    }

    /// Logical now (ms).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The work id of the turn a trigger starts: its dedup key (else its
    /// id), stable across every crash and re-claim — or, for a RESUME
    /// trigger boot emitted, the interrupted work it resumes.
    pub fn trigger_work(trigger: &Trigger) -> String {
        if let Some(work) = resume::resumed_work(trigger) {
            return work.to_string();
        }
        format!("trigger:{}", trigger.dedup_key.as_deref().unwrap_or(&trigger.id))
    }

    /// Run the turn `claim` (a trigger this process claimed) starts, on
    /// `agent` with `prompt`, then ack it DONE — the chain seed 001 makes
    /// exactly-once for effects: the turn's identity ([`Self::trigger_work`])
    /// and so every idempotency key inside it survive any crash and
    /// re-claim, a turn that completed is never run again, and the ack
    /// proves the claim still holds the lease ([`StoreError::LeaseLost`]
    /// otherwise, with nothing changed).
    ///
    /// A provider failure is returned as is, the trigger still CLAIMED:
    /// the caller acks it failed ([`TriggerStore::ack_failed`]) to retry
    /// with backoff.
    ///
    /// This runs the turn's provider and tool calls inline; a caller that
    /// must not hold the system across them uses [`Self::start_fire`], drives
    /// the turn ([`Runtime::continue_turn`]) and ends with
    /// [`Self::ack_fire`] — the same steps.
    pub fn fire(&mut self, claim: &Trigger, agent: &AgentId, prompt: &str) -> Result<Fired, SystemError> {
        let fired = match self.start_fire(claim, agent, prompt)? {
            Started::Running(task, step) => {
                let outcome = self.runtime.drive(task, step)?;
                Fired::Ran {
                    tool_calls: outcome.tool_calls.len(),
                }
            }
            Started::AlreadyDone => Fired::AlreadyDone,
        };
        self.ack_fire(claim, fired)
    }

    /// [`Self::fire`]'s first step: check the claim, then start the turn
    /// performing [`Self::trigger_work`] (or learn that it completed).
    pub fn start_fire(
        &mut self,
        claim: &Trigger,
        agent: &AgentId,
        prompt: &str,
    ) -> Result<Started, SystemError> {
        if claim.status != TriggerStatus::Claimed {
            return Err(SystemError::Store(StoreError::WrongState {
                table: "triggers",
                id: claim.id.clone(),
                op: "fire",
                expected: "CLAIMED",
                actual: claim.status.as_str().to_string(),
            }));
        }
        let work = Self::trigger_work(claim);
        if let Some(reads) = wake::wake_reads(claim) {
            return self.start_wake(agent, prompt, &work, &reads);
        }
        Ok(self.runtime.start_turn(agent, prompt, TurnKind::Work(&work))?)
    }

    /// [`Self::fire`]'s last step, once the turn completed (or had
    /// completed): settle the job run a RESUME trigger resumed
    /// ([`Self::settle_resumed_run`]), then ack `claim` DONE, proving it
    /// still holds the lease.
    pub fn ack_fire(&mut self, claim: &Trigger, fired: Fired) -> Result<Fired, SystemError> {
        self.settle_resumed_run(claim, RunStatus::Succeeded)?;
        let now = self.now_ms();
        self.triggers.ack_done(self.db().conn(), claim, now)?;
        Ok(fired)
    }
}

/// Boot steps 1-2: the root exists, its entry is durable up the chain, and
/// this process holds its lock. The lock is taken before the fsyncs so
/// that a second process fails before touching anything.
/// The opened store is the one the manifest names; a root without a
/// manifest gets one (its store given an identity first, if it has none).
fn store_identity(
    fs: &dyn Fs,
    root: &Path,
    config: &SystemConfig,
    db: &Db,
    manifest: Option<Manifest>,
    now_ms: u64,
) -> Result<(), SystemError> {
    let path = config.db_path();
    let store_err = |e: rusqlite::Error| {
        SystemError::Damaged(DamageError::Io {
            path: path.clone(),
            step: "application_id",
            source: io::Error::other(e.to_string()),
        })
    };
    let found = db
        .conn()
        .query_row("PRAGMA application_id", [], |r| r.get::<_, i32>(0))
        .map_err(store_err)? as u32;
    match manifest {
        Some(m) if m.store_id == found => Ok(()),
        Some(m) => Err(SystemError::Damaged(DamageError::StoreReplaced {
            path: path.clone(),
            manifest: root.join(MANIFEST_FILE),
            expected: m.store_id,
            found,
        })),
        None => {
            let store_id = if found != 0 {
                found
            } else {
                let id = new_store_id(now_ms, root);
                db.conn()
                    .pragma_update(None, "application_id", id as i32)
                    .map_err(store_err)?;
                id
            };
            let m = Manifest {
                schema_version: MANIFEST_VERSION,
                store_id,
            };
            manifest::write(fs, root, &m).map_err(DamageError::from)?;
            Ok(())
        }
    }
}

/// A store identity: nonzero, and different for roots created at another
/// time or place. Deterministic from the clock and the root's path, and
/// independent of the seed: an install is the same disk whatever the seed
/// (the harness copies one install into every run).
fn new_store_id(now_ms: u64, root: &Path) -> u32 {
    let mut bytes = now_ms.to_le_bytes().to_vec();
    bytes.extend_from_slice(root.as_os_str().as_encoded_bytes());
    let h = crate::runtime::ids::fnv1a(&bytes);
    ((h ^ (h >> 32)) as u32).max(1)
}

fn durable_root_locked(fs: &dyn Fs, root: &Path) -> Result<FsLock, SystemError> {
    let io = |source| SystemError::Root {
        root: root.to_path_buf(),
        source,
    };
    fs.create_dir_all(root, "root mkdir").map_err(io)?;
    let lock_path = root.join(LOCK_FILE);
    let lock = fs.lock_exclusive(&lock_path, "root lock").map_err(|source| {
        // Only "held by someone else" means another writer; any other
        // failure (permissions, I/O) is the root's problem, not a daemon's.
        if source.kind() == io::ErrorKind::WouldBlock {
            SystemError::Locked {
                root: root.to_path_buf(),
                lock: lock_path.clone(),
                source,
            }
        } else {
            SystemError::Root {
                root: root.to_path_buf(),
                source,
            }
        }
    })?;
    for dir in crate::fs::dirs_above(root) {
        fs.sync_dir(dir, "root parent chain fsync").map_err(io)?;
    }
    Ok(lock)
}
