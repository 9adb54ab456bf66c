//! `durable-agent-sim`: the fuzz campaign CLI (what the README's first
//! command runs).
//!
//! ```text
//! durable-agent-sim fuzz [--profile ci|nightly|default] [--cases N] [--time 10m] [--canary no_dir_fsync]
//! durable-agent-sim canaries [--profile ci]
//! durable-agent-sim sweep [--case FILE] [--seed N] [--replay]
//! durable-agent-sim repro --case FILE [--sweep]
//! ```
//! Exit code 0: nothing found; 1: a failure (its report and repro command
//! are printed); 2: bad arguments or files. Wall-clock time is used only
//! for `--time` (the campaign's budget), never inside a case.

// The harness allocates a lot of small short-lived values (trace entries,
// model clones, JSON); mimalloc makes the same run ~15% faster than glibc's
// malloc (`examples/profile_cases`). Binaries only: the library leaves the
// allocator to its user.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use durable_agent::canary::{Canaries, Canary};
use durable_agent_sim::canaries::{self, Verdict};
use durable_agent_sim::replay::replay;
use durable_agent_sim::tour::tour;
use durable_agent_sim::{
    generated, search_with_progress, sweep, Case, Failure, Profile, SweepMethod, SweepOptions,
};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Parser)]
#[command(about = "Crash-fuzz durable-agent: search, sweep, canaries, repro")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Crash-recovery search, then a crash-point sweep of the tour.
    Fuzz {
        /// ci | nightly | default (else `DA_PROFILE`).
        #[arg(long)]
        profile: Option<String>,
        /// Cases per search round (overrides the profile).
        #[arg(long)]
        cases: Option<u32>,
        /// Keep searching with fresh random seeds until this much time has
        /// passed (`90s`, `10m`, `2h`).
        #[arg(long)]
        time: Option<String>,
        /// Switch one canary on (snake_case name) to watch it get caught.
        #[arg(long)]
        canary: Option<String>,
    },
    /// Every canary: the search must catch it; prints cases needed.
    Canaries {
        #[arg(long)]
        profile: Option<String>,
    },
    /// Crash a case's ops (default: the 40-op tour) at every I/O point.
    Sweep {
        #[arg(long)]
        case: Option<PathBuf>,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Replay the sequence into every point instead of forking each
        /// point's crash image from one dry run (same verdicts, slower: the
        /// reference method).
        #[arg(long)]
        replay: bool,
    },
    /// Replay a saved case.
    Repro {
        #[arg(long)]
        case: PathBuf,
        #[arg(long)]
        sweep: bool,
    },
}

fn profile(name: Option<&str>) -> Result<Profile, String> {
    match name {
        None => Ok(Profile::from_env()),
        Some("ci") => Ok(Profile::ci()),
        Some("nightly") => Ok(Profile::nightly()),
        Some("default") | Some("local") => Ok(Profile::local()),
        Some(other) => Err(format!("unknown profile {other:?}: use ci, nightly or default")),
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use 90s, 10m, 2h)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("bad duration unit in {s:?} (use s, m or h)")),
    };
    Ok(Duration::from_secs(secs))
}

fn canary(name: &str) -> Result<Canary, String> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|_| {
        let names: Vec<String> = Canary::ALL
            .iter()
            .filter_map(|c| serde_json::to_value(c).ok())
            .map(|v| v.to_string())
            .collect();
        format!("unknown canary {name:?}; one of {}", names.join(", "))
    })
}

/// Sweep totals of a campaign.
#[derive(Default)]
struct Swept {
    sequences: u64,
    points: u64,
    judged: u64,
    time: Duration,
}

/// One round's sweeps: the tour (first round only: it is deterministic),
/// then `p.sweeps` generated sequences from `seed`, every point and mode,
/// stopping at the first failure.
fn sweep_round(
    p: &Profile,
    round: u32,
    seed: u64,
    canaries: &Canaries,
    swept: &mut Swept,
) -> Option<Box<Failure>> {
    let started = Instant::now();
    let mut sequences = Vec::new();
    if round == 1 {
        sequences.push(Case {
            seed: 7,
            ops: tour(),
            canaries: canaries.clone(),
            crash_at: None,
        });
    }
    for mut case in generated(seed, p.sweeps as usize, p.max_steps) {
        case.canaries = canaries.clone();
        sequences.push(case);
    }
    let options = SweepOptions {
        stop_at_first: true,
        rot_every: p.rot_every,
        ..SweepOptions::default()
    };
    let bar = ProgressBar::new(sequences.len() as u64);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} sequences") {
        bar.set_style(style);
    }
    bar.set_prefix(format!("sweep ({}, round {round})", p.name));
    let mut failure = None;
    for case in &sequences {
        let s = sweep(case.seed, &case.ops, &case.canaries, &options);
        swept.sequences += 1;
        swept.points += s.points;
        swept.judged += s.runs;
        bar.inc(1);
        if let Some(f) = s.failures.into_iter().next() {
            failure = Some(f);
            break;
        }
    }
    bar.finish_and_clear();
    swept.time += started.elapsed();
    failure
}

