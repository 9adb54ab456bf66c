//! The driver: runs resolved [`Action`]s on the real runtime
//! (`durable_agent::runtime::Runtime`) over [`SimFs`], restarts it after a
//! crash, and projects its observable state onto the model's [`State`].
//!
//! The system under test is the product's one composition,
//! [`System::boot`] — the runtime, the stores' SQLite database (triggers,
//! activity ledger, checkpoints) and the external world — booted exactly
//! as the daemon boots it, with the harness's stand-ins as its provider,
//! reversible tools, outbox and clock.
//!
//! Invariant: the driver only translates. It never repairs, retries or
//! interprets the runtime's behaviour; the external world (the outbox) and
//! the id↔name maps live here because they outlive every crash.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use durable_agent::canary::Canaries;
use durable_agent::fs::{Fault, SimConfig, SimFs, SimSnapshot};
use durable_agent::runtime::WorkTurn;
use durable_agent::runtime::{AgentId, MessageId, Runtime, RuntimeError, Started, TurnKind, TurnOutcome};
use durable_agent::store::activities::ActivityStatus;
use durable_agent::store::triggers::{Trigger, TriggerSource, TriggerSpec};
use durable_agent::store::StoreError;
use durable_agent::system::{job_work, settled_status, JobStart};
use durable_agent::system::{Deps, Resolution, System, SystemConfig, SystemError};
use durable_agent::worker::ops::{settle_fire, FireResult};
use durable_agent::world::World;

use crate::model::{Action, Msg, TriggerRow};
use crate::op::{CrashKind, ToolStep};
use crate::oracle_context::ContextOracle;
use crate::rot::{self, Rot};
use durable_agent::system::{CorruptLine, LineFault};
use std::path::PathBuf;
mod collected;
mod errors;
mod misuse;
mod project;
mod release;
mod replays;
mod stamps;
mod typed;
mod usage;
pub mod verified;
mod verify_fault;
mod views;

use project::checkpoint;

use crate::standins::{ProviderFaults, Rewording, ScriptedOutbox, ScriptedProvider, SimTools, SteppedClock};

/// The stores' database (the system's layout: `store.db` in the root).
pub const STORE_DB: &str = "/da/store.db";
/// Logical ms between two ops, and from a crash to the reboot: longer than
/// any trigger lease, so every boot finds every lease expired; shorter
/// than the backoff floor ([`crate::model::BACKOFF_BASE_MS`]),
/// so a failed ack's row is not due at the next two ops.
pub const OP_MS: u64 = 10_000_000;
pub const BOOT_MS: u64 = 5_000_000;
/// Trigger lease.
pub const LEASE_MS: u64 = 3_600_000;
/// The checkpointed loop's run and session ids.
pub const LOOP_RUN: &str = "run-0";
pub const LOOP_SESSION: &str = "loop-0";

/// One reading of the stores the projection compares: the trigger rows,
/// the checkpointed loop's messages, the job runs (id, status).
type StoreReading = (Vec<TriggerRow>, Vec<String>, BTreeMap<String, String>);

/// Where the runtime lives on the simulated disk.
pub const ROOT: &str = "/da";

/// The fault model the harness runs: SimFs's defaults, but a write the
/// crash interrupts is torn more often (half the time): a torn tail is the
/// shape log recovery exists for, and the search should meet it often (so
/// is an `fsync` the power cut in the middle of: the same draw). And one
/// `read_at` in ten returns short, so every reader must loop.
pub fn sim_config(seed: u64) -> SimConfig {
    SimConfig {
        torn_write_probability: 0.5,
        short_read_probability: SHORT_READ_PROBABILITY,
        ..SimConfig::new(seed)
    }
}

/// Share of the harness's `read_at`s that return fewer bytes than asked.
pub const SHORT_READ_PROBABILITY: f64 = 0.1;

/// The seed the install is made with (any: the install does not use it).
const INSTALL_SEED: u64 = 0;

/// Installed disks by canary set and origin (canaries may change the
/// install's I/O; an older origin's install migrates its store).
static INSTALLED: Mutex<Vec<(Canaries, u32, Arc<SimSnapshot>)>> = Mutex::new(Vec::new());

/// The disk right after installing the system with `canaries` on the
/// disk an `origin` build left ([`Driver::before_install`]): booted once
/// (the store schema created, or an older build's store migrated; the
/// loop's first checkpoint written), then stopped cleanly. The same for
/// every seed of that origin (`tests/install.rs` checks it), so it is
/// built once per canary set and origin and copied: the fresh install
/// (mostly SQLite parsing the schema's DDL) costs more than the rest of a
/// short run.
pub fn installed_disk(canaries: &Canaries, origin: u32) -> Result<Arc<SimSnapshot>, String> {
    let mut cache = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, disk)) = cache.iter().find(|(c, o, _)| c == canaries && *o == origin) {
        return Ok(Arc::clone(disk));
    }
    let mut driver = Driver::before_install(INSTALL_SEED, canaries.clone(), origin)?;
    driver.open().map_err(|e| format!("installing the system: {e}"))?;
    driver.shutdown(CrashKind::Process);
    let disk = driver
        .fs
        .snapshot()
        .map(Arc::new)
        .ok_or("installing the system: the disk is not quiet after a clean stop")?;
    cache.push((canaries.clone(), origin, disk.clone()));
    Ok(disk)
}

/// Disks older builds left, by schema version ([`left_by`]).
static LEFT: Mutex<Vec<(u32, SimFs)>> = Mutex::new(Vec::new());

/// The disk this build is installed on when a build of schema `origin`
/// ran there before ([`crate::model::installed_by`]): empty for this
/// build's own schema; else that build's store, created at its schema
/// (`store::schema::older_schema`, its `user_version` stamped, no rows,
/// no `root.json`: builds of then wrote none) and closed cleanly, so all
/// of it is durable. Its writes are not this run's: the run's disk is a
/// detached copy ([`SimFs::detached`]), its I/O points counted from 0, and
/// the first boot's migration is crashed like any other I/O.
fn left_by(origin: u32, config: SimConfig) -> Result<SimFs, String> {
    use durable_agent::store::schema::{older_schema, SCHEMA_VERSION};
    use durable_agent::system::STORE_DB_FILE;
    if origin == SCHEMA_VERSION {
        return Ok(SimFs::new(config));
    }
    let mut cache = LEFT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, disk)) = cache.iter().find(|(o, _)| *o == origin) {
        return Ok(disk.detached(config));
    }
    let ddl = older_schema(origin).ok_or_else(|| format!("no schema version {origin} to install from"))?;
    let fs = SimFs::new(SimConfig::new(INSTALL_SEED));
    let root = std::path::Path::new(ROOT);
    let made = (|| -> Result<(), String> {
        use durable_agent::fs::Fs;
        let err = |e: std::io::Error| e.to_string();
        fs.create_dir_all(root, "older build mkdir").map_err(err)?;
        fs.sync_dir(std::path::Path::new("/"), "older build root dir fsync")
            .map_err(err)?;
        let db = durable_agent::sqlite::open(
            Arc::new(fs.clone()),
            &root.join(STORE_DB_FILE),
            &durable_agent::sqlite::SqliteOptions::default(),
        )
        .map_err(|e| e.to_string())?;
        db.conn().execute_batch(&ddl).map_err(|e| e.to_string())?;
        db.conn()
            .pragma_update(None, "user_version", origin)
            .map_err(|e| e.to_string())?;
        drop(db);
        fs.sync_dir(root, "older build store dir fsync").map_err(err)
    })();
    made.map_err(|e| format!("making a version-{origin} build's store: {e}"))?;
    if fs.snapshot().is_none() {
        return Err(format!(
            "making a version-{origin} build's store: the disk is not quiet"
        ));
    }
    let disk = fs.detached(config);
    cache.push((origin, fs));
    Ok(disk)
}

