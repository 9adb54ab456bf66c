//! Sweep mode (ALICE / CrashMonkey style): one op sequence crashed at EVERY
//! I/O point, under every crash mode.
//!
//! Invariant: the sweep covers points 1..=P where P is the point count of a
//! crash-free dry run of the same sequence, each under every mode asked
//! for, recovered and judged by the same oracle as the search. A sweep's
//! crash is a kill -9 at its point: the interrupted op is in flight (before
//! or after) whatever its doomed code goes on to return, and the dead
//! process delivers nothing. `Op::Crash` and `Op::Fault` entries are
//! dropped (the sweep places the crash); `Op::Recover` stays, so recovery's
//! own points are swept too.
//!
//! Two ways to reach a point, with the same verdicts (checked point by
//! point in `tests/sweep.rs`):
//! - [`SweepMethod::Fork`] (default): one dry run in SimFs's capture mode
//!   leaves the crash image of every point; each is rebooted under each
//!   mode, recovered and judged ([`Exec::judge_fork`]). A point costs one
//!   recovery, not a replay of everything before it. The dry run performs
//!   the install itself (a replay copies it when the point lies past it:
//!   the same I/O), so the install's points are forked too.
//! - [`SweepMethod::Replay`]: every point is a fresh run from the start
//!   with `Fault::CrashAt(p)` (from a copy of the installed disk when `p`
//!   lies past the install, else from the empty disk: the same run either
//!   way, see `Exec::new`). The reference; also the only method that can
//!   continue the sequence after the recovery.
//!
//! A fork's failure is confirmed by replaying its point, and the replay's
//! failure (full crash site and trace) is what gets reported.

use std::ops::ControlFlow;

use durable_agent::canary::Canaries;

use crate::exec::{run_case, Case, Exec, GlobalCrash};
use crate::model::Model;
use crate::op::{CrashKind, Op};
use crate::oracle::Side;
use crate::report::Failure;
use crate::verdicts::VerdictCache;

/// What a sweep did.
#[derive(Debug, Default)]
pub struct SweepSummary {
    /// I/O points in the dry run (the points swept per crash mode).
    pub points: u64,
    /// Crash points judged (points × modes, fewer when stopping at a
    /// failure).
    pub runs: u64,
    /// Of those, the ones whose crash point was actually hit.
    pub crashes: u64,
    /// Of those, the ones whose verdict the cache reused (a fork of the
    /// same phase left recovery the same thing to observe, see
    /// [`crate::verdicts`]); `runs - reused` recoveries were performed.
    pub reused: u64,
    /// Reused verdicts judged afresh as a check (all agreed, or a HARNESS
    /// BUG failure is among `failures`).
    pub rechecked: u64,
    /// One failure per failing (point, mode).
    pub failures: Vec<Box<Failure>>,
}

/// How each point is reached (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SweepMethod {
    /// Fork the crash image of every point from one dry run.
    #[default]
    Fork,
    /// Replay the sequence from the start for every point.
    Replay,
}

/// How a sweep runs.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub kinds: Vec<CrashKind>,
    /// Stop at the first failing point (CI); else collect them all.
    pub stop_at_first: bool,
    /// Continue the sequence after the recovery (checks that the recovered
    /// runtime keeps working), or stop right after judging it. Continuing
    /// needs [`SweepMethod::Replay`] (forks are judged, not continued); it
    /// is used whenever this is set.
    pub continue_after_crash: bool,
    pub method: SweepMethod,
    /// `PowerRot` is judged at every `rot_every`-th point only (1: every
    /// point). A rot point costs about two boots (the refused one and the
    /// one after the restore), so the PR gate samples it; sweeps and
    /// nightly judge every point.
    pub rot_every: u64,
    /// The fork method's verdict cache re-judges every `recheck_every`-th
    /// reused verdict (0: no cache, every fork is recovered).
    pub recheck_every: u64,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            kinds: CrashKind::ALL.to_vec(),
            stop_at_first: false,
            continue_after_crash: false,
            method: SweepMethod::Fork,
            rot_every: 1,
            recheck_every: crate::verdicts::DEFAULT_RECHECK_EVERY,
        }
    }
}

