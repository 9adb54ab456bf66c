//! Deterministic simulation of the daemon under madsim: the daemon users
//! run, [`durable_agent::worker::Worker`], driven by simulated clients,
//! simulated provider and tool latency and simulated time.
//!
//! One madsim node runs the worker on a [`durable_agent::fs::SimFs`]
//! (madsim has no disk model: SimFs is the disk) with a driver like
//! `serve`'s ([`node`]): requests in from a channel, each call performed by
//! a task of its own after a seeded latency, a scheduler pass whenever the
//! worker's timeout passes. Simulated API clients ([`clients`]) on another
//! node issue the real request types — agents created and deleted, turns
//! with work ids (retried after an unknown outcome, and again after an
//! answer), messages, triggers with delays (emitted again after an unknown
//! outcome, and as duplicates), recurring schedules, confirmations,
//! retries of DEAD and FAILED triggers, status, GC — steering toward the
//! kinds a run has not acknowledged yet ([`coverage`]). The supervisor
//! stops the node (SIGTERM: the worker drains its calls) or kills it at
//! simulated instants drawn from the seed — right away, a seeded number of
//! I/O points later (mid-operation), or aimed at a one-time trigger's turn
//! in flight ([`TurnPhase`], `target`) — applies a crash mode to the disk
//! (`ProcessCrash`, `PowerLoss(Strict)`, `PowerLoss(Eager)`), waits a
//! seeded downtime and restarts the node, which boots (recovery) and goes
//! on. At the horizon it crashes the node once more, recovers the disk
//! itself (`view`) and hands everything to [`oracle`].
//!
//! Invariant: a run is a pure function of its [`SimPlan`]: madsim's task
//! order, the clients', provider's and latencies' choices, the crash
//! schedule and SimFs all draw from the plan's seed, so
//! [`SimOutcome::hash`] repeats. Runs are serialised in one process
//! (SQLite's PRNG is process-global).
//!
//! Run: `cargo sim` (fixed seeds, the PR gate). Reproduce a failing seed:
//! `MADSIM_TEST_SEED=<seed> cargo sim <test>` (printed on failure). Nightly
//! ranges: `MADSIM_TEST_SEEDS=<start>..<end> cargo sim`.

#[cfg(madsim)]
mod clients;
pub mod coverage;
#[cfg(madsim)]
mod node;
pub mod oracle;
pub mod provider;
pub mod recorder;
#[cfg(madsim)]
mod run;
#[cfg(madsim)]
mod target;
#[cfg(madsim)]
mod view;

use std::path::PathBuf;

use durable_agent::canary::Canaries;
use durable_agent::fs::CrashMode;
use durable_agent::store::triggers::TriggerPolicy;
use serde_json::Value;

pub use coverage::Coverage;
pub use oracle::{check, FinalView};
pub use provider::FlakyProvider;
pub use recorder::Recorder;
#[cfg(madsim)]
pub use run::run_sim;

/// What the simulation's clock reads when a run starts: a wall clock's
/// milliseconds (2025-11-28 00:00 UTC), not 0, so that schedule buckets
/// (`now / period`) number as they do in life. From 0, a schedule
/// changed to a longer period found its first bucket's key taken by the
/// old definition's buckets of the first minutes — a collision a real
/// clock never reaches.
pub const ORIGIN_MS: u64 = 1_764_288_000_000;

/// The simulation's clock: logical milliseconds since `origin`, plus
/// `origin_ms`. Under madsim `Instant` is simulated time, and the
/// supervisor keeps one clock across node restarts, as a wall clock would.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    pub origin: tokio::time::Instant,
    pub origin_ms: u64,
}

impl durable_agent::system::LogicalClock for SimClock {
    fn now_ms(&self) -> u64 {
        SimClock::now_ms(self)
    }
}

