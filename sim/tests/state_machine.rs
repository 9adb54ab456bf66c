//! The proptest-state-machine entry point, as its book describes it:
//! `RefMachine` generates, `SimTest` drives the clean runtime and panics
//! with the full failure report. (The search in `tests/search.rs` runs the
//! same machine through `Exec` with profiles and canaries.)

use durable_agent_sim::machine::SimTest;
use proptest::prelude::*;
use proptest_state_machine::prop_state_machine;

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        rng_seed: proptest::test_runner::RngSeed::Fixed(5),
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn clean_runtime_matches_the_reference_machine(sequential 1..30 => SimTest);
}
