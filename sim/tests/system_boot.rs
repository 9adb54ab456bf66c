//! The one boot, [`System::boot`], as every entry point uses it: one writer
//! per root (the lock), and the trigger chain claim → turn → effects → ack
//! exactly-once for effects across a crash at every I/O point of it.

use std::collections::BTreeMap;
use std::sync::Arc;

use durable_agent::fs::{CrashMode, DirModel, Fault, RealFs, SimConfig, SimFs};
use durable_agent::runtime::{AgentId, ConversationItem, RuntimeError};
use durable_agent::store::triggers::{Trigger, TriggerSource, TriggerSpec, TriggerStatus};
use durable_agent::system::{Deps, Fired, LogicalClock, System, SystemConfig, SystemError};
use durable_agent::world::World;
use durable_agent_sim::standins::{ScriptedOutbox, ScriptedProvider, SimTools, SteppedClock};

const ROOT: &str = "/sys";
const MODES: [CrashMode; 3] = [
    CrashMode::ProcessCrash,
    CrashMode::PowerLoss(DirModel::Strict),
    CrashMode::PowerLoss(DirModel::Eager),
];

fn deps(fs: &SimFs, world: &World, clock: &SteppedClock) -> Deps {
    Deps {
        provider: Arc::new(ScriptedProvider::default()),
        tools: Arc::new(SimTools::new(fs.clone())),
        outbox: Arc::new(ScriptedOutbox {
            world: world.clone(),
            fs: fs.clone(),
            sent_at: Arc::default(),
            lost: Arc::default(),
            lost_keys: Arc::default(),
        }),
        clock: Arc::new(clock.clone()),
    }
}

fn boot(fs: &SimFs, world: &World, clock: &SteppedClock) -> Result<System, SystemError> {
    System::boot(
        Arc::new(fs.clone()),
        SystemConfig::new(ROOT, 7),
        deps(fs, world, clock),
    )
    .map(|(system, _)| system)
}

