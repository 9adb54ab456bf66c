//! The crash driver: applies ops to the model and the runtime in lockstep,
//! crashes where a case says, recovers, and asks the oracle.
//!
//! Invariant: every check a case is subject to happens here, in one order:
//! after every op the runtime's own invariants, I1 and I4 hold and, when no
//! crash happened, the runtime equals the model; after every restart I2
//! and I3 hold and the oracle accepts the recovered state, which then
//! becomes the model. A case is a pure function of (seed, ops, canaries,
//! sweep point): replaying it gives the same trace and the same verdict.

use durable_agent::canary::Canaries;
use durable_agent::fs::{Fault, SimFs};
use serde::{Deserialize, Serialize};

use crate::driver::{installed_disk, sim_config, Driver};
use crate::model::Model;
use crate::op::{CrashKind, FaultKind, Op};
use crate::oracle;
use crate::report::Failure;

mod fork;
pub(crate) use fork::content_key;
mod restart;

pub use fork::{Fork, Judging, Observed};

/// A sweep crash: the `point`-th I/O point of the whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalCrash {
    pub point: u64,
    pub kind: CrashKind,
}

/// Everything needed to replay a run (what case files hold).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    /// Seeds the runtime's ids and SimFs's power-loss choices.
    pub seed: u64,
    pub ops: Vec<Op>,
    #[serde(default)]
    pub canaries: Canaries,
    /// Sweep mode: crash at this global point; `Op::Crash` is then ignored.
    #[serde(default)]
    pub crash_at: Option<GlobalCrash>,
}

/// What a passing run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// I/O points the run performed (all ops and recoveries).
    pub points: u64,
    /// Restarts (crashes and clean recovers) checked by the oracle.
    pub restarts: u64,
    /// Injected crash points that were hit.
    pub crashes: u64,
}

/// Bound on back-to-back crashes while recovering (a crash armed into a
/// recovery, then the recovery of that).
const MAX_RECOVERY_ATTEMPTS: u32 = 3;

/// The runtime and the model in lockstep.
#[derive(Debug)]
pub struct Exec {
    seed: u64,
    canaries: Canaries,
    global: Option<GlobalCrash>,
    driver: Driver,
    model: Model,
    armed: Option<(u16, CrashKind)>,
    armed_fault: Option<(u16, FaultKind)>,
    history: Vec<Op>,
    restarts: u64,
    crashes: u64,
    /// I/O points done before the current op (the crash site is searched
    /// after it, never in an earlier op).
    step_start: u64,
    /// The crash mode of the current op's crash, and the point it fell
    /// after when it landed between ops.
    crash_mode: Option<CrashKind>,
    boundary: Option<u64>,
    /// One line per accepted restart, for the report.
    restart_notes: Vec<String>,
    /// Capture mode (the fast sweep): crash images taken so far, each with
    /// what a replay crashed at its point would be judged against.
    forks: Option<Vec<Fork>>,
    /// The side the oracle accepted at the first restart after an
    /// injected crash was hit (what a sweep's picture colours a cell by).
    crash_side: Option<oracle::Side>,
    /// The next judged restart is a clean stop and start (no crash point
    /// hit, no fault armed): the oracle's strict candidate, no R3.
    clean_restart: bool,
    /// The op in flight answered its provider's failure
    /// (`RuntimeError::Provider`, the process alive): its `errors` row was
    /// committed before the answer, so a reopen after it (an armed fault
    /// that never fired) does not excuse a missing row (E1).
    answered_failure: bool,
    /// Judging the second boot of a crash chain
    /// ([`Exec::power_cut_after_boot`]): not chained again.
    in_chain: bool,
}

impl Exec {
    /// An installed system, booted: every run begins with the install
    /// (the first boot on an empty disk, then a clean stop) and a boot on
    /// the installed disk, judged like any restart (nothing is
    /// acknowledged yet, so the recovered state must be empty).
    ///
    /// The install is the same for every seed (`tests/install.rs`), so a
    /// run whose crash point lies past it starts from a copy of the
    /// installed disk ([`installed_disk`], [`Driver::from_install`])
    /// instead of performing it:
    /// the same I/O up to that point, numbered the same. A sweep point
    /// inside the install runs it from the empty disk.
    pub fn new(seed: u64, canaries: Canaries, global: Option<GlobalCrash>) -> Result<Exec, Box<Failure>> {
        Exec::start(seed, canaries, global, false)
    }

