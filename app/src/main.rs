//! The `durable-agent` binary.
//!
//! Invariant: every subcommand reports failure as one readable message on
//! stderr and exit code 1 (2 for usage errors, from clap); nothing here
//! panics on bad input.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use durable_agent_cli::config::Config;
use durable_agent_cli::mock_llm::{MockLlm, Script};
use durable_agent_cli::openai::OpenAiProvider;
use durable_agent_cli::telemetry;

#[derive(Debug, Parser)]
#[command(
    name = "durable-agent",
    version,
    about = "A crash-proof runtime for LLM agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a scripted (or, without --script, echoing) OpenAI-compatible
    /// mock LLM on loopback until interrupted.
    MockLlm {
        /// Replies in order (.toml or .json); omit for echo mode.
        #[arg(long)]
        script: Option<PathBuf>,
        /// Loopback address; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// Parse and validate a config file, then print a summary.
    CheckConfig {
        /// The config file (TOML).
        file: PathBuf,
    },
    // ---------------------------------------------------------------
    // TO BE ADDED (issue 13), once `durable_agent::system::System::boot`
    // lands in the system crate: `serve`, `run`, `status`, `emit`,
    // `confirm`. They need the one boot of the system (runtime + ledger +
    // stores) and are deliberately absent, not stubbed.
    // ---------------------------------------------------------------
}

fn main() -> ExitCode {
    telemetry::init_tracing();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::MockLlm { script, listen } => mock_llm(script, listen),
        Command::CheckConfig { file } => check_config(&file),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn mock_llm(script: Option<PathBuf>, listen: SocketAddr) -> Result<(), String> {
    let mock = match script {
        Some(path) => {
            let script = Script::load(&path).map_err(|e| e.to_string())?;
            let replies = script.replies.len();
            let mock = MockLlm::scripted(listen, script).map_err(|e| e.to_string())?;
            eprintln!("mock LLM: {replies} scripted replies from {}", path.display());
            mock
        }
        None => {
            let mock = MockLlm::echo(listen).map_err(|e| e.to_string())?;
            eprintln!("mock LLM: echo mode");
            mock
        }
    };
    // The URL alone on stdout, so scripts can capture it.
    println!("{}", mock.base_url());
    eprintln!("use it as [provider] base_url; Ctrl-C stops it");
    // Ctrl-C's default action ends the process; the mock holds nothing
    // that needs flushing, so no handler is installed.
    loop {
        std::thread::park();
    }
}

fn check_config(file: &std::path::Path) -> Result<(), String> {
    let config = Config::load(file).map_err(|e| e.to_string())?;
    print!("{}", config.summary());
    if let Err(e) = OpenAiProvider::from_config(&config) {
        // Not an error: the file is valid; the key is needed at run time.
        eprintln!("warning: {e}");
    }
    println!("{}: ok", file.display());
    Ok(())
}
