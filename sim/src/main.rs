//! `durable-agent-sim`: the fuzz campaign CLI (what the README's first
//! command runs).
//!
//! ```text
//! durable-agent-sim fuzz [--profile ci|nightly|default] [--cases N] [--time 10m] [--canary no_dir_fsync]
//!                        [--jobs N] [--seed S] [--json FILE]
//! durable-agent-sim canaries [--profile ci]   (default profile: random seed)
//! durable-agent-sim sweep [--case FILE] [--seed N] [--replay] [--report FILE.html]
//! durable-agent-sim repro --case FILE [--sweep]
//! durable-agent-sim soak --kill|--power-cut [--time 60s] [--seed N] [--min-crashes 30] [--bin PATH]
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
use std::time::Duration;

use clap::{Parser, Subcommand};
use durable_agent::canary::Canaries;
use durable_agent_sim::canaries::{self, Verdict};
use durable_agent_sim::fuzz::{self, FuzzArgs};
use durable_agent_sim::replay::replay;
use durable_agent_sim::sweep_report;
use durable_agent_sim::tour::tour;
use durable_agent_sim::{sweep, Case, Profile, SweepMethod, SweepOptions};

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
        /// Worker processes, each a campaign with its own seed (default:
        /// every core; for the `ci` profile the PR gate's one
        /// derandomized campaign, its search and its sweeps in two
        /// processes on two cores: `--jobs 1` runs it in one).
        #[arg(long)]
        jobs: Option<u32>,
        /// Campaign seed (decimal or 0x-hex): replays a whole campaign
        /// (with the same --jobs, profile, budget and canary).
        #[arg(long, value_parser = seed_arg)]
        seed: Option<u64>,
        /// Also write the summary as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Recover every swept crash image, even one whose disk and world
        /// equal an earlier one's of the same phase (for measuring the
        /// verdict cache, and for doubting it).
        #[arg(long)]
        no_verdict_cache: bool,
    },
    /// A `fuzz --jobs` worker (internal: started by `fuzz`).
    #[command(hide = true)]
    Worker {
        #[arg(long)]
        spec: String,
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
        /// Recover every forked point, even one whose rebooted disk and
        /// world equal an earlier point's of the same phase (the verdict
        /// cache off: for measuring it, and for doubting it).
        #[arg(long)]
        no_verdict_cache: bool,
        /// Also write a picture of the sweep (one self-contained HTML
        /// page: every point x mode coloured by verdict, labels and trace
        /// on hover, failing cells' repro commands); forked.
        #[arg(long, value_name = "FILE.html")]
        report: Option<PathBuf>,
    },
    /// Replay a saved case.
    Repro {
        #[arg(long)]
        case: PathBuf,
        #[arg(long)]
        sweep: bool,
    },
    /// Soak the real binary: `serve` under a seeded API workload, crashed
    /// again and again, checked after every restart (see `soak` docs).
    #[cfg(not(madsim))]
    Soak(SoakArgs),
}

#[cfg(not(madsim))]
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("crash").required(true).args(["kill", "power_cut"])))]
struct SoakArgs {
    /// Crash by SIGKILL on a plain directory (the page cache survives).
    #[arg(long)]
    kill: bool,
    /// Crash by SIGKILL and a power cut: the root lives on a FUSE mount
    /// that drops what was never fsynced (SimFs's PowerLoss choices; needs
    /// /dev/fuse and root, and fails loudly without them).
    #[arg(long)]
    power_cut: bool,
    /// Start no new crash after this long (`90s`, `10m`).
    #[arg(long, default_value = "60s")]
    time: String,
    /// The workload's seed (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Fail unless at least this many crashes were survived.
    #[arg(long, default_value_t = 0)]
    min_crashes: u64,
    /// Stop after this many crashes, even with time left.
    #[arg(long)]
    max_crashes: Option<u64>,
    /// Start a fresh root after this many crashes.
    #[arg(long, default_value_t = 100)]
    crashes_per_root: u64,
    /// The `durable-agent` binary (default: next to this one).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Keep logs, configs and roots here (default: a temp dir, kept only
    /// on failure).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Switch one canary on in a `--features canaries` build of the binary.
    #[arg(long)]
    canary: Option<String>,
    /// One line per crash on stderr.
    #[arg(long, short)]
    verbose: bool,
}