    fn start(
        seed: u64,
        canaries: Canaries,
        global: Option<GlobalCrash>,
        capture: bool,
    ) -> Result<Exec, Box<Failure>> {
        let origin = crate::model::installed_by(seed);
        let mut exec = Exec {
            seed,
            canaries: canaries.clone(),
            global,
            driver: Driver::with_fs(seed, canaries.clone(), SimFs::new(sim_config(seed))),
            model: Model::for_seed(seed),
            armed: None,
            armed_fault: None,
            history: Vec::new(),
            restarts: 0,
            crashes: 0,
            step_start: 0,
            crash_mode: None,
            boundary: None,
            restart_notes: Vec::new(),
            forks: None,
            crash_side: None,
            clean_restart: false,
            answered_failure: false,
            in_chain: false,
        };
        let install = match installed_disk(&canaries, origin) {
            Ok(disk) => disk,
            Err(e) => return Err(exec.fail("installing the system failed", e, None)),
        };
        let kind = global.map(|g| g.kind).unwrap_or(CrashKind::Process);
        let empty = exec.model.clone();
        match global {
            // The capturing dry run installs too, so the install's points
            // get crash images like every other point.
            Some(g) if capture || g.point <= install.points() => {
                exec.driver = match Driver::before_install(seed, canaries.clone(), origin) {
                    Ok(driver) => driver,
                    Err(e) => return Err(exec.fail("installing the system failed", e, None)),
                };
                exec.driver.fs.set_fault(Some(Fault::CrashAt(g.point)));
                if capture {
                    exec.forks = Some(Vec::new());
                    exec.driver.fs.set_capture(true);
                }
                let names = exec.names();
                match exec.driver.open() {
                    Ok(()) => {}
                    Err(_) if exec.driver.fs.crashed() => {
                        exec.restart(kind, &empty, None, None)?;
                        return Ok(exec);
                    }
                    Err(e) => return Err(exec.fail("opening a fresh runtime failed", e, None)),
                }
                exec.crash_mode = Some(kind);
                if exec.driver.shutdown(kind) {
                    exec.crashes += 1;
                }
                exec.disarm();
                exec.collect(|e| Judging::restart(&empty, names, e));
            }
            _ => {
                exec.crash_mode = Some(kind);
                exec.driver = Driver::from_install(seed, canaries, &install);
                if let Some(g) = global {
                    exec.driver.fs.set_fault(Some(Fault::CrashAt(g.point)));
                }
            }
        }
        let names = exec.names();
        exec.reopen_and_judge(kind, &empty, None, None)?;
        exec.collect(|e| Judging::restart(&empty, names, e));
        Ok(exec)
    }

    /// The labelled I/O trace of the run so far.
    pub fn trace(&self) -> Vec<durable_agent::fs::TraceEntry> {
        self.driver.fs.trace()
    }

    /// The model the harness currently holds (the acknowledged state).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The side the oracle accepted for the recovery from the first
    /// injected crash that was hit (`None`: none hit, or not judged yet).
    pub fn crash_side(&self) -> Option<oracle::Side> {
        self.crash_side
    }

    /// Stats so far.
    pub fn stats(&self) -> RunStats {
        RunStats {
            points: self.driver.fs.points(),
            restarts: self.restarts,
            crashes: self.crashes,
        }
    }

    /// A hash of every byte of the disk as the run left it
    /// ([`SimFs::image_hash`](durable_agent::fs::SimFs::image_hash)).
    pub fn disk_hash(&self) -> u64 {
        self.driver.fs.image_hash()
    }

    /// The case that replays this run up to now.
    pub fn case(&self) -> Case {
        Case {
            seed: self.seed,
            ops: self.history.clone(),
            canaries: self.canaries.clone(),
            crash_at: self.global,
        }
    }

    /// Apply one op. `Err` is a property violation, fully described.
    pub fn step(&mut self, op: &Op) -> Result<(), Box<Failure>> {
        self.history.push(op.clone());
        self.driver.set_step(self.history.len() as u64);
        self.model.at_step(self.history.len() as u64);
        self.step_start = self.driver.fs.points();
        self.answered_failure = false;
        self.crash_mode = None;
        self.boundary = None;
        match op {
            Op::Crash { offset, kind } => {
                if self.global.is_none() {
                    self.armed = Some((*offset, *kind));
                }
                Ok(())
            }
            Op::Fault { offset, kind } => {
                if self.global.is_none() {
                    self.armed_fault = Some((*offset, *kind));
                }
                Ok(())
            }
            Op::Recover => {
                // A clean stop, then reopen; an armed crash — or else an
                // armed I/O fault — lands inside the recovery itself
                // (recovery must be restartable, and must fail cleanly).
                let model = self.model.clone();
                let names = self.names();
                let armed = self.armed.take();
                let fault = if armed.is_none() {
                    self.armed_fault.take()
                } else {
                    None
                };
                let sweep_kind = self.global.map(|g| g.kind).unwrap_or(CrashKind::Process);
                let hit = self.driver.shutdown(sweep_kind);
                if hit {
                    self.crashes += 1;
                }
                self.clean_restart = !hit && armed.is_none() && fault.is_none();
                self.disarm();
                if let Some((offset, _)) = armed {
                    self.driver.fs.set_fault(Some(Fault::CrashAt(
                        self.driver.fs.points() + 1 + u64::from(offset),
                    )));
                }
                if let Some((offset, kind)) = fault {
                    self.driver
                        .fs
                        .set_fault(Some(kind.at(self.driver.fs.points() + 1 + u64::from(offset))));
                }
                let kind = armed
                    .map(|(_, k)| k)
                    .or(self.global.map(|g| g.kind))
                    .unwrap_or(CrashKind::Process);
                self.crash_mode = Some(kind);
                self.reopen_and_judge(kind, &model, None, None)?;
                self.collect(|e| Judging::restart(&model, names, e));
                Ok(())
            }
            _ => self.action(op),
        }
    }

