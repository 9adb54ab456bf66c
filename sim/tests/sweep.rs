//! Sweep mode: the tour crashed at every I/O point under every crash mode.

use durable_agent::canary::{Canaries, Canary};
use durable_agent_sim::model::Model;
use durable_agent_sim::tour::tour;
use durable_agent_sim::{run_case, sweep, Case, SweepOptions};

#[test]
fn tour_resolves_every_op() {
    let mut m = Model::default();
    for (i, op) in tour().iter().enumerate() {
        if op.is_control() {
            continue;
        }
        let action = m
            .resolve(op)
            .unwrap_or_else(|| panic!("op {} ({op:?}) would be skipped", i + 1));
        m.apply(&action);
    }
}

fn sweep_clean(ops: &[durable_agent_sim::op::Op]) {
    let s = sweep(7, ops, &Canaries::none(), &SweepOptions::default());
    eprintln!(
        "swept {} points, {} replays, {} crashes hit, {} failures",
        s.points,
        s.runs,
        s.crashes,
        s.failures.len()
    );
    if let Some(f) = s.failures.first() {
        panic!("{} failing points; first:\n{}", s.failures.len(), f.report());
    }
    assert!(
        s.points > 100,
        "the sequence should cross many I/O points, got {}",
        s.points
    );
    assert_eq!(s.runs, 3 * s.points);
    assert_eq!(s.crashes, s.runs, "every swept point must be hit");
}

/// The PR-gate sweep: the first 10 ops of the tour (tree, turns with
/// tools, messages, delivery), every point, every crash mode.
#[test]
fn clean_runtime_survives_a_crash_at_every_io_point_of_the_tour_prefix() {
    sweep_clean(&tour()[..10]);
}

/// The whole 30-op tour (about a minute in debug): nightly.
#[test]
#[ignore = "slow in debug; run with --ignored (nightly)"]
fn clean_runtime_survives_a_crash_at_every_io_point_of_the_whole_tour() {
    sweep_clean(&tour());
}

#[test]
fn sweep_finds_the_missing_dir_fsync() {
    let options = SweepOptions {
        stop_at_first: true,
        ..SweepOptions::default()
    };
    let s = sweep(7, &tour(), &Canaries::only(Canary::NoDirFsync), &options);
    assert_eq!(
        s.failures.len(),
        1,
        "NoDirFsync must fail at some point of the tour"
    );
}

#[test]
fn same_case_gives_the_same_verdict_and_stats() {
    let case = Case {
        seed: 99,
        ops: tour(),
        canaries: Canaries::none(),
        crash_at: None,
    };
    assert_eq!(run_case(&case).unwrap(), run_case(&case).unwrap());
}
