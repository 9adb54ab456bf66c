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

#[test]
fn clean_runtime_survives_a_crash_at_every_io_point_of_the_tour() {
    let s = sweep(7, &tour(), &Canaries::none(), &SweepOptions::default());
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
        "the tour should cross many I/O points, got {}",
        s.points
    );
    assert_eq!(s.runs, 3 * s.points);
    assert_eq!(s.crashes, s.runs, "every swept point must be hit");
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