    fn action(&mut self, op: &Op) -> Result<(), Box<Failure>> {
        let Some(action) = self.model.resolve(op) else {
            return Ok(()); // no agent fits: skipped, on both sides
        };
        self.model.note_started(&action);
        let before = self.model.clone();
        let mut after = before.clone();
        after.apply(&action);
        // A turn a hook parks for a human does, at most, stop there.
        let must_block = before.must_block(&action);
        if let Some(blocked) = must_block.then(|| before.blocked(&action)).flatten() {
            after = blocked;
        }
        let armed = self.armed.take();
        let fault = if armed.is_some() {
            None
        } else {
            self.armed_fault.take()
        };
        let next = self.driver.fs.points() + 1;
        if let Some((offset, _)) = armed {
            self.driver
                .fs
                .set_fault(Some(Fault::CrashAt(next + u64::from(offset))));
        }
        if let Some((offset, kind)) = fault {
            self.driver.fs.set_fault(Some(kind.at(next + u64::from(offset))));
        }
        if matches!(action, crate::model::Action::Gc { strip: false }) {
            self.driver.forget_usage();
        }
        let names = self.names();
        let lost_before = self.driver.lost_replies();
        let result = self.driver.exec(&action);
        if let crate::model::Action::RunTurn { agent, .. } = &action {
            // The turn's number: its agent's completed turns before it.
            let turn = before.state.agents.get(agent).map_or(0, |a| a.turns.len());
            self.driver.note_failed_turn(self.step_start, turn as u64);
        }
        self.collect(|e| Judging::in_flight(&before, &after, &action, names.clone(), e));
        let blocked = self.driver.take_blocked();
        let provider_failed = self.driver.take_provider_failed();
        // (A sweep's crash is a kill -9: no answer reached anyone.)
        self.answered_failure = provider_failed && !self.driver.fs.crashed() && self.global.is_none();
        // The world acted and lost its answer to this live process: the
        // op's outcome is unknown to the runtime, as after an I/O error
        // that took effect (no crash: the disk keeps everything).
        let world_lost = self.driver.lost_replies() > lost_before;
        if world_lost && result.is_err() && !self.driver.fs.crashed() && blocked.is_none() {
            self.disarm();
            if let Some(why) = self.driver.poisoned_probe(None) {
                return Err(self.fail("a poisoned runtime went on", why, None));
            }
            return match armed {
                // A crash armed past the op's points: the process dies
                // right after it, as ever.
                Some((_, kind)) => self.restart(kind, &before, Some(&after), Some(&action)),
                None => {
                    let judged =
                        self.reopen_and_judge(CrashKind::Process, &before, Some(&after), Some(&action));
                    // A crash inside that reopen is a crash inside this op.
                    self.collect(|e| Judging::in_flight(&before, &after, &action, names, e));
                    judged
                }
            };
        }
        if fault.is_some() && !self.driver.fs.crashed() {
            self.disarm();
            if result.is_err() {
                let failed_write =
                    fault.and_then(|(offset, _)| self.driver.failed_session_write(next + u64::from(offset)));
                if let Some(why) = self.driver.poisoned_probe(failed_write.as_deref()) {
                    return Err(self.fail("a poisoned runtime went on", why, None));
                }
                // Unknown outcome: the daemon reopens everything in place
                // (no crash) and the oracle judges it like one.
                let judged = self.reopen_and_judge(CrashKind::Process, &before, Some(&after), Some(&action));
                self.collect(|e| Judging::in_flight(&before, &after, &action, names, e));
                return judged;
            }
        }
        let kind = armed.map(|(_, k)| k).or(self.global.map(|g| g.kind));
        if self.driver.fs.crashed() {
            let kind = kind.unwrap_or(CrashKind::Process);
            // A sweep's crash is a kill -9 at its point: the op never
            // returned, whatever the doomed code went on to return (the
            // fast sweep, which forks the disk at the point, sees the
            // same). A search's armed crash lets the runtime answer, so
            // an op acknowledged past a dead I/O point must be durable.
            if result.is_ok() && self.global.is_none() {
                // The runtime acknowledged the op although an I/O point
                // inside it died: acknowledged means durable, so "after"
                // is the only candidate.
                return self.restart(kind, &after, None, None);
            }
            return self.restart(kind, &before, Some(&after), Some(&action));
        }
        let after = match (result, blocked) {
            (Ok(()), _) if must_block => {
                return Err(self.fail(
                    "a call a hook parked for a human ran unconfirmed",
                    format!(
                    "the turn's first call needs a human's confirmation, yet the turn completed: {action:?}"
                ),
                    None,
                ))
            }
            (Ok(()), _) => after,
            // The turn stopped at a key needing confirmation: a definite
            // answer, judged against the model's blocked state.
            (Err(e), Some((key, effect))) => match before.blocked(&action) {
                Some(mut blocked) => {
                    if let Err(why) = blocked.note_needs_human(&action, &key, effect.as_deref()) {
                        return Err(self.fail("a turn blocked on a confirmed call", why, None));
                    }
                    blocked
                }
                None => {
                    return Err(self.fail(
                        "a turn blocked on a confirmation it cannot need (it was never lost in a crash)",
                        format!("{key}: {e}"),
                        None,
                    ))
                }
            },
            // The provider failed the turn where the script says (the
            // model's state after is the failed turn's).
            (Err(_), None) if provider_failed && before.fails(&action).is_some() => after,
            (Err(e), None) => {
                return Err(self.fail(
                    "the runtime refused a valid operation with no fault injected",
                    e.to_string(),
                    None,
                ))
            }
        };
        self.model = after;
        if armed.is_some() {
            // The armed point lay past this op: the harness's own reads
            // below must not hit it.
            self.disarm();
            self.boundary = Some(self.driver.fs.points());
        }
        let names = self.names();
        let (state, mut violations) = self.driver.state();
        self.collect(|e| Judging::restart(&e.model, names, e));
        if self.driver.fs.crashed() {
            // A sweep point landed in the projection's reads: that is a
            // crash between ops.
            self.boundary = Some(self.driver.fs.points());
            let model = self.model.clone();
            return self.restart(kind.unwrap_or(CrashKind::Process), &model, None, None);
        }
        violations.extend(oracle::state_invariants(&state));
        if !violations.is_empty() {
            return Err(self.fail("an invariant broke", violations.join("\n"), None));
        }
        let full_outbox = state.outbox.clone();
        // Residency too: the model's LRU evicts as the runtime's slots do.
        let mut recovered = state.clone();
        self.model.learn(&state);
        let mut expected = self.model.expected();
        // Effects of unknown fate (R4) are compared by the oracle and I4
        // only; one that shows up now becomes known.
        let maybe = &self.model.maybe_effects;
        let shown: Vec<String> = recovered
            .outbox
            .iter()
            .filter(|k| maybe.contains(*k))
            .cloned()
            .collect();
        recovered.outbox.retain(|k| !maybe.contains(k));
        expected.outbox.retain(|k| !maybe.contains(k));
        if recovered != expected {
            return Err(self.fail(
                "the runtime diverged from the model with no crash",
                "state after the op differs (residency included)".into(),
                Some((expected, recovered)),
            ));
        }
        if !shown.is_empty() {
            self.model.state.outbox = full_outbox;
            self.model.maybe_effects.retain(|k| !shown.contains(k));
        }
        if let Some((_, kind)) = armed {
            // The process dies right after the op.
            let model = self.model.clone();
            return self.restart(kind, &model, None, None);
        }
        Ok(())
    }
}

/// Replay a case from scratch and hash the disk it leaves
/// ([`Exec::disk_hash`]): the search's determinism check.
pub fn replay_disk(case: &Case) -> Result<u64, Box<Failure>> {
    replay(case).map(|exec| exec.disk_hash())
}

fn replay(case: &Case) -> Result<Exec, Box<Failure>> {
    let mut exec = Exec::new(case.seed, case.canaries.clone(), case.crash_at)?;
    for op in &case.ops {
        exec.step(op)?;
    }
    Ok(exec)
}

/// Replay a case from scratch. `Ok` means every check passed.
///
/// See [`Exec::capturing`] for the dry run the fast sweep forks from.
pub fn run_case(case: &Case) -> Result<RunStats, Box<Failure>> {
    replay(case).map(|exec| exec.stats())
}