fn fuzz(
    mut p: Profile,
    cases: Option<u32>,
    time: Option<Duration>,
    canaries: Canaries,
) -> Result<bool, String> {
    if let Some(n) = cases {
        p.cases = n;
    }
    let started = Instant::now();
    let (mut total, mut points, mut restarts, mut round) = (0u64, 0u64, 0u64, 0u32);
    let mut search_time = Duration::ZERO;
    let mut swept = Swept::default();
    // Fixed in `ci`; otherwise drawn once and printed (each failure's case
    // file holds its own seed and ops, so it replays without this).
    let sweep_seed = p.seed.unwrap_or_else(rand::random);
    let failure = loop {
        round += 1;
        let bar = ProgressBar::new(u64::from(p.cases));
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} cases {per_sec} {msg}")
                .map_err(|e| e.to_string())?,
        );
        bar.set_prefix(format!("search ({}, round {round})", p.name));
        let searched = Instant::now();
        let out = search_with_progress(&p, &canaries, canaries == Canaries::none(), &|n| {
            bar.set_position(n)
        });
        bar.finish_and_clear();
        search_time += searched.elapsed();
        total += out.runs;
        points += out.points;
        restarts += out.restarts;
        if let Some(f) = out.failure {
            println!("{}", f.report());
            let first = out.first_failure_at.unwrap_or(out.runs);
            println!(
                "found at case {first} of round {round} ({total} runs with shrinking) in {:.1?}",
                started.elapsed()
            );
            return Ok(false);
        }
        let seed = sweep_seed.wrapping_add(u64::from(round - 1));
        let failure = sweep_round(&p, round, seed, &canaries, &mut swept);
        if failure.is_some() || time.is_none_or(|t| started.elapsed() >= t) {
            break failure;
        }
        p.seed = None; // later rounds explore fresh random seeds
    };
    let rate = |n: u64, t: Duration| n as f64 / t.as_secs_f64().max(1e-9);
    println!("\n== durable-agent-sim fuzz: summary ==");
    println!("profile    {} ({round} round(s)), canaries {canaries:?}", p.name);
    println!(
        "search     {total} cases, {restarts} crash/restart recoveries judged, {points} I/O points  ({:.0} cases/s)",
        rate(total, search_time)
    );
    println!(
        "sweep      {} sequences (the 40-op tour, then {} generated {}-op ones a round; sweep seed {sweep_seed:#x} + round - 1): {} I/O points x {} modes (PowerRot at 1 point in {}) = {} crash points judged  ({:.0} points/s, forked)",
        swept.sequences,
        p.sweeps,
        p.max_steps,
        swept.points,
        SweepOptions::default().kinds.len(),
        p.rot_every,
        swept.judged,
        rate(swept.judged, swept.time)
    );
    println!("modes      ProcessCrash, PowerLoss(Strict), PowerLoss(Eager), PowerRot (power loss + one flipped bit in a durable log line or record)");
    println!("failures   {}", usize::from(failure.is_some()));
    println!("time       {:.1?}", started.elapsed());
    if let Some(f) = failure {
        println!("{}", f.report());
        return Ok(false);
    }
    Ok(true)
}

fn run(cli: Cli) -> Result<bool, String> {
    match cli.command {
        Command::Fuzz {
            profile: name,
            cases,
            time,
            canary: c,
        } => {
            let canaries = match c {
                Some(name) => Canaries::only(canary(&name)?),
                None => Canaries::none(),
            };
            let time = time.as_deref().map(duration).transpose()?;
            fuzz(profile(name.as_deref())?, cases, time, canaries)
        }
        Command::Canaries { profile: name } => {
            let rows = canaries::run(&profile(name.as_deref())?, None);
            println!("canary                     result");
            for row in &rows {
                println!("{row}");
            }
            Ok(rows.iter().all(|r| matches!(r.verdict, Verdict::Caught { .. })))
        }
        Command::Sweep { case, seed, replay } => {
            let (seed, ops, canaries) = match case {
                Some(path) => {
                    let text =
                        std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                    let c: Case =
                        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                    (c.seed, c.ops, c.canaries)
                }
                None => (seed, tour(), Canaries::none()),
            };
            let options = SweepOptions {
                method: if replay {
                    SweepMethod::Replay
                } else {
                    SweepMethod::Fork
                },
                ..SweepOptions::default()
            };
            let started = std::time::Instant::now();
            let s = sweep(seed, &ops, &canaries, &options);
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            println!(
                "swept {} points × {} crash modes = {} crash points judged ({:?}), {} crashes hit, {} failing, {:.1}s ({:.0} points/s)",
                s.points,
                options.kinds.len(),
                s.runs,
                options.method,
                s.crashes,
                s.failures.len(),
                secs,
                s.runs as f64 / secs
            );
            if let Some(f) = s.failures.first() {
                println!("{}", f.report());
            }
            Ok(s.failures.is_empty())
        }
        Command::Repro { case, sweep } => {
            let (passed, out) = replay(&case, sweep)?;
            println!("{out}");
            Ok(passed)
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