#[cfg(not(madsim))]
fn soak(args: SoakArgs) -> Result<bool, String> {
    use durable_agent_sim::soak::{self, Crash, Kill, PowerCut, SoakOptions};
    let bin = soak::serve::locate(args.bin.as_deref())?;
    if let Some(dir) = &args.work_dir {
        if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
            return Err(format!(
                "--work-dir {}: not empty (each soak starts from nothing)",
                dir.display()
            ));
        }
    }
    let temp = match &args.work_dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("da-soak-")
                .tempdir()
                .map_err(|e| format!("cannot create a temp dir: {e}"))?,
        ),
    };
    let work_dir = match (&args.work_dir, &temp) {
        (Some(dir), _) => dir.clone(),
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => return Err("no work dir".into()),
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let options = SoakOptions {
        seed,
        time: duration(&args.time)?,
        min_crashes: args.min_crashes,
        max_crashes: args.max_crashes,
        crashes_per_root: args.crashes_per_root.max(1),
        bin: bin.clone(),
        work_dir: work_dir.clone(),
        canary: args.canary.clone(),
        verbose: args.verbose,
    };
    let mut crash: Box<dyn Crash> = if args.power_cut {
        Box::new(PowerCut::new(&work_dir.join("data"), seed)?)
    } else {
        Box::new(Kill::new(&work_dir.join("data"))?)
    };
    eprintln!(
        "soak --{}: seed {seed}, {} on {}",
        crash.name(),
        bin.display(),
        work_dir.display()
    );
    let report = soak::run(&options, crash.as_mut());
    println!("{}", report.summary(options.min_crashes));
    let passed = report.passed(options.min_crashes);
    if !passed {
        if let Some(t) = temp {
            // Keep the evidence: logs, roots, configs.
            println!("work dir kept: {}", t.keep().display());
        }
        println!(
            "repro: durable-agent-sim soak --{} --seed {seed} --time {} --bin {}{}",
            report.crash,
            args.time,
            bin.display(),
            args.canary.map(|c| format!(" --canary {c}")).unwrap_or_default()
        );
    }
    Ok(passed)
}

fn profile(name: Option<&str>) -> Result<Profile, String> {
    Profile::named(name)
}

fn seed_arg(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => s.replace('_', "").parse(),
    }
    .map_err(|_| format!("bad seed {s:?} (decimal or 0x-hex)"))
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

fn run(cli: Cli) -> Result<bool, String> {
    match cli.command {
        Command::Fuzz {
            profile: name,
            cases,
            time,
            canary: c,
            jobs,
            seed,
            json,
            no_verdict_cache,
        } => {
            let canaries = match &c {
                Some(name) => Canaries::only(canaries::parse(name)?),
                None => Canaries::none(),
            };
            fuzz::fuzz(FuzzArgs {
                profile: profile(name.as_deref())?,
                cases,
                budget: time.as_deref().map(duration).transpose()?,
                canary_name: c,
                canaries,
                jobs,
                seed,
                json,
                no_verdict_cache,
            })
        }
        Command::Worker { spec } => fuzz::worker(&spec),
        Command::Canaries { profile: name } => {
            let rows = canaries::run(&profile(name.as_deref())?, None);
            println!("canary                     result");
            for row in &rows {
                println!("{row}");
            }
            Ok(rows.iter().all(|r| {
                matches!(
                    r.verdict,
                    Verdict::Caught { .. } | Verdict::RealFsOnly | Verdict::WorkerOnly
                )
            }))
        }
        Command::Sweep {
            case,
            seed,
            replay,
            no_verdict_cache,
            report,
        } => {
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
                recheck_every: if no_verdict_cache {
                    0
                } else {
                    durable_agent_sim::verdicts::DEFAULT_RECHECK_EVERY
                },
                ..SweepOptions::default()
            };
            if let Some(path) = report {
                if replay {
                    return Err("--report maps a forked sweep; drop --replay".into());
                }
                return sweep_report(seed, &ops, &canaries, &options, &path);
            }
            let started = std::time::Instant::now();
            let s = sweep(seed, &ops, &canaries, &options);
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            println!(
                "swept {} points × {} crash modes = {} crash points judged ({:?}; {} verdicts reused, {} re-judged), {} crashes hit, {} failing, {:.1}s ({:.0} points/s)",
                s.points,
                options.kinds.len(),
                s.runs,
                options.method,
                s.reused,
                s.rechecked,
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
        #[cfg(not(madsim))]
        Command::Soak(args) => soak(args),
    }
}

/// `sweep --report`: the sweep, mapped and written as HTML.
fn sweep_report(
    seed: u64,
    ops: &[durable_agent_sim::op::Op],
    canaries: &Canaries,
    options: &SweepOptions,
    path: &std::path::Path,
) -> Result<bool, String> {
    let started = std::time::Instant::now();
    let (map, s) = match sweep_report::map_sweep(seed, ops, canaries, &options.kinds) {
        Ok(done) => done,
        Err(f) => {
            println!("the dry run failed, nothing to map:\n{}", f.report());
            return Ok(false);
        }
    };
    let title = format!("{} ops, seed {seed}", map.ops.len().saturating_sub(1));
    let html = sweep_report::render_html(&map, &title);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, html).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "swept {} points × {} crash modes = {} crash points judged (Fork), {} failing, {:.1}s; report: {}",
        s.points,
        options.kinds.len(),
        s.runs,
        s.failures.len(),
        started.elapsed().as_secs_f64(),
        path.display()
    );
    if let Some(f) = s.failures.first() {
        println!("{}", f.report());
    }
    Ok(s.failures.is_empty())
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
