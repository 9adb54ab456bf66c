//! Recovery itself can crash: crashing at every I/O point of a recovery,
//! then recovering again, gives the same state and a disk that satisfies
//! the invariants (recovery is idempotent and crash-safe).

mod runtime_support;

use std::path::Path;

use durable_agent::canary::Canaries;
use durable_agent::fs::{CrashMode, Fault, SimConfig, SimFs};
use durable_agent::recovery::check_invariants;
use runtime_support::{apply, dry_run, full_scenario, open, Op, MODES, ROOT};

const SEED: u64 = 3;

/// Run `ops` with a crash at `point`, then restart with `mode`: the disk a
/// recovery starts from (deterministic for the seed).
fn crashed_disk(ops: &[Op], point: u64, mode: CrashMode) -> SimFs {
    let sim = SimFs::new(SimConfig::new(SEED));
    let (mut rt, _) = open(&sim, SEED, &Canaries::none()).unwrap();
    sim.set_fault(Some(Fault::CrashAt(point)));
    let mut agents = Vec::new();
    for op in ops {
        if apply(&mut rt, &mut agents, op).is_err() {
            break;
        }
    }
    drop(rt);
    sim.restart(mode);
    sim
}

#[test]
fn crash_during_recovery_then_recovering_again_gives_the_same_state() {
    let ops = full_scenario();
    let dry = dry_run(SEED, &ops);
    let (first, _) = dry.op_points[0];
    let (_, last) = *dry.op_points.last().unwrap();
    let mut checked = 0;
    for mode in MODES {
        for point in (first..=last).step_by(7) {
            let sim = crashed_disk(&ops, point, mode);
            let start = sim.points();
            let (reference, _) = open(&sim, SEED, &Canaries::none()).unwrap();
            let expected = reference.state().normalized();
            let recovery_points = sim.points() - start;
            drop(reference);
            for q in 1..=recovery_points {
                let sim = crashed_disk(&ops, point, mode);
                sim.set_fault(Some(Fault::CrashAt(sim.points() + q)));
                assert!(
                    open(&sim, SEED, &Canaries::none()).is_err(),
                    "recovery point {q} was not reached"
                );
                sim.restart(mode);
                let (rt, _) = open(&sim, SEED, &Canaries::none())
                    .unwrap_or_else(|e| panic!("{mode:?} point {point} recovery point {q}: {e}"));
                assert_eq!(
                    rt.state().normalized(),
                    expected,
                    "{mode:?} point {point} recovery point {q}"
                );
                check_invariants(&sim, Path::new(ROOT)).unwrap();
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "only {checked} recovery crash points exercised");
}

#[test]
fn recovery_of_an_intact_disk_changes_nothing() {
    let ops = full_scenario();
    let sim = SimFs::new(SimConfig::new(SEED));
    let (mut rt, _) = open(&sim, SEED, &Canaries::none()).unwrap();
    let mut agents = Vec::new();
    for op in &ops {
        apply(&mut rt, &mut agents, op).unwrap();
    }
    let state = rt.state();
    drop(rt);
    let (_, report) = open(&sim, SEED, &Canaries::none()).unwrap();
    let image = sim.disk_image();
    let (rt, again) = open(&sim, SEED, &Canaries::none()).unwrap();
    assert_eq!(rt.state(), state.normalized());
    assert_eq!(sim.disk_image(), image, "a second recovery wrote something");
    // The only verdicts: each log's kept high-water mark, deduped.
    let only_marks = again.logs_repaired.values().all(|r| {
        *r == durable_agent::log::LogRepair {
            pending_deduped: true,
            ..Default::default()
        }
    });
    assert!(
        only_marks && again.orphans_cleaned.is_empty() && again.suspended.is_empty(),
        "{again:?}"
    );
    assert!(report.orphans_cleaned.is_empty());
}
