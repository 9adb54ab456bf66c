//! The soak: the real `durable-agent serve` binary on a real directory,
//! killed again and again while a seeded workload drives its API, and
//! checked after every restart against what it acknowledged.
//!
//! One generation = one fresh root: start `serve`; then, per crash epoch,
//! check what the restarted daemon shows ([`check::after_restart`]),
//! sometimes start a second `serve` on the held root (it must refuse:
//! one writer per root), re-ask the turns whose answer a kill swallowed
//! (same work id: exactly once), answer the ledger's open confirmations
//! truthfully from the sink, issue a few ops, and crash the daemon by the
//! epoch's [`KillAt`] — idle (a trigger or schedule may be firing), a few
//! ms into a request (mid-turn), or the moment the sink receives a tool
//! call (mid-tool: the effect landed, its answer not yet). The [`Crash`]
//! backend then decides what the directory holds ([`Kill`]: all of it).
//! A generation ends after `crashes_per_root` crashes or when the time is
//! up: its schedules are deleted, every trigger must settle, `serve`
//! must stop cleanly on SIGTERM, and the root is opened with the library
//! for the deep check ([`check::final_state`]).
//!
//! Guarantees checked (the oracle's, see `sim/src/oracle.rs`):
//! acknowledged ops are present after every restart (agents, parents,
//! turns, triggers, schedules; messages pending or delivered, and each
//! acknowledged turn in its conversation exactly once, at the deep
//! check); nothing appears that was never asked for; no irreversible
//! action reaches the non-deduplicating sink twice, counted per
//! idempotency key and per logical action, against a mock LLM that
//! rewords every ask (I4 — needs confirmation is the allowed outcome
//! instead), and every email's key is a call of a logged `round.decided`
//! (no effect without a durable decision behind it); every acknowledged
//! trigger runs (DONE, or FAILED/DEAD with a reason) and its turn at most
//! once; no orphans (I1), nothing resident after boot (I2), every event
//! log valid JSONL (I3), the runtime's own invariants; a second `serve`
//! on a held root is refused.
//!
//! Invariant (determinism, as far as a real process allows): the ops, the
//! kill plans, the probes and every backend choice come from `--seed`
//! (generation `g` uses `seed + g`); what cannot be seeded is the
//! scheduler's timing, so a failure's repro command replays the same plan
//! and usually, not always, the same interleaving.

pub mod check;
pub mod crash;
pub mod expect;
pub mod plan;
pub mod power_cut;
pub mod report;
pub mod serve;
pub mod workload;
pub mod world;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use durable_agent_cli::access::Token;
use durable_agent_cli::api::Client;
use rand::Rng;
use serde_json::json;

use check::StatusView;
pub use crash::{Crash, Kill};
pub use plan::{KillAt, KillPlan};
pub use power_cut::PowerCut;
pub use report::SoakReport;
use serve::{Program, Serve};
use workload::{Op, Outcome, Workload};
use world::World;

/// Environment variable a `--features canaries` build of the binary reads
/// to switch one canary on (see `app/src/boot.rs`).
pub const CANARY_ENV: &str = "DURABLE_AGENT_CANARY";

/// How long the API client waits for one answer.
const API_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the end of a generation waits for its triggers to settle.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub seed: u64,
    /// Stop starting new crash epochs after this long.
    pub time: Duration,
    /// Fail unless at least this many crashes were survived.
    pub min_crashes: u64,
    /// Stop after this many crashes (tests), even with time left.
    pub max_crashes: Option<u64>,
    /// A fresh root after this many crashes (bounds boot time and memory).
    pub crashes_per_root: u64,
    /// The binary (a copy is taken into `work_dir`).
    pub bin: PathBuf,
    /// Logs, configs and the binary's copy.
    pub work_dir: PathBuf,
    /// One canary for a `--features canaries` build of the binary.
    pub canary: Option<String>,
    /// One line per crash on stderr.
    pub verbose: bool,
}

/// A check failed: the message for the report.
struct Failed(String);

impl From<String> for Failed {
    fn from(s: String) -> Failed {
        Failed(s)
    }
}

/// Run the soak with `crash` as the way the daemon dies.
pub fn run(options: &SoakOptions, crash: &mut dyn Crash) -> SoakReport {
    let started = Instant::now();
    let mut report = SoakReport {
        crash: crash.name().to_string(),
        seed: options.seed,
        ..SoakReport::default()
    };
    let result = soak(options, crash, &mut report, started);
    report.elapsed = started.elapsed();
    if let Err(e) = crash.finish() {
        report
            .failure
            .get_or_insert(format!("{} backend: {e}", crash.name()));
    }
    if let Err(Failed(why)) = result {
        report.failure = Some(why);
    }
    report
}