/// After a boot: `root.json` names the store the boot opened (its SQLite
/// `application_id`), as the boot promises, so that a store swapped in
/// later is refused (`StoreReplaced`) and a store lost is missed
/// (`StoreMissing`). Read from a detached copy: no I/O point of the run.
fn identity_violation(fs: &SimFs, store_id: rusqlite::Result<i32>) -> Option<String> {
    use durable_agent::fs::SimConfig;
    use durable_agent::store::manifest;
    let root = std::path::Path::new(ROOT);
    let copy = fs.detached(SimConfig::new(0));
    let found = manifest::read(&copy, root);
    match (found, store_id) {
        (Ok(Some(m)), Ok(id)) if m.store_id == id as u32 => None,
        (Ok(found), Ok(id)) => Some(format!(
            "identity: after the boot {} reads {found:?}, the store's application_id is {id:#x}",
            root.join(manifest::MANIFEST_FILE).display()
        )),
        (Err(e), _) => Some(format!("identity: {e}")),
        (_, Err(e)) => Some(format!(
            "identity: the store's application_id cannot be read: {e}"
        )),
    }
}

/// One system (runtime + stores + world) on one simulated disk.
#[derive(Debug)]
pub struct Driver {
    pub fs: SimFs,
    pub world: World,
    canaries: Canaries,
    tools: SimTools,
    clock: SteppedClock,
    seed: u64,
    system: Option<System>,
    /// Triggers claimed since the last boot, by dedup key: an ack presents
    /// its claim (the store checks it still holds the lease).
    claims: BTreeMap<String, Trigger>,
    /// Claims made before a restart (their leases reclaimed at boot): what
    /// a zombie process would present.
    stale: BTreeMap<String, Trigger>,
    /// Every agent ever seen, so messages from terminated senders resolve.
    names: BTreeMap<AgentId, String>,
    msgs: BTreeMap<MessageId, Msg>,
    /// Last reading of the stores (triggers, loop messages); `None` after
    /// a boot or a store op.
    store_cache: Option<StoreReading>,
    /// The operator's views are judged at the next projection (after a
    /// boot: [`views`]).
    views_due: bool,
    /// The I/O point count each world delivery happened after.
    sent_at: Arc<Mutex<Vec<u64>>>,
    /// Answers the world lost to a live process ([`ScriptedOutbox`]).
    lost_replies: Arc<Mutex<Vec<String>>>,
    /// Keys whose first request the world lost ([`ScriptedOutbox`]).
    lost_keys: Arc<Mutex<std::collections::BTreeSet<String>>>,
    /// Runs an operator's release was asked for (whatever its outcome):
    /// a call refused for such a run may be answered while it runs (R9).
    released_runs: std::collections::BTreeSet<String>,
    /// The model's asks so far: a model that does not repeat itself
    /// answers a re-asked round in other words ([`Rewording`]).
    asks: Rewording,
    /// The asks the provider failed ([`ProviderFaults`]): the world's
    /// memory, which the `errors` rows are held to ([`errors`]).
    faults: ProviderFaults,
    /// The last op's turn failed with its provider's error
    /// (`RuntimeError::Provider`): the model decides whether it may.
    provider_failed: bool,
    /// The line a `PowerRot` crash damaged, until the next boot is judged.
    rot: Option<Rot>,
    /// The older build's lines rot strikes planted (without newline):
    /// the only unsealed lines V1 lets through (`stamps`).
    older_lines: std::collections::BTreeSet<Vec<u8>>,
    /// Where the last failed boot said the data is damaged, and whether
    /// as a newer version's line.
    corruption: Option<(CorruptLine, bool)>,
    /// The damage the last failed boot refused the root for, if any
    /// ([`crate::loss::refusal`]).
    refusal: Option<crate::loss::Refusal>,
    /// Where the last boot's recovery report disagrees with what it did
    /// to the logs ([`project::report_violations`]).
    report_violations: Vec<String>,
    /// The operator's `verify` of the disk the last boot opened, taken just
    /// before it (I7; [`Driver::take_verified`]).
    verified: Option<durable_agent::recovery::verify::Verification>,
    /// The logs the last boot left ([`project::is_log_file`]), read once
    /// for its checks; `None` once anything may have written since (a
    /// close, a crash, an op). [`Driver::logs`] hands them out.
    boot_logs: Option<BTreeMap<PathBuf, Vec<u8>>>,
    /// Answers that disagree with what the system did (a turn's:
    /// [`Driver::check_answer`]; a trigger id: [`Driver::check_trigger_id`]),
    /// until the next [`Driver::state`].
    answer_violations: Vec<String>,
    /// The answer each API work (agent name, work id) last completed with
    /// in a live process: a retry of a done work is answered from the
    /// log with it (`Runtime::work_outcome`, what `GET /runs/{id}` and the
    /// retried `POST /agents/{a}/turn` return).
    work_answers: BTreeMap<(String, String), TurnOutcome>,
    /// The id first answered for each emitted trigger's dedup key.
    trigger_ids: BTreeMap<String, String>,
    /// The key the last op's turn stopped at (`NeedsConfirmation`), with
    /// the effect the ledger's row names.
    blocked: Option<(String, Option<String>)>,
    /// The agent each delivered idempotency key belongs to, as the
    /// decisions in the logs say ([`Driver::attribute`]): a cache (a key's
    /// session never changes), refilled when an unknown key is delivered.
    owners: BTreeMap<String, String>,
    /// Per effect (`agent/call key`), the idempotency keys the world or a
    /// NEEDS_CONFIRMATION row showed it with, first seen first: the n-th
    /// is its n-th occurrence ([`crate::model::effect_key`]), an agent's
    /// turn that asked the same call again.
    occurrences: BTreeMap<String, Vec<String>>,
    /// Agents alive at a GC, whose usage rows it may have deleted
    /// ([`usage`]'s relaxation).
    usage_unchecked: std::collections::BTreeSet<AgentId>,
    /// The context budget the system runs under, and the judge of what
    /// the provider is asked under it ([`ContextOracle`]).
    context: ContextOracle,
    /// The tool calls the last boot found in flight, with their replay
    /// counts ([`replays`]).
    in_flight: replays::InFlight,
}

