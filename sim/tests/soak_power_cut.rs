//! The power-cut soak of the real binary, small: `serve` with its root on
//! the power-cut FUSE mount, SIGKILLed and then power-cut at seeded
//! moments, remounted, restarted and checked as the kill soak checks; and
//! the soak proven to catch a `RealFs` whose `sync` does nothing and one
//! whose `sync_dir` does nothing — bugs a kill -9 cannot see (the control
//! test shows the kill soak green on the same broken build).
//!
//! These tests mount FUSE (they need /dev/fuse and root); where it cannot
//! be mounted they fail, saying so, rather than pass without power cuts.
#![cfg(not(madsim))]

mod soak_common;

use durable_agent_sim::soak::{self, serve, Kill, PowerCut, SoakReport};
use soak_common::options;

/// A power-cut soak of `crashes` cuts with `canary` on in a canaries build.
fn power_cut_soak(seed: u64, crashes: u64, canary: Option<&str>) -> SoakReport {
    let dir = tempfile::tempdir().expect("temp dir");
    let features: &[&str] = if canary.is_some() { &["canaries"] } else { &[] };
    let bin = serve::build_snapshot(features, &dir.path().join("built")).expect("building durable-agent");
    let mut options = options(dir.path(), bin, seed, crashes);
    options.canary = canary.map(str::to_string);
    let mut crash = PowerCut::new(&dir.path().join("data"), seed).unwrap_or_else(|e| panic!("{e}"));
    let report = soak::run(&options, &mut crash);
    eprintln!("{}", report.summary(options.min_crashes));
    report
}

#[test]
fn power_cut_soak_survives_cuts_with_every_acknowledged_op_present() {
    let report = power_cut_soak(7, 8, None);
    assert!(report.passed(8), "{}", report.summary(8));
    assert_eq!(report.crash, "power-cut");
    assert_eq!(report.generations, 2, "two roots, each with its deep check");
    assert!(
        report.ops_acked > 0 && report.acked_checked == report.ops_acked,
        "{report:?}"
    );
}

/// The soak's failure for a canary: present, and about the runtime's
/// data, not the FUSE backend.
fn caught(report: SoakReport, canary: &str) -> String {
    let failure = report
        .failure
        .unwrap_or_else(|| panic!("the power-cut soak missed {canary} in {} cuts", report.crashes));
    assert!(
        !failure.contains("power-cut backend"),
        "{canary}: the backend failed, not the check: {failure}"
    );
    failure
}

/// `RealFs::sync_dir` does nothing: a created file or directory, or a
/// rename, never reaches the disk's directory under the strict model, so
/// an acknowledged agent (or the whole root) is gone after a cut.
#[test]
fn power_cut_soak_catches_a_realfs_whose_sync_dir_does_nothing() {
    let failure = caught(
        power_cut_soak(11, 20, Some("real_fs_sync_dir_noop")),
        "RealFsSyncDirNoop",
    );
    eprintln!("caught RealFsSyncDirNoop: {failure}");
}

/// `RealFs::sync` does nothing: log appends, record writes and SQLite's
/// WAL frames are lost or torn at a cut, so an acknowledged op is missing
/// or a record no longer parses.
#[test]
fn power_cut_soak_catches_a_realfs_whose_sync_does_nothing() {
    let failure = caught(
        power_cut_soak(12, 20, Some("real_fs_sync_noop")),
        "RealFsSyncNoop",
    );
    eprintln!("caught RealFsSyncNoop: {failure}");
}

/// The control: the same broken build survives the kill soak — a process
/// death keeps the page cache, so only a power cut can see a missing
/// fsync.
#[test]
fn kill_soak_cannot_see_a_realfs_whose_sync_does_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = serve::build_snapshot(&["canaries"], &dir.path().join("built"))
        .expect("building durable-agent --features canaries");
    let mut options = options(dir.path(), bin, 12, 8);
    options.canary = Some("real_fs_sync_noop".into());
    let mut crash = Kill::new(&dir.path().join("data")).expect("data dir");
    let report = soak::run(&options, &mut crash);
    assert!(report.passed(8), "{}", report.summary(8));
}
