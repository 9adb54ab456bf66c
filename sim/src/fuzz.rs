//! The `fuzz` command: one campaign in this process (`--jobs 1`, the `ci`
//! profile's default: the PR gate's single derandomized run) or one per
//! worker process ([`crate::jobs`]), one progress bar, one summary, and
//! optionally the summary as JSON for CI (`--json FILE`).
//!
//! Invariant: the campaign seed is printed on every run, and the summary's
//! `replay` command (`--seed S --jobs N` with the same profile, budget and
//! canary) reruns the very same campaigns, worker by worker.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use durable_agent::canary::Canaries;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::campaign::{self, Found, Outcome, Plan, Progress, Stages, Totals};
use crate::jobs::{run_workers, Message, WorkerSpec};
use crate::profile::Profile;
use crate::sweep::SweepOptions;

/// What `fuzz` was asked to do.
#[derive(Debug, Clone)]
pub struct FuzzArgs {
    pub profile: Profile,
    pub cases: Option<u32>,
    pub budget: Option<Duration>,
    /// The canary's snake_case name, if one is on.
    pub canary_name: Option<String>,
    pub canaries: Canaries,
    /// `None`: 1 for the `ci` profile (split over two processes when
    /// there are two cores), else every core.
    pub jobs: Option<u32>,
    /// `None`: the profile's (`ci`'s fixed one) or a random one.
    pub seed: Option<u64>,
    pub json: Option<PathBuf>,
    /// Recover every swept crash image (the verdict cache off).
    pub no_verdict_cache: bool,
}

/// One worker's line in the summary.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSummary {
    pub index: u32,
    pub seed: u64,
    /// `None`: it ended without a summary (stopped, or died).
    pub totals: Option<Totals>,
    pub stopped: bool,
    pub status: String,
}

/// The machine-readable summary (`--json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub profile: String,
    pub seed: u64,
    pub jobs: u32,
    /// One campaign whose search and sweeps ran in two processes.
    #[serde(default)]
    pub split: bool,
    pub canaries: Canaries,
    pub budget_secs: Option<u64>,
    pub wall_secs: f64,
    /// Summed over workers.
    pub totals: Totals,
    /// Search cases per second of wall time, all workers together.
    pub cases_per_sec: f64,
    /// Restarts the oracle judged in the search per second of wall time.
    pub restarts_per_sec: f64,
    /// Sweep crash points judged per second of wall time.
    pub judged_per_sec: f64,
    pub workers: Vec<WorkerSummary>,
    pub failures: Vec<Found>,
    /// The command that reruns these campaigns.
    pub replay: String,
    pub passed: bool,
}