impl SweepOptions {
    /// Whether (point, kind) is judged.
    fn judges(&self, point: u64, kind: CrashKind) -> bool {
        kind != CrashKind::PowerRot || point.is_multiple_of(self.rot_every.max(1))
    }
}

/// The verdict at one (point, mode): the model the run goes on from, or
/// the failure.
#[derive(Debug)]
pub struct PointVerdict {
    pub point: u64,
    pub kind: CrashKind,
    /// Whether the crash point was hit (a replay may end before it).
    pub hit: bool,
    /// Whether the verdict is a cached one (and whether that reuse was
    /// also judged afresh as a check).
    pub reused: bool,
    pub rechecked: bool,
    /// The candidate the oracle accepted the recovered state as (`None`
    /// when the point was not hit or the recovery failed).
    pub side: Option<Side>,
    pub outcome: Result<Model, Box<Failure>>,
}

/// `n` op sequences of exactly `len` ops from the search's generator,
/// drawn deterministically from `seed` (each case carries its own run
/// seed and ops, so a failure replays from its case file alone). Fewer if
/// the generator rejects a draw.
pub fn generated(seed: u64, n: usize, len: usize) -> Vec<Case> {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    generated_by(&mut TestRunner::new_with_rng(Config::default(), rng), n, len)
}

/// [`generated`] drawing from `runner` (the benchmark keeps proptest's
/// deterministic runner, so its case set stays the one its figures were
/// measured on).
pub fn generated_by(runner: &mut proptest::test_runner::TestRunner, n: usize, len: usize) -> Vec<Case> {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest_state_machine::ReferenceStateMachine;

    let strategy = crate::machine::RefMachine::sequential_strategy(len..=len);
    (0..n)
        .filter_map(|_| strategy.new_tree(runner).ok())
        .map(|tree| {
            let (state, ops, _) = tree.current();
            Case {
                seed: state.seed,
                ops,
                canaries: Canaries::none(),
                crash_at: None,
            }
        })
        .collect()
}

/// Sweep `ops` (with `seed`, `canaries`) over every I/O point.
pub fn sweep(seed: u64, ops: &[Op], canaries: &Canaries, options: &SweepOptions) -> SweepSummary {
    let mut summary = SweepSummary::default();
    let swept = sweep_points(seed, ops, canaries, options, |v| {
        summary.runs += 1;
        summary.crashes += u64::from(v.hit);
        summary.reused += u64::from(v.reused);
        summary.rechecked += u64::from(v.rechecked);
        match v.outcome {
            Ok(_) => ControlFlow::Continue(()),
            Err(f) => {
                summary.failures.push(f);
                if options.stop_at_first {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }
        }
    });
    match swept {
        Ok(points) => summary.points = points,
        Err(f) => summary.failures.push(f),
    }
    summary
}

/// Sweep `ops` and hand every (point, mode) verdict to `visit`, which may
/// stop the sweep. Returns the dry run's point count, or its failure.
pub fn sweep_points(
    seed: u64,
    ops: &[Op],
    canaries: &Canaries,
    options: &SweepOptions,
    mut visit: impl FnMut(PointVerdict) -> ControlFlow<()>,
) -> Result<u64, Box<Failure>> {
    let ops: Vec<Op> = ops
        .iter()
        .filter(|op| !matches!(op, Op::Crash { .. }))
        .cloned()
        .collect();
    let method = if options.continue_after_crash {
        SweepMethod::Replay
    } else {
        options.method
    };
    let sweeper = Sweeper {
        seed,
        ops: &ops,
        canaries,
        continue_after_crash: options.continue_after_crash,
        options,
    };
    match method {
        SweepMethod::Replay => sweeper.by_replay(&options.kinds, &mut visit),
        SweepMethod::Fork => sweeper.by_fork(&options.kinds, &mut visit),
    }
}

struct Sweeper<'a> {
    seed: u64,
    ops: &'a [Op],
    canaries: &'a Canaries,
    continue_after_crash: bool,
    options: &'a SweepOptions,
}

