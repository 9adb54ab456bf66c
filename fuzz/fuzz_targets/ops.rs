//! Coverage-guided op sequences through the same driver and oracle as the
//! proptest search: arbitrary ops (crashes with their offset and mode
//! included) and a seed, run by `run_case`. A failure panics with the full
//! report, which names the saved case and the `repro` command.
#![no_main]

use arbitrary::Arbitrary;
use durable_agent::canary::Canaries;
use durable_agent_sim::op::Op;
use durable_agent_sim::{run_case, Case};
use libfuzzer_sys::fuzz_target;

/// Longer sequences add run time, not new crash states, beyond this.
const MAX_OPS: usize = 40;

#[derive(Debug, Arbitrary)]
struct Input {
    seed: u64,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let mut ops = input.ops;
    ops.truncate(MAX_OPS);
    let case = Case {
        seed: input.seed,
        ops,
        canaries: Canaries::none(),
        crash_at: None,
    };
    if let Err(failure) = run_case(&case) {
        panic!("{}", failure.report());
    }
});
