//! The harness proves itself: with each canary switched on, the `ci`
//! profile search must find a failure. Prints the table of how many cases
//! each canary needed (also: `cargo run --release -p durable-agent-sim --
//! canaries`).

use durable_agent::canary::Canary;
use durable_agent_sim::canaries::{run, Verdict, IMPLEMENTED, REAL_FS_ONLY, WORKER_ONLY};
use durable_agent_sim::Profile;

#[test]
fn ci_profile_catches_every_canary() {
    let rows = run(&Profile::ci(), None);
    eprintln!("canary                     result");
    for row in &rows {
        eprintln!("{row}");
    }
    let missed: Vec<Canary> = rows
        .iter()
        .filter(|r| {
            !matches!(
                r.verdict,
                Verdict::Caught { .. } | Verdict::RealFsOnly | Verdict::WorkerOnly
            )
        })
        .map(|r| r.canary)
        .collect();
    assert!(missed.is_empty(), "the ci profile did not catch {missed:?}");
    assert_eq!(
        IMPLEMENTED.len() + REAL_FS_ONLY.len() + WORKER_ONLY.len(),
        Canary::ALL.len(),
        "every canary must be re-introducible"
    );
}