impl SimClock {
    /// A clock reading `origin_ms` now.
    pub fn starting_at(origin_ms: u64) -> Self {
        SimClock {
            origin: tokio::time::Instant::now(),
            origin_ms,
        }
    }

    /// Logical milliseconds now.
    pub fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_ms.saturating_add(elapsed)
    }

    /// The instant `ms` after the run's start (a plan's times).
    pub fn after_start(&self, ms: u64) -> tokio::time::Instant {
        self.origin + std::time::Duration::from_millis(ms)
    }
}

/// A recurring schedule the clients add at the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurring {
    pub id: String,
    /// Worker index.
    pub agent: usize,
    pub period_ms: u64,
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimPlan {
    pub seed: u64,
    /// The root on the SimFs.
    pub root: PathBuf,
    /// Worker agents (children of one `lead` root).
    pub agents: usize,
    /// Concurrent API clients.
    pub clients: usize,
    /// Pause between a client's requests.
    pub think_ms: (u64, u64),
    /// Provider and tool latency per call.
    pub latency_ms: (u64, u64),
    /// Chance that one provider completion fails.
    pub provider_failure: f64,
    /// The worker's settings.
    pub poll_ms: u64,
    pub lease_ms: u64,
    pub slots: usize,
    pub trigger_policy: TriggerPolicy,
    /// Wake-ups for pending messages (`[orchestration] wake`).
    pub wake: bool,
    pub recurring: Vec<Recurring>,
    /// Known bugs to re-introduce; empty for the guarantees' runs.
    pub canaries: Canaries,
    /// Simulated run length.
    pub horizon_ms: u64,
    /// Crashes during the run.
    pub crashes: u32,
    /// Stops (SIGTERM, drained) during the run.
    pub stops: u32,
    /// Sends whose answer the world loses (delivered or not), spread over
    /// the run.
    pub lost_answers: u32,
    /// Where crash and stop instants are drawn from (logical ms).
    pub crash_window_ms: (u64, u64),
    /// Time the node stays down after a crash or stop.
    pub downtime_ms: (u64, u64),
    /// Chance that a crash is armed some I/O points ahead (dying inside a
    /// write, fsync or SQLite commit) rather than at the instant itself.
    pub mid_io_probability: f64,
    /// Chance that a crash waits for a one-time trigger's turn to be in
    /// flight and kills it there, in a seeded [`TurnPhase`] (a crash at a
    /// random instant rarely lands inside one turn's few seconds).
    pub aimed_probability: f64,
    /// The phases aimed crashes take in turn (from a seeded one); not
    /// empty.
    pub aimed_phases: Vec<TurnPhase>,
    /// A due trigger's turn starts within this much of its fire time
    /// unless the daemon was down (slots busy with other turns, a poll).
    pub start_bound_ms: u64,
    /// Share of client emits whose prompt the provider always fails on:
    /// they die (DEAD) after the policy's attempts, for a human to retry.
    pub poison_share: f64,
    /// How long after its due time a trigger may still be unfired at the
    /// horizon (leases, backoff, latency) before the oracle calls it lost.
    pub settle_ms: u64,
}

impl SimPlan {
    /// `agents` workers and two clients for `horizon_ms`, `crashes` crashes
    /// in the middle.
    pub fn new(seed: u64, agents: usize, horizon_ms: u64, crashes: u32) -> Self {
        let settle_ms = 180_000;
        SimPlan {
            seed,
            root: PathBuf::from("/daemon"),
            agents,
            clients: 3,
            think_ms: (500, 8_000),
            latency_ms: (50, 2_000),
            provider_failure: 0.1,
            poll_ms: 1_000,
            lease_ms: 60_000,
            slots: 3,
            trigger_policy: TriggerPolicy {
                overdue_grace_ms: 1_000,
                ..TriggerPolicy::default()
            },
            wake: true,
            recurring: vec![Recurring {
                id: "digest".into(),
                agent: 0,
                period_ms: 120_000,
            }],
            canaries: Canaries::none(),
            horizon_ms,
            crashes,
            stops: 1,
            lost_answers: 6,
            crash_window_ms: (
                horizon_ms / 20,
                horizon_ms.saturating_sub(settle_ms + 60_000).max(horizon_ms / 2),
            ),
            downtime_ms: (0, 30_000),
            mid_io_probability: 0.5,
            aimed_probability: 0.4,
            aimed_phases: TurnPhase::ALL.to_vec(),
            start_bound_ms: 1_000 + 60_000,
            poison_share: 0.02,
            settle_ms,
        }
    }

