//! The driver: runs resolved [`Action`]s on the real runtime
//! (`durable_agent::runtime::Runtime`) over [`SimFs`], restarts it after a
//! crash, and projects its observable state onto the model's [`State`].
//!
//! The system under test is what a daemon runs on one disk: the runtime,
//! the stores' SQLite database (triggers, activity ledger) and the external
//! world. [`Driver::open`] is the daemon's boot: the one recovery procedure
//! (`recovery::recover_stores`, then the runtime's recovery in
//! `Runtime::open`), plus the checkpointed loop's resume.
//!
//! Invariant: the driver only translates. It never repairs, retries or
//! interprets the runtime's behaviour; the external world (the outbox) and
//! the id↔name maps live here because they outlive every crash.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use durable_agent::canary::Canaries;
use durable_agent::fs::{CrashMode, Fault, Fs, SimConfig, SimFs, SimSnapshot};
use durable_agent::recovery::recover_stores;
use durable_agent::runtime::{AgentId, MessageId, Runtime, RuntimeConfig};
use durable_agent::sqlite::{Db, SqliteOptions};
use durable_agent::store::activities::{ActivityGate, ActivityStore};
use durable_agent::store::checkpoints::CheckpointStore;
use durable_agent::store::schema::open_store;
use durable_agent::store::triggers::{TriggerPolicy, TriggerSource, TriggerSpec, TriggerStore};
use durable_agent::world::World;

use crate::model::{Action, Msg, TriggerRow};
mod project;

use crate::standins::{ScriptedOutbox, ScriptedProvider, SimTools};

/// The stores' database.
pub const STORE_DB: &str = "/da/store.db";
/// Logical ms between two ops, and from a crash to the reboot: longer than
/// any trigger lease or backoff, so every op sees all triggers due and
/// every boot finds every lease expired.
pub const OP_MS: u64 = 10_000_000;
pub const BOOT_MS: u64 = 5_000_000;
/// Trigger lease.
pub const LEASE_MS: u64 = 3_600_000;
/// The checkpointed loop's run and session ids.
pub const LOOP_RUN: &str = "run-0";
pub const LOOP_SESSION: &str = "loop-0";

/// Where the runtime lives on the simulated disk.
pub const ROOT: &str = "/da";

/// The fault model the harness runs: SimFs's defaults, but a write the
/// crash interrupts is torn more often (half the time): a torn tail is the
/// shape log recovery exists for, and the search should meet it often.
pub fn sim_config(seed: u64) -> SimConfig {
    SimConfig {
        torn_write_probability: 0.5,
        ..SimConfig::new(seed)
    }
}

/// The seed the install is made with (any: the install does not use it).
const INSTALL_SEED: u64 = 0;

/// Installed disks by canary set (canaries may change the install's I/O).
static INSTALLED: Mutex<Vec<(Canaries, Arc<SimSnapshot>)>> = Mutex::new(Vec::new());

/// The disk right after installing the system with `canaries`: booted
/// once on an empty disk (the store schema created, the loop's first
/// checkpoint written), then stopped cleanly. The same for every seed
/// (`tests/install.rs` checks it), so it is built once per canary set and
/// copied: the fresh install (mostly SQLite parsing the schema's DDL)
/// costs more than the rest of a short run.
pub fn installed_disk(canaries: &Canaries) -> Result<Arc<SimSnapshot>, String> {
    let mut cache = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, disk)) = cache.iter().find(|(c, _)| c == canaries) {
        return Ok(Arc::clone(disk));
    }
    let mut driver = Driver::new(INSTALL_SEED, canaries.clone());
    driver.open().map_err(|e| format!("installing the system: {e}"))?;
    driver.shutdown(CrashMode::ProcessCrash);
    let disk = driver
        .fs
        .snapshot()
        .map(Arc::new)
        .ok_or("installing the system: the disk is not quiet after a clean stop")?;
    cache.push((canaries.clone(), disk.clone()));
    Ok(disk)
}

