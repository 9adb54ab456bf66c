//! Harness throughput on 30-op sequences (release: `cargo bench -p
//! durable-agent-sim --bench throughput`; figures in the README's
//! Throughput section):
//! - `crash_recover_check_30_ops`: whole generated cases (ops with crash
//!   points, recoveries, oracle and invariants) per second;
//! - `sweep_points_30_op_tour_power_strict`: crash points swept per second
//!   on the tour (40 ops; 30 before trigger fires joined it), forking each point's crash image from one dry run
//!   (power loss, recover, judge), the sweep's default;
//! - `…_replay`: the same points, each replayed from the start into the
//!   crash (the reference method);
//! - `sweep_points_generated_30_ops_all_modes`: crash points judged per
//!   second, forked, on four generated 30-op sequences under every mode.

// The harness allocates a lot of small short-lived values (trace entries,
// model clones, JSON); mimalloc makes the same run ~15% faster than glibc's
// malloc (`examples/profile_cases`). Binaries only: the library leaves the
// allocator to its user.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use durable_agent::canary::Canaries;
use durable_agent_sim::op::CrashKind;
use durable_agent_sim::tour::tour;
use durable_agent_sim::{generated_by, run_case, sweep, Case, SweepMethod, SweepOptions};
use proptest::test_runner::TestRunner;

fn cases(n: usize) -> Vec<Case> {
    generated_by(&mut TestRunner::deterministic(), n, 30)
}

fn crash_recover_check(c: &mut Criterion) {
    let generated_cases = cases(64);
    let mut g = c.benchmark_group("harness");
    g.throughput(Throughput::Elements(generated_cases.len() as u64));
    g.bench_function("crash_recover_check_30_ops", |b| {
        b.iter(|| {
            for case in &generated_cases {
                // Known runtime bugs may fail a case; the cost is the same.
                let _ = run_case(case);
            }
        })
    });
    let points: u64 = sweep(
        7,
        &tour(),
        &Canaries::none(),
        &SweepOptions {
            kinds: vec![],
            ..Default::default()
        },
    )
    .points;
    g.throughput(Throughput::Elements(points));
    g.sample_size(10);
    for (name, method) in [
        ("sweep_points_30_op_tour_power_strict", SweepMethod::Fork),
        ("sweep_points_30_op_tour_power_strict_replay", SweepMethod::Replay),
    ] {
        g.bench_function(name, |b| {
            let options = SweepOptions {
                kinds: vec![CrashKind::PowerStrict],
                method,
                ..Default::default()
            };
            b.iter(|| sweep(7, &tour(), &Canaries::none(), &options))
        });
    }
    // Generated sequences, not only the hand-written tour: the forked
    // sweep of four generated 30-op cases (their `Op::Crash` entries are
    // dropped: the sweep places the crash), every mode.
    let generated: Vec<Case> = cases(4);
    let options = SweepOptions::default();
    let points: u64 = generated
        .iter()
        .map(|c| sweep(c.seed, &c.ops, &Canaries::none(), &options).runs)
        .sum();
    g.throughput(Throughput::Elements(points));
    g.bench_function("sweep_points_generated_30_ops_all_modes", |b| {
        b.iter(|| {
            for c in &generated {
                sweep(c.seed, &c.ops, &Canaries::none(), &options);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, crash_recover_check);
criterion_main!(benches);
