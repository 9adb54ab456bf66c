//! The PR-gate search: the clean runtime passes the profile `DA_PROFILE`
//! selects (`ci` in CI), with committed regressions replayed first.

use durable_agent::canary::Canaries;
use durable_agent_sim::{search, Profile};

#[test]
fn clean_runtime_passes_the_profile_search() {
    let profile = Profile::from_env();
    let out = search(&profile, &Canaries::none(), true);
    eprintln!(
        "profile {}: {} cases, {} I/O points, {} restarts judged",
        profile.name, out.runs, out.points, out.restarts
    );
    if let Some(f) = out.failure {
        panic!(
            "{}or rerun this search (persisted failures replay first):\n  DA_PROFILE={} cargo test -p durable-agent-sim --test search\n",
            f.report(),
            profile.name
        );
    }
}
