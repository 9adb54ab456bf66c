//! The madsim supervisor: one node runs the daemon; the supervisor crashes
//! it on the seeded schedule, applies the crash mode to the SimFs, restarts
//! it, and at the horizon recovers the disk and asks the oracle.
//!
//! Invariant: the node's database connections are gone (their futures
//! dropped) before the disk reboots, and any I/O the dying process still
//! attempts fails, so nothing a dead process does reaches the next boot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::recovery;
use durable_agent::sqlite::Db;
use durable_agent::store::activities::{ActivityStatus, ActivityStore};
use durable_agent::store::triggers::TriggerStore;
use durable_agent::system::System;
use durable_agent::worker::schedule::Schedules;
use durable_agent::world::{Scripted, World};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::clients::run_client;
use super::node::{boot_and_run, NodeCtx};
use super::oracle::{check, works_to_check, AgentMessages, Bounds, FinalView, TriggerRow};
use super::{fnv1a, CrashRecord, Recorder, SimClock, SimOutcome, SimPlan, FNV_START};

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

/// Stop the node as SIGTERM would: the worker drains its calls and ends;
/// then the process exits (its connections dropped, the disk intact).
async fn stop(handle: &madsim::runtime::Handle, node: madsim::task::NodeId, ctx: &NodeCtx) {
    ctx.stop.store(true, Ordering::SeqCst);
    for _ in 0..12_000 {
        if ctx.ended.load(Ordering::SeqCst) || ctx.fs.crashed() {
            break;
        }
        sleep_ms(10).await;
    }
    if !ctx.ended.load(Ordering::SeqCst) {
        ctx.note("a stopped daemon did not drain within 120 s".into());
    }
    kill(handle, node, ctx).await;
}

