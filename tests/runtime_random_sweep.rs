//! Random valid op sequences (from fixed seeds), crashed at every I/O point
//! under every crash mode: the same all-or-nothing and invariant checks as
//! the fixed scenario, over shapes nobody hand-picked. Seeds 0..6 by
//! default; `RS_SEEDS=40` runs seeds 6..40 instead (a longer local run).

mod runtime_support;

use durable_agent::canary::Canaries;
use runtime_support::{random_ops, sweep, MODES};

#[test]
fn random_sequences_recover_all_or_nothing_at_every_crash_point() {
    for seed in std::env::var("RS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(0..6, |n: u64| 6..n)
    {
        let ops = random_ops(seed, 14);
        for mode in MODES {
            let v = sweep(seed, &ops, mode, &Canaries::none());
            assert!(
                v.is_empty(),
                "seed {seed}, {mode:?}, ops {ops:?}: {} violations, first: point {} ({}): {}",
                v.len(),
                v[0].0,
                v[0].1,
                v[0].2
            );
        }
    }
}
