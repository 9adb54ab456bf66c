//! `repro`: replay a saved case and print the full failure report (or say
//! that it passes). Exit code 1 when the case fails.
//!
//! ```text
//! cargo run -p durable-agent-sim --bin repro -- --case target/da-failures/<hash>.json
//! cargo run -p durable-agent-sim --bin repro -- --case <file> --sweep
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use durable_agent_sim::op::render;
use durable_agent_sim::{run_case, sweep, Case, SweepOptions};

#[derive(Debug, Parser)]
#[command(about = "Replay a durable-agent-sim case and print what it shows")]
struct Args {
    /// The case JSON (written by a failing search under target/da-failures/).
    #[arg(long)]
    case: PathBuf,
    /// Instead of replaying as saved, crash the case's ops at every I/O
    /// point under every crash mode and report each failing point.
    #[arg(long)]
    sweep: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let text = match std::fs::read_to_string(&args.case) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {}: {e}", args.case.display());
            return ExitCode::from(2);
        }
    };
    let case: Case = match serde_json::from_str(&text) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: not a case file: {e}", args.case.display());
            return ExitCode::from(2);
        }
    };
    if args.sweep {
        let summary = sweep(case.seed, &case.ops, &case.canaries, &SweepOptions::default());
        println!(
            "swept {} points × 3 modes = {} replays, {} failing",
            summary.points,
            summary.runs,
            summary.failures.len()
        );
        if let Some(first) = summary.failures.first() {
            println!("{}", first.report());
            return ExitCode::from(1);
        }
        return ExitCode::SUCCESS;
    }
    match run_case(&case) {
        Ok(stats) => {
            println!(
                "PASS: seed {:#x}, {} ops, {} I/O points, {} restarts checked",
                case.seed,
                case.ops.len(),
                stats.points,
                stats.restarts
            );
            for (i, op) in case.ops.iter().enumerate() {
                println!("  {:>3}. {}", i + 1, render(op));
            }
            ExitCode::SUCCESS
        }
        Err(failure) => {
            println!("{}", failure.report());
            ExitCode::from(1)
        }
    }
}
