//! The canary run: the harness proves itself by searching, with each known
//! bug class switched on, until the oracle catches it.
//!
//! Invariant: a canary is reported `Caught` only with the shrunk, replayed
//! failure in hand (its case saved for `repro`); a canary the system cannot
//! re-introduce is reported `Unproven`, never counted as caught.

use std::fmt;

use durable_agent::canary::{Canaries, Canary};

use crate::profile::Profile;
use crate::search::search;

/// Canaries the system can re-introduce today (every one of `Canary::ALL`;
/// the list stays explicit so a new canary shows up UNPROVEN, not skipped).
pub const IMPLEMENTED: [Canary; 16] = [
    Canary::NoFsyncBeforeRename,
    Canary::NoDirFsync,
    Canary::AckBeforeLog,
    Canary::NoPartialLineRepair,
    Canary::DeliveredBeforeDelivery,
    Canary::TriggerWithoutDedup,
    Canary::SideEffectBeforeIntent,
    Canary::CheckpointRollbackSkipped,
    Canary::TriggerTurnKeyedByTurn,
    Canary::TriggerTurnRerun,
    Canary::AckIgnoresLease,
    Canary::DeliveredAtCollect,
    Canary::NonLoopingReader,
    Canary::NoChecksumVerify,
    Canary::ConfirmationNotBlocking,
    Canary::ReaskDecidedRound,
];

/// Canaries of `RealFs` itself: the simulation never runs `RealFs`, so
/// its search cannot see them; the power-cut soak of the real binary
/// (`soak --power-cut`) is what must catch them. Listed as such, never
/// counted as caught here.
pub const REAL_FS_ONLY: [Canary; 2] = [Canary::RealFsSyncNoop, Canary::RealFsSyncDirNoop];

/// Canaries of the worker core (`durable_agent::worker`): the op-sequence
/// search runs the system, not the daemon's worker, so it cannot see them;
/// the madsim simulation (`cargo sim`, `sim/tests/madsim_daemon.rs`) is
/// what must catch them. Listed as such, never counted as caught here.
pub const WORKER_ONLY: [Canary; 2] = [Canary::TriggerAckedBeforeTurn, Canary::ScheduleBucketWithoutKey];

/// What the search did with one canary on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Caught {
        /// Cases until the first failure (before shrinking).
        cases: u64,
        /// Runs including shrinking.
        runs: u64,
        shrunk_ops: usize,
        what: String,
        /// The saved case (`repro --case <path>`).
        case_path: String,
    },
    Missed {
        runs: u64,
    },
    Unproven,
    /// A [`REAL_FS_ONLY`] canary: out of the simulation's reach.
    RealFsOnly,
    /// A [`WORKER_ONLY`] canary: `cargo sim`'s to catch.
    WorkerOnly,
}

/// One row of the canary table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub canary: Canary,
    pub verdict: Verdict,
}

/// Search `profile` once per canary (shrinking capped: finding is what is
/// measured). `only`: restrict to these canaries.
pub fn run(profile: &Profile, only: Option<&[Canary]>) -> Vec<Row> {
    let mut profile = profile.clone();
    profile.max_shrink_iters = profile.max_shrink_iters.min(50);
    let mut rows = Vec::new();
    for canary in Canary::ALL {
        if only.is_some_and(|o| !o.contains(&canary)) {
            continue;
        }
        let verdict = if REAL_FS_ONLY.contains(&canary) {
            Verdict::RealFsOnly
        } else if WORKER_ONLY.contains(&canary) {
            Verdict::WorkerOnly
        } else if !IMPLEMENTED.contains(&canary) {
            Verdict::Unproven
        } else {
            let out = search(&profile, &Canaries::only(canary), false);
            match (&out.failure, out.first_failure_at) {
                (Some(f), Some(cases)) => Verdict::Caught {
                    cases,
                    runs: out.runs,
                    shrunk_ops: f.case.ops.len(),
                    what: f.what.clone(),
                    case_path: f.case.save().map(|p| p.display().to_string()).unwrap_or_default(),
                },
                _ => Verdict::Missed { runs: out.runs },
            }
        };
        rows.push(Row { canary, verdict });
    }
    rows
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = format!("{:?}", self.canary);
        match &self.verdict {
            Verdict::Caught { cases, runs, shrunk_ops, what, case_path } => write!(
                f,
                "{name:<26} caught after {cases:>4} cases ({runs} runs with shrinking), shrunk to {shrunk_ops} ops: {what}\n{:26} case: {case_path}",
                ""
            ),
            Verdict::Missed { runs } => write!(f, "{name:<26} MISSED in {runs} cases"),
            Verdict::Unproven => write!(f, "{name:<26} UNPROVEN (the system cannot re-introduce it yet)"),
            Verdict::RealFsOnly => write!(f, "{name:<26} not simulated: RealFs only, for the power-cut soak"),
            Verdict::WorkerOnly => write!(f, "{name:<26} not searched: the worker core's, caught by `cargo sim`"),
        }
    }
}

/// The canary named `name` (its snake_case serde name, as `--canary`
/// takes it), or an error listing them all.
pub fn parse(name: &str) -> Result<Canary, String> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|_| {
        let names: Vec<String> = Canary::ALL
            .iter()
            .filter_map(|c| serde_json::to_value(c).ok())
            .map(|v| v.to_string())
            .collect();
        format!("unknown canary {name:?}; one of {}", names.join(", "))
    })
}
