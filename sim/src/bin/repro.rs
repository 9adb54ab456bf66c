//! `repro`: replay a saved case and print the full failure report (or say
//! that it passes). Exit code 1 when the case fails, 2 on a bad file.
//!
//! ```text
//! cargo run -p durable-agent-sim --bin repro -- --case target/da-failures/<hash>.json
//! cargo run -p durable-agent-sim --bin repro -- --case <file> --sweep
//! ```

// The harness allocates a lot of small short-lived values (trace entries,
// model clones, JSON); mimalloc makes the same run ~15% faster than glibc's
// malloc (`examples/profile_cases`). Binaries only: the library leaves the
// allocator to its user.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use durable_agent_sim::replay::replay;

#[derive(Debug, Parser)]
#[command(about = "Replay a durable-agent-sim case and print what it shows")]
struct Args {
    /// The case JSON (written by a failing search under target/da-failures/).
    #[arg(long)]
    case: PathBuf,
    /// Crash the case's ops at every I/O point under every crash mode
    /// instead of replaying it as saved.
    #[arg(long)]
    sweep: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match replay(&args.case, args.sweep) {
        Ok((passed, out)) => {
            println!("{out}");
            if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