#[test]
fn a_second_boot_on_a_locked_root_fails_with_a_clear_error() {
    let fs = SimFs::new(SimConfig::new(1));
    let (world, clock) = (World::without_dedup(), SteppedClock::default());
    let first = boot(&fs, &world, &clock).expect("first boot");
    let disk = fs.image_hash();
    let err = boot(&fs, &world, &clock).expect_err("a second writer booted");
    assert!(matches!(err, SystemError::Locked { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("/sys") && msg.contains("in use by another"), "{msg}");
    assert_eq!(fs.image_hash(), disk, "the refused boot changed the disk");
    drop(first);
    let second = boot(&fs, &world, &clock).expect("boot after the first stopped");
    // The process dies (crash + reboot): its lock dies with it, and the
    // dead system's late drop does not release the next boot's lock.
    fs.set_fault(Some(Fault::CrashAt(fs.points() + 1)));
    fs.restart(CrashMode::ProcessCrash);
    let third = boot(&fs, &world, &clock).expect("boot after the holder died");
    drop(second);
    assert!(
        matches!(boot(&fs, &world, &clock), Err(SystemError::Locked { .. })),
        "a dead system's drop released the live one's lock"
    );
    drop(third);
}

/// On the real kernel path: the lock is `flock(2)` on `{root}/LOCK`, so it
/// excludes a second boot in this process and another process (`flock(1)`
/// from util-linux stands in for a second durable-agent), and is gone once
/// the holder is.
#[test]
fn the_root_lock_holds_on_a_real_directory_against_other_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let deps = || {
        let fs = SimFs::new(SimConfig::new(1));
        deps(&fs, &World::without_dedup(), &SteppedClock::default())
    };
    let boot_real = || System::boot(Arc::new(RealFs::new()), SystemConfig::new(&root, 1), deps());
    let (held, _) = boot_real().expect("first boot");
    let err = boot_real().expect_err("a second writer booted");
    assert!(matches!(err, SystemError::Locked { .. }), "{err}");
    assert!(err.to_string().contains(&root.display().to_string()), "{err}");
    let lock = root.join("LOCK");
    let other_process_gets_it = || {
        std::process::Command::new("flock")
            .args(["--nonblock", "--conflict-exit-code", "75"])
            .arg(&lock)
            .arg("true")
            .status()
            .ok()
            .and_then(|s| s.code())
    };
    match other_process_gets_it() {
        None => eprintln!("flock(1) not available: skipped the cross-process half"),
        Some(code) => {
            assert_eq!(code, 75, "another process took the lock while a system held it");
            drop(held);
            assert_eq!(other_process_gets_it(), Some(0), "the lock outlived its holder");
        }
    }
}

fn spec(key: &str) -> TriggerSpec {
    TriggerSpec {
        source: TriggerSource::Scheduled,
        dedup_key: Some(key.into()),
        session_id: None,
        fire_at_ms: 0,
        priority: 0,
        description: format!("trigger {key}"),
        payload: serde_json::json!({ "key": key }),
    }
}

fn worker(system: &System) -> AgentId {
    let nodes = system.runtime().tree().nodes();
    let found = nodes
        .iter()
        .find(|(_, n)| n.name == "worker")
        .map(|(id, _)| id.clone());
    found.expect("the worker survived")
}

fn claim(system: &System) -> Result<Option<Trigger>, SystemError> {
    let now = system.now_ms();
    let claimed = system.triggers().claim(system.db().conn(), now, 60_000)?;
    Ok(claimed)
}

/// The fired turn: two rounds, each with an irreversible effect.
const FIRE_PROMPT: &str = "p1:II";

fn fire(system: &mut System) -> Result<Option<Fired>, SystemError> {
    let Some(t) = claim(system)? else {
        return Ok(None);
    };
    let agent = worker(system);
    system.fire(&t, &agent, FIRE_PROMPT).map(Some)
}

/// Fire again after the reboot, as `serve` would: a firing blocked on a
/// key that needs confirmation is acked FAILED naming it; an honest human
/// answers from the world's record, which puts the trigger back to
/// PENDING, and it fires again. Returns the last firing and whether it
/// was blocked.
fn refire(system: &mut System, world: &World, clock: &SteppedClock) -> Result<(Option<Fired>, bool), String> {
    let Some(t) = claim(system).map_err(|e| e.to_string())? else {
        return Ok((None, false));
    };
    let agent = worker(system);
    let key = match system.fire(&t, &agent, FIRE_PROMPT) {
        Ok(fired) => return Ok((Some(fired), false)),
        Err(SystemError::Runtime(e @ RuntimeError::NeedsConfirmation { .. })) => {
            let RuntimeError::NeedsConfirmation { idem_key, .. } = &e else {
                unreachable!()
            };
            let now = clock.now_ms();
            system
                .triggers()
                .ack_failed(system.db().conn(), &t, now, &e.to_string(), false)
                .map_err(|e| e.to_string())?;
            idem_key.clone()
        }
        Err(e) => return Err(e.to_string()),
    };
    let confirmed = system
        .confirm(&key, &world.honest_answer(&key))
        .map_err(|e| e.to_string())?;
    if confirmed.retried.iter().map(|r| &r.id).ne([&t.id]) {
        return Err(format!(
            "confirming {key} retried {:?}, not {}",
            confirmed.retried, t.id
        ));
    }
    fire(system).map(|f| (f, true)).map_err(|e| e.to_string())
}

/// Disk, world and clock with the system installed, the worker created and
/// the trigger emitted (acknowledged).
fn setup(dedup: bool) -> (SimFs, World, SteppedClock) {
    let fs = SimFs::new(SimConfig::new(3));
    let world = if dedup {
        World::with_dedup()
    } else {
        World::without_dedup()
    };
    let clock = SteppedClock::default();
    clock.set(1_000);
    let mut system = boot(&fs, &world, &clock).expect("install");
    system
        .runtime_mut()
        .create_root("worker", "work")
        .expect("worker");
    system
        .triggers()
        .emit(system.db().conn(), &spec("nightly"), 1_000)
        .expect("emit");
    drop(system);
    (fs, world, clock)
}

/// Deliveries per logical effect (the scripted call's key).
fn effects(world: &World) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for d in world.deliveries() {
        let key = d.payload["key"].as_str().unwrap_or("?").to_string();
        *out.entry(key).or_default() += 1;
    }
    out
}