impl Sweeper<'_> {
    /// The dry run: a sweep run whose point is never reached (like every
    /// sweep run it ignores `Op::Fault`: the sweep places the faults).
    fn dry_run(&self) -> Result<u64, Box<Failure>> {
        let dry = Case {
            seed: self.seed,
            ops: self.ops.to_vec(),
            canaries: self.canaries.clone(),
            crash_at: Some(GlobalCrash {
                point: u64::MAX,
                kind: CrashKind::Process,
            }),
        };
        run_case(&dry).map(|stats| stats.points)
    }

    /// One fresh run crashed at `point`.
    fn replay(&self, point: u64, kind: CrashKind) -> PointVerdict {
        let result = (|| {
            let mut exec = Exec::new(
                self.seed,
                self.canaries.clone(),
                Some(GlobalCrash { point, kind }),
            )?;
            for op in self.ops {
                // Stop right after the judged recovery (the crash may have
                // hit in the first boot, before any op).
                if !self.continue_after_crash && exec.stats().crashes > 0 {
                    break;
                }
                exec.step(op)?;
            }
            Ok::<_, Box<Failure>>((exec.stats().crashes > 0, exec.crash_side(), exec.model().clone()))
        })();
        let (hit, side, outcome) = match result {
            Ok((hit, side, model)) => (hit, side, Ok(model)),
            Err(f) => (true, None, Err(f)),
        };
        PointVerdict {
            point,
            kind,
            hit,
            reused: false,
            rechecked: false,
            side,
            outcome,
        }
    }

    fn by_replay(
        &self,
        kinds: &[CrashKind],
        visit: &mut impl FnMut(PointVerdict) -> ControlFlow<()>,
    ) -> Result<u64, Box<Failure>> {
        let points = self.dry_run()?;
        for &kind in kinds {
            for point in (1..=points).filter(|&p| self.options.judges(p, kind)) {
                if visit(self.replay(point, kind)).is_break() {
                    return Ok(points);
                }
            }
        }
        Ok(points)
    }

    fn by_fork(
        &self,
        kinds: &[CrashKind],
        visit: &mut impl FnMut(PointVerdict) -> ControlFlow<()>,
    ) -> Result<u64, Box<Failure>> {
        let mut exec = Exec::capturing(self.seed, self.canaries.clone())?;
        let mut cache = VerdictCache::new(self.options.recheck_every);
        let mut ops = self.ops.iter();
        loop {
            for fork in exec.take_forks() {
                let point = fork.image.point();
                // One image per mode: clones for all but the last, which
                // takes the original.
                let mut images: Vec<_> = (1..kinds.len()).map(|_| fork.image.clone()).collect();
                images.push(fork.image);
                for (&kind, image) in kinds.iter().zip(images) {
                    if !self.options.judges(point, kind) {
                        continue;
                    }
                    let (reused, rechecked) = (cache.reused, cache.rechecked);
                    let judged = cache
                        .judge(&exec, image, &fork.judging, kind)
                        .map_err(|fast| self.confirm(point, kind, fast));
                    let (side, outcome) = match judged {
                        Ok((side, model)) => (Some(side), Ok(model)),
                        Err(f) => (None, Err(f)),
                    };
                    let verdict = PointVerdict {
                        point,
                        kind,
                        hit: true,
                        reused: cache.reused > reused,
                        rechecked: cache.rechecked > rechecked,
                        side,
                        outcome,
                    };
                    if visit(verdict).is_break() {
                        return Ok(exec.stats().points);
                    }
                }
            }
            match ops.next() {
                Some(op) => exec.step(op)?,
                None => return Ok(exec.stats().points),
            }
        }
    }

    /// A fork failed: replay its point for the full report. A replay that
    /// passes means the two methods disagree, which is a harness bug.
    fn confirm(&self, point: u64, kind: CrashKind, fast: Box<Failure>) -> Box<Failure> {
        // The live dry run goes on after this: keep SQLite's PRNG as it was.
        let replayed = durable_agent::sqlite::with_saved_prng(|| self.replay(point, kind));
        match replayed.outcome {
            Err(replayed) => replayed,
            Ok(_) => {
                let mut f = fast;
                f.what = format!(
                    "HARNESS BUG: the fast sweep fails point {point} ({kind:?}) but a replay of it passes; \
                     the fork said: {}",
                    f.what
                );
                f.case.crash_at = Some(GlobalCrash { point, kind });
                f
            }
        }
    }
}