/// The driver's id↔name bookkeeping, saved at the start of an op so a
/// crash image forked inside it sees what a crashed run would have.
#[derive(Debug, Clone, Default)]
pub struct Names {
    names: BTreeMap<AgentId, String>,
    msgs: BTreeMap<MessageId, Msg>,
    /// Every claim the process held or had held (a forked run's zombies).
    claims: BTreeMap<String, Trigger>,
    usage_unchecked: std::collections::BTreeSet<AgentId>,
}

impl Driver {
    /// The disk `seed`'s run is installed on: empty, or the store an
    /// older build left ([`crate::model::installed_by`]); nothing is open
    /// yet (see [`Driver::open`]).
    pub fn new(seed: u64, canaries: Canaries) -> Result<Driver, String> {
        Driver::before_install(seed, canaries, crate::model::installed_by(seed))
    }

    /// On the disk a build of schema `origin` left ([`left_by`]), before
    /// this build's install; nothing is open yet.
    pub fn before_install(seed: u64, canaries: Canaries, origin: u32) -> Result<Driver, String> {
        Ok(Driver::with_fs(
            seed,
            canaries,
            left_by(origin, sim_config(seed))?,
        ))
    }

    /// A disk with the system installed on it ([`installed_disk`]);
    /// nothing is open yet.
    pub fn from_install(seed: u64, canaries: Canaries, install: &SimSnapshot) -> Driver {
        Driver::with_fs(seed, canaries, SimFs::from_snapshot(install, sim_config(seed)))
    }

    pub(crate) fn with_fs(seed: u64, canaries: Canaries, fs: SimFs) -> Driver {
        let context = ContextOracle::new(seed, fs.clone());
        let tools = SimTools::new(fs.clone());
        Driver {
            asks: Rewording {
                seed,
                fs: fs.clone(),
                asks: Arc::default(),
            },
            faults: ProviderFaults::new(fs.clone()),
            provider_failed: false,
            fs,
            world: if crate::model::dedup_world(seed) {
                World::with_dedup()
            } else {
                World::without_dedup()
            },
            canaries,
            tools,
            clock: SteppedClock::default(),
            seed,
            system: None,
            claims: BTreeMap::new(),
            stale: BTreeMap::new(),
            names: BTreeMap::new(),
            msgs: BTreeMap::new(),
            store_cache: None,
            views_due: false,
            sent_at: Arc::default(),
            lost_replies: Arc::default(),
            lost_keys: Arc::default(),
            released_runs: Default::default(),
            rot: None,
            older_lines: Default::default(),
            corruption: None,
            refusal: None,
            report_violations: Vec::new(),
            verified: None,
            boot_logs: None,
            in_flight: replays::InFlight::default(),
            answer_violations: Vec::new(),
            work_answers: BTreeMap::new(),
            trigger_ids: BTreeMap::new(),
            blocked: None,
            owners: BTreeMap::new(),
            occurrences: BTreeMap::new(),
            usage_unchecked: Default::default(),
            context,
        }
    }

    /// The bookkeeping [`Driver::fork`] needs (cheap: a few names).
    pub fn names(&self) -> Names {
        let mut claims = self.stale.clone();
        claims.extend(self.claims.iter().map(|(k, c)| (k.clone(), c.clone())));
        Names {
            names: self.names.clone(),
            msgs: self.msgs.clone(),
            claims,
            usage_unchecked: self.usage_unchecked.clone(),
        }
    }

    /// A closed driver on `fs` (a disk rebooted from a crash image at
    /// `point`) whose world holds the deliveries made before that point,
    /// with the bookkeeping `names` and this driver's clock: what a run
    /// killed at `point` has when it reopens. The live run is untouched.
    pub fn fork(&self, fs: SimFs, point: u64, names: Names) -> Driver {
        let (n_sent, _) = self.prefix_at(point);
        let sent: Vec<u64> = {
            let sent_at = self.sent_at.lock().unwrap_or_else(|e| e.into_inner());
            sent_at[..n_sent].to_vec()
        };
        let mut driver = Driver::with_fs(self.seed, self.canaries.clone(), fs);
        driver.world = self.world.fork_prefix(sent.len());
        driver.sent_at = Arc::new(Mutex::new(sent));
        driver.asks = self.asks.fork(driver.fs.clone(), point);
        driver.faults = self.faults.fork(driver.fs.clone(), point);
        driver.tools = self.tools.fork(driver.fs.clone(), point);
        driver.released_runs = self.released_runs.clone();
        // Lines planted after `point` are not on the fork's disk: keeping
        // them allowed changes nothing.
        driver.older_lines = self.older_lines.clone();
        driver.set_step(self.now() / OP_MS);
        driver.names = names.names;
        driver.msgs = names.msgs;
        driver.stale = names.claims;
        driver.usage_unchecked = names.usage_unchecked;
        driver
    }

    /// How many deliveries the world saw, and how many asks the model
    /// answered, before I/O point `point` (what [`Driver::fork`] keeps).
    pub fn prefix_at(&self, point: u64) -> (usize, usize) {
        let sent = {
            let sent_at = self.sent_at.lock().unwrap_or_else(|e| e.into_inner());
            sent_at.iter().take_while(|p| **p < point).count()
        };
        (sent, self.asks.count_before(point))
    }

    /// How many first attempts of lookups the world lost before I/O point
    /// `point` (what [`Driver::fork`] keeps of them).
    pub fn lost_attempts_before(&self, point: u64) -> usize {
        self.tools.lost_before(point)
    }