/// The claim → turn → effects → ack chain crashed at every I/O point under
/// every crash mode; after the reboot the agent first runs a turn of its
/// own (so its turn count moves on: keys derived from the turn number
/// would change), then the trigger is claimed and fired again. Each
/// irreversible effect reaches the world at most once (exactly once where
/// the world deduplicates), the trigger ends DONE, and the fired turn is in
/// the conversation exactly once.
#[test]
fn a_trigger_turn_crashed_at_every_point_between_claim_and_ack_sends_each_effect_at_most_once() {
    for dedup in [false, true] {
        // The chain's I/O points, from a crash-free run.
        let (fs, world, clock) = setup(dedup);
        let mut system = boot(&fs, &world, &clock).expect("boot");
        let first = fs.points() + 1;
        let fired = fire(&mut system).expect("fire");
        assert_eq!(fired, Some(Fired::Ran { tool_calls: 2 }));
        let last = fs.points();
        drop(system);
        assert!(last - first > 20, "too few points to sweep: {first}..={last}");
        let mut judged = 0;
        let mut blocked = 0;
        for mode in MODES {
            for point in first..=last {
                let (fs, world, clock) = setup(dedup);
                let mut system = boot(&fs, &world, &clock).expect("boot");
                fs.set_fault(Some(Fault::CrashAt(point)));
                let _ = fire(&mut system); // dies at `point`
                assert!(fs.crashed(), "point {point} not reached");
                drop(system);
                fs.restart(mode);
                clock.set(10_000_000);
                let repro = format!("dedup={dedup} mode={mode:?} point={point}");
                let mut system = boot(&fs, &world, &clock).unwrap_or_else(|e| panic!("{repro}: reboot: {e}"));
                let agent = worker(&system);
                system
                    .runtime_mut()
                    .run_turn(&agent, "p2:r")
                    .unwrap_or_else(|e| panic!("{repro}: own turn: {e}"));
                let refired = match refire(&mut system, &world, &clock) {
                    Ok((fired, was_blocked)) => {
                        blocked += usize::from(was_blocked);
                        fired
                    }
                    Err(e) => panic!("{repro}: re-fire: {e}"),
                };
                let rows = system.triggers().all(system.db().conn(), 0).expect("rows");
                assert_eq!(rows.len(), 1, "{repro}");
                assert_eq!(rows[0].status, TriggerStatus::Done, "{repro}: {refired:?}");
                let counts = effects(&world);
                for (key, n) in &counts {
                    assert!(*n <= 1, "{repro}: effect {key} delivered {n} times");
                }
                if dedup {
                    assert_eq!(counts.len(), 2, "{repro}: dedup world, effects {counts:?}");
                }
                let conversation = &system.runtime().state().conversations[&agent];
                let fired_turns = conversation
                    .iter()
                    .filter(|i| matches!(i, ConversationItem::Prompt { text } if text == FIRE_PROMPT))
                    .count();
                assert_eq!(fired_turns, 1, "{repro}: the fired turn ran {fired_turns} times");
                judged += 1;
            }
        }
        eprintln!(
            "dedup={dedup}: {judged} crash points judged ({first}..={last} x 3 modes), {blocked} re-fires blocked on a confirmation"
        );
        // Only a world that cannot deduplicate leaves a key to confirm.
        assert_eq!(blocked > 0, !dedup, "{blocked} re-fires blocked");
    }
}

#[test]
fn a_trigger_whose_turn_completed_before_a_crash_is_acked_without_running_again() {
    let (fs, world, clock) = setup(false);
    let mut system = boot(&fs, &world, &clock).expect("boot");
    let t = claim(&system).expect("claim").expect("due");
    let agent = worker(&system);
    // The turn completes; the process dies before the ack.
    system
        .runtime_mut()
        .run_work_turn(&agent, FIRE_PROMPT, &System::trigger_work(&t))
        .expect("turn");
    let sent = world.deliveries_len();
    drop(system);
    fs.set_fault(Some(Fault::CrashAt(fs.points() + 1)));
    fs.restart(CrashMode::PowerLoss(DirModel::Strict));
    clock.set(10_000_000);
    let mut system = boot(&fs, &world, &clock).expect("reboot");
    assert_eq!(fire(&mut system).expect("re-fire"), Some(Fired::AlreadyDone));
    assert_eq!(
        world.deliveries_len(),
        sent,
        "the completed turn's effects were sent again"
    );
    // The ack proved the re-claim's lease: the row is DONE at attempt 2.
    let rows = system.triggers().all(system.db().conn(), 0).expect("rows");
    assert_eq!((rows[0].status, rows[0].attempts), (TriggerStatus::Done, 2));
}