fn soak(
    options: &SoakOptions,
    crash: &mut dyn Crash,
    report: &mut SoakReport,
    started: Instant,
) -> Result<(), Failed> {
    let bin = serve::snapshot(&options.bin, &options.work_dir.join("bin"))?;
    let logs = options.work_dir.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    let budget = Budget {
        started,
        time: options.time,
        max_crashes: options.max_crashes,
    };
    let mut generation = 0u64;
    while generation == 0 || !budget.up(report.crashes) {
        generation += 1;
        report.generations = generation;
        let gen = Generation::start(options, crash, &bin, &logs, generation)?;
        gen.run(options, crash, report, &budget)?;
    }
    Ok(())
}

/// When to stop starting crash epochs.
struct Budget {
    started: Instant,
    time: Duration,
    max_crashes: Option<u64>,
}

impl Budget {
    fn up(&self, crashes: u64) -> bool {
        self.started.elapsed() >= self.time || self.max_crashes.is_some_and(|m| crashes >= m)
    }
}

/// One root's life.
struct Generation {
    number: u64,
    world: Arc<World>,
    program: Program,
    root: PathBuf,
    log: PathBuf,
    api: Client,
    workload: Workload,
    /// Markers of every turn, trigger and schedule issued.
    issued: BTreeSet<String>,
    /// Idempotency keys already answered with `/confirm`.
    confirmed: BTreeSet<String>,
    /// Ledger entries already counted as verified.
    verified: BTreeSet<usize>,
}

impl Generation {
    fn start(
        options: &SoakOptions,
        crash: &mut dyn Crash,
        bin: &Path,
        logs: &Path,
        number: u64,
    ) -> Result<Generation, Failed> {
        let world = Arc::new(World::start(options.seed.wrapping_add(number))?);
        let root = crash.data_dir().join(format!("root-{number}"));
        let api_addr = world::free_api_addr()?;
        let config = world.write_config(
            &options.work_dir.join(format!("agent-{number}.toml")),
            &root,
            api_addr,
        )?;
        let mut env: Vec<(String, String)> = options
            .canary
            .iter()
            .map(|c| (CANARY_ENV.to_string(), c.clone()))
            .collect();
        // The API's token, from the variable the config names.
        env.push((world::TOKEN_ENV.to_string(), world::TOKEN.to_string()));
        Ok(Generation {
            number,
            world,
            program: Program {
                bin: bin.to_path_buf(),
                config,
                env,
            },
            root,
            log: logs.join(format!("serve-{number}.log")),
            api: Client::new(api_addr, API_TIMEOUT).with_token(Token::new(world::TOKEN)),
            workload: Workload::new(options.seed.wrapping_add(number)),
            issued: BTreeSet::new(),
            confirmed: BTreeSet::new(),
            verified: BTreeSet::new(),
        })
    }

    fn boot(&self, options: &SoakOptions, epoch: u64) -> Result<Serve, Failed> {
        append_log(
            &self.log,
            &format!("=== soak: start, generation {} epoch {epoch}", self.number),
        );
        let serve = self.program.start(&self.log)?;
        if let Some(canary) = &options.canary {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if !text.contains(&format!("canary on: {canary}")) {
                return Err(Failed(format!(
                    "asked for canary {canary} but the binary did not switch it on (build it with `cargo build -p durable-agent-cli --features canaries`)"
                )));
            }
        }
        Ok(serve)
    }

    fn run(
        mut self,
        options: &SoakOptions,
        crash: &mut dyn Crash,
        report: &mut SoakReport,
        budget: &Budget,
    ) -> Result<(), Failed> {
        let mut serve = self.boot(options, 0)?;
        let mut epoch = 0u64;
        loop {
            if let Err(Failed(e)) = self.after_restart(report, &serve) {
                let _ = serve.kill();
                return Err(Failed(self.context(epoch, e)));
            }
            if epoch >= options.crashes_per_root || budget.up(report.crashes) {
                break;
            }
            epoch += 1;
            let rng = self.workload.rng();
            let probe = epoch == 1 || rng.random_ratio(1, 8);
            let plan = KillPlan::draw(rng);
            if probe {
                self.program.probe_lock().map_err(|e| self.context(epoch, e))?;
                report.lock_probes += 1;
            }
            if let Err(Failed(e)) = self.epoch(report, &serve, plan) {
                let _ = serve.kill();
                return Err(Failed(self.context(epoch, e)));
            }
            serve.kill().map_err(|e| self.context(epoch, e))?;
            let note = crash
                .after_kill(crash_seed(options.seed, self.number, epoch))
                .map_err(|e| self.context(epoch, format!("{} backend: {e}", crash.name())))?;
            report.crashes += 1;
            if options.verbose {
                eprintln!(
                    "soak: crash {} (generation {}, epoch {epoch}, {plan:?}): {note}",
                    report.crashes, self.number
                );
            }
            serve = self
                .boot(options, epoch)
                .map_err(|Failed(e)| self.context(epoch, e))?;
        }
        let at = format!(
            "the end of generation {} (root {}, kept)\n  serve log: {}",
            self.number,
            self.root.display(),
            self.log.display()
        );
        self.finish(report, serve)
            .map_err(|Failed(e)| Failed(format!("{e}\n  at: {at}")))
    }

