//! Crash at EVERY I/O point of a scenario covering every operation, under
//! each crash mode: recovery succeeds, the on-disk and in-memory invariants
//! hold, and the recovered state is the state before or after the
//! interrupted operation (acknowledged means durable; in-flight is
//! all-or-nothing).

mod runtime_support;

use durable_agent::canary::Canaries;
use durable_agent::fs::{CrashMode, DirModel};
use runtime_support::{full_scenario, sweep};

fn assert_clean(mode: CrashMode) {
    for seed in [1, 2] {
        let violations = sweep(seed, &full_scenario(), mode, &Canaries::none());
        assert!(
            violations.is_empty(),
            "seed {seed}, {mode:?}: {} violations, first: point {} ({}): {}",
            violations.len(),
            violations[0].0,
            violations[0].1,
            violations[0].2
        );
    }
}

#[test]
fn every_crash_point_recovers_all_or_nothing_under_process_crash() {
    assert_clean(CrashMode::ProcessCrash);
}

#[test]
fn every_crash_point_recovers_all_or_nothing_under_strict_power_loss() {
    assert_clean(CrashMode::PowerLoss(DirModel::Strict));
}

#[test]
fn every_crash_point_recovers_all_or_nothing_under_eager_power_loss() {
    assert_clean(CrashMode::PowerLoss(DirModel::Eager));
}
