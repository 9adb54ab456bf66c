//! The property search: generate op sequences with [`RefMachine`], run each
//! through [`Exec`], shrink the first failure, and report it.
//!
//! Invariant: the reported failure is the shrunk case REPLAYED from scratch
//! with [`run_case`], so what is printed is exactly what `repro` shows; a
//! failure that does not replay is itself reported (non-determinism).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use durable_agent::canary::Canaries;
use proptest::test_runner::{TestCaseError, TestError, TestRunner};
use proptest_state_machine::ReferenceStateMachine;

use crate::exec::{run_case, Case, Exec};
use crate::machine::RefMachine;
use crate::profile::Profile;
use crate::report::Failure;

/// What a search found.
#[derive(Debug, Default)]
pub struct SearchOutcome {
    /// Cases run, shrink replays included.
    pub runs: u64,
    /// 1-based index of the first failing case (before shrinking).
    pub first_failure_at: Option<u64>,
    /// I/O points performed across all runs.
    pub points: u64,
    /// Restarts checked by the oracle across all runs.
    pub restarts: u64,
    /// The shrunk failure, replayed.
    pub failure: Option<Box<Failure>>,
}

/// Run `profile`'s search against the runtime with `canaries` enabled.
/// `persist`: replay/record failures in the committed regressions file.
pub fn search(profile: &Profile, canaries: &Canaries, persist: bool) -> SearchOutcome {
    search_with_progress(profile, canaries, persist, &|_| {})
}

/// [`search`], calling `progress(runs_so_far)` after every case.
pub fn search_with_progress(
    profile: &Profile,
    canaries: &Canaries,
    persist: bool,
    progress: &(dyn Fn(u64) + Sync),
) -> SearchOutcome {
    let runs = AtomicU64::new(0);
    let points = AtomicU64::new(0);
    let restarts = AtomicU64::new(0);
    let first = Mutex::new(None);
    let sample = Mutex::new(None);
    let mut runner = TestRunner::new(profile.config(persist));
    let strategy = RefMachine::sequential_strategy(1..=profile.max_steps);
    let result = runner.run(&strategy, |(state, ops, seen)| {
        let n = runs.fetch_add(1, Ordering::Relaxed) + 1;
        progress(n);
        let outcome = (|| {
            let mut exec = Exec::new(state.seed, canaries.clone(), None)?;
            for op in &ops {
                if let Some(seen) = &seen {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                exec.step(op)?;
            }
            // The disk of a sample of cases (the 1st, 2nd, 4th, 8th …),
            // for the determinism check below.
            let disk = n.is_power_of_two().then(|| exec.disk_hash());
            Ok::<_, Box<Failure>>((exec.stats(), disk))
        })();
        match outcome {
            Ok((stats, disk)) => {
                points.fetch_add(stats.points, Ordering::Relaxed);
                restarts.fetch_add(stats.restarts, Ordering::Relaxed);
                if let Some(disk) = disk {
                    let case = Case {
                        seed: state.seed,
                        ops: ops.clone(),
                        canaries: canaries.clone(),
                        crash_at: None,
                    };
                    *sample.lock().unwrap_or_else(|e| e.into_inner()) = Some((case, disk));
                }
                Ok(())
            }
            Err(f) => {
                let mut first = first.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert(n);
                Err(TestCaseError::fail(f.what.clone()))
            }
        }
    });
    let failure = match result {
        Ok(()) => None,
        Err(TestError::Fail(_, (state, ops, _))) => {
            let case = Case {
                seed: state.seed,
                ops,
                canaries: canaries.clone(),
                crash_at: None,
            };
            Some(match run_case(&case) {
                Err(f) => f,
                Ok(_) => Box::new(Failure {
                    case,
                    step: 0,
                    what: "NON-DETERMINISM: the shrunk case failed in the search but passes on replay".into(),
                    detail: "something in the runtime or harness depends on state outside the seed".into(),
                    crash: None,
                    expected: None,
                    recovered: None,
                    earlier_restarts: Vec::new(),
                }),
            })
        }
        Err(TestError::Abort(why)) => Some(Box::new(Failure {
            case: Case {
                seed: 0,
                ops: Vec::new(),
                canaries: canaries.clone(),
                crash_at: None,
            },
            step: 0,
            what: "the search aborted".into(),
            // No case failed: proptest itself stopped (a bound on rejected
            // draws, `Profile::max_local_rejects`), so there is nothing to
            // replay and the fault is the harness's.
            detail: format!(
                "{why}: proptest stopped the search, no case failed (a harness problem, not the runtime's; see Profile::max_local_rejects)"
            ),
            crash: None,
            expected: None,
            recovered: None,
            earlier_restarts: Vec::new(),
        })),
    };
    let sample = sample.into_inner().unwrap_or_else(|e| e.into_inner());
    let failure = failure.or_else(|| sample.and_then(|(case, disk)| replays_alike(case, disk)));
    let first_failure_at = *first.lock().unwrap_or_else(|e| e.into_inner());
    SearchOutcome {
        runs: runs.into_inner(),
        first_failure_at,
        points: points.into_inner(),
        restarts: restarts.into_inner(),
        failure,
    }
}

/// The determinism check: the last sampled case of the search, replayed
/// alone after it, must leave the byte-identical disk it left in the
/// search ("same seed, same trace, byte-identical disk": what every
/// printed repro relies on). In the search that case ran after hundreds
/// of others in this process, so state that outlives a case — SQLite's
/// process-global PRNG, which `sqlite::open` reseeds, naming WAL salts —
/// would show here as different bytes.
fn replays_alike(case: Case, disk: u64) -> Option<Box<Failure>> {
    let replayed = crate::exec::replay_disk(&case);
    match replayed {
        Ok(again) if again == disk => None,
        Ok(again) => Some(Box::new(Failure {
            step: case.ops.len().saturating_sub(1),
            case,
            what: "NON-DETERMINISM: a case replayed alone left a different disk than in the search".into(),
            detail: format!(
                "disk hash {disk:#018x} in the search, {again:#018x} on replay: state outside the seed \
                 (a process-global PRNG, a clock, an iteration order) reached the disk"
            ),
            crash: None,
            expected: None,
            recovered: None,
            earlier_restarts: Vec::new(),
        })),
        Err(f) => Some(Box::new(Failure {
            what: format!(
                "NON-DETERMINISM: a case that passed in the search fails on replay: {}",
                f.what
            ),
            ..*f
        })),
    }
}
