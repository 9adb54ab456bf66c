//! The madsim supervisor: one node runs the daemon; the supervisor crashes
//! it on the seeded schedule — at the instant, a seeded number of I/O
//! points later, or aimed at a one-time trigger's turn in flight
//! ([`super::target`]) — applies the crash mode to the SimFs, restarts it,
//! and at the horizon has the disk recovered once more ([`super::view`])
//! and asks the oracle.
//!
//! Invariant: the node's database connections are gone (their futures
//! dropped) before the disk reboots, and any I/O the dying process still
//! attempts fails, so nothing a dead process does reaches the next boot.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use durable_agent::fs::{CrashMode, DirModel, Fault, SimConfig, SimFs};
use durable_agent::world::{Scripted, World};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::clients::run_client;
use super::node::{boot_and_run, NodeCtx};
use super::oracle::{check, Bounds};
use super::target::{Aim, Sights};
use super::view::final_view;
use super::{fnv1a, AimedAt, CrashRecord, Recorder, SimClock, SimOutcome, SimPlan, TurnPhase, FNV_START};

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
    if !ctx.database_released().await {
        ctx.note("a killed daemon still holds its database after 1 s".into());
    }
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
        clock: SimClock::starting_at(super::ORIGIN_MS),
        plan: plan.clone(),
        boots: Arc::new(AtomicU32::new(0)),
        watch: Arc::new(Mutex::new(Weak::new())),
        inbox: Arc::new(Mutex::new(None)),
        stop: Arc::new(AtomicBool::new(false)),
        ended: Arc::new(AtomicBool::new(false)),
        ready: Arc::new(AtomicBool::new(false)),
        sights: Sights::default(),
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
    // Aimed crashes take the plan's phases in turn from a seeded one, so a
    // run with as many aimed crashes as phases hits every phase.
    let mut next_phase = rng.random_range(0..plan.aimed_phases.len().max(1));
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
        tokio::time::sleep_until(ctx.clock.after_start(at)).await;
        let at_ms = ctx.clock.now_ms();
        let mut aimed = None;
        let mut point = None;
        let mode = if crash {
            if rng.random_bool(plan.aimed_probability) {
                let phase = plan.aimed_phases[next_phase % plan.aimed_phases.len()];
                next_phase += 1;
                aimed = aim_and_wait(&ctx, phase, &mut rng).await;
            } else if rng.random_bool(plan.mid_io_probability) {
                let armed = ctx.fs.points() + rng.random_range(1..=400u64);
                ctx.fs.set_fault(Some(Fault::CrashAt(armed)));
                wait_for_death(&ctx, 6_000).await;
            }
            point = dying_point(&ctx.fs);
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
            aimed,
            restarted_ms: ctx.clock.now_ms(),
        });
    }
    tokio::time::sleep_until(ctx.clock.after_start(plan.horizon_ms)).await;
    kill(&handle, node, &ctx).await;
    ctx.fs.restart(CrashMode::ProcessCrash);
    let end_ms = ctx.clock.now_ms();
    let events = ctx.recorder.events();
    let view = final_view(&ctx, end_ms, &events);
    let mut violations = ctx.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let bounds = Bounds {
        settle_ms: plan.settle_ms,
        fire_bound_ms: plan.start_bound_ms,
        down: down_windows(&crashes, &events),
        policy: plan.trigger_policy,
        aimed: crashes
            .iter()
            .filter_map(|c| Some((c.killed_ms, c.aimed.clone()?)))
            .collect(),
    };
    violations.extend(check(&events, &view, &bounds));
    let hash = [ctx.fs.trace_hash(), ctx.fs.image_hash(), ctx.recorder.hash()]
        .iter()
        .fold(FNV_START, |h, x| fnv1a(h, &x.to_le_bytes()));
    SimOutcome {
        seed: plan.seed,
        plan,
        hash,
        events,
        crashes,
        io_points: ctx.fs.points(),
        violations,
        view,
    }
}

/// Wait (10 ms polls, at most `polls`) until the process died at its armed
/// I/O point, or the sights ask for a kill now.
async fn wait_for_death(ctx: &NodeCtx, polls: u32) {
    for _ in 0..polls {
        if ctx.fs.crashed() || ctx.sights.kill_now() {
            return;
        }
        sleep_ms(10).await;
    }
}

/// The I/O point the process died at, with its label, if it died at one.
/// (A crashed SimFs counts no further points: its last is the one.)
fn dying_point(fs: &SimFs) -> Option<(u64, String)> {
    if !fs.crashed() {
        return None;
    }
    let point = fs.points();
    let label = fs.trace_from(point).into_iter().find(|t| t.point == point);
    Some((point, label.map(|t| t.label).unwrap_or_default()))
}

/// How long an aimed crash waits for a one-time trigger's turn to get to
/// its phase before the node is killed anyway (10 ms polls: 2 minutes, the
/// clients' emits fire every few seconds).
const AIM_PATIENCE_POLLS: u32 = 12_000;

/// Aim at the next one-time trigger's turn in `phase` and wait for the hit
/// (or the patience to run out).
async fn aim_and_wait(ctx: &NodeCtx, phase: TurnPhase, rng: &mut ChaCha8Rng) -> Option<AimedAt> {
    let aim = Aim {
        phase,
        // Its first call, or a later one (a tool's, the next round's).
        nth: rng.random_range(1..=3),
        points_ahead: match phase {
            // At once: the claim and `turn.start` are all there is.
            TurnPhase::Started => rng.random_range(1..=3),
            // Inside `turn.complete` (a handful of points) or the ack's
            // commit after it.
            TurnPhase::Completing => rng.random_range(1..=12),
            // Somewhere inside persisting one result: a log append is a
            // handful of points, a ledger commit a dozen.
            _ => rng.random_range(1..=24),
        },
    };
    ctx.sights.arm(aim);
    wait_for_death(ctx, AIM_PATIENCE_POLLS).await;
    ctx.sights.disarm()
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