    /// This plan with every crash aimed at a one-time trigger's turn in
    /// flight ([`TurnPhase`]): killed right after it started, while one
    /// of its calls is out, or while a call's result (or the one that
    /// completes it) is being persisted.
    pub fn aimed_at_triggers(mut self) -> Self {
        self.aimed_probability = 1.0;
        self
    }

    /// This plan with trigger leases shorter than one provider call: every
    /// trigger's turn outlives its lease, so its holder is still running
    /// (and acks) after the lease expired. The start bound stays the
    /// default plan's: a short lease must not make turns start sooner.
    pub fn with_short_leases(mut self) -> Self {
        self.latency_ms = (600, 3_000);
        self.lease_ms = 400;
        self
    }

    /// The name of worker `i`.
    pub fn agent_name(i: usize) -> String {
        format!("w{i}")
    }
}

/// An API operation a client asked for, as the oracle reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    CreateAgent {
        name: String,
        parent: Option<String>,
    },
    DeleteAgent {
        name: String,
    },
    Turn {
        agent: String,
        work_id: String,
    },
    Message {
        from: String,
        to: String,
        /// Unique, bracketed (`[c0m3]`): a prompt quoting it is found by a
        /// substring search.
        payload: String,
    },
    Emit {
        key: String,
        agent: String,
        delay_ms: u64,
    },
    AddSchedule {
        id: String,
        agent: String,
        period_ms: u64,
    },
    DeleteSchedule {
        id: String,
    },
    Confirm {
        key: String,
        delivered: bool,
        /// The human gave up on the call instead.
        abandon: bool,
    },
    RetryTrigger {
        id: String,
        /// The status the trigger was listed with (DEAD or FAILED).
        status: String,
    },
    Status,
    Gc,
}

/// What happened, in order: the simulation's trace and the oracle's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The node booted (recovery ran).
    Booted {
        boot: u32,
    },
    /// A client sent `op`.
    Sent {
        client: usize,
        op: Op,
    },
    /// The worker answered `op` with 200: acknowledged.
    Acked {
        client: usize,
        op: Op,
        reply: Value,
    },
    /// The worker refused `op` (its status and message).
    Refused {
        client: usize,
        op: Op,
        status: u16,
        error: String,
    },
    /// No answer (the node died or stopped): the outcome is unknown.
    Lost {
        client: usize,
        op: Op,
    },
    /// The worker started a turn of `agent` performing `work`.
    TurnStarted {
        agent: String,
        work: String,
    },
    /// That turn ended: `ran` (it ran to completion now), or it was done
    /// before (`already_done`), or it failed (`error`).
    TurnEnded {
        agent: String,
        work: String,
        ran: bool,
        error: Option<String>,
    },
    /// The worker stopped on an unknown outcome.
    Failed {
        cause: String,
    },
    /// The node was asked to stop (SIGTERM) / stopped after draining.
    Stopping,
    Drained {
        in_flight: usize,
    },
}

/// Where in a one-time trigger's turn an aimed crash kills the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TurnPhase {
    /// Right after the turn started: the claim and `turn.start` written,
    /// its first call handed out (dies at the next I/O point).
    Started,
    /// While one of the turn's provider or tool calls is out: the call
    /// dies with the node, its result never persisted.
    CallOut,
    /// While one call's result is being persisted (a seeded number of I/O
    /// points after it came back): the call's effect happened, its record
    /// (decision, ledger, `tool.result`) partly durable.
    Persisting,
    /// While the result that completes the turn (a reply asking for no
    /// tool) is being persisted: inside its `turn.complete` or the ack
    /// after it — the work durable, its trigger not yet DONE.
    Completing,
}

