//! The kill -9 soak of the real binary, small: a few crashes over two
//! roots, every check of the full soak (after each restart and the deep
//! check of each root); and the soak proven to catch a known bug in a
//! `--features canaries` build of the binary.
//!
//! These tests build `durable-agent` themselves (`cargo build -p
//! durable-agent-cli`, through the `CARGO` cargo sets for tests) and run a
//! copy of it; a build failure is reported as such.
#![cfg(not(madsim))]

mod soak_common;

use durable_agent_sim::soak::{self, serve, Kill};
use soak_common::options;

#[test]
fn kill_soak_survives_sigkills_with_every_acknowledged_op_present() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = serve::build_snapshot(&[], &dir.path().join("built")).expect("building durable-agent");
    let options = options(dir.path(), bin, 7, 8);
    let mut crash = Kill::new(&dir.path().join("data")).expect("data dir");
    let report = soak::run(&options, &mut crash);
    eprintln!("{}", report.summary(options.min_crashes));
    assert!(
        report.passed(options.min_crashes),
        "{}",
        report.summary(options.min_crashes)
    );
    assert_eq!(report.generations, 2, "two roots, each with its deep check");
    assert!(
        report.ops_acked > 0 && report.acked_checked == report.ops_acked,
        "{report:?}"
    );
    assert!(report.lock_probes >= 2, "{report:?}");
}

/// The irreversible call's effect sent before its INTENT is recorded: a
/// kill inside the tool call (the sink answers late) leaves no trace, the
/// re-asked turn sends it again, and the non-deduplicating sink sees it
/// twice. The soak must say so.
#[test]
fn kill_soak_catches_side_effect_before_intent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = serve::build_snapshot(&["canaries"], &dir.path().join("built"))
        .expect("building durable-agent --features canaries");
    let mut options = options(dir.path(), bin, 11, 40);
    options.canary = Some("side_effect_before_intent".into());
    let mut crash = Kill::new(&dir.path().join("data")).expect("data dir");
    let report = soak::run(&options, &mut crash);
    eprintln!("{}", report.summary(options.min_crashes));
    let failure = report.failure.expect("the soak missed SideEffectBeforeIntent");
    assert!(failure.contains("I4 duplicate side effect"), "{failure}");
}
