//! Sweep mode (ALICE / CrashMonkey style): one op sequence crashed at EVERY
//! I/O point, under every crash mode.
//!
//! Invariant: the sweep covers points 1..=P where P is the point count of a
//! crash-free dry run of the same sequence; each point is a fresh replay
//! with `Fault::CrashAt(p)` (from a copy of the installed disk when `p`
//! lies past the install, else from the empty disk: the same run either
//! way, see `Exec::new`), recovered and judged by the same oracle as the
//! search. `Op::Crash` entries are dropped (the sweep
//! places the crash); `Op::Recover` stays, so recovery's own points are
//! swept too.

use durable_agent::canary::Canaries;

use crate::exec::{run_case, Case, Exec, GlobalCrash};
use crate::op::{CrashKind, Op};
use crate::report::Failure;

/// What a sweep did.
#[derive(Debug, Default)]
pub struct SweepSummary {
    /// I/O points in the dry run (the points swept per crash mode).
    pub points: u64,
    /// Replays run (points × modes, fewer when stopping at a failure).
    pub runs: u64,
    /// Replays whose crash point was actually hit.
    pub crashes: u64,
    /// One failure per failing (point, mode), in sweep order.
    pub failures: Vec<Box<Failure>>,
}

/// How a sweep runs.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub kinds: Vec<CrashKind>,
    /// Stop at the first failing point (CI); else collect them all.
    pub stop_at_first: bool,
    /// Continue the sequence after the recovery (checks that the recovered
    /// runtime keeps working), or stop right after judging it.
    pub continue_after_crash: bool,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            kinds: CrashKind::ALL.to_vec(),
            stop_at_first: false,
            continue_after_crash: false,
        }
    }
}

/// Sweep `ops` (with `seed`, `canaries`) over every I/O point.
pub fn sweep(seed: u64, ops: &[Op], canaries: &Canaries, options: &SweepOptions) -> SweepSummary {
    let ops: Vec<Op> = ops
        .iter()
        .filter(|op| !matches!(op, Op::Crash { .. }))
        .cloned()
        .collect();
    // The dry run is a sweep run whose point is never reached: like every
    // sweep run it ignores `Op::Fault` (the sweep places the faults).
    let dry = Case {
        seed,
        ops: ops.clone(),
        canaries: canaries.clone(),
        crash_at: Some(GlobalCrash {
            point: u64::MAX,
            kind: CrashKind::Process,
        }),
    };
    let mut summary = SweepSummary::default();
    let points = match run_case(&dry) {
        Ok(stats) => stats.points,
        Err(f) => {
            summary.failures.push(f);
            return summary;
        }
    };
    summary.points = points;
    for &kind in &options.kinds {
        for point in 1..=points {
            summary.runs += 1;
            let crash_at = Some(GlobalCrash { point, kind });
            let result = (|| {
                let mut exec = Exec::new(seed, canaries.clone(), crash_at)?;
                for op in &ops {
                    exec.step(op)?;
                    if !options.continue_after_crash && exec.stats().crashes > 0 {
                        break;
                    }
                }
                Ok::<_, Box<Failure>>(exec.stats())
            })();
            match result {
                Ok(stats) => summary.crashes += stats.crashes.min(1),
                Err(f) => {
                    summary.crashes += 1;
                    summary.failures.push(f);
                    if options.stop_at_first {
                        return summary;
                    }
                }
            }
        }
    }
    summary
}
