//! Deterministic simulation of the concurrent daemon under madsim.
//!
//! One madsim node runs [`durable_agent::daemon::Daemon`] on a
//! [`durable_agent::fs::SimFs`]
//! (madsim has no disk model: SimFs is the disk). The supervisor kills the
//! node at simulated instants drawn from the seed — either right away or a
//! seeded number of I/O points later, mid-operation — applies a crash mode
//! drawn from the seed to the disk (`ProcessCrash`, `PowerLoss(Strict)`,
//! `PowerLoss(Eager)`), waits a seeded downtime and restarts the node, which
//! boots (recovery) and goes on. At the horizon it crashes the node once
//! more, recovers the disk itself and hands everything to [`oracle`].
//!
//! Invariant: a run is a pure function of its [`SimPlan`]: madsim's task
//! order, the daemon's choices, the crash schedule and SimFs all draw from
//! the plan's seed, so [`SimOutcome::hash`] repeats. Runs are serialised in
//! one process (SQLite's PRNG is process-global).
//!
//! Run: `cargo sim` (fixed seeds, the PR gate). Reproduce a failing seed:
//! `MADSIM_TEST_SEED=<seed> cargo sim <test>` (printed on failure). Nightly
//! ranges: `MADSIM_TEST_SEEDS=<start>..<end> cargo sim`.
//!
//! The fuzzer's op-sequence oracle ([`crate::oracle`]) compares a recovered
//! state with a reference model replaying the same op sequence; the
//! daemon's history is concurrent and produced by the daemon itself, so
//! [`oracle`] checks the same guarantees directly against the
//! acknowledgements the daemon reported, and reuses the fuzzer's log check
//! ([`crate::oracle::log_invariants`], I3) on the recovered disk.

pub mod oracle;
pub mod recorder;
#[cfg(madsim)]
mod run;

use durable_agent::daemon::DaemonConfig;
use durable_agent::fs::CrashMode;

pub use oracle::{check, delivered_without_a_turn, FinalView};
pub use recorder::Recorder;
#[cfg(madsim)]
pub use run::run_sim;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimPlan {
    pub seed: u64,
    /// The daemon's configuration (its `seed` and `boot` are set per run).
    pub daemon: DaemonConfig,
    /// Simulated run length.
    pub horizon_ms: u64,
    /// Crashes during the run.
    pub crashes: u32,
    /// Where crash instants are drawn from (logical ms).
    pub crash_window_ms: (u64, u64),
    /// Time the node stays down after a crash.
    pub downtime_ms: (u64, u64),
    /// Chance that a crash is armed some I/O points ahead (dying inside a
    /// write, fsync or SQLite commit) rather than at the instant itself.
    pub mid_io_probability: f64,
    /// How long after its due time a trigger may still be unfired at the
    /// horizon (leases, backoff, latency) before the oracle calls it lost.
    pub settle_ms: u64,
}

impl SimPlan {
    /// `agents` workers for `horizon_ms`, `crashes` crashes in the middle.
    pub fn new(seed: u64, agents: usize, horizon_ms: u64, crashes: u32) -> Self {
        let daemon = DaemonConfig::new(seed, agents);
        let settle_ms = 180_000;
        SimPlan {
            seed,
            daemon,
            horizon_ms,
            crashes,
            crash_window_ms: (
                horizon_ms / 20,
                horizon_ms.saturating_sub(settle_ms + 60_000).max(horizon_ms / 2),
            ),
            downtime_ms: (0, 30_000),
            mid_io_probability: 0.5,
            settle_ms,
        }
    }
}

/// One crash the supervisor caused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashRecord {
    /// When the supervisor decided to crash.
    pub at_ms: u64,
    /// When the node was killed (later than `at_ms` for a mid-I/O crash).
    pub killed_ms: u64,
    pub mode: CrashMode,
    /// The SimFs point the process died at, with its label, if it died
    /// inside an I/O call.
    pub point: Option<(u64, String)>,
    /// When the node was restarted.
    pub restarted_ms: u64,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    pub seed: u64,
    /// Hash of the SimFs trace, the final disk image and the daemon's event
    /// trace: equal seeds give equal hashes.
    pub hash: u64,
    pub events: Vec<(u64, durable_agent::daemon::DaemonEvent)>,
    pub crashes: Vec<CrashRecord>,
    pub io_points: u64,
    /// Oracle violations (empty: the run is correct).
    pub violations: Vec<String>,
    /// Fire-key deliveries in the world, per key.
    pub fire_deliveries: std::collections::BTreeMap<String, usize>,
    pub view: FinalView,
}

impl SimOutcome {
    /// The one-line reproduction command (narrowed to the running test:
    /// libtest names each test's thread after it).
    pub fn repro(&self) -> String {
        repro_command(self.seed)
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