impl TurnPhase {
    pub const ALL: [TurnPhase; 4] = [
        TurnPhase::Started,
        TurnPhase::CallOut,
        TurnPhase::Persisting,
        TurnPhase::Completing,
    ];
}

/// The one-time trigger's turn an aimed crash killed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AimedAt {
    /// Its work (`trigger:{key}`) and agent.
    pub work: String,
    pub agent: String,
    pub phase: TurnPhase,
}

/// One crash or stop the supervisor caused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashRecord {
    /// When the supervisor decided to crash.
    pub at_ms: u64,
    /// When the node was killed (later than `at_ms` for a mid-I/O crash).
    pub killed_ms: u64,
    /// `None`: a stop (SIGTERM), the disk intact.
    pub mode: Option<CrashMode>,
    /// The SimFs point the process died at, with its label, if it died
    /// inside an I/O call.
    pub point: Option<(u64, String)>,
    /// The trigger's turn it killed, if the crash was aimed at one (and
    /// one was in flight in time).
    pub aimed: Option<AimedAt>,
    /// When the node was restarted.
    pub restarted_ms: u64,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    pub seed: u64,
    /// The plan that ran.
    pub plan: SimPlan,
    /// Hash of the SimFs trace, the final disk image and the event trace:
    /// equal seeds give equal hashes.
    pub hash: u64,
    pub events: Vec<(u64, Event)>,
    pub crashes: Vec<CrashRecord>,
    pub io_points: u64,
    /// Oracle violations (empty: the run is correct).
    pub violations: Vec<String>,
    pub view: FinalView,
}

impl SimOutcome {
    /// The one-line reproduction command (narrowed to the running test:
    /// libtest names each test's thread after it).
    pub fn repro(&self) -> String {
        repro_command(self.seed)
    }

    /// What the run exercised ([`coverage`]).
    pub fn coverage(&self) -> Coverage {
        Coverage::of(self)
    }

    /// A report for a failing run: seed, command, crashes, violations.
    pub fn report(&self) -> String {
        let mut s = format!(
            "madsim daemon simulation failed: MADSIM_TEST_SEED={}\nreproduce: {}\n",
            self.seed,
            self.repro()
        );
        for c in &self.crashes {
            s.push_str(&format!("crash: {c:?}\n"));
        }
        for v in &self.violations {
            s.push_str(&format!("violation: {v}\n"));
        }
        s
    }
}

/// The short name of `op`'s kind.
pub fn op_name(op: &Op) -> &'static str {
    match op {
        Op::CreateAgent { .. } => "create_agent",
        Op::DeleteAgent { .. } => "delete_agent",
        Op::Turn { .. } => "turn",
        Op::Message { .. } => "message",
        Op::Emit { .. } => "emit",
        Op::AddSchedule { .. } => "add_schedule",
        Op::DeleteSchedule { .. } => "delete_schedule",
        Op::Confirm { .. } => "confirm",
        Op::RetryTrigger { .. } => "retry_trigger",
        Op::Status => "status",
        Op::Gc => "gc",
    }
}

/// `MADSIM_TEST_SEED=<seed> cargo sim [<test>]`.
pub fn repro_command(seed: u64) -> String {
    let thread = std::thread::current();
    match thread.name().filter(|n| *n != "main") {
        Some(test) => format!("MADSIM_TEST_SEED={seed} cargo sim {test}"),
        None => format!("MADSIM_TEST_SEED={seed} cargo sim"),
    }
}

/// FNV-1a over bytes, continuing from `h` (a fixed hash: no std hasher).
pub fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// FNV-1a offset basis.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;
