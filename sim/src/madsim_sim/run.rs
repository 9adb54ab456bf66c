//! The madsim supervisor: one node runs the daemon; the supervisor crashes
//! it on the seeded schedule, applies the crash mode to the SimFs, restarts
//! it, and at the horizon recovers the disk and asks the oracle.
//!
//! Invariant: the node's database connections are gone (their futures
//! dropped) before the disk reboots, and any I/O the dying process still
//! attempts fails, so nothing a dead process does reaches the next boot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use durable_agent::daemon::{Daemon, DaemonClock, DaemonConfig};
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::recovery;
use durable_agent::runtime::{FakeProvider, PureTools};
use durable_agent::sqlite::Db;
use durable_agent::store::activities::{ActivityStatus, ActivityStore};
use durable_agent::store::triggers::TriggerStore;
use durable_agent::system::{Deps, System, SystemConfig};
use durable_agent::world::World;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::oracle::{check, AgentMessages, FinalView, TriggerRow};
use super::{fnv1a, CrashRecord, Recorder, SimOutcome, SimPlan, FNV_START};

/// SQLite's PRNG is process-global: runs in one process take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// Run `plan` in a fresh madsim runtime seeded with `plan.seed`.
pub fn run_sim(plan: &SimPlan) -> SimOutcome {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = madsim::runtime::Runtime::with_seed_and_config(plan.seed, madsim::Config::default());
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(supervise(plan.clone()))
    }));
    match run {
        Ok(outcome) => outcome,
        Err(panic) => {
            eprintln!(
                "madsim daemon simulation panicked: MADSIM_TEST_SEED={}\nreproduce: {}",
                plan.seed,
                super::repro_command(plan.seed)
            );
            std::panic::resume_unwind(panic)
        }
    }
}