/// Run the `fuzz` command; `Ok(true)`: nothing found.
pub fn fuzz(args: FuzzArgs) -> Result<bool, String> {
    let mut profile = args.profile.clone();
    if let Some(n) = args.cases {
        profile.cases = n;
    }
    if args.no_verdict_cache {
        profile.recheck_every = 0;
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| if profile.name == "ci" { 1 } else { cores() })
        .max(1);
    // The `ci` profile's one round, unless told `--jobs`: its search and
    // its sweeps in two processes when there are two cores (the same
    // verdicts as one process: see `campaign`), so the PR gate's run
    // takes the longer of the two instead of their sum.
    let split = args.jobs.is_none() && profile.name == "ci" && args.budget.is_none() && cores() >= 2;
    let seed = args.seed.or(profile.seed).unwrap_or_else(rand::random);
    let budget_secs = args.budget.map(|b| b.as_secs());
    let replay = replay_command(&args, &profile, seed, jobs);
    let how = if split {
        "search and sweeps in two processes".to_string()
    } else {
        format!("{jobs} job(s)")
    };
    println!(
        "fuzz: profile {}, {how}, campaign seed {seed:#x}\n  replay: {replay}",
        profile.name
    );
    let bar = progress_bar(&profile, &how)?;
    let started = Instant::now();
    let mut workers = Vec::new();
    let mut failures = Vec::new();
    if jobs == 1 && !split {
        let plan = Plan {
            profile: profile.clone(),
            seed,
            canaries: args.canaries.clone(),
            budget: args.budget,
            stages: Stages::Both,
        };
        let out = campaign::run(&plan, &|p| show(&bar, &[p]));
        failures.extend(out.found.clone());
        workers.push(WorkerSummary {
            index: 0,
            seed,
            totals: Some(out.totals),
            stopped: false,
            status: "in process".into(),
        });
    } else {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let spec = |index, seed, stages| WorkerSpec {
            index,
            profile: profile.name.to_string(),
            cases: args.cases,
            seed,
            canary: args.canary_name.clone(),
            budget_secs,
            no_verdict_cache: args.no_verdict_cache,
            stages,
        };
        let specs: Vec<WorkerSpec> = if split {
            // One campaign: both halves keep its seed.
            vec![spec(0, seed, Stages::Search), spec(1, seed, Stages::Sweeps)]
        } else {
            (0..jobs)
                .map(|index| spec(index, campaign::worker_seed(seed, index), Stages::Both))
                .collect()
        };
        for r in run_workers(&exe, &specs, |all| show(&bar, all))? {
            let index = r.spec.index;
            match &r.outcome {
                Some(o) => failures.extend(o.found.clone()),
                None if !r.stopped => failures.push(Found {
                    campaign_seed: r.spec.seed,
                    round: r.progress.round,
                    stage: "worker".into(),
                    what: format!("worker {index} ended ({}) without a summary", r.status),
                    case_seed: 0,
                    repro: replay.clone(),
                    report: format!(
                        "worker {index} (campaign seed {:#x}) ended ({}) without reporting; \
                         its stderr is above; rerun the campaign with: {replay}",
                        r.spec.seed, r.status
                    ),
                }),
                None => {}
            }
            workers.push(WorkerSummary {
                index,
                seed: r.spec.seed,
                totals: r.outcome.map(|o| o.totals),
                stopped: r.stopped,
                status: r.status,
            });
        }
    }
    bar.finish_and_clear();
    let wall_secs = started.elapsed().as_secs_f64();
    let mut totals = Totals::default();
    for w in &workers {
        if let Some(t) = &w.totals {
            totals.add(t);
        }
    }
    let per_sec = |n: u64| n as f64 / wall_secs.max(1e-9);
    let summary = Summary {
        profile: profile.name.to_string(),
        seed,
        jobs,
        split,
        canaries: args.canaries.clone(),
        budget_secs,
        wall_secs,
        totals,
        cases_per_sec: per_sec(totals.cases),
        restarts_per_sec: per_sec(totals.restarts),
        judged_per_sec: per_sec(totals.judged),
        workers,
        passed: failures.is_empty(),
        failures,
        replay,
    };
    print_summary(&summary, &profile);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
        std::fs::write(path, json + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("json       {}", path.display());
    }
    Ok(summary.passed)
}

/// The hidden `worker` subcommand: run the campaign `spec` describes and
/// report on stdout as JSON lines ([`Message`]).
pub fn worker(spec: &str) -> Result<bool, String> {
    let spec: WorkerSpec = serde_json::from_str(spec).map_err(|e| format!("bad worker spec: {e}"))?;
    let mut profile = Profile::named(Some(&spec.profile))?;
    if let Some(n) = spec.cases {
        profile.cases = n;
    }
    if spec.no_verdict_cache {
        profile.recheck_every = 0;
    }
    let canaries = match &spec.canary {
        Some(name) => Canaries::only(crate::canaries::parse(name)?),
        None => Canaries::none(),
    };
    let plan = Plan {
        profile,
        seed: spec.seed,
        canaries,
        budget: spec.budget_secs.map(Duration::from_secs),
        stages: spec.stages,
    };
    // Progress at most every 100 ms: enough for a bar, cheap for a pipe.
    let last = std::sync::Mutex::new(Instant::now());
    let out: Outcome = campaign::run(&plan, &|p| {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= Duration::from_millis(100) {
            *last = Instant::now();
            if let Err(e) = Message::Progress(p).emit(&mut std::io::stdout().lock()) {
                // The parent's end of the pipe is closed: it was killed,
                // and nobody reads this campaign any more. Stop now rather
                // than run out the budget as an orphan (found killing a
                // `fuzz --jobs 2` by its pid: both workers ran on).
                eprintln!(
                    "worker {}: the parent stopped reading ({e}); stopping",
                    spec.index
                );
                std::process::exit(2);
            }
        }
    });
    let passed = out.found.is_none();
    Message::Done(out)
        .emit(&mut std::io::stdout().lock())
        .map_err(|e| format!("worker {}: cannot report: {e}", spec.index))?;
    Ok(passed)
}

