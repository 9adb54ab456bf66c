//! Each runtime-side canary re-introduces one known bug; these tests show
//! the crash sweep (or a targeted crash) observes it. A canary nobody can
//! catch would make the harness's claims worthless.

mod runtime_support;

use std::path::Path;

use durable_agent::canary::{Canaries, Canary};
use durable_agent::fs::{CrashMode, DirModel, Fs, SimConfig, SimFs};
use durable_agent::log::EVENTS_FILE;
use runtime_support::{full_scenario, open, sweep, Op};

fn caught(canary: Canary, mode: CrashMode) -> usize {
    let canaries = Canaries::only(canary);
    sweep(1, &full_scenario(), mode, &canaries).len()
}

#[test]
fn ack_before_log_loses_acknowledged_operations_under_process_crash() {
    assert!(caught(Canary::AckBeforeLog, CrashMode::ProcessCrash) > 0);
}

#[test]
fn delivered_before_delivery_loses_acknowledged_messages_under_process_crash() {
    assert!(caught(Canary::DeliveredBeforeDelivery, CrashMode::ProcessCrash) > 0);
}

#[test]
fn no_fsync_before_rename_is_caught_under_power_loss() {
    let n = caught(
        Canary::NoFsyncBeforeRename,
        CrashMode::PowerLoss(DirModel::Strict),
    ) + caught(Canary::NoFsyncBeforeRename, CrashMode::PowerLoss(DirModel::Eager));
    assert!(n > 0);
}

#[test]
fn no_dir_fsync_is_caught_under_strict_power_loss() {
    assert!(caught(Canary::NoDirFsync, CrashMode::PowerLoss(DirModel::Strict)) > 0);
}

/// Write a torn append (half a line) and a pending file holding the full
/// entry, exactly what a crash mid-append leaves, then reopen.
fn torn_tail_then_reopen(canaries: &Canaries) -> Result<(), String> {
    let sim = SimFs::new(SimConfig::new(5));
    let (mut rt, _) = open(&sim, 5, canaries).map_err(|e| e.to_string())?;
    let mut agents = Vec::new();
    runtime_support::apply(&mut rt, &mut agents, &Op::CreateRoot("a")).map_err(|e| e.to_string())?;
    let dir = rt.session_dir(&agents[0]).ok_or("no session dir")?;
    let before = rt.state();
    drop(rt);
    // A torn second copy of the last line, as a crash mid-append leaves it.
    let log = dir.join(EVENTS_FILE);
    let bytes = sim.read(&log, "test read").map_err(|e| e.to_string())?;
    let half = &bytes[..bytes.len() / 2];
    sim.append(&log, half, "test torn append")
        .map_err(|e| e.to_string())?;
    let (mut rt, report) = open(&sim, 5, canaries).map_err(|e| e.to_string())?;
    if canaries.has(Canary::NoPartialLineRepair) {
        assert_eq!(report.truncated_bytes(), 0);
    } else {
        assert_eq!(report.truncated_bytes(), half.len() as u64);
    }
    if rt.state().normalized() != before.normalized() {
        return Err("state changed".into());
    }
    // The next append lands after the torn bytes unless they were cut.
    rt.run_turn(&agents[0], "hello").map_err(|e| e.to_string())?;
    drop(rt);
    open(&sim, 5, canaries).map_err(|e| e.to_string())?;
    durable_agent::recovery::check_invariants(&sim, Path::new(runtime_support::ROOT))
        .map_err(|v| format!("{v:?}"))
}

#[test]
fn partial_line_repair_keeps_the_log_valid_after_a_torn_append() {
    torn_tail_then_reopen(&Canaries::none()).unwrap();
}

#[test]
fn no_partial_line_repair_corrupts_the_log_after_a_torn_append() {
    let err = torn_tail_then_reopen(&Canaries::only(Canary::NoPartialLineRepair)).unwrap_err();
    assert!(err.contains("corrupt") && err.contains(EVENTS_FILE), "{err}");
}