    /// How many answers the world has lost to a live process so far.
    pub fn lost_replies(&self) -> u64 {
        self.lost_replies.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    /// The logical time of op number `step` (ms).
    pub fn set_step(&self, step: u64) {
        self.clock.set(step * OP_MS);
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The simulated clock (ms).
    pub fn now(&self) -> u64 {
        self.clock.get()
    }

    /// Boot the system ([`System::boot`]), at the op's time plus
    /// [`BOOT_MS`]; then start the checkpointed loop's run if it has no
    /// checkpoint yet (a fresh install). Any error leaves the driver closed.
    pub fn open(&mut self) -> Result<(), String> {
        self.close();
        let mut config = SystemConfig::new(ROOT, self.seed);
        config.canaries = self.canaries.clone();
        config.trigger_policy.max_attempts = crate::model::MAX_ATTEMPTS;
        config.trigger_policy.backoff_base_ms = crate::model::BACKOFF_BASE_MS;
        config.trigger_policy.backoff_cap_ms = crate::model::BACKOFF_CAP_MS;
        // The model's tool steps spawn and send through the runtime's own
        // tools; the model holds them to the three limits, set low enough
        // to be reached (`model::MAX_DEPTH`, `MAX_CHILDREN`, `max_agents`).
        let mut orchestration = durable_agent::runtime::orchestration::Orchestration::all();
        orchestration.max_depth = crate::model::MAX_DEPTH;
        // Some agents may not spawn, some may not send (by name: see
        // `model::granted`).
        orchestration.grants = crate::model::grants().clone();
        orchestration.max_children = crate::model::MAX_CHILDREN as u32;
        orchestration.max_agents = u32::try_from(crate::model::max_agents(self.seed)).unwrap_or(u32::MAX);
        config.orchestration = Some(orchestration);
        config.context_budget = self.context.budget();
        config.hooks = Arc::new(crate::standins::ScriptedHooks);
        config.tool_retries = Arc::new(crate::standins::LookupRetries);
        let deps = Deps {
            provider: Arc::new(ScriptedProvider {
                rewording: Some(self.asks.clone()),
                asked: Some(self.context.recorder()),
                faults: Some(self.faults.clone()),
            }),
            tools: Arc::new(self.tools.clone()),
            outbox: Arc::new(ScriptedOutbox {
                world: self.world.clone(),
                fs: self.fs.clone(),
                sent_at: self.sent_at.clone(),
                lost: self.lost_replies.clone(),
                lost_keys: self.lost_keys.clone(),
            }),
            clock: Arc::new(self.clock.clone()),
        };
        // The boot runs at boot time; ops after it at their own step.
        let step_ms = self.now();
        self.clock.set(step_ms + BOOT_MS);
        let logs_before = self.fs.disk_image_where(project::is_log_file);
        // A memoized report that differs from a fresh one fails the run
        // before the boot (no refusal can excuse it).
        let (verified, verify_points) = verified::verified(&self.fs, || self.verify())?;
        if let Some(v) = verify_fault::check(
            &self.fs,
            self.seed,
            (&verified, verify_points),
            std::path::Path::new(ROOT),
            std::path::Path::new(STORE_DB),
        ) {
            self.answer_violations.push(v);
        }
        let lost_before = self.lost_replies() as usize;
        let booted = System::boot(Arc::new(self.fs.clone()), config, deps);
        self.clock.set(step_ms);
        self.verified = Some(verified);
        self.corruption = None;
        self.refusal = None;
        let (system, report) = booted.map_err(|e| {
            if let Some(v) = typed::generic_sqlite_error(&e) {
                self.answer_violations.push(v);
            }
            self.refusal = crate::loss::refusal(&e);
            self.corruption = e
                .damaged_line()
                .map(|(line, fault)| (line, fault == LineFault::Newer));
            format!("boot: {e}")
        })?;
        // A boot a crash point cut short wrote nothing after it: its
        // report is not judged (the restart boots again).
        self.report_violations = if self.fs.crashed() {
            Vec::new()
        } else {
            let logs_after = self.fs.disk_image_where(project::is_log_file);
            let mut v = project::report_violations(&logs_before, &logs_after, &report.runtime);
            if let Some(verified) = &self.verified {
                v.extend(crate::oracle::verify_saw_cuts(
                    verified,
                    &report.runtime,
                    std::path::Path::new(ROOT),
                ));
                v.extend(crate::oracle::verify_lists_every_log(
                    verified,
                    logs_before.keys(),
                ));
            }
            let decided = project::decided_calls(&logs_after);
            v.extend(project::undecided_effects(&decided, &self.world.deliveries()));
            v.extend(project::hook_violations(&decided));
            v.extend(stamps::stamp_violations(&logs_after, &self.older_lines));
            // Nothing after this writes a log before the next op or crash.
            self.boot_logs = Some(logs_after);
            // The boot settles every INTENT a crash left (re-sent to a
            // dedup sink, else NEEDS_CONFIRMATION); none may be left but
            // one whose re-send the world answered not at all during this
            // boot (a dedup sink that lost it: kept for next time). The
            // harness's read must not trip an I/O fault armed for the
            // system (one the boot did not reach): it is suspended for the
            // read. (A crash point stays armed: a crash here restarts the
            // recovery, as one in the projection's reads does.)
            let armed = self.fs.fault();
            let suspended = matches!(armed, Some(Fault::FailAt(..) | Fault::LostReplyAt(..)));
            if suspended {
                self.fs.set_fault(None);
            }
            let intents = system
                .gate()
                .store()
                .with_status(system.db().conn(), ActivityStatus::Intent);
            let store_id: rusqlite::Result<i32> =
                system
                    .db()
                    .conn()
                    .pragma_query_value(None, "application_id", |r| r.get(0));
            if suspended {
                self.fs.set_fault(armed);
            }
            v.extend(identity_violation(&self.fs, store_id));
            // (Unreadable: the INTENT read above says why.)
            self.in_flight =
                replays::InFlight::after_boot(&decided, self.boot_logs.as_ref(), || self.store_copy());
            let lost_at_boot: Vec<String> = self
                .lost_replies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(lost_before..)
                .unwrap_or_default()
                .to_vec();
            let intents = intents.map(|mut left| {
                left.retain(|r| !lost_at_boot.contains(&r.idem_key));
                left
            });
            match intents {
                Ok(left) if left.is_empty() => {}
                Ok(left) => v.push(format!(
                    "ledger: the boot left {} INTENT row(s) unsettled: {:?}",
                    left.len(),
                    left.iter().map(|r| r.idem_key.as_str()).collect::<Vec<_>>()
                )),
                Err(e) => v.push(format!("ledger: cannot read the INTENT rows after the boot: {e}")),
            }
            v
        };
        let now = step_ms + BOOT_MS;
        // Boot resumed every run with a checkpoint: the loop's is among
        // them unless this is a fresh install.
        if !report.loops_resumed.iter().any(|(run, _)| run == LOOP_RUN) {
            checkpoint(system.checkpoints(), &system.db(), 0, now)?;
        }
        self.system = Some(system);
        Ok(())
    }

    fn close(&mut self) {
        self.in_flight.forget();
        self.store_cache = None;
        self.views_due = true;
        self.boot_logs = None;
        self.stale.append(&mut self.claims);
        self.system = None;
    }

    /// kill -9: nothing after this instant reaches the disk (not even
    /// SQLite's close-time checkpoint: the next I/O point, if any, is the
    /// crash), then apply `mode` and reboot the disk. Returns whether an
    /// injected crash point had been hit. The system must be
    /// [`Driver::open`]ed again.
    pub fn crash(&mut self, kind: CrashKind) -> bool {
        let hit = self.fs.crashed();
        if !hit {
            self.fs.set_fault(Some(Fault::CrashAt(self.fs.points() + 1)));
        }
        self.close();
        self.reboot_disk(kind);
        hit
    }

    /// kill -9 of a process whose disk is thrown away with this driver (a
    /// judged fork): as [`Driver::crash`], without rebooting the disk
    /// nobody will read.
    pub fn discard(&mut self) {
        if !self.fs.crashed() {
            self.fs.set_fault(Some(Fault::CrashAt(self.fs.points() + 1)));
        }
        self.close();
    }

    /// Apply `kind` to the dead process's disk: its crash mode, then, for
    /// `PowerRot`, one flipped bit ([`rot::strike`]) unless a rot is
    /// already waiting to be judged (a crash inside that recovery).
    fn reboot_disk(&mut self, kind: CrashKind) {
        let floor = (kind == CrashKind::PowerRot && self.rot.is_none())
            .then(|| self.fs.durable_image_where(rot::is_target));
        self.fs.restart(kind.mode());
        if let Some(floor) = floor {
            self.rot = rot::strike(&self.fs, &floor, self.seed, self.fs.points());
            self.note_planted();
        }
    }

    /// Remember the line a [`rot::Damage::Older`] strike planted (it is
    /// left in place): the one kind of unsealed line V1 lets through.
    fn note_planted(&mut self) {
        let Some(rot) = self.rot.as_ref().filter(|r| r.damage == rot::Damage::Older) else {
            return;
        };
        let path = rot.path.clone();
        let image = self.fs.disk_image_where(|p| p == path);
        let line = image
            .get(&path)
            .and_then(|bytes| bytes.get(usize::try_from(rot.line_offset).ok()?..))
            .and_then(|rest| rest.split(|b| *b == b'\n').next());
        if let Some(line) = line {
            self.older_lines.insert(line.to_vec());
        }
    }

    /// What the operator's `verify` said of the disk the last boot opened,
    /// just before it (taken once, like the rot it is judged beside).
    pub fn take_verified(&mut self) -> Option<durable_agent::recovery::verify::Verification> {
        self.verified.take()
    }

    /// The operator's `durable-agent verify` of the disk as it is now, run
    /// on a detached copy ([`SimFs::detached`]): the run's points, draws
    /// and armed fault are untouched (I7).
    /// The operator's `verify` of the disk now, and the I/O points it took.
    fn verify(&self) -> verified::Verified {
        let copy = Arc::new(self.fs.detached(durable_agent::fs::SimConfig::new(self.seed)));
        use durable_agent::recovery::verify::{verify_with, Writers};
        let start = copy.points();
        // A dead process's disk: nobody writes it.
        let report = verify_with(
            copy.clone(),
            std::path::Path::new(ROOT),
            std::path::Path::new(STORE_DB),
            Writers::None,
        );
        (report, copy.points() - start)
    }

    /// The store as the disk holds it now, opened on a detached copy
    /// ([`SimFs::detached`]) with the harness's own connection: the run's
    /// points, draws and armed fault are untouched.
    fn store_copy(&self) -> Result<durable_agent::sqlite::Db, String> {
        let copy = self.fs.detached(durable_agent::fs::SimConfig::new(self.seed));
        durable_agent::sqlite::open(
            Arc::new(copy),
            std::path::Path::new(STORE_DB),
            &durable_agent::sqlite::SqliteOptions::default(),
        )
        .map_err(|e| e.to_string())
    }

    /// Whether a rot is pending (struck at the last crash, not yet judged).
    pub fn rot_pending(&self) -> bool {
        self.rot.is_some()
    }

    /// The rot the next boot must detect, if one is pending.
    pub fn take_rot(&mut self) -> Option<Rot> {
        self.rot.take()
    }

    /// Rot a disk this driver forks from a crash image (see
    /// [`Driver::fork`]): the same bit a replay's crash flips.
    pub fn rot_fork(&mut self, kind: CrashKind, floor: Option<&BTreeMap<PathBuf, Vec<u8>>>, point: u64) {
        if let (CrashKind::PowerRot, Some(floor)) = (kind, floor) {
            self.rot = rot::strike(&self.fs, floor, self.seed, point);
            self.note_planted();
        }
    }

    /// Where the last failed boot said the data is damaged, if it did,
    /// and whether it said the line is a newer version's.
    pub fn take_corruption(&mut self) -> Option<(CorruptLine, bool)> {
        self.corruption.take()
    }

    /// The damage the last failed boot refused the root for, if it did.
    pub fn take_refusal(&mut self) -> Option<crate::loss::Refusal> {
        self.refusal.take()
    }

    /// A runtime an I/O error of unknown outcome poisoned must refuse
    /// every further change, without touching the disk, until it is
    /// reopened (a failed fsync leaves its data unknown: writing on could
    /// make later entries durable past a hole). Probed with a root
    /// creation; `Some` says how the runtime went on instead.
    ///
    /// `failed_write`: the write, sync, truncate or rename of an event log,
    /// its pending copy or a session record that the injected fault failed
    /// (its data now unknown), if it was one: then the runtime must have
    /// poisoned itself (a runtime that went on could append past a hole).
    pub fn poisoned_probe(&mut self, failed_write: Option<&str>) -> Option<String> {
        let rt = self.system.as_mut()?.runtime_mut();
        if !rt.is_poisoned() {
            return failed_write.map(|what| {
                format!("the op failed at {what} (its outcome unknown), yet the runtime is not poisoned: it would go on writing after data of unknown fate")
            });
        }
        let points = self.fs.points();
        let answer = rt.create_root("poison-probe", "");
        let io = self.fs.points() - points;
        match answer {
            Err(RuntimeError::Poisoned { .. }) if io == 0 => None,
            other => Some(format!(
                "after an I/O error of unknown outcome poisoned the runtime, a root creation answered {other:?} after {io} I/O points"
            )),
        }
    }

    /// The session-file write the injected fault at `point` failed, if it
    /// fired there on one ([`Driver::poisoned_probe`]): an append, write,
    /// sync, truncate or rename of `events.jsonl`, `events.pending` or a
    /// session record (or its temporary file).
    pub fn failed_session_write(&self, point: u64) -> Option<String> {
        use durable_agent::fs::sim::{IoOp, Outcome};
        let entry = self.fs.trace_from(point).into_iter().next()?;
        let failed = matches!(entry.outcome, Outcome::Failed(_) | Outcome::LostReply);
        let write = matches!(
            entry.op,
            IoOp::Append | IoOp::WriteAt | IoOp::Sync | IoOp::Truncate | IoOp::Rename
        );
        let name = std::path::Path::new(&entry.path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let session_file =
            name.starts_with("events.") || name.starts_with(durable_agent::store::session::SESSION_FILE);
        (entry.point == point && failed && write && session_file)
            .then(|| format!("point {point} ({:?} of {})", entry.op, entry.path))
    }

    /// A completed turn's answer (what the API returns to its caller: the
    /// response and every call the turn made, those before a crash it
    /// resumed from included) must be what the turn did: the model's
    /// script, call by call. A mismatch is kept for the next
    /// [`Driver::state`]'s invariant check. Not judged once the disk
    /// crashed (a doomed process's answer reaches no one).
    fn check_answer(&mut self, agent: &str, outcome: &TurnOutcome, tools: &[ToolStep], response: &str) {
        if self.fs.crashed() {
            return;
        }
        let project::LedgerVerdict {
            violations: mut ledger,
            parked,
            answered,
        } = self.ledger_violations(agent, outcome, tools);
        self.in_flight.settled(answered);
        let script: Vec<(bool, bool)> = tools.iter().map(|t| (t.irreversible, t.ok)).collect();
        // A call the ledger shows refused for a parked run (R9) answered
        // failed whatever the script says: it did not run.
        let did: Vec<(bool, bool)> = outcome
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, (id, call, out))| match script.get(i) {
                Some(&(_, ok)) if parked.contains(id) => (call.irreversible, ok),
                _ => (call.irreversible, out.ok),
            })
            .collect();
        if did != script || outcome.response != response {
            self.answer_violations.push(format!(
                "turn answer of {agent}: {:?} with calls (irreversible, ok) {did:?}, but the turn did {response:?} with {script:?}",
                outcome.response
            ));
        }
        self.answer_violations.append(&mut ledger);
    }

    /// The trigger id the system answered for dedup key `key` (an emit's
    /// answer, a claim's row) must be the one it answered before: an
    /// emit tells its caller (the API) the id of the row carrying the key,
    /// a duplicate emit the original's. Only answers a live process gave
    /// are kept; a mismatch waits for the next [`Driver::state`].
    fn check_trigger_id(&mut self, key: &str, id: &str) {
        if self.fs.crashed() {
            return;
        }
        match self.trigger_ids.get(key) {
            Some(known) if known != id => self.answer_violations.push(format!(
                "trigger {key}: the system answered id {id:?}, but {known:?} before"
            )),
            Some(_) => {}
            None => {
                self.trigger_ids.insert(key.to_string(), id.to_string());
            }
        }
    }

    /// Where the last boot's recovery report disagrees with the disk.
    pub fn take_report_violations(&mut self) -> Vec<String> {
        std::mem::take(&mut self.report_violations)
    }

    /// The idempotency key the last op's turn stopped at, needing a
    /// human's confirmation (the op then returned `Err`): the model decides
    /// whether that turn may block ([`crate::model::Model::blocked`]).
    pub fn take_blocked(&mut self) -> Option<(String, Option<String>)> {
        self.blocked.take()
    }

    /// Job run `run`'s work turn on `agent`, then its status as the turn's
    /// end settles it (`System::finish_job_run`), as the app's `run` does.
    /// `Err` only when the status cannot be written; the turn's own
    /// result is returned for the caller to judge.
    fn job_turn(
        &mut self,
        run: &str,
        agent: &AgentId,
        prompt: &str,
    ) -> Result<Result<WorkTurn, RuntimeError>, String> {
        let system = self.system.as_mut().ok_or("harness: system not open")?;
        let ran = system.runtime_mut().run_work_turn(agent, prompt, &job_work(run));
        if let Some(status) = settled_status(&ran) {
            system
                .finish_job_run(run, agent, status)
                .map_err(|e| e.to_string())?;
        }
        Ok(ran)
    }

    /// Note a turn that stopped at a key needing confirmation, and the
    /// effect its ledger row names (what a human looks up in the world).
    ///
    /// B1: a live process's turn that stopped for a human left its key in
    /// the list a human answers from (`System::needs_confirmation`, what
    /// `durable-agent confirm` and `GET /confirm` show): a key missing
    /// there can never be answered, and the work waits forever.
    fn note_blocked(&mut self, e: &RuntimeError) {
        if let RuntimeError::NeedsConfirmation { idem_key, .. } = e {
            self.note_blocked_key(idem_key);
        }
    }

    /// [`Driver::note_blocked`] by the key the turn stopped at.
    fn note_blocked_key(&mut self, idem_key: &str) {
        {
            let rows = self.system().ok().and_then(|s| s.needs_confirmation().ok());
            if let Some(rows) = &rows {
                if !self.fs.crashed() && !rows.iter().any(|r| r.idem_key == idem_key) {
                    self.answer_violations.push(format!(
                        "B1: a turn stopped for a human at key {idem_key}, but the calls waiting for a human are {:?}",
                        rows.iter().map(|r| r.idem_key.as_str()).collect::<Vec<_>>()
                    ));
                }
            }
            let effect = rows.and_then(|rows| self.effect_of(&rows, idem_key));
            self.blocked = Some((idem_key.to_string(), effect));
        }
    }

    /// The effect (the world's key, `payload.key`, of the agent the row's
    /// task names) of the NEEDS_CONFIRMATION row `idem_key` among `rows`,
    /// as an operator listing them sees it.
    fn effect_of(
        &mut self,
        rows: &[durable_agent::store::activities::ActivityRecord],
        idem_key: &str,
    ) -> Option<String> {
        let row = rows.iter().find(|r| r.idem_key == idem_key)?;
        let agent = self.names.get(&AgentId::from_hex(&row.task_id).ok()?)?;
        let effect = format!("{agent}/{}", row.payload.get("key")?.as_str()?);
        Some(self.occurrence_of(effect, idem_key))
    }

    /// `effect` numbered by the idempotency key it came with
    /// ([`Driver::occurrences`]): the first key names it plainly, the
    /// n-th as `effect@n`.
    fn occurrence_of(&mut self, effect: String, idem_key: &str) -> String {
        let keys = self.occurrences.entry(effect.clone()).or_default();
        let n = match keys.iter().position(|k| k == idem_key) {
            Some(n) => n,
            None => {
                keys.push(idem_key.to_string());
                keys.len() - 1
            }
        };
        match n {
            0 => effect,
            n => format!("{effect}@{n}"),
        }
    }

    /// A clean stop: close everything (SQLite checkpoints on close), then
    /// reboot the disk keeping what was written. Returns whether an injected
    /// crash point was hit during the stop (then `mode_if_hit` applies).
    pub fn shutdown(&mut self, kind_if_hit: CrashKind) -> bool {
        self.close();
        let hit = self.fs.crashed();
        self.reboot_disk(if hit { kind_if_hit } else { CrashKind::Process });
        hit
    }

    fn system(&self) -> Result<&System, String> {
        self.system
            .as_ref()
            .ok_or_else(|| "harness: system not open".to_string())
    }

    fn rt(&mut self) -> Result<&mut Runtime, String> {
        self.system
            .as_mut()
            .map(System::runtime_mut)
            .ok_or_else(|| "harness: system not open".to_string())
    }

    fn id(&self, name: &str) -> Result<AgentId, String> {
        self.system()?
            .runtime()
            .tree()
            .nodes()
            .iter()
            .find(|(_, v)| v.name == name)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| format!("harness: no live agent named {name}"))
    }

