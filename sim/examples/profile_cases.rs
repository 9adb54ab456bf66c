//! The benchmark's workload without criterion, for a profiler: generate
//! `N` 30-op cases (proptest's deterministic runner, as the bench does),
//! run each once, print totals. Instruction counts are repeatable:
//!
//! ```text
//! CARGO_PROFILE_RELEASE_DEBUG=true cargo build --release -p durable-agent-sim --example profile_cases
//! valgrind --tool=callgrind target/release/examples/profile_cases 16
//! valgrind --tool=callgrind target/release/examples/profile_cases sweep
//! ```

// As in the CLI and the bench.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use durable_agent::canary::Canaries;
use durable_agent_sim::{generated_by, run_case};
use proptest::test_runner::TestRunner;

fn main() -> Result<(), String> {
    if std::env::args().nth(1).as_deref() == Some("sweep") {
        return sweep_tour();
    }
    let n: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|e| format!("N: {e}"))?,
        None => 16,
    };
    let cases = generated_by(&mut TestRunner::deterministic(), n, 30);
    if cases.len() != n {
        return Err(format!("the generator gave {} cases, not {n}", cases.len()));
    }
    let start = std::time::Instant::now();
    let (mut passed, mut restarts, mut points) = (0, 0, 0);
    for case in &cases {
        if let Ok(stats) = run_case(case) {
            passed += 1;
            restarts += stats.restarts;
            points += stats.points;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{n} cases ({passed} passed, {restarts} restarts, {points} I/O points) in {secs:.3}s: {:.0} cases/s",
        n as f64 / secs
    );
    Ok(())
}

/// `profile_cases sweep`: the fast sweep of the 30-op tour under power
/// loss (strict directories), as the bench runs it.
fn sweep_tour() -> Result<(), String> {
    use durable_agent_sim::op::CrashKind;
    use durable_agent_sim::{sweep, SweepOptions};
    let options = SweepOptions {
        kinds: vec![CrashKind::PowerStrict],
        ..SweepOptions::default()
    };
    let start = std::time::Instant::now();
    let s = sweep(7, &durable_agent_sim::tour::tour(), &Canaries::none(), &options);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} points judged ({} failures) in {secs:.3}s: {:.0} points/s",
        s.runs,
        s.failures.len(),
        s.runs as f64 / secs
    );
    Ok(())
}