/// What the node's init closure needs; survives restarts.
#[derive(Clone)]
struct NodeCtx {
    fs: SimFs,
    world: World,
    recorder: Recorder,
    clock: DaemonClock,
    template: DaemonConfig,
    boots: Arc<AtomicU32>,
    watch: Arc<Mutex<Weak<Mutex<Db>>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl NodeCtx {
    fn note(&self, e: String) {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }
}

async fn boot_and_run(ctx: NodeCtx) {
    let boot = ctx.boots.fetch_add(1, Ordering::SeqCst);
    let config = DaemonConfig {
        boot,
        ..ctx.template.clone()
    };
    let fs: Arc<dyn Fs> = Arc::new(ctx.fs.clone());
    match Daemon::boot(
        fs,
        Arc::new(ctx.world.clone()),
        config,
        ctx.clock,
        Arc::new(ctx.recorder.clone()),
    ) {
        Ok(daemon) => {
            *ctx.watch.lock().unwrap_or_else(|p| p.into_inner()) = daemon.db_watch();
            let stopped = daemon.run().await;
            tracing::info!(boot, %stopped, "daemon stopped");
        }
        Err(e) => ctx.note(format!("boot {boot} failed: {e}")),
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn draw(rng: &mut ChaCha8Rng, (lo, hi): (u64, u64)) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

/// Kill the node as a crash would: I/O from the dying process fails, and
/// its connections are dropped before returning.
async fn kill(handle: &madsim::runtime::Handle, node: madsim::task::NodeId, ctx: &NodeCtx) {
    if !ctx.fs.crashed() {
        ctx.fs.set_fault(Some(Fault::CrashAt(ctx.fs.points() + 1)));
    }
    handle.kill(node);
    for _ in 0..1_000 {
        if ctx
            .watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade()
            .is_none()
        {
            return;
        }
        sleep_ms(1).await;
    }
    ctx.note("a killed daemon still holds its database after 1 s".into());
}

async fn supervise(plan: SimPlan) -> SimOutcome {
    let template = DaemonConfig {
        seed: plan.seed,
        ..plan.daemon.clone()
    };
    let ctx = NodeCtx {
        fs: SimFs::new(SimConfig::new(plan.seed)),
        world: World::without_dedup(),
        recorder: Recorder::default(),
        clock: DaemonClock::starting_at(0),
        template,
        boots: Arc::new(AtomicU32::new(0)),
        watch: Arc::new(Mutex::new(Weak::new())),
        errors: Arc::new(Mutex::new(Vec::new())),
    };
    let handle = madsim::runtime::Handle::current();
    let init_ctx = ctx.clone();
    let node = handle
        .create_node()
        .name("daemon")
        .init(move || boot_and_run(init_ctx.clone()))
        .build()
        .id();
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed ^ 0x5eed_c4a5_11ed);
    let mut instants: Vec<u64> = (0..plan.crashes)
        .map(|_| draw(&mut rng, plan.crash_window_ms))
        .collect();
    instants.sort_unstable();
    let mut crashes = Vec::new();
    for at in instants {
        tokio::time::sleep_until(ctx.clock.instant_at(at)).await;
        let at_ms = ctx.clock.now_ms();
        let mut point = None;
        if rng.random_bool(plan.mid_io_probability) {
            let armed = ctx.fs.points() + rng.random_range(1..=400u64);
            ctx.fs.set_fault(Some(Fault::CrashAt(armed)));
            for _ in 0..6_000 {
                if ctx.fs.crashed() {
                    break;
                }
                sleep_ms(10).await;
            }
            if ctx.fs.crashed() {
                let label = ctx
                    .fs
                    .trace()
                    .into_iter()
                    .find(|t| t.point == armed)
                    .map(|t| t.label);
                point = Some((armed, label.unwrap_or_default()));
            }
        }
        let killed_ms = ctx.clock.now_ms();
        kill(&handle, node, &ctx).await;
        let mode = match rng.random_range(0..10u32) {
            0..=3 => CrashMode::ProcessCrash,
            4..=6 => CrashMode::PowerLoss(DirModel::Strict),
            _ => CrashMode::PowerLoss(DirModel::Eager),
        };
        ctx.fs.restart(mode);
        sleep_ms(draw(&mut rng, plan.downtime_ms)).await;
        handle.restart(node);
        crashes.push(CrashRecord {
            at_ms,
            killed_ms,
            mode,
            point,
            restarted_ms: ctx.clock.now_ms(),
        });
    }
    tokio::time::sleep_until(ctx.clock.instant_at(plan.horizon_ms)).await;
    kill(&handle, node, &ctx).await;
    ctx.fs.restart(CrashMode::ProcessCrash);
    let end_ms = ctx.clock.now_ms();
    let view = final_view(&ctx, end_ms);
    let events = ctx.recorder.events();
    let mut violations = ctx.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    violations.extend(check(&events, &view, plan.settle_ms));
    let hash = [ctx.fs.trace_hash(), ctx.fs.image_hash(), ctx.recorder.hash()]
        .iter()
        .fold(FNV_START, |h, x| fnv1a(h, &x.to_le_bytes()));
    let fire_deliveries = view
        .deliveries
        .iter()
        .filter(|(k, _)| k.starts_with("fire:"))
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    SimOutcome {
        seed: plan.seed,
        hash,
        events,
        crashes,
        io_points: ctx.fs.points(),
        violations,
        fire_deliveries,
        view,
    }
}

/// Recover the disk once more (outside the node) and read what survived.
fn final_view(ctx: &NodeCtx, end_ms: u64) -> FinalView {
    let config = &ctx.template;
    let fs: Arc<dyn Fs> = Arc::new(ctx.fs.clone());
    let mut view = FinalView {
        workers: config.agents,
        end_ms,
        ..FinalView::default()
    };
    // The final look is one more boot: the same composition as every node
    // boot (no second, read-only composition that could disagree with it).
    let mut sc = SystemConfig::new(config.root.clone(), config.seed);
    sc.slots = config.slots;
    sc.trigger_policy = config.trigger_policy;
    let deps = Deps {
        provider: Arc::new(FakeProvider::new(config.seed)),
        tools: Arc::new(PureTools),
        outbox: Arc::new(ctx.world.clone()),
        clock: Arc::new(ctx.clock),
    };
    match System::boot(fs.clone(), sc, deps) {
        Ok((system, _)) => {
            let runtime = system.runtime();
            let state = runtime.state();
            let name_of = |id| state.agents.get(id).map(|a| a.name.clone());
            for (id, agent) in &state.agents {
                let msgs = AgentMessages {
                    parent: agent.parent.as_ref().and_then(name_of),
                    pending: state.pending[id].iter().map(|m| m.id.to_string()).collect(),
                    delivered: state.delivered[id].iter().map(|m| m.to_string()).collect(),
                };
                view.agents.insert(agent.name.clone(), msgs);
            }
            view.runtime_violations = runtime.check_invariants();
            read_stores(&system.db(), config, end_ms, &mut view);
        }
        Err(e) => view.runtime_violations.push(format!("final boot failed: {e}")),
    }
    view.disk_violations = recovery::check_invariants(&*fs, &config.root)
        .err()
        .unwrap_or_default();
    // The fuzzer's I3 (every events.jsonl is complete JSON lines), reused.
    view.disk_violations
        .extend(crate::oracle::log_invariants(&ctx.fs.disk_image()));
    let mut deliveries = BTreeMap::new();
    for d in ctx.world.deliveries() {
        *deliveries.entry(d.idem_key).or_insert(0) += 1;
    }
    view.deliveries = deliveries;
    view
}

fn read_stores(db: &Db, config: &DaemonConfig, end_ms: u64, view: &mut FinalView) {
    let triggers = TriggerStore::new(config.trigger_policy, Default::default());
    match triggers.all(db.conn(), end_ms) {
        Ok(rows) => {
            for t in rows {
                let row = TriggerRow {
                    status: t.status.as_str().to_string(),
                    fire_at_ms: t.fire_at_ms,
                    attempts: t.attempts,
                };
                view.triggers.insert(t.dedup_key.unwrap_or(t.id), row);
            }
        }
        Err(e) => view.runtime_violations.push(format!("reading triggers: {e}")),
    }
    let ledger = ActivityStore::default();
    for status in [
        ActivityStatus::Intent,
        ActivityStatus::Done,
        ActivityStatus::Failed,
        ActivityStatus::NeedsConfirmation,
    ] {
        match ledger.with_status(db.conn(), status) {
            Ok(rows) => {
                for r in rows {
                    view.ledger.insert(r.idem_key, status.as_str().to_string());
                }
            }
            Err(e) => view.runtime_violations.push(format!("reading the ledger: {e}")),
        }
    }
}