    /// Run one action on the system. One that failed may leave tool
    /// calls in flight that this process replays later: the boot's
    /// reading of them no longer holds ([`replays`]).
    pub fn exec(&mut self, action: &Action) -> Result<(), String> {
        let done = self.exec_action(action);
        if done.is_err() {
            self.in_flight.forget();
        }
        done
    }

    fn exec_action(&mut self, action: &Action) -> Result<(), String> {
        let now = self.now();
        self.blocked = None;
        self.provider_failed = false;
        self.boot_logs = None;
        if matches!(
            action,
            Action::Emit { .. }
                | Action::Claim { .. }
                | Action::ClaimNothing
                | Action::Ack { .. }
                | Action::LoopRound { .. }
                | Action::Fire { .. }
                | Action::StaleAck { .. }
                | Action::Retry { .. }
                | Action::Confirm { .. }
                | Action::Gc { .. }
                | Action::JobRun { .. }
                | Action::JobResume { .. }
                | Action::Release { .. }
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
            Action::RunTurn {
                agent,
                prompt,
                reads,
                tools,
                response,
            } => {
                let id = self.id(agent)?;
                let rt = self.rt()?;
                let ran = if *reads {
                    let ids: Vec<MessageId> = rt.pending(&id).iter().map(|m| m.id.clone()).collect();
                    rt.run_turn_consuming(&id, prompt, &ids)
                } else {
                    rt.run_turn(&id, prompt)
                };
                match ran {
                    Ok(outcome) => self.check_answer(agent, &outcome, tools, response),
                    Err(e) => {
                        self.note_blocked(&e);
                        self.provider_failed = matches!(e, RuntimeError::Provider { .. });
                        return Err(e.to_string());
                    }
                }
            }
            Action::WorkTurn {
                agent, work, asked, ..
            }
            | Action::WorkDone { agent, work, asked } => {
                let (tools, response) = match action {
                    Action::WorkTurn { tools, response, .. } => (tools.as_slice(), response.as_str()),
                    _ => (&[][..], ""),
                };
                // What the API does: the caller's prompt and the messages
                // waiting now; the runtime decides what a started work runs.
                let id = self.id(agent)?;
                let fs = self.fs.clone();
                let rt = self.rt()?;
                let ids: Vec<MessageId> = rt.pending(&id).iter().map(|m| m.id.clone()).collect();
                let ran = match rt.start_turn(&id, asked, TurnKind::WorkReading(work, &ids)) {
                    Ok(Started::Running(task, step)) => {
                        misuse::drive_keeping(rt, &fs, task, step).map(|(outcome, misuse)| {
                            self.answer_violations.extend(misuse);
                            self.check_answer(agent, &outcome, tools, response);
                            if !self.fs.crashed() {
                                self.work_answers.insert((agent.clone(), work.clone()), outcome);
                            }
                            true
                        })
                    }
                    Ok(Started::AlreadyDone) => {
                        // Answered from the log: with what the work
                        // completed with (when a live process saw it).
                        // Up to `invalid_args` (why a call's arguments
                        // were unusable), which the conversation does not
                        // keep: the stored answer says it in the call's
                        // output only (noticed in issue 27, left alone).
                        let plain = |o: &TurnOutcome| {
                            let mut o = o.clone();
                            o.tool_calls
                                .iter_mut()
                                .for_each(|(_, call, _)| call.invalid_args = None);
                            o
                        };
                        let stored = rt.work_outcome(&id, work).map(|o| o.as_ref().map(plain));
                        if let Some(first) = self.work_answers.get(&(agent.clone(), work.clone())) {
                            if !self.fs.crashed() && stored.as_ref().ok() != Some(&Some(plain(first))) {
                                self.answer_violations.push(format!(
                                    "{work} of {agent} was answered as done, with the stored outcome {stored:?}, but it completed with {first:?}"
                                ));
                            }
                        }
                        Ok(false)
                    }
                    Err(e) => Err(e),
                };
                match ran {
                    Err(e) => {
                        self.note_blocked(&e);
                        return Err(e.to_string());
                    }
                    Ok(true) if matches!(action, Action::WorkDone { .. }) => {
                        return Err(format!("{work} of {agent} completed before, and ran again"))
                    }
                    Ok(false) if matches!(action, Action::WorkTurn { .. }) => {
                        return Err(format!("{work} of {agent} was answered as done, and did not run"))
                    }
                    Ok(_) => {}
                }
            }
            Action::JobRun {
                run,
                agent,
                prompt,
                tools,
                response,
            } => {
                // The app's `run` of a new job, through the same library
                // calls (`app/src/run.rs`): its telemetry and summary aside.
                let system = self.system.as_mut().ok_or("harness: system not open")?;
                let start = JobStart {
                    run_id: run,
                    agent,
                    instructions: "root",
                    parent_run_id: None,
                    job_json: None,
                };
                let (_, id) = system.start_job_run(&start).map_err(|e| e.to_string())?;
                self.names.insert(id.clone(), agent.clone());
                match self.job_turn(run, &id, prompt)? {
                    Ok(WorkTurn::Ran(outcome)) => self.check_answer(agent, &outcome, tools, response),
                    Ok(WorkTurn::AlreadyDone) => {
                        return Err(format!("the new job run {run} was answered as done"))
                    }
                    Err(e) => {
                        self.note_blocked(&e);
                        return Err(e.to_string());
                    }
                }
            }
            Action::JobResume {
                run,
                agent,
                prompt,
                tools,
                response,
                done,
            } => {
                // The app's `run --resume` (`app/src/run.rs`), through the
                // same library calls. The job's prompt: a started work
                // runs the one it started with whatever it is asked.
                let system = self.system.as_mut().ok_or("harness: system not open")?;
                let (_, id) = system.resume_job_run(run).map_err(|e| e.to_string())?;
                match self.job_turn(run, &id, prompt)? {
                    Ok(WorkTurn::Ran(_)) if *done => {
                        return Err(format!(
                            "job run {run} completed before, and its resume ran it again"
                        ))
                    }
                    Ok(WorkTurn::Ran(outcome)) => self.check_answer(agent, &outcome, tools, response),
                    Ok(WorkTurn::AlreadyDone) if !*done => {
                        return Err(format!(
                            "job run {run}'s resume was answered as done, and did not run"
                        ))
                    }
                    Ok(WorkTurn::AlreadyDone) => {}
                    Err(e) => {
                        self.note_blocked(&e);
                        return Err(e.to_string());
                    }
                }
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
            Action::Emit { key, fire_at } => {
                let spec = TriggerSpec {
                    source: TriggerSource::System,
                    dedup_key: Some(key.clone()),
                    session_id: None,
                    fire_at_ms: *fire_at,
                    priority: 0,
                    description: format!("trigger {key}"),
                    payload: serde_json::json!({ "key": key }),
                };
                let system = self.system()?;
                let emitted = system
                    .triggers()
                    .emit(system.db().conn(), &spec, now)
                    .map_err(|e| e.to_string())?;
                self.check_trigger_id(key, emitted.id());
            }
            Action::ClaimNothing => {
                let system = self.system()?;
                let got = system
                    .triggers()
                    .claim(system.db().conn(), now, LEASE_MS)
                    .map_err(|e| e.to_string())?;
                if let Some(t) = got {
                    let key = self.model_key(t.dedup_key.as_deref(), &t.id);
                    self.claims.insert(key.clone(), t);
                    return Err(format!(
                        "claim handed out {key:?}, the model expected nothing due (every pending row under its backoff floor, or none pending)"
                    ));
                }
            }
            Action::Claim { key } => {
                let system = self.system()?;
                let got = system
                    .triggers()
                    .claim(system.db().conn(), now, LEASE_MS)
                    .map_err(|e| e.to_string())?;
                let got_key = got
                    .as_ref()
                    .map(|t| self.model_key(t.dedup_key.as_deref(), &t.id));
                match got {
                    Some(claim) if got_key.as_deref() == Some(key.as_str()) => {
                        self.check_trigger_id(key, &claim.id);
                        self.claims.insert(key.clone(), claim);
                    }
                    _ => {
                        return Err(format!(
                            "claim handed out {got_key:?}, the model expected {key:?}"
                        ))
                    }
                }
            }
            Action::LoopRound { round, tools } => self.loop_round(*round, *tools, now)?,
            Action::Fire {
                key, agent, prompt, ..
            } => {
                let id = self.id(agent)?;
                let system = self.system()?;
                let got = system
                    .triggers()
                    .claim(system.db().conn(), now, LEASE_MS)
                    .map_err(|e| e.to_string())?;
                let handed = got.as_ref().map(|t| (t.dedup_key.clone(), t.fire_at_ms, now));
                let Some(claim) = got.filter(|t| self.model_key(t.dedup_key.as_deref(), &t.id) == *key)
                else {
                    return Err(format!(
                        "fire: the model expected {key:?} to be due, the claim handed out {handed:?} (key, fire_at, now)"
                    ));
                };
                self.check_trigger_id(key, &claim.id);
                let system = self.system.as_mut().ok_or("harness: system not open")?;
                let fired = system.fire(&claim, &id, prompt);
                let blocked = match &fired {
                    Err(SystemError::Runtime(RuntimeError::NeedsConfirmation { idem_key, .. })) => {
                        Some(idem_key.clone())
                    }
                    _ => None,
                };
                // The daemon's settling of the firing (`worker::ops::fire`):
                // a blocked one acked FAILED, the key in its last error,
                // until a human answers; a job run's RESUME trigger
                // settles the run's status.
                match settle_fire(system, &claim, fired) {
                    Ok(Some(FireResult::Fired { .. })) => {}
                    Ok(Some(FireResult::Failed { error, .. })) => {
                        if let Some(idem_key) = blocked {
                            self.note_blocked_key(&idem_key);
                        }
                        return Err(error);
                    }
                    Ok(None) => return Err("the firing was interrupted".into()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            Action::Retry { key } => {
                // The operator's path: the id as the dead-letter and
                // failed listings show it (`durable-agent triggers`), then
                // `durable-agent retry` (the API's `POST
                // /triggers/{id}/retry`). The model retries only a DEAD or
                // FAILED row, so a listing that hides one refuses the op.
                let system = self.system()?;
                let mut listed = system.dead_triggers().map_err(|e| e.to_string())?;
                listed.extend(system.failed_triggers().map_err(|e| e.to_string())?);
                let id = listed
                    .iter()
                    .find(|t| &self.model_key(t.dedup_key.as_deref(), &t.id) == key)
                    .map(|t| t.id.clone())
                    .ok_or_else(|| format!("no trigger {key} to retry"))?;
                system.retry_trigger(&id).map_err(|e| e.to_string())?;
            }
            Action::Gc { strip } => {
                use durable_agent::worker::gc::{collect, GcRequest};
                let system = self.system()?;
                // The daemon's pass, with TTLs of 1 ms (every settled row
                // older than the op's time) — or, stripping, no row past
                // the TTL (the cutoff is 0) and every one past the
                // payload TTL.
                let request = GcRequest {
                    ttl_ms: if *strip { u64::MAX } else { 1 },
                    payload_ttl_ms: 1,
                };
                let pass = collect(system, request).map_err(|e| e.to_string())?;
                let report = pass.collected;
                // A collected key may be emitted again, as a new row.
                let gone = &report.triggers.deleted;
                self.trigger_ids.retain(|_, id| !gone.contains(id));
                // A doomed process's GC answered no one.
                if !self.fs.crashed() {
                    let mut left = self.collected_violations(now, *strip);
                    self.answer_violations.append(&mut left);
                }
            }
            Action::Release { run } => self.release(run)?,
            Action::Confirm { idem, delivered, .. } => {
                let resolution = if *delivered {
                    Resolution::Delivered {
                        provider_ref: format!("seen in the world: {idem}"),
                    }
                } else {
                    Resolution::NotDelivered
                };
                self.system()?
                    .confirm(idem, &resolution)
                    .map_err(|e| e.to_string())?;
            }
            Action::StaleAck { key } => {
                // A zombie's ack: the system must refuse it (the lease is
                // gone). Refused is the op's success; an accepted stale ack
                // shows in the triggers the projection reads.
                if let Some(claim) = self.stale.remove(key) {
                    let system = self.system()?;
                    let r = system.triggers().ack_done(system.db().conn(), &claim, now);
                    match r {
                        // A collected row is refused as missing.
                        Ok(()) | Err(StoreError::LeaseLost { .. } | StoreError::NotFound { .. }) => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
            }
            Action::Ack { key, ok } => {
                let claim = self
                    .claims
                    .get(key)
                    .cloned()
                    .ok_or_else(|| format!("harness: no claim of {key} since the last boot"))?;
                let system = self.system()?;
                let db = system.db();
                let conn = db.conn();
                let r = if *ok {
                    system.triggers().ack_done(conn, &claim, now)
                } else {
                    system
                        .triggers()
                        .ack_failed(conn, &claim, now, "tool failed", true)
                        .map(|_| ())
                };
                r.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
