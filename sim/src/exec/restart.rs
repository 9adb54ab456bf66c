//! Restarts and failure reports of [`Exec`]: killing the process,
//! re-arming the sweep's crash point, recovering, judging, and describing
//! where a failure happened.
//!
//! Invariant: every restart goes through [`Exec::reopen_and_judge`], so no
//! recovered state escapes the invariants and the oracle.

use durable_agent::fs::sim::Outcome;
use durable_agent::fs::Fault;

use super::{Exec, MAX_RECOVERY_ATTEMPTS};
use crate::model::{Action, Model, State};
use crate::op::CrashKind;
use crate::oracle;
use crate::report::{CrashSite, Failure, TRACE_CONTEXT};

/// The failure title of a boot that mishandled a damaged line (R6).
const R6_FAILED: &str =
    "R6: a durable line changed at rest (bit rot, a newer or older version's line, a gap), or a file \
     or log lines lost at rest, was not handled as promised (refused with the typed error naming it, \
     replaced from events.pending, or — an older version's — read)";

/// The failure title of a boot that called an injected I/O fault damage
/// (F1, `crate::oracle`).
const FAULT_AS_DAMAGE: &str =
    "F1: a boot failed by an injected I/O fault (EIO, ENOSPC, a lost reply) refused the root as \
     damaged (a corrupt, lost or newer line or file): the operator would restore or quarantine over \
     a transient error";

/// The failure title of an operator's `verify` that disagreed with the
/// boot after it (I7).
const VERIFY_DISAGREES: &str = "I7: `verify` did not say what the boot then did";

/// The failure title of an operator's repair of a refused disk that did
/// not do what it promises (Q1–Q6, `crate::repair`).
const REPAIR_FAILED: &str = "Q: `repair --quarantine` of a refused disk did not do what it promises";

impl Exec {
    /// Kill the process; counts it when an injected crash point was hit.
    pub(super) fn kill(&mut self, kind: CrashKind) {
        if self.driver.crash(kind) {
            self.crashes += 1;
        }
        self.disarm();
    }

    /// Clear the op's armed crash; in sweep mode keep (re-arm) the global
    /// crash point until it has been hit (a restart disarms SimFs).
    pub(super) fn disarm(&mut self) {
        let fault = match self.global {
            Some(g) if self.crashes == 0 && g.point > self.driver.fs.points() => {
                Some(Fault::CrashAt(g.point))
            }
            _ => None,
        };
        self.driver.fs.set_fault(fault);
    }

    /// Whether an injected I/O fault (a failed point or a lost reply) fired
    /// after point `start`.
    fn fault_fired_since(&self, start: u64) -> bool {
        self.driver
            .fs
            .trace_from(start + 1)
            .iter()
            .any(|e| matches!(e.outcome, Outcome::Failed(_) | Outcome::LostReply))
    }

    /// Where the current op's crash hit, if it did.
    pub(super) fn site(&self) -> Option<CrashSite> {
        let start = self.step_start;
        // Only the op's points (a boundary lies past them) and the window
        // before them are needed.
        let trace = self
            .driver
            .fs
            .trace_from(start.saturating_sub(TRACE_CONTEXT as u64));
        let hit = trace.iter().position(|e| {
            e.point > start
                && matches!(
                    e.outcome,
                    Outcome::Crashed | Outcome::Failed(_) | Outcome::LostReply
                )
        });
        let site = match (hit, self.boundary) {
            (Some(i), _) => Some(CrashSite::around(&trace, i, false)),
            (None, Some(p)) => trace
                .iter()
                .rposition(|e| e.point <= p)
                .map(|i| CrashSite::around(&trace, i, true)),
            (None, None) => None,
        };
        site.map(|mut s| {
            s.mode = self.crash_mode;
            s
        })
    }

    pub(super) fn fail(&self, what: &str, detail: String, states: Option<(State, State)>) -> Box<Failure> {
        let crash = self.site();
        let (expected, recovered) = match states {
            Some((e, r)) => (Some(e), Some(r)),
            None => (None, None),
        };
        Box::new(Failure {
            case: self.case(),
            step: self.history.len().saturating_sub(1),
            what: what.to_string(),
            detail,
            crash,
            expected,
            recovered,
            earlier_restarts: self.restart_notes.clone(),
        })
    }