fn cores() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

fn replay_command(args: &FuzzArgs, profile: &Profile, seed: u64, jobs: u32) -> String {
    let mut cmd = format!(
        "cargo run --release -p durable-agent-sim -- fuzz --profile {} --seed {seed:#x} --jobs {jobs}",
        profile.name
    );
    if let Some(n) = args.cases {
        cmd.push_str(&format!(" --cases {n}"));
    }
    if let Some(b) = args.budget {
        cmd.push_str(&format!(" --time {}s", b.as_secs()));
    }
    if let Some(c) = &args.canary_name {
        cmd.push_str(&format!(" --canary {c}"));
    }
    cmd
}

fn progress_bar(profile: &Profile, how: &str) -> Result<ProgressBar, String> {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{prefix} {elapsed_precise} {pos} cases ({per_sec}) {msg}")
            .map_err(|e| e.to_string())?,
    );
    bar.set_prefix(format!("fuzz ({}, {how})", profile.name));
    Ok(bar)
}

/// Merge every worker's latest progress into the one bar.
fn show(bar: &ProgressBar, all: &[Progress]) {
    let cases = all.iter().map(|p| p.cases).sum();
    let sequences: u64 = all.iter().map(|p| p.sequences).sum();
    let judged: u64 = all.iter().map(|p| p.judged).sum();
    let round = all.iter().map(|p| p.round).max().unwrap_or(0);
    bar.set_position(cases);
    bar.set_message(format!(
        "| {sequences} sequences swept, {judged} crash points judged | round {round}"
    ));
}

fn print_summary(s: &Summary, p: &Profile) {
    let t = &s.totals;
    let rounds: Vec<String> = s
        .workers
        .iter()
        .map(|w| {
            w.totals
                .map(|t| t.rounds.to_string())
                .unwrap_or_else(|| "-".into())
        })
        .collect();
    println!("\n== durable-agent-sim fuzz: summary ==");
    let how = if s.split {
        "its search and its sweeps in two processes".to_string()
    } else {
        format!("{} job(s), rounds per job: {}", s.jobs, rounds.join(" "))
    };
    println!(
        "profile    {} ({how}), canaries {:?}, campaign seed {:#x}",
        s.profile, s.canaries, s.seed
    );
    println!(
        "search     {} cases, {} crash/restart recoveries judged, {} I/O points  ({:.0} cases/s of wall time; {:.0} cases/s per job while searching)",
        t.cases,
        t.restarts,
        t.points,
        s.cases_per_sec,
        t.cases as f64 / t.search_secs.max(1e-9)
    );
    println!(
        "sweep      {} sequences (the 40-op tour, then {} generated {}-op ones a round): {} I/O points x {} modes = {} crash points judged  ({:.0} points/s of wall time; {:.0} points/s per job while sweeping, forked)",
        t.sequences,
        p.sweeps,
        p.max_steps,
        t.sweep_points,
        SweepOptions::default().kinds.len(),
        t.judged,
        s.judged_per_sec,
        // The sweep's own rate, as the search's: the wall-time rate above
        // also divides by the search's time, so it moves with the search.
        t.judged as f64 / t.sweep_secs.max(1e-9)
    );
    println!(
        "verdicts   {} crash states recovered, {} verdicts reused from an equal state of the same phase, {} of those re-judged: all equal",
        t.judged - t.reused + t.rechecked,
        t.reused,
        t.rechecked
    );
    println!(
        "verify     {} reports computed, {} answered by an equal disk's (1 in {} of those re-verified: all equal)",
        t.verify_misses,
        t.verify_hits,
        crate::driver::verified::RECHECK_EVERY
    );
    println!("modes      ProcessCrash, PowerLoss(Strict), PowerLoss(Eager), PowerLoss+BitRot (the last sampled per the profile's rot_every)");
    println!("rates      per second of wall time, all jobs together");
    println!("failures   {}", s.failures.len());
    println!("time       {:.1}s", s.wall_secs);
    for f in &s.failures {
        println!("{}", f.report);
    }
    if !s.failures.is_empty() {
        println!("replay the whole campaign: {}", s.replay);
    }
}
