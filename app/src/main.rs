//! The `durable-agent` binary.
//!
//! Invariant: every subcommand reports failure as one readable message on
//! stderr and exit code 1 (2 for usage errors, from clap); nothing here
//! panics on bad input.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use durable_agent::store::inspect::{Page, DEFAULT_LIMIT, MAX_LIMIT};
use durable_agent_cli::access::Token;
use durable_agent_cli::api::{self, Client, ClientError};
use durable_agent_cli::boot::{boot_watched, boot_with, real_fs, ApiKey};
use durable_agent_cli::config::Config;
use durable_agent_cli::daemon::{Daemon, ServeSettings};
use durable_agent_cli::gc;
use durable_agent_cli::inspect::{self, cli::InspectCommand, View};
use durable_agent_cli::interrupt::Stop;
use durable_agent_cli::mock_llm::{MockLlm, Reword, Script};
use durable_agent_cli::openai::OpenAiProvider;
use durable_agent_cli::ops;
use durable_agent_cli::progress::{Progress, Style as ProgressStyle};
use durable_agent_cli::run::{run, RunMode};
use durable_agent_cli::schedule::Schedules;
use durable_agent_cli::telemetry;
use durable_agent_cli::verify::{self, RootArg};
use durable_agent_cli::webhook_sink::WebhookSink;