async fn supervise(plan: SimPlan) -> SimOutcome {
    let ctx = NodeCtx {
        fs: SimFs::new(SimConfig::new(plan.seed)),
        world: World::without_dedup(),
        recorder: Recorder::default(),
        clock: SimClock::starting_at(0),
        plan: plan.clone(),
        boots: Arc::new(AtomicU32::new(0)),
        watch: Arc::new(Mutex::new(Weak::new())),
        inbox: Arc::new(Mutex::new(None)),
        stop: Arc::new(AtomicBool::new(false)),
        ended: Arc::new(AtomicBool::new(false)),
        ready: Arc::new(AtomicBool::new(false)),
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
    let clients = handle.create_node().name("clients").build();
    for i in 0..plan.clients {
        clients.spawn(run_client(ctx.clone(), i));
    }
    // The outside world's faults: now and then a send's answer is lost
    // (delivered or not), which a world without idempotency keys leaves
    // for a human to confirm.
    let (world, lost, horizon) = (ctx.world.clone(), plan.lost_answers, plan.horizon_ms);
    let mut world_rng = ChaCha8Rng::seed_from_u64(plan.seed ^ 0x0077_0e1d);
    clients.spawn(async move {
        for _ in 0..lost {
            sleep_ms(world_rng.random_range(0..=horizon / u64::from(lost.max(1)))).await;
            let answer = match world_rng.random_bool(0.5) {
                true => Scripted::DeliverLoseReply,
                false => Scripted::DropSilently,
            };
            world.script([answer]);
        }
    });
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed ^ 0x5eed_c4a5_11ed);
    // Each instant is a crash (true) or a stop (false).
    let mut instants: Vec<(u64, bool)> = Vec::new();
    for crash in (0..plan.crashes)
        .map(|_| true)
        .chain((0..plan.stops).map(|_| false))
    {
        instants.push((draw(&mut rng, plan.crash_window_ms), crash));
    }
    instants.sort_unstable();
    let mut crashes = Vec::new();
    for (at, crash) in instants {
        tokio::time::sleep_until(ctx.clock.instant_at(at)).await;
        let at_ms = ctx.clock.now_ms();
        let mut point = None;
        let mode = if crash {
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
            kill(&handle, node, &ctx).await;
            let mode = match rng.random_range(0..10u32) {
                0..=3 => CrashMode::ProcessCrash,
                4..=6 => CrashMode::PowerLoss(DirModel::Strict),
                _ => CrashMode::PowerLoss(DirModel::Eager),
            };
            ctx.fs.restart(mode);
            Some(mode)
        } else {
            stop(&handle, node, &ctx).await;
            // A clean exit: everything written stays (the page cache is
            // the OS's), as after a process crash.
            ctx.fs.restart(CrashMode::ProcessCrash);
            None
        };
        let killed_ms = ctx.clock.now_ms();
        sleep_ms(draw(&mut rng, plan.downtime_ms)).await;
        ctx.stop.store(false, Ordering::SeqCst);
        ctx.ended.store(false, Ordering::SeqCst);
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
    let events = ctx.recorder.events();
    let view = final_view(&ctx, end_ms, &events);
    let mut violations = ctx.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let bounds = Bounds {
        settle_ms: plan.settle_ms,
        fire_bound_ms: plan.poll_ms + plan.lease_ms,
        down: down_windows(&crashes, &events),
        policy: plan.trigger_policy,
    };
    violations.extend(check(&events, &view, &bounds));
    let hash = [ctx.fs.trace_hash(), ctx.fs.image_hash(), ctx.recorder.hash()]
        .iter()
        .fold(FNV_START, |h, x| fnv1a(h, &x.to_le_bytes()));
    SimOutcome {
        seed: plan.seed,
        hash,
        events,
        crashes,
        io_points: ctx.fs.points(),
        violations,
        view,
    }
}

/// When the daemon was down: the supervisor's crashes and stops, and each
/// fail-stop exit until the boot after it.
fn down_windows(crashes: &[CrashRecord], events: &[(u64, super::Event)]) -> Vec<(u64, u64)> {
    let mut down: Vec<(u64, u64)> = crashes
        .iter()
        .map(|c| (c.at_ms, c.restarted_ms + 1_000))
        .collect();
    let mut failed_at = None;
    for (at, e) in events {
        match e {
            super::Event::Failed { .. } => failed_at = failed_at.or(Some(*at)),
            super::Event::Booted { .. } => {
                if let Some(from) = failed_at.take() {
                    down.push((from, at + 1_000));
                }
            }
            _ => {}
        }
    }
    if let Some(from) = failed_at {
        down.push((from, u64::MAX));
    }
    down
}

/// Recover the disk once more (outside the node) and read what survived.
fn final_view(ctx: &NodeCtx, end_ms: u64, events: &[(u64, super::Event)]) -> FinalView {
    let plan = &ctx.plan;
    let fs: Arc<dyn Fs> = Arc::new(ctx.fs.clone());
    let mut view = FinalView {
        end_ms,
        ..FinalView::default()
    };
    // The final look is one more boot: the same composition as every node
    // boot (no second, read-only composition that could disagree with it),
    // without the canaries (the look must not re-introduce a bug).
    let mut sc = ctx.system_config();
    sc.canaries = durable_agent::canary::Canaries::none();
    match System::boot(fs.clone(), sc, ctx.deps(u32::MAX, 0.0)) {
        Ok((system, _)) => {
            let runtime = system.runtime();
            let state = runtime.state();
            let name_of = |id| state.agents.get(id).map(|a| a.name.clone());
            let mut ids = BTreeMap::new();
            for (id, agent) in &state.agents {
                let msgs = AgentMessages {
                    parent: agent.parent.as_ref().and_then(name_of),
                    pending: state.pending[id].iter().map(|m| m.id.to_string()).collect(),
                    delivered: state.delivered[id].iter().map(|m| m.to_string()).collect(),
                };
                view.agents.insert(agent.name.clone(), msgs);
                ids.insert(agent.name.clone(), id.clone());
                ids.insert(id.to_string(), id.clone());
            }
            view.runtime_violations = runtime.check_invariants();
            read_stores(&system.db(), plan, end_ms, &mut view, &ids, &state);
            let mut works = works_to_check(events);
            works.extend(
                view.triggers
                    .values()
                    .filter_map(|t| Some((t.agent.clone()?, t.work.clone()))),
            );
            for (agent, work) in works {
                let Some(id) = ids.get(&agent) else { continue };
                if runtime.work_done(id, &work).unwrap_or(false) {
                    view.completed.insert((agent, work));
                }
            }
        }
        Err(e) => view.runtime_violations.push(format!("final boot failed: {e}")),
    }
    match Schedules::load(fs.clone(), &plan.root) {
        Ok(s) => view.schedules = s.list().into_iter().map(|s| s.id).collect(),
        Err(e) => view.disk_violations.push(format!("schedules: {e}")),
    }
    view.disk_violations.extend(
        recovery::check_invariants(&*fs, &plan.root)
            .err()
            .unwrap_or_default(),
    );
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

fn read_stores(
    db: &Db,
    plan: &SimPlan,
    end_ms: u64,
    view: &mut FinalView,
    ids: &BTreeMap<String, durable_agent::runtime::AgentId>,
    state: &durable_agent::runtime::RuntimeState,
) {
    let triggers = TriggerStore::new(plan.trigger_policy, Default::default());
    match triggers.all(db.conn(), end_ms) {
        Ok(rows) => {
            for t in rows {
                // The agent its payload names, by name (or id).
                let agent = t.payload["agent"]
                    .as_str()
                    .and_then(|a| ids.get(a))
                    .and_then(|id| state.agents.get(id))
                    .map(|a| a.name.clone());
                let row = TriggerRow {
                    status: t.status.as_str().to_string(),
                    fire_at_ms: t.fire_at_ms,
                    attempts: t.attempts,
                    agent,
                    work: System::trigger_work(&t),
                };
                if let (Some(schedule), Some(bucket)) =
                    (t.payload["schedule"].as_str(), t.payload["bucket"].as_u64())
                {
                    *view.buckets.entry((schedule.to_string(), bucket)).or_insert(0) += 1;
                }
                if let Some(key) = &t.dedup_key {
                    *view.rows_per_key.entry(key.clone()).or_insert(0) += 1;
                }
                view.triggers.insert(t.dedup_key.clone().unwrap_or(t.id), row);
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
