//! The harness proves itself: with each canary the runtime implements
//! switched on, the `ci` profile search must find a failure. Prints a table
//! of how many cases each canary needed.
//!
//! Canaries the runtime does not implement yet are listed as UNPROVEN and
//! fail nothing: they are reported, not pretended.

use durable_agent::canary::{Canaries, Canary};
use durable_agent_sim::{search, Profile};

/// Canaries whose bug the system can re-introduce today (all of them; the
/// list stays explicit so a new canary is reported UNPROVEN, not skipped).
const IMPLEMENTED: [Canary; 8] = [
    Canary::NoFsyncBeforeRename,
    Canary::NoDirFsync,
    Canary::AckBeforeLog,
    Canary::NoPartialLineRepair,
    Canary::DeliveredBeforeDelivery,
    Canary::TriggerWithoutDedup,
    Canary::SideEffectBeforeIntent,
    Canary::CheckpointRollbackSkipped,
];

#[test]
fn ci_profile_catches_every_implemented_canary() {
    let mut profile = Profile::ci();
    // The canary search may stop at the first failure: shrinking is not
    // what is measured here.
    profile.max_shrink_iters = 50;
    let mut rows = Vec::new();
    let mut missed = Vec::new();
    for canary in Canary::ALL {
        if !IMPLEMENTED.contains(&canary) {
            rows.push(format!(
                "{canary:<28?} UNPROVEN (not implemented by the runtime yet)"
            ));
            continue;
        }
        let out = search(&profile, &Canaries::only(canary), false);
        match (&out.failure, out.first_failure_at) {
            (Some(f), Some(n)) => {
                let saved = f.case.save().map(|p| p.display().to_string()).unwrap_or_default();
                rows.push(format!(
                    "{canary:<28?} caught after {n:>4} cases ({} runs with shrinking), shrunk to {} ops: {}\n{:>30}case: {saved}",
                    out.runs,
                    f.case.ops.len(),
                    f.what,
                    ""
                ));
            }
            _ => {
                rows.push(format!("{canary:<28?} MISSED in {} cases", out.runs));
                missed.push(canary);
            }
        }
    }
    eprintln!("canary                       result\n{}", rows.join("\n"));
    assert!(missed.is_empty(), "the ci profile missed canaries {missed:?}");
}
