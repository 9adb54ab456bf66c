//! The libFuzzer target's input type: any bytes decode (via `arbitrary`)
//! into an op sequence the harness runs, and the clean system passes it.

use arbitrary::{Arbitrary, Unstructured};
use durable_agent_sim::op::Op;
use durable_agent_sim::{run_case, Case};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn arbitrary_bytes_decode_into_cases_the_clean_system_passes() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut ran = 0;
    let n: usize = std::env::var("DA_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for _ in 0..n {
        let bytes: Vec<u8> = (0..2048).map(|_| rng.random()).collect();
        let mut u = Unstructured::new(&bytes);
        let seed = u64::arbitrary(&mut u).unwrap();
        let ops: Vec<Op> = (0..30).map(|_| Op::arbitrary(&mut u).unwrap()).collect();
        let case = Case {
            seed,
            ops,
            canaries: Default::default(),
            crash_at: None,
        };
        if let Err(f) = run_case(&case) {
            panic!("{}", f.report());
        }
        ran += case.ops.len();
    }
    assert!(
        ran > 100,
        "arbitrary should produce real sequences, got {ran} ops in total"
    );
}
