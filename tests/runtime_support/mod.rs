//! Shared test harness for the runtime's crash tests: a tiny op language,
//! a dry run that records the observable state after each op and the I/O
//! trace, and a crash run that kills the process at a chosen I/O point,
//! restarts under a crash mode, recovers and checks:
//! - recovery succeeds and the on-disk invariants hold;
//! - the recovered state is the state before the interrupted op or after
//!   it (the in-flight op is all-or-nothing), never anything else.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use durable_agent::canary::Canaries;
use durable_agent::fs::sim::TraceEntry;
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::recovery::{check_invariants, RecoveryReport};
use durable_agent::runtime::{AgentId, Runtime, RuntimeConfig, RuntimeError, RuntimeState};

pub const ROOT: &str = "/data";

pub const MODES: [CrashMode; 3] = [
    CrashMode::ProcessCrash,
    CrashMode::PowerLoss(DirModel::Strict),
    CrashMode::PowerLoss(DirModel::Eager),
];

/// One runtime operation; agents are named by creation index.
#[derive(Debug, Clone)]
pub enum Op {
    CreateRoot(&'static str),
    Spawn(usize, &'static str),
    Turn(usize, &'static str),
    Send(usize, usize, &'static str),
    Deliver(usize),
    Evict(usize),
    Terminate(usize),
}

pub fn config(seed: u64, canaries: &Canaries) -> RuntimeConfig {
    RuntimeConfig::new(seed)
        .with_slots(2)
        .with_canaries(canaries.clone())
}

pub fn open(sim: &SimFs, seed: u64, canaries: &Canaries) -> Result<(Runtime, RecoveryReport), RuntimeError> {
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    Runtime::open(fs, Path::new(ROOT), config(seed, canaries))
}

pub fn apply(rt: &mut Runtime, agents: &mut Vec<AgentId>, op: &Op) -> Result<(), RuntimeError> {
    match op {
        Op::CreateRoot(name) => agents.push(rt.create_root(name, "instructions")?),
        Op::Spawn(p, name) => {
            let parent = agents[*p].clone();
            agents.push(rt.spawn_child(&parent, name, "child instructions")?);
        }
        Op::Turn(a, prompt) => drop(rt.run_turn(&agents[*a], prompt)?),
        Op::Send(f, t, payload) => drop(rt.send_message(&agents[*f], &agents[*t], payload)?),
        Op::Deliver(a) => drop(rt.deliver(&agents[*a])?),
        Op::Evict(a) => rt.evict(&agents[*a])?,
        Op::Terminate(a) => rt.terminate(&agents[*a])?,
    }
    Ok(())
}

/// A crash-free run: normalized state before the ops (index 0) and after
/// each op, the trace, and the I/O points of each op as (first, last).
pub struct DryRun {
    pub states: Vec<RuntimeState>,
    pub trace: Vec<TraceEntry>,
    pub op_points: Vec<(u64, u64)>,
}

pub fn dry_run(seed: u64, ops: &[Op]) -> DryRun {
    let sim = SimFs::new(SimConfig::new(seed));
    let (mut rt, _) = open(&sim, seed, &Canaries::none()).unwrap();
    let mut agents = Vec::new();
    let mut states = vec![rt.state().normalized()];
    let mut op_points = Vec::new();
    for op in ops {
        let first = sim.points() + 1;
        apply(&mut rt, &mut agents, op).unwrap();
        op_points.push((first, sim.points()));
        states.push(rt.state().normalized());
    }
    DryRun {
        states,
        trace: sim.trace(),
        op_points,
    }
}

/// The first point in op `op_index` (0-based) whose label is `label`.
pub fn point_of(dry: &DryRun, op_index: usize, label: &str) -> u64 {
    let (first, last) = dry.op_points[op_index];
    dry.trace
        .iter()
        .find(|t| t.point >= first && t.point <= last && t.label == label)
        .unwrap_or_else(|| panic!("no I/O point labelled {label:?} in op {op_index}"))
        .point
}

/// The first point labelled `label` in op `op_index` that comes after the
/// first point labelled `anchor` in it.
pub fn point_after(dry: &DryRun, op_index: usize, anchor: &str, label: &str) -> u64 {
    let start = point_of(dry, op_index, anchor);
    let (_, last) = dry.op_points[op_index];
    dry.trace
        .iter()
        .find(|t| t.point > start && t.point <= last && t.label == label)
        .unwrap_or_else(|| panic!("no I/O point labelled {label:?} after {anchor:?} in op {op_index}"))
        .point
}

/// Result of one crash run.
pub struct CrashRun {
    /// Index of the op that observed the crash (0-based).
    pub failed_op: usize,
    pub runtime: Runtime,
    pub report: RecoveryReport,
    pub sim: SimFs,
    pub agents: Vec<AgentId>,
}

/// How the process comes back after the fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The op got an error but the process lives: drop the (poisoned)
    /// runtime and reopen it on the same disk.
    SameProcess,
    /// The process died: apply the crash mode, reboot, reopen.
    Crash(CrashMode),
}

/// Run `ops`, crash at I/O point `point`, restart with `mode`, recover.
/// Errors describe a violated guarantee.
pub fn crash_run(
    seed: u64,
    ops: &[Op],
    point: u64,
    mode: CrashMode,
    canaries: &Canaries,
) -> Result<Option<CrashRun>, String> {
    fault_run(seed, ops, Fault::CrashAt(point), Restart::Crash(mode), canaries)
}

/// Run `ops` with `fault` armed, come back per `restart`, recover and check
/// the invariants. `Ok(None)` when no op saw the fault.
pub fn fault_run(
    seed: u64,
    ops: &[Op],
    fault: Fault,
    restart: Restart,
    canaries: &Canaries,
) -> Result<Option<CrashRun>, String> {
    let sim = SimFs::new(SimConfig::new(seed));
    let (mut rt, _) = open(&sim, seed, canaries).map_err(|e| e.to_string())?;
    sim.set_fault(Some(fault));
    let mut agents = Vec::new();
    let mut failed_op = None;
    for (i, op) in ops.iter().enumerate() {
        if apply(&mut rt, &mut agents, op).is_err() {
            failed_op = Some(i);
            break;
        }
    }
    let Some(failed_op) = failed_op else {
        return Ok(None);
    };
    drop(rt);
    match restart {
        Restart::SameProcess => sim.set_fault(None),
        Restart::Crash(mode) => sim.restart(mode),
    }
    let (runtime, report) = recover_checked(&sim, seed, canaries)?;
    Ok(Some(CrashRun {
        failed_op,
        runtime,
        report,
        sim,
        agents,
    }))
}

fn recover_checked(sim: &SimFs, seed: u64, canaries: &Canaries) -> Result<(Runtime, RecoveryReport), String> {
    let (runtime, report) = open(sim, seed, canaries).map_err(|e| format!("recovery failed: {e}"))?;
    check_invariants(sim, Path::new(ROOT)).map_err(|v| format!("on-disk invariants: {v:#?}"))?;
    let mem = runtime.check_invariants();
    if !mem.is_empty() {
        return Err(format!("in-memory invariants: {mem:#?}"));
    }
    Ok((runtime, report))
}

/// After a recovery, lose power with no further op: the next recovery must
/// find the same state (recovery made durable everything it relied on).
pub fn then_power_loss(run: CrashRun, mode: CrashMode, seed: u64, canaries: &Canaries) -> Result<(), String> {
    let first = run.runtime.state().normalized();
    drop(run.runtime);
    run.sim.restart(mode);
    let (runtime, _) =
        recover_checked(&run.sim, seed, canaries).map_err(|e| format!("after a second crash: {e}"))?;
    let second = runtime.state().normalized();
    if first != second {
        return Err(format!(
            "{mode:?} after recovery changed the recovered state:\n{}",
            similar_diff(&first, &second)
        ));
    }
    Ok(())
}

/// Check the recovered state is the state before or after the failed op.
pub fn check_all_or_nothing(dry: &DryRun, run: &CrashRun) -> Result<(), String> {
    let got = run.runtime.state().normalized();
    let k = run.failed_op;
    if got == dry.states[k] || got == dry.states[k + 1] {
        return Ok(());
    }
    let diff_before = similar_diff(&dry.states[k], &got);
    Err(format!(
        "crash in op {k}: recovered state is neither the state before nor after it\n--- before op vs recovered:\n{diff_before}"
    ))
}

fn similar_diff(a: &RuntimeState, b: &RuntimeState) -> String {
    let a = serde_json::to_string_pretty(a).unwrap();
    let b = serde_json::to_string_pretty(b).unwrap();
    let mut out = String::new();
    for (la, lb) in a.lines().zip(b.lines()) {
        if la != lb {
            out.push_str(&format!("- {la}\n+ {lb}\n"));
        }
    }
    if a.lines().count() != b.lines().count() {
        out.push_str(&format!(
            "(line counts differ: {} vs {})\n",
            a.lines().count(),
            b.lines().count()
        ));
    }
    out
}

/// Crash at every I/O point of `ops` under `mode`; returns every violation
/// (point, label, message).
pub fn sweep(seed: u64, ops: &[Op], mode: CrashMode, canaries: &Canaries) -> Vec<(u64, String, String)> {
    sweep_faults(seed, ops, Fault::CrashAt, Restart::Crash(mode), None, canaries)
}

/// Arm `fault(n)` at every I/O point `n` of `ops`, come back per `restart`,
/// recover, check invariants and all-or-nothing; then, if `second` is set,
/// crash again right after recovery and check the state held. Returns every
/// violation (point, label, message).
pub fn sweep_faults(
    seed: u64,
    ops: &[Op],
    fault: impl Fn(u64) -> Fault,
    restart: Restart,
    second: Option<CrashMode>,
    canaries: &Canaries,
) -> Vec<(u64, String, String)> {
    let dry = dry_run(seed, ops);
    let (first, _) = dry.op_points[0];
    let (_, last) = *dry.op_points.last().unwrap();
    let mut violations = Vec::new();
    for point in first..=last + 1 {
        let label = dry
            .trace
            .iter()
            .find(|t| t.point == point)
            .map(|t| t.label.clone())
            .unwrap_or_default();
        let result = fault_run(seed, ops, fault(point), restart, canaries).and_then(|run| match run {
            Some(run) => {
                check_all_or_nothing(&dry, &run)?;
                match second {
                    Some(mode) => then_power_loss(run, mode, seed, canaries),
                    None => Ok(()),
                }
            }
            None => Ok(()),
        });
        if let Err(e) = result {
            violations.push((point, label, e));
        }
    }
    violations
}

/// A scenario touching every operation: tree, turns with tools, messages,
/// eviction/restore, termination.
pub fn full_scenario() -> Vec<Op> {
    vec![
        Op::CreateRoot("alpha"),
        Op::Spawn(0, "worker"),
        Op::Turn(0, "plan the lookup"),
        Op::Turn(1, "send_email to the client"),
        Op::Send(1, 0, "report"),
        Op::CreateRoot("beta"),
        Op::Send(0, 1, "more work"),
        Op::Deliver(0),
        Op::Evict(1),
        Op::Turn(1, "write_note about it"),
        Op::Deliver(1),
        Op::Terminate(1),
    ]
}

/// A random valid op sequence of `len` ops from `seed` (a tiny shadow of
/// the tree keeps every op legal: terminate only leaves, no op on the dead).
pub fn random_ops(seed: u64, len: usize) -> Vec<Op> {
    use rand::{Rng, SeedableRng};
    const NAMES: [&str; 4] = ["a", "b", "c", "d"];
    const PROMPTS: [&str; 5] = ["hi", "lookup x", "send_email now", "write_note y", "think"];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut parent: Vec<Option<usize>> = Vec::new();
    let mut alive: Vec<bool> = Vec::new();
    let mut ops = Vec::new();
    while ops.len() < len {
        let live: Vec<usize> = (0..alive.len()).filter(|&i| alive[i]).collect();
        let pick = |rng: &mut rand_chacha::ChaCha8Rng| live[rng.random_range(0..live.len())];
        let name = NAMES[rng.random_range(0..NAMES.len())];
        let op = match (live.is_empty(), rng.random_range(0..10u32)) {
            (true, _) | (false, 0) => {
                parent.push(None);
                alive.push(true);
                Op::CreateRoot(name)
            }
            (false, 1) => {
                let p = pick(&mut rng);
                parent.push(Some(p));
                alive.push(true);
                Op::Spawn(p, name)
            }
            (false, 2 | 3) => Op::Turn(pick(&mut rng), PROMPTS[rng.random_range(0..PROMPTS.len())]),
            (false, 4 | 5) => Op::Send(pick(&mut rng), pick(&mut rng), name),
            (false, 6 | 7) => Op::Deliver(pick(&mut rng)),
            (false, 8) => Op::Evict(pick(&mut rng)),
            (false, _) => {
                let a = pick(&mut rng);
                let has_children = (0..alive.len()).any(|c| alive[c] && parent[c] == Some(a));
                if has_children {
                    continue;
                }
                alive[a] = false;
                Op::Terminate(a)
            }
        };
        ops.push(op);
    }
    ops
}