/// One system (runtime + stores + world) on one simulated disk.
#[derive(Debug)]
pub struct Driver {
    pub fs: SimFs,
    pub world: World,
    config: RuntimeConfig,
    tools: SimTools,
    triggers: TriggerStore,
    activities: ActivityStore,
    checkpoints: CheckpointStore,
    seed: u64,
    rt: Option<Runtime>,
    db: Option<Arc<Mutex<Db>>>,
    /// Every agent ever seen, so messages from terminated senders resolve.
    names: BTreeMap<AgentId, String>,
    msgs: BTreeMap<MessageId, Msg>,
    /// Last reading of the stores (triggers, loop messages); `None` after
    /// a boot or a store op.
    store_cache: Option<(Vec<TriggerRow>, Vec<String>)>,
    /// The I/O point count each world delivery happened after.
    sent_at: Arc<Mutex<Vec<u64>>>,
}

/// The driver's id↔name bookkeeping, saved at the start of an op so a
/// crash image forked inside it sees what a crashed run would have.
#[derive(Debug, Clone, Default)]
pub struct Names {
    names: BTreeMap<AgentId, String>,
    msgs: BTreeMap<MessageId, Msg>,
}

/// A panic mid-call leaves no half-applied SQL (each store step is its
/// own transaction), so a poisoned lock is still usable.
fn lock(db: &Mutex<Db>) -> MutexGuard<'_, Db> {
    db.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(what: &str) -> impl FnOnce(String) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Driver {
    /// A fresh disk; nothing is open yet (see [`Driver::open`]).
    pub fn new(seed: u64, canaries: Canaries) -> Driver {
        Driver::with_fs(seed, canaries, SimFs::new(sim_config(seed)))
    }

    /// A disk with the system installed on it ([`installed_disk`]);
    /// nothing is open yet.
    pub fn from_install(seed: u64, canaries: Canaries, install: &SimSnapshot) -> Driver {
        Driver::with_fs(seed, canaries, SimFs::from_snapshot(install, sim_config(seed)))
    }

    fn with_fs(seed: u64, canaries: Canaries, fs: SimFs) -> Driver {
        let world = World::without_dedup();
        let tools = SimTools {
            world: world.clone(),
            ..SimTools::default()
        };
        let mut config = RuntimeConfig::new(seed).with_canaries(canaries.clone());
        config.provider = Arc::new(ScriptedProvider);
        config.tools = Arc::new(tools.clone());
        Driver {
            fs,
            world,
            config,
            tools,
            triggers: TriggerStore::new(TriggerPolicy::default(), canaries.clone()),
            activities: ActivityStore::new(canaries.clone()),
            checkpoints: CheckpointStore::new(canaries),
            seed,
            rt: None,
            db: None,
            names: BTreeMap::new(),
            msgs: BTreeMap::new(),
            store_cache: None,
            sent_at: Arc::default(),
        }
    }

    /// The bookkeeping [`Driver::fork`] needs (cheap: a few names).
    pub fn names(&self) -> Names {
        Names {
            names: self.names.clone(),
            msgs: self.msgs.clone(),
        }
    }

    /// A closed driver on `fs` (a disk rebooted from a crash image at
    /// `point`) whose world holds the deliveries made before that point,
    /// with the bookkeeping `names` and this driver's clock: what a run
    /// killed at `point` has when it reopens. The live run is untouched.
    pub fn fork(&self, fs: SimFs, point: u64, names: Names) -> Driver {
        let sent: Vec<u64> = {
            let sent_at = self.sent_at.lock().unwrap_or_else(|e| e.into_inner());
            sent_at.iter().copied().take_while(|p| *p < point).collect()
        };
        let mut driver = Driver::with_fs(self.seed, self.config.canaries.clone(), fs);
        driver.world = self.world.fork_prefix(sent.len());
        driver.tools.world = driver.world.clone();
        driver.config.tools = Arc::new(driver.tools.clone());
        driver.sent_at = Arc::new(Mutex::new(sent));
        driver.set_step(self.now() / OP_MS);
        driver.names = names.names;
        driver.msgs = names.msgs;
        driver
    }

    /// The logical time of op number `step` (ms).
    pub fn set_step(&self, step: u64) {
        self.tools.now_ms.store(step * OP_MS, Ordering::SeqCst);
    }

    fn now(&self) -> u64 {
        self.tools.now_ms.load(Ordering::SeqCst)
    }

    /// Boot: the stores (ledger recovery, lease reclaim), then the runtime
    /// (its recovery). Any error leaves the driver closed.
    pub fn open(&mut self) -> Result<(), String> {
        self.close();
        let now = self.now() + BOOT_MS;
        let fs: Arc<dyn Fs> = Arc::new(self.fs.clone());
        fs.create_dir_all(Path::new(ROOT), "daemon root mkdir")
            .map_err(|e| format!("mkdir {ROOT}: {e}"))?;
        fs.sync_dir(Path::new("/"), "daemon root parent fsync")
            .map_err(|e| format!("fsync /: {e}"))?;
        let opts = SqliteOptions {
            seed: self.seed,
            ..SqliteOptions::default()
        };
        // One connection serves the ledger gate, the trigger store and the
        // loop, under one lock (as a single-threaded daemon would run it):
        // one schema read per boot instead of two. The concurrent daemon
        // (`src/daemon`) keeps two connections; its crashes mid-I/O,
        // second connection included, are the madsim simulation's
        // (`crate::madsim_sim`), not this driver's.
        let db = open_store(fs.clone(), Path::new(STORE_DB), &opts)
            .map_err(|e| err("open the stores")(e.to_string()))?;
        let db = Arc::new(Mutex::new(db));
        let gate = ActivityGate::shared(
            db.clone(),
            Arc::new(ScriptedOutbox {
                world: self.world.clone(),
                fs: self.fs.clone(),
                sent_at: self.sent_at.clone(),
            }),
            self.activities.clone(),
        );
        recover_stores(&gate, &self.triggers, &db, now).map_err(|e| err("store recovery")(e.to_string()))?;
        {
            // The loop resumes from its last checkpoint (rolling back a
            // partial round); a fresh loop starts with an empty checkpoint.
            let db = lock(&db);
            let resumed = self
                .checkpoints
                .resume(db.conn(), LOOP_RUN, LOOP_SESSION)
                .map_err(|e| err("loop resume")(e.to_string()))?;
            if resumed.checkpoint.is_none() {
                self.checkpoint(&db, 0, now)?;
            }
        }
        *self.tools.gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(gate);
        let (rt, _report) = Runtime::open(fs, Path::new(ROOT), self.config.clone())
            .map_err(|e| err("runtime recovery")(e.to_string()))?;
        self.db = Some(db);
        self.rt = Some(rt);
        Ok(())
    }

    fn close(&mut self) {
        self.store_cache = None;
        self.rt = None;
        self.db = None;
        *self.tools.gate.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// kill -9: nothing after this instant reaches the disk (not even
    /// SQLite's close-time checkpoint: the next I/O point, if any, is the
    /// crash), then apply `mode` and reboot the disk. Returns whether an
    /// injected crash point had been hit. The system must be
    /// [`Driver::open`]ed again.
    pub fn crash(&mut self, mode: CrashMode) -> bool {
        let hit = self.fs.crashed();
        if !hit {
            self.fs.set_fault(Some(Fault::CrashAt(self.fs.points() + 1)));
        }
        self.close();
        self.fs.restart(mode);
        hit
    }

    /// A clean stop: close everything (SQLite checkpoints on close), then
    /// reboot the disk keeping what was written. Returns whether an injected
    /// crash point was hit during the stop (then `mode_if_hit` applies).
    pub fn shutdown(&mut self, mode_if_hit: CrashMode) -> bool {
        self.close();
        let hit = self.fs.crashed();
        self.fs
            .restart(if hit { mode_if_hit } else { CrashMode::ProcessCrash });
        hit
    }

    fn rt(&mut self) -> Result<&mut Runtime, String> {
        self.rt
            .as_mut()
            .ok_or_else(|| "harness: runtime not open".to_string())
    }

    /// The stores' connection (shared with the ledger gate: never hold it
    /// across a runtime call, which may go through the gate).
    fn db(&self) -> Result<MutexGuard<'_, Db>, String> {
        self.db
            .as_ref()
            .map(|db| lock(db))
            .ok_or_else(|| "harness: store not open".to_string())
    }

    fn id(&self, name: &str) -> Result<AgentId, String> {
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| "harness: runtime not open".to_string())?;
        rt.tree()
            .nodes()
            .iter()
            .find(|(_, v)| v.name == name)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| format!("harness: no live agent named {name}"))
    }

    fn trigger_id(&self, key: &str) -> Result<String, String> {
        let all = self
            .triggers
            .all(self.db()?.conn(), self.now())
            .map_err(|e| e.to_string())?;
        all.into_iter()
            .find(|t| t.dedup_key.as_deref() == Some(key))
            .map(|t| t.id)
            .ok_or_else(|| format!("no trigger with dedup key {key}"))
    }

    /// Run one action on the system.
    pub fn exec(&mut self, action: &Action) -> Result<(), String> {
        let now = self.now();
        if matches!(
            action,
            Action::Emit { .. } | Action::Claim { .. } | Action::Ack { .. } | Action::LoopRound { .. }
        ) {
            self.store_cache = None;
        }
        match action {
            Action::CreateRoot { name } => {
                let id = self.rt()?.create_root(name, "root").map_err(|e| e.to_string())?;
                self.names.insert(id, name.clone());
            }
            Action::SpawnChild { parent, name } => {
                let parent = self.id(parent)?;
                let id = self
                    .rt()?
                    .spawn_child(&parent, name, "child")
                    .map_err(|e| e.to_string())?;
                self.names.insert(id, name.clone());
            }
            Action::RunTurn { agent, prompt, .. } => {
                let id = self.id(agent)?;
                self.rt()?.run_turn(&id, prompt).map_err(|e| e.to_string())?;
            }
            Action::SendMessage { from, to, payload } => {
                let (f, t) = (self.id(from)?, self.id(to)?);
                let mid = self
                    .rt()?
                    .send_message(&f, &t, payload)
                    .map_err(|e| e.to_string())?;
                self.msgs.insert(
                    mid,
                    Msg {
                        from: from.clone(),
                        payload: payload.clone(),
                    },
                );
            }
            Action::Deliver { agent } => {
                let id = self.id(agent)?;
                self.rt()?.deliver(&id).map_err(|e| e.to_string())?;
            }
            Action::Evict { agent } => {
                let id = self.id(agent)?;
                self.rt()?.evict(&id).map_err(|e| e.to_string())?;
            }
            Action::Restore { agent } => {
                let id = self.id(agent)?;
                self.rt()?.restore(&id).map_err(|e| e.to_string())?;
            }
            Action::Terminate { agent } => {
                let id = self.id(agent)?;
                self.rt()?.terminate(&id).map_err(|e| e.to_string())?;
            }
            Action::Emit { key } => {
                let spec = TriggerSpec {
                    source: TriggerSource::System,
                    dedup_key: Some(key.clone()),
                    session_id: None,
                    fire_at_ms: 0,
                    priority: 0,
                    description: format!("trigger {key}"),
                    payload: serde_json::json!({ "key": key }),
                };
                self.triggers
                    .emit(self.db()?.conn(), &spec, now)
                    .map_err(|e| e.to_string())?;
            }
            Action::Claim { key } => {
                let got = self
                    .triggers
                    .claim(self.db()?.conn(), now, LEASE_MS)
                    .map_err(|e| e.to_string())?;
                let got_key = got.as_ref().and_then(|t| t.dedup_key.clone());
                if got_key.as_deref() != Some(key.as_str()) {
                    return Err(format!(
                        "claim handed out {got_key:?}, the model expected {key:?}"
                    ));
                }
            }
            Action::LoopRound { round, tools } => self.loop_round(*round, *tools, now)?,
            Action::Ack { key, ok } => {
                let id = self.trigger_id(key)?;
                let db = self.db()?;
                let conn = db.conn();
                let r = if *ok {
                    self.triggers.ack_done(conn, &id, now)
                } else {
                    self.triggers
                        .ack_failed(conn, &id, now, "tool failed", true)
                        .map(|_| ())
                };
                r.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
