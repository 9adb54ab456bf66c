//! Faults other than a single crash, at EVERY I/O point of a scenario:
//! - a crash, recovery, then a power loss right after recovery: the second
//!   recovery finds the same state (recovery persisted what it relied on);
//! - EIO, ENOSPC and lost replies: the op fails with an unknown outcome,
//!   the runtime is reopened in the same process (recovery), and the state
//!   is the one before or after the op — and stays so across a power loss
//!   (after a failed fsync the written bytes are of unknown durability).

mod runtime_support;

use durable_agent::canary::Canaries;
use durable_agent::fs::sim::FailKind;
use durable_agent::fs::{CrashMode, DirModel, Fault};
use runtime_support::{full_scenario, sweep_faults, Restart, MODES};

const POWER_LOSS: [CrashMode; 2] = [
    CrashMode::PowerLoss(DirModel::Strict),
    CrashMode::PowerLoss(DirModel::Eager),
];

fn assert_none(what: &str, v: Vec<(u64, String, String)>) {
    assert!(
        v.is_empty(),
        "{what}: {} violations, first: point {} ({}): {}",
        v.len(),
        v[0].0,
        v[0].1,
        v[0].2
    );
}

#[test]
fn power_loss_right_after_recovery_keeps_the_recovered_state() {
    for first in MODES {
        for second in POWER_LOSS {
            for seed in [1, 2] {
                let v = sweep_faults(
                    seed,
                    &full_scenario(),
                    Fault::CrashAt,
                    Restart::Crash(first),
                    Some(second),
                    &Canaries::none(),
                );
                assert_none(&format!("seed {seed}, {first:?} then {second:?}"), v);
            }
        }
    }
}

#[test]
fn eio_at_any_point_then_reopen_is_all_or_nothing_and_survives_power_loss() {
    for second in POWER_LOSS {
        for seed in [1, 2] {
            let fault = |n| Fault::FailAt(n, FailKind::Eio);
            let v = sweep_faults(
                seed,
                &full_scenario(),
                fault,
                Restart::SameProcess,
                Some(second),
                &Canaries::none(),
            );
            assert_none(&format!("seed {seed}, EIO then {second:?}"), v);
        }
    }
}

#[test]
fn enospc_at_any_point_then_reopen_is_all_or_nothing() {
    let fault = |n| Fault::FailAt(n, FailKind::Enospc);
    let v = sweep_faults(
        1,
        &full_scenario(),
        fault,
        Restart::SameProcess,
        Some(POWER_LOSS[0]),
        &Canaries::none(),
    );
    assert_none("ENOSPC", v);
}

#[test]
fn lost_reply_at_any_point_then_reopen_is_all_or_nothing_and_survives_power_loss() {
    for second in POWER_LOSS {
        let v = sweep_faults(
            1,
            &full_scenario(),
            Fault::LostReplyAt,
            Restart::SameProcess,
            Some(second),
            &Canaries::none(),
        );
        assert_none(&format!("lost reply then {second:?}"), v);
    }
}