    /// A failure message with where it happened.
    fn context(&self, epoch: u64, what: String) -> String {
        format!(
            "{what}\n  at: generation {} (root {}), after crash {epoch}\n  serve log: {}\n  last ops:\n{}",
            self.number,
            self.root.display(),
            self.log.display(),
            self.last_ops(8)
        )
    }

    fn status(&self) -> Result<StatusView, Failed> {
        self.api
            .call("GET", "/status", None)
            .map(|v| StatusView::parse(&v))
            .map_err(|e| Failed(format!("GET /status after a restart: {e}")))
    }

    /// The checks after a (re)start, then the housekeeping an operator
    /// would do: re-ask lost turns, answer confirmations.
    fn after_restart(&mut self, report: &mut SoakReport, serve: &Serve) -> Result<(), Failed> {
        let seen = self.status()?;
        let (checked, violations) = check::after_restart(&self.workload, &seen);
        report.promises_checked += checked.promises;
        self.check_sink()?;
        if let Some(v) = violations.first() {
            return Err(Failed(format!(
                "after restart: {v} (and {} more)",
                violations.len() - 1
            )));
        }
        self.count_verified(report);
        self.workload.observe(seen.agents.keys().cloned());
        if !seen.needs_confirmation.is_empty() {
            // An honest answer needs every send the dead daemon made on
            // record: one may still queue behind a delayed reply (the
            // gate's kill soak, seed 1, answered "not delivered" too soon).
            self.world
                .sink
                .settle(std::time::Duration::from_secs(10))
                .map_err(|e| Failed(format!("settling the sink before confirmations: {e}")))?;
        }
        for key in seen.needs_confirmation {
            if self.confirmed.insert(key.clone()) {
                let delivered = self.world.sink.deliveries_for(&key) > 0;
                let body = json!({"idem_key": key, "delivered": delivered, "provider_ref": "soak: the sink's record"});
                self.api
                    .call("POST", "/confirm", Some(&body))
                    .map_err(|e| format!("confirming {key}: {e}"))?;
                report.confirmations += 1;
            }
        }
        for i in self.workload.unknown_turns() {
            let op = self.workload.ledger[i].op.clone();
            let (method, path, body) = op.request();
            let outcome = workload::outcome(self.api.call(method, &path, body.as_ref()));
            if let Some(v) = check::refusal(&self.workload, &op, &outcome) {
                return Err(Failed(v));
            }
            match outcome {
                Outcome::Acked(v) => {
                    report.turns_retried += 1;
                    report.ops_unknown -= 1;
                    report.ops_acked += 1;
                    self.workload.ledger[i].outcome = Outcome::Acked(v);
                }
                Outcome::Refused { .. } => {
                    // Its agent is gone (an unknown delete): stays unknown.
                    self.workload.ledger[i].outcome = Outcome::Unknown("re-asked: refused".into());
                }
                Outcome::Unknown(e) => {
                    if serve.exited().is_some() {
                        return Err(Failed(format!("serve died on its own re-asking {op:?}: {e}")));
                    }
                    return Err(Failed(format!(
                        "re-asking {op:?} with no crash in flight failed: {e}"
                    )));
                }
            }
        }
        Ok(())
    }

    fn check_sink(&self) -> Result<(), Failed> {
        let deliveries = self.world.sink.deliveries();
        match check::sink(&deliveries, &self.issued).first() {
            Some(v) => Err(Failed(v.clone())),
            None => Ok(()),
        }
    }

    fn count_verified(&mut self, report: &mut SoakReport) {
        for (i, r) in self.workload.ledger.iter().enumerate() {
            if matches!(r.outcome, Outcome::Acked(_))
                && !matches!(r.op, Op::Message { .. })
                && self.verified.insert(i)
            {
                report.acked_checked += 1;
            }
        }
    }