    /// A crash chain: the power fails right after a reboot that left
    /// anything unsynced, before anything else runs (strict directory
    /// model), and the system boots again. Nothing is in flight, so the
    /// state that reboot showed (now the model's) is the only one
    /// accepted: what a recovery adopted from writes that were never
    /// synced — SQLite replaying a committed WAL frame a process crash
    /// left in the page cache, a log tail — it must make durable before
    /// anyone relies on it. A reboot that left the disk durable needs no
    /// such link (the power cut would change nothing), so on a correct
    /// runtime the chain costs one scan of the disk's pending changes. One
    /// link only: the second boot is not chained again.
    fn power_cut_after_boot(&mut self) -> Result<(), Box<Failure>> {
        let shown = self.model.clone();
        self.driver.crash(CrashKind::PowerStrict);
        self.disarm();
        self.restart_notes
            .push("the power failed right after that reboot, which had left writes unsynced".to_string());
        self.reopen_and_judge(CrashKind::PowerStrict, &shown, None, None)
    }

    /// Crash the process with `kind`, recover, and judge.
    pub(super) fn restart(
        &mut self,
        kind: CrashKind,
        before: &Model,
        after: Option<&Model>,
        action: Option<&Action>,
    ) -> Result<(), Box<Failure>> {
        self.crash_mode = Some(kind);
        self.kill(kind);
        self.reopen_and_judge(kind, before, after, action)
    }