#[derive(Debug, Parser)]
#[command(
    name = "durable-agent",
    version,
    about = "A crash-proof runtime for LLM agents"
)]
struct Cli {
    /// How log lines are written to stderr: `text` (coloured only on a
    /// terminal, never with NO_COLOR) or `json` (one object per line).
    #[arg(long, global = true, value_enum, env = telemetry::LogFormat::ENV, default_value = "text")]
    log_format: telemetry::LogFormat,
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
        /// Never answer the same way twice: every ask gets a deterministic
        /// variant (reworded arguments naming the ask number; per --seed,
        /// sometimes another tool, fewer or more calls, or text instead),
        /// as a real model asked again does.
        #[arg(long)]
        reword: bool,
        /// The rewording's seed (with --reword).
        #[arg(long, requires = "reword", default_value_t = 0)]
        seed: u64,
    },
    /// Serve a webhook sink (a stand-in for an email or payment API) on
    /// loopback and print each delivery, until interrupted.
    WebhookSink {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Deduplicate by Idempotency-Key (answer a repeat with the
        /// original id, deliver nothing).
        #[arg(long)]
        dedup: bool,
    },
    /// Parse and validate a config file, then print a summary.
    CheckConfig {
        /// The config file (TOML).
        file: PathBuf,
    },
    /// Run a job (one work turn on its own root agent), or resume or fork
    /// a run. Prints a JSON summary; SIGINT/SIGTERM stop it at the next
    /// provider call (exit 0, resume later).
    #[command(group(clap::ArgGroup::new("what").required(true).args(["job", "resume", "fork"])))]
    Run {
        /// The job file (TOML: agent, instructions, prompt, run_id?).
        job: Option<PathBuf>,
        #[arg(long)]
        config: PathBuf,
        /// Boot (recovery runs) and finish this run.
        #[arg(long, value_name = "RUN")]
        resume: Option<String>,
        /// Start a new run with this run's job and conversation.
        #[arg(long, value_name = "RUN")]
        fork: Option<String>,
        /// No progress lines on stderr (rounds, tool calls, retries, the
        /// end): only the summary, on stdout.
        #[arg(long, short)]
        quiet: bool,
    },
    /// The daemon: boot the root, serve the control API on [api] listen,
    /// fire due triggers; SIGINT/SIGTERM stop it gracefully.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Agents, triggers, irreversible calls needing confirmation, runs (JSON).
    Status {
        #[arg(long)]
        config: PathBuf,
    },
    /// Schedule a prompt for an agent, once per dedup key.
    Emit {
        #[arg(long)]
        config: PathBuf,
        /// The trigger's identity: a second emit with it is a no-op.
        #[arg(long)]
        dedup_key: String,
        /// Agent name or id.
        #[arg(long)]
        agent: String,
        #[arg(long)]
        prompt: String,
        /// Fire this many ms from now (default: now).
        #[arg(long, conflicts_with = "fire_at_ms")]
        delay_ms: Option<u64>,
        /// Fire at this host time (ms since the UNIX epoch).
        #[arg(long)]
        fire_at_ms: Option<u64>,
    },
    /// Retry a DEAD or FAILED trigger (listed by `status`): PENDING now,
    /// its attempts reset.
    Retry {
        #[arg(long)]
        config: PathBuf,
        /// The trigger's id (`trg-N`).
        trigger_id: String,
    },
    /// Release a session run parked `waiting_for_human` (listed by
    /// `status`) once what made its replays die is fixed: `running` again,
    /// the replay counts of its calls still in flight reset. A job run
    /// waiting on a confirmation is answered with `confirm` instead.
    Release {
        #[arg(long)]
        config: PathBuf,
        /// The run's id (`session:{id}` or a job run's id).
        run_id: String,
    },
    /// Check a root without changing it or taking its lock (works while
    /// `serve` runs): every session's log and record, the store. Prints
    /// what is healthy and what is damaged (file, line, offset) and the
    /// command that repairs each. Exit 0 healthy, 1 damaged.
    #[command(group(clap::ArgGroup::new("where").required(true).args(["root", "config"])))]
    Verify {
        /// The root directory.
        root: Option<PathBuf>,
        /// Or the config whose `[runtime] root` it is.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move what `verify` finds damaged into `{root}/quarantine/NNNN-<UTC time>/`
    /// with a NOTE.txt (never deletes), under the root lock (refused while a
    /// daemon holds it); the rest of the root then boots.
    #[command(group(clap::ArgGroup::new("where").required(true).args(["root", "config"])))]
    Repair {
        /// Required: the only repair there is (the word says what it does).
        #[arg(long, required = true)]
        quarantine: bool,
        /// The root directory.
        root: Option<PathBuf>,
        /// Or the config whose `[runtime] root` it is.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Move a damaged session's live descendants along with it
        /// (without it, such a session is refused: nothing is moved).
        #[arg(long)]
        force: bool,
        /// Give up a missing, corrupt or foreign store.db: move what is
        /// left of it aside and create a new, empty store (every trigger,
        /// run, dedup key and the side-effect ledger forgotten; root.json
        /// records the loss).
        #[arg(long)]
        accept_store_loss: bool,
        /// The result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read-only views of a root: runs, agents, work answers, usage,
    /// errors, triggers, confirmations, schedules (tables, or --json).
    /// Asks the daemon when one holds the root, else reads a copy of it;
    /// never writes to it.
    Inspect {
        /// The config whose root to inspect (required).
        #[arg(long, global = true)]
        config: Option<PathBuf>,
        /// The API's JSON answer instead of a table.
        #[arg(long, global = true)]
        json: bool,
        /// Rows per page of a list (1-500).
        #[arg(long, global = true, default_value_t = DEFAULT_LIMIT)]
        limit: u32,
        /// Rows of a list to skip (newest first).
        #[arg(long, global = true, default_value_t = 0)]
        offset: u64,
        #[command(subcommand)]
        view: InspectCommand,
    },
    /// An agent's conversation as a Markdown transcript (by agent name or
    /// id, or by run id: the run's agent). Read-only, like `inspect`.
    Transcript {
        #[arg(long)]
        config: PathBuf,
        /// Agent name or id, or run id.
        agent_or_run: String,
        /// The API's JSON answer (`{agent, run_id, markdown}`).
        #[arg(long)]
        json: bool,
    },
    /// Collect settled rows past the TTL (DONE/FAILED/DEAD triggers,
    /// DONE/FAILED ledger rows) and strip the bodies of settled ledger
    /// rows past [gc] payload_ttl_ms; never what recovery or a human still
    /// needs. Through the daemon when one holds the root. Prints the
    /// counts per table.
    Gc {
        #[arg(long)]
        config: PathBuf,
        /// Collect rows settled longer ago than this (ms, or with a unit:
        /// 90s, 30m, 24h, 7d); default [gc] ttl_ms. Bodies are stripped
        /// after [gc] payload_ttl_ms, capped at this.
        #[arg(long, value_parser = gc::parse_duration_ms)]
        ttl: Option<u64>,
        /// The API's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Tell the ledger whether an irreversible call that needs confirmation
    /// happened (look it up with `status`, at the receiving service). The
    /// work blocked on it (a trigger's turn) then runs again and resumes
    /// at that call.
    #[command(group(clap::ArgGroup::new("answer").required(true).args(["delivered", "not_delivered", "abandon"])))]
    Confirm {
        #[arg(long)]
        config: PathBuf,
        /// The call's idempotency key.
        idem_key: String,
        /// It happened.
        #[arg(long)]
        delivered: bool,
        /// It did not happen: the resumed work sends it, once.
        #[arg(long)]
        not_delivered: bool,
        /// Never send it, whatever happened: the resumed work sees it failed.
        #[arg(long)]
        abandon: bool,
        /// The service's reference for the effect (with --delivered).
        #[arg(long, requires = "delivered")]
        provider_ref: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_tracing(cli.log_format);
    let result = match cli.command {
        Command::MockLlm {
            script,
            listen,
            reword,
            seed,
        } => mock_llm(script, listen, reword.then_some(Reword::new(seed))).map(|()| ExitCode::SUCCESS),
        Command::WebhookSink { listen, dedup } => webhook_sink(listen, dedup).map(|()| ExitCode::SUCCESS),
        Command::CheckConfig { file } => check_config(&file).map(|()| ExitCode::SUCCESS),
        Command::Run {
            job,
            config,
            resume,
            fork,
            quiet,
        } => {
            let mode = match (&job, &resume, &fork) {
                (Some(job_file), _, _) => RunMode::New { job_file },
                (_, Some(run_id), _) => RunMode::Resume { run_id },
                (_, _, Some(run_id)) => RunMode::Fork { run_id },
                // clap's required group makes this unreachable.
                (None, None, None) => return ExitCode::from(2),
            };
            run_command(&config, mode, quiet)
        }
        Command::Serve { config } => serve(&config).map(|()| ExitCode::SUCCESS),
        Command::Verify { root, config, json } => verify_cmd(root, config, json),
        Command::Repair {
            quarantine: _,
            root,
            config,
            force,
            accept_store_loss,
            json,
        } => repair_cmd(root, config, force, accept_store_loss, json),
        Command::Inspect {
            config,
            json,
            limit,
            offset,
            view,
        } => inspect_cmd(config, json, limit, offset, view),
        Command::Transcript {
            config,
            agent_or_run,
            json,
        } => view_cmd(&config, &View::Transcript(agent_or_run), json),
        Command::Gc { config, ttl, json } => gc_cmd(&config, ttl, json),
        Command::Status { config } => control(&config, "GET", "/status", None),
        Command::Release { config, run_id } => control(
            &config,
            "POST",
            &format!("/runs/{}/release", path_segment(&run_id)),
            None,
        ),
        Command::Retry { config, trigger_id } => {
            // The id goes into the path: only what an id can hold.
            if trigger_id.is_empty() || !trigger_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                Err(format!("not a trigger id: {trigger_id:?}"))
            } else {
                control(&config, "POST", &format!("/triggers/{trigger_id}/retry"), None)
            }
        }
        Command::Emit {
            config,
            dedup_key,
            agent,
            prompt,
            delay_ms,
            fire_at_ms,
        } => {
            let body = serde_json::json!({
                "dedup_key": dedup_key, "agent": agent, "prompt": prompt,
                "delay_ms": delay_ms, "fire_at_ms": fire_at_ms,
            });
            control(&config, "POST", "/triggers", Some(body))
        }
        Command::Confirm {
            config,
            idem_key,
            delivered,
            not_delivered: _,
            abandon,
            provider_ref,
        } => {
            let body = serde_json::json!({
                "idem_key": idem_key, "delivered": delivered, "provider_ref": provider_ref,
                "abandon": abandon,
            });
            control(&config, "POST", "/confirm", Some(body))
        }
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `s` as one URL path segment: unreserved characters as they are, every
/// other byte percent-escaped (the API decodes it back).
fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn mock_llm(script: Option<PathBuf>, listen: SocketAddr, reword: Option<Reword>) -> Result<(), String> {
    let mock = match script {
        Some(path) => {
            let mut script = Script::load(&path).map_err(|e| e.to_string())?;
            if let Some(r) = reword {
                script = script.reworded(r);
            }
            let replies = script.replies.len();
            let rewording = script.reword;
            let mock = MockLlm::scripted(listen, script).map_err(|e| e.to_string())?;
            eprintln!(
                "mock LLM: {replies} scripted replies from {}{}",
                path.display(),
                rewording.map_or(String::new(), |r| format!(", reworded (seed {})", r.seed))
            );
            mock
        }
        None => {
            let mock = match reword {
                Some(r) => MockLlm::echo_rewording(listen, r),
                None => MockLlm::echo(listen),
            }
            .map_err(|e| e.to_string())?;
            eprintln!(
                "mock LLM: echo mode{}",
                reword.map_or(String::new(), |r| format!(", reworded (seed {})", r.seed))
            );
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

fn webhook_sink(listen: SocketAddr, dedup: bool) -> Result<(), String> {
    let sink = WebhookSink::start(listen, dedup).map_err(|e| e.to_string())?;
    println!("{}", sink.url(""));
    eprintln!(
        "webhook sink{}: Ctrl-C stops it",
        if dedup { " (dedup by Idempotency-Key)" } else { "" }
    );
    // Print deliveries as they land; polling keeps the sink's API small.
    let mut shown = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let deliveries = sink.deliveries();
        for d in deliveries.iter().skip(shown) {
            println!(
                "{} {} {} key={} {}",
                d.id,
                d.request.method,
                d.request.path,
                d.idempotency_key().unwrap_or("-"),
                d.request.body
            );
        }
        shown = deliveries.len();
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

/// `run`: progress on stderr as it happens (none with `quiet`), the
/// summary alone on stdout.
fn run_command(config: &std::path::Path, mode: RunMode<'_>, quiet: bool) -> Result<ExitCode, String> {
    let config = Config::load(config).map_err(|e| e.to_string())?;
    let stop = Stop::new();
    stop.on_signals("the run")
        .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    let progress = Progress::new(ProgressStyle::detect(quiet));
    let (mut system, _report, lifecycle) =
        boot_watched(&config, &stop, ApiKey::Required, Some(&progress)).map_err(|e| e.to_string())?;
    let summary = run(&mut system, &lifecycle, mode, &stop, &progress).map_err(|e| {
        progress.finish();
        e.to_string()
    })?;
    let json = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    print_out(&json);
    if let (Some(error), false) = (&summary.error, quiet) {
        eprintln!("run {}: {error}", summary.run_id);
    }
    Ok(if summary.is_failure() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn serve(config: &std::path::Path) -> Result<(), String> {
    let config = Config::load(config).map_err(|e| e.to_string())?;
    let stop = Stop::new();
    stop.on_signals("the daemon")
        .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    let daemon = Daemon::start(&config, &stop, ServeSettings::default()).map_err(|e| e.to_string())?;
    let report = &daemon.report;
    eprintln!(
        "serving root {}: {} agents recovered, {} leases reclaimed, {} INTENTs settled",
        config.runtime.root.display(),
        report.runtime.agents_recovered,
        report.stores.reclaimed_triggers.len(),
        report.stores.activities.len()
    );
    // The URL alone on stdout, so scripts can capture it.
    println!("{}", daemon.url());
    daemon.run().map_err(|e| e.to_string())?;
    eprintln!("stopped");
    Ok(())
}

fn verify_cmd(root: Option<PathBuf>, config: Option<PathBuf>, json: bool) -> Result<ExitCode, String> {
    let root = RootArg::resolve(root, config)?;
    let (report, healthy) = verify::verify_command(&root, json)?;
    print_out(report.trim_end());
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn repair_cmd(
    root: Option<PathBuf>,
    config: Option<PathBuf>,
    force: bool,
    accept_store_loss: bool,
    json: bool,
) -> Result<ExitCode, String> {
    let root = RootArg::resolve(root, config)?;
    let repaired = verify::repair_command_run(&root, force, accept_store_loss)?;
    if json {
        print_out(&serde_json::to_string_pretty(&repaired).map_err(|e| e.to_string())?);
    } else {
        print_out(verify::repaired_text(&repaired).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

/// `inspect`: one view, its page checked before anything is read.
fn inspect_cmd(
    config: Option<PathBuf>,
    json: bool,
    limit: u32,
    offset: u64,
    view: InspectCommand,
) -> Result<ExitCode, String> {
    let config = config.ok_or("inspect needs --config FILE (the root it names is inspected)")?;
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(format!("--limit must be 1..={MAX_LIMIT}, not {limit}"));
    }
    let view = view.view(Page::new(limit, offset))?;
    view_cmd(&config, &view, json)
}

/// Print `view` of the root `config` names (see [`inspect::cli`]).
fn view_cmd(config: &std::path::Path, view: &View, json: bool) -> Result<ExitCode, String> {
    let config = Config::load(config).map_err(|e| e.to_string())?;
    print_out(&inspect::cli::print(&config, view, json)?);
    Ok(ExitCode::SUCCESS)
}

/// `gc`: one pass with the config's TTLs (`--ttl` overriding), as a
/// table of counts per table or the API's JSON.
fn gc_cmd(config_path: &std::path::Path, ttl: Option<u64>, json: bool) -> Result<ExitCode, String> {
    let config = Config::load(config_path).map_err(|e| e.to_string())?;
    let request = gc::request_from_config(&config.gc, ttl);
    let body = serde_json::to_value(request).map_err(|e| e.to_string())?;
    let answer = call_root(&config, "POST", "/gc", Some(body))?;
    if json {
        print_out(&serde_json::to_string_pretty(&answer).map_err(|e| e.to_string())?);
    } else {
        print_out(gc::table(&answer).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

/// One API operation (see [`call_root`]), its answer printed as JSON.
fn control(
    config: &std::path::Path,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<ExitCode, String> {
    let config = Config::load(config).map_err(|e| e.to_string())?;
    let value = call_root(&config, method, path, body)?;
    let json = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
    print_out(&json);
    Ok(ExitCode::SUCCESS)
}

/// One API operation: directly under the root lock when no daemon holds
/// the root, else through the daemon's API (the lock says which).
fn call_root(
    config: &Config,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<serde_json::Value, String> {
    let text = body.as_ref().map_or(String::new(), ToString::to_string);
    let value = match boot_with(config, &Stop::new(), ApiKey::Optional) {
        Ok((mut system, _report, lifecycle)) => {
            let request = api::route(method, path, &text).map_err(|r| r.message)?;
            let mut schedules = Schedules::load(
                Arc::new(real_fs().map_err(|e| e.to_string())?),
                &config.runtime.root,
            )
            .map_err(|e| e.to_string())?;
            ops::apply(&mut system, &mut schedules, &lifecycle, request).map_err(|e| e.to_string())?
        }
        Err(e) if e.is_locked() => {
            tracing::info!(addr = %config.api.listen, "the root is held (a daemon?): asking its API");
            let token = Token::for_client(config).map_err(|t| format!("{e}\nand its API token: {t}"))?;
            let client = Client::new(config.api.listen, std::time::Duration::from_secs(60)).with_token(token);
            // Meant for this root only: a daemon of another root at the
            // same address refuses it (409).
            let client = match durable_agent_cli::daemon::root_store_id(&config.runtime.root) {
                Some(id) => client.for_root(id),
                None => client,
            };
            client
                .call(method, path, body.as_ref())
                .map_err(|api_error| match api_error {
                    // It answered, with a refusal: say what it said (a 4xx
                    // is the daemon's word on the request, not silence).
                    ClientError::Api { .. } => format!("the daemon holding the root refused: {api_error}"),
                    _ => format!("{e}\nand its API did not answer: {api_error}"),
                })?
        }
        Err(e) => return Err(e.to_string()),
    };
    Ok(value)
}

/// Print a command's result to stdout. A closed pipe (`| head`) is the
/// reader's choice, not an error worth a panic; the work is already done.
fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: writing the result to stdout: {e}");
        }
    }
}