    fn issue(
        &mut self,
        report: &mut SoakReport,
        op: Op,
        epoch_kill: Option<(KillAt, &Serve)>,
    ) -> Result<bool, Failed> {
        if let Op::Turn { marker, .. } | Op::Emit { marker, .. } | Op::AddSchedule { marker, .. } = &op {
            self.issued.insert(marker.clone());
        }
        let (method, path, body) = op.request();
        let killer = epoch_kill.map(|(at, serve)| {
            let killer = serve.killer();
            let done = Arc::new(AtomicBool::new(false));
            let world = Arc::clone(&self.world);
            let base = world.sink.requests();
            let flag = Arc::clone(&done);
            let handle = std::thread::spawn(move || {
                match at {
                    KillAt::MidRequest { delay_ms } => std::thread::sleep(Duration::from_millis(delay_ms)),
                    KillAt::MidOp { delay_us } => std::thread::sleep(Duration::from_micros(delay_us)),
                    KillAt::MidTool => {
                        while world.sink.requests() == base && !flag.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_micros(500));
                        }
                    }
                    KillAt::Idle { .. } => {}
                }
                killer.kill();
                world.sink.requests() > base
            });
            (handle, done)
        });
        let result = self.api.call(method, &path, body.as_ref());
        let mut cut = false;
        if let Some((handle, done)) = killer {
            done.store(true, Ordering::SeqCst);
            let tool_seen = handle.join().unwrap_or(false);
            cut = result.is_err();
            if cut {
                report.crashes_mid_request += 1;
                report.crashes_mid_tool += u64::from(tool_seen);
            }
        }
        let outcome = workload::outcome(result);
        if let Some(v) = check::refusal(&self.workload, &op, &outcome) {
            return Err(Failed(v));
        }
        match &outcome {
            Outcome::Acked(_) => report.ops_acked += 1,
            Outcome::Refused { .. } => report.ops_refused += 1,
            Outcome::Unknown(_) => report.ops_unknown += 1,
        }
        if !cut && matches!(outcome, Outcome::Unknown(_)) {
            return Err(Failed(format!(
                "{op:?} failed with no crash in flight: {outcome:?}"
            )));
        }
        self.workload.record(op, outcome, self.number);
        Ok(cut)
    }

    /// A few ops, then the crash the plan says (the caller reaps).
    fn epoch(&mut self, report: &mut SoakReport, serve: &Serve, plan: KillPlan) -> Result<(), Failed> {
        for _ in 0..plan.ops_before {
            let op = self.workload.next_op(false);
            self.issue(report, op, None)?;
        }
        match plan.at {
            KillAt::Idle { delay_ms } => {
                std::thread::sleep(Duration::from_millis(delay_ms));
                serve.killer().kill();
            }
            at => {
                let op = self.workload.next_op(!matches!(at, KillAt::MidOp { .. }));
                self.issue(report, op, Some((at, serve)))?;
            }
        }
        Ok(())
    }

    /// The end of a root: no new work, every trigger settles, a clean
    /// stop, the deep check.
    fn finish(mut self, report: &mut SoakReport, serve: Serve) -> Result<(), Failed> {
        let schedules: Vec<String> = check::StatusView::parse(
            &self
                .api
                .call("GET", "/status", None)
                .map_err(|e| format!("GET /status: {e}"))?,
        )
        .schedules
        .into_iter()
        .collect();
        for id in schedules {
            self.issue(report, Op::DeleteSchedule { id }, None)?;
        }
        let started = Instant::now();
        let settled = loop {
            let seen = self.status()?;
            let open = seen.unsettled();
            if open.is_empty() {
                break seen;
            }
            if started.elapsed() > SETTLE_DEADLINE {
                let _ = serve.kill();
                return Err(Failed(format!(
                    "triggers never settled within {SETTLE_DEADLINE:?} (lost?): {open:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        self.check_sink()?;
        serve.stop()?;
        let deliveries = self.world.sink.deliveries();
        report.irreversible_delivered +=
            deliveries.iter().filter(|d| d.request.path == "/send").count() as u64;
        report.model_asks += self.world.mock.request_bodies().len() as u64;
        let (checked, violations) = check::final_state(
            &self.workload,
            &self.program.config,
            &self.root,
            &deliveries,
            &settled,
        );
        report.promises_checked += checked.promises;
        if let Some(v) = violations.first() {
            return Err(Failed(format!(
                "deep check: {v} (and {} more)",
                violations.len() - 1
            )));
        }
        for (i, r) in self.workload.ledger.iter().enumerate() {
            if matches!(r.outcome, Outcome::Acked(_)) && self.verified.insert(i) {
                report.acked_checked += 1;
            }
        }
        Ok(())
    }

    fn last_ops(&self, n: usize) -> String {
        let ledger = &self.workload.ledger;
        ledger[ledger.len().saturating_sub(n)..]
            .iter()
            .map(|r| format!("    {:?} -> {:?}", r.op, r.outcome))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The seed of crash `epoch` of `generation` (the backend's choices).
pub fn crash_seed(seed: u64, generation: u64, epoch: u64) -> u64 {
    seed ^ generation.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ epoch.wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

fn append_log(log: &Path, line: &str) {
    use std::io::Write;
    // Best effort: the log is for a human after a failure.
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "{line}");
    }
}