    pub(super) fn reopen_and_judge(
        &mut self,
        kind: CrashKind,
        before: &Model,
        after: Option<&Model>,
        action: Option<&Action>,
    ) -> Result<(), Box<Failure>> {
        self.restarts += 1;
        if action.is_some() && !std::mem::take(&mut self.answered_failure) {
            // The op in flight was cut: a failure it was handed may have
            // no durable row (E1).
            self.driver.cut_failures_since(self.step_start);
        }
        let clean = std::mem::take(&mut self.clean_restart);
        let mut attempts = 0;
        let (state, mut violations) = loop {
            attempts += 1;
            // A crash armed into the recovery (or a sweep point landing in
            // it, or in the projection's reads) restarts it.
            let boot_start = self.driver.fs.points();
            let opened = self.driver.open();
            let verified = self.driver.take_verified();
            if self.driver.fs.crashed() && attempts < MAX_RECOVERY_ATTEMPTS {
                self.kill(kind);
                continue;
            }
            // An I/O fault armed into the recovery (`fault` then
            // `recover`) may fail the boot: it must leave the disk such
            // that the next boot, without the fault, recovers as from any
            // crash. A boot that succeeded over the fault is judged as is.
            if opened.is_err() && self.fault_fired_since(boot_start) && attempts < MAX_RECOVERY_ATTEMPTS {
                // F1: the error is the I/O error's (outcome unknown: boot
                // again), never damage's. A disk damaged at rest (a rot
                // pending) may be refused for that damage; nothing else
                // on this disk is outside the crash model.
                if !self.driver.rot_pending() {
                    let claim = match (self.driver.take_corruption(), self.driver.take_refusal()) {
                        (Some((line, newer)), _) => Some(format!(
                            "{} line {} (byte {}) refused as {}",
                            line.path.display(),
                            line.line,
                            line.offset,
                            if newer { "a newer version's" } else { "corrupt" }
                        )),
                        (None, Some(refusal)) if !matches!(refusal, crate::loss::Refusal::Other(_)) => {
                            Some(format!("refused as {refusal:?}"))
                        }
                        _ => None,
                    };
                    if let Some(claim) = claim {
                        return Err(self.fail(FAULT_AS_DAMAGE, format!("{claim}\n{opened:?}"), None));
                    }
                }
                self.restart_notes.push(format!(
                    "boot failed under an injected I/O fault, booted again: {opened:?}"
                ));
                self.disarm();
                continue;
            }
            if let Some(rot) = self.driver.take_rot() {
                let (named, newer) = self.driver.take_corruption().unzip();
                let read = rot.read_since(&self.driver.fs);
                let replaced = rot.replaced(&self.driver.fs);
                let refused = self.driver.take_refusal();
                let judged = match rot.damage {
                    crate::rot::Damage::Lost(loss) => {
                        crate::loss::judge(&rot, loss, &opened, refused.as_ref(), &self.driver.fs)
                            .map(|()| oracle::RotVerdict::Refused)
                    }
                    _ => {
                        oracle::judge_rot(&rot, &opened, named.as_ref(), newer == Some(true), read, replaced)
                    }
                };
                match judged {
                    Ok(verdict) => {
                        let disagree =
                            oracle::verify_agrees(verified.as_ref(), Some((&rot, verdict)), opened.is_ok());
                        if !disagree.is_empty() {
                            return Err(self.fail(VERIFY_DISAGREES, disagree.join("\n"), None));
                        }
                        // The operator's other answer to a refusal: repair
                        // a copy of the disk, and judge it (the run goes on
                        // from the restored disk below).
                        if let (oracle::RotVerdict::Refused, Err(_), Some(v)) =
                            (verdict, &opened, verified.as_ref())
                        {
                            let (seed, now) = (self.driver.seed(), self.driver.now());
                            if let Err(why) = crate::repair::judge(&self.driver.fs, seed, v, now) {
                                return Err(self.fail(
                                    REPAIR_FAILED,
                                    format!("{}\n{why}", rot.describe()),
                                    None,
                                ));
                            }
                        }
                        if !matches!(
                            verdict,
                            oracle::RotVerdict::Replaced | oracle::RotVerdict::ReadOlder
                        ) {
                            if opened.is_ok() && rot.backup.is_some() {
                                // A boot over a lost parent: stopped before the
                                // whole root is restored (the restore and the
                                // re-boot below make a crash hit here moot).
                                self.driver.shutdown(CrashKind::Process);
                            }
                            rot.restore(&self.driver.fs);
                        }
                        self.restart_notes
                            .push(format!("{}: {verdict:?}", rot.describe()));
                        if verdict == oracle::RotVerdict::Refused {
                            // Restored from a backup: boot the same disk again
                            // (a boot over a lost parent was stopped first).
                            if opened.is_ok() {
                                self.disarm();
                            }
                            continue;
                        }
                    }
                    Err(why) => return Err(self.fail(R6_FAILED, format!("{}\n{why}", rot.describe()), None)),
                }
            }
            if let Err(e) = opened {
                return Err(self.fail("recovery failed", e, None));
            }
            if !self.fault_fired_since(boot_start) {
                let disagree = oracle::verify_agrees(verified.as_ref(), None, true);
                if !disagree.is_empty() {
                    return Err(self.fail(VERIFY_DISAGREES, disagree.join("\n"), None));
                }
            }
            self.disarm();
            let projected = self.driver.state();
            if self.driver.fs.crashed() && attempts < MAX_RECOVERY_ATTEMPTS {
                self.kill(kind);
                continue;
            }
            break projected;
        };
        violations.extend(oracle::state_invariants(&state));
        violations.extend(oracle::recovery_invariants(&state));
        violations.extend(oracle::log_invariants(&self.driver.logs()));
        violations.extend(self.driver.disk_violations());
        violations.extend(self.driver.take_report_violations());
        if !violations.is_empty() {
            return Err(self.fail("an invariant broke after recovery", violations.join("\n"), None));
        }
        // Clean only if this boot was the first and only one (no crash or
        // fault inside the recovery either).
        let clean = clean && attempts == 1 && !self.driver.fs.crashed();
        match oracle::judge(before, after, action, &state, clean) {
            Ok(accepted) => {
                if self.crashes > 0 && self.crash_side.is_none() {
                    self.crash_side = Some(accepted.side);
                }
                self.model = accepted.adopted;
                // The provider's failures are the world's, which no crash
                // rolls back: what it failed, the model's turns meet failed.
                self.model.provider_failed = self.driver.provider_failures();
                if accepted.side == oracle::Side::Before {
                    // The turn was rolled back: remember it for resume_turn,
                    // and its effects the world did not show as unknown.
                    if let Some(turn @ Action::RunTurn { agent, prompt, .. }) = action {
                        self.model.lost_turns.insert(agent.clone(), turn.clone());
                        let identity = self.model.turn_identity(agent, prompt);
                        self.model.rolled_back.insert(identity);
                    }
                    for key in oracle::effects_of(&self.model, action) {
                        if !self.model.state.outbox.contains(&key) {
                            self.model.maybe_effects.insert(key);
                        }
                    }
                }
                // A crash inside a human's answer: applied or not, the
                // model cannot tell (see `Model::forget_answer`).
                if let Some(Action::Confirm { idem, effect, .. }) = action {
                    self.model.forget_answer(idem, effect);
                }
                // Names, prompts and effect keys stay unique across the run
                // even when the interrupted op is rolled back.
                if let Some(after) = after {
                    self.model.counter = self.model.counter.max(after.counter);
                }
                let how = match self.site() {
                    Some(c) => format!("{kind:?} crash at point {} \"{}\"", c.point, c.label),
                    None => "no crash point hit (a clean start or stop)".to_string(),
                };
                let when = match self.history.len() {
                    0 => "boot after the install".to_string(),
                    n => format!("op #{n}"),
                };
                self.restart_notes.push(format!(
                    "{when}: {how}; recovered state accepted as {:?}",
                    accepted.side
                ));
                if !self.in_chain && !self.driver.fs.is_durable() {
                    self.in_chain = true;
                    let chained = self.power_cut_after_boot();
                    self.in_chain = false;
                    chained?;
                }
                Ok(())
            }
            Err(rejected) => Err(self.fail(
                if after.is_some() {
                    "the recovered state matches neither the model before nor after the interrupted op"
                } else {
                    "the recovered state differs from the acknowledged state"
                },
                rejected.reason,
                Some((rejected.expected, state)),
            )),
        }
    }
}
