//! The daemon: the concurrent, async face of the synchronous runtime and
//! stores. Agents run turns at once (each with provider latency), send each
//! other messages and schedule reminders; a scheduler sleeps until the next
//! trigger's `fire_at`, claims it with a lease, fires it and acks it;
//! failures are retried with exponential backoff; expired leases are
//! reclaimed (at boot and while running).
//!
//! It is written against `tokio` (the `madsim-tokio` package): real tokio in
//! production, madsim's deterministic simulated runtime under `--cfg madsim`
//! (see `sim/src/madsim_sim`). All time is [`DaemonClock`]: simulated under
//! madsim, monotonic under tokio; the stores get logical milliseconds from it
//! and never read a wall clock.
//!
//! Invariants this module keeps:
//! - one owner: every runtime/store call happens under one
//!   `tokio::sync::Mutex<Core>` and never across an `.await`, so the
//!   synchronous runtime sees a serial history (the concurrency is in the
//!   waiting: latency, think time, fire times, backoff);
//! - fail-stop: an unknown-outcome error (I/O, poisoned runtime, lost
//!   provider answer) stops every task and [`Daemon::run`] returns it; the
//!   only way on is a new [`Daemon::boot`], which runs recovery;
//! - a trigger fires through the activity ledger with key `fire:{dedup_key}`,
//!   so a re-claimed trigger (lease expired after a crash) never repeats the
//!   side effect: it finds the ledger row instead.
//! - randomness comes from ChaCha8 seeded by `(seed, boot, task)`.

mod agents;
mod core;
mod scheduler;
mod tools;
mod turns;

use std::path::PathBuf;
use std::sync::Arc;

use crate::canary::Canaries;
use crate::store::retry::RetryPolicy;
use crate::store::triggers::TriggerPolicy;

pub use self::core::Daemon;
pub use tools::FlakyProvider;

/// The daemon's clock: logical milliseconds since `origin`, plus
/// `origin_ms`. Under madsim `Instant` is simulated time and the supervisor
/// keeps one clock across node restarts, as a wall clock would. Trigger
/// times are stored in this clock, so it must not restart from zero: in
/// production `origin_ms` is read once at process start from the host's
/// clock (the one wall-clock read, at the edge, outside the logic).
#[derive(Debug, Clone, Copy)]
pub struct DaemonClock {
    pub origin: tokio::time::Instant,
    pub origin_ms: u64,
}

impl crate::system::LogicalClock for DaemonClock {
    fn now_ms(&self) -> u64 {
        DaemonClock::now_ms(self)
    }
}

impl DaemonClock {
    /// A clock reading `origin_ms` now.
    pub fn starting_at(origin_ms: u64) -> Self {
        DaemonClock {
            origin: tokio::time::Instant::now(),
            origin_ms,
        }
    }

    /// Logical milliseconds now.
    pub fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_ms.saturating_add(elapsed)
    }

    /// The instant at logical time `ms` (now, if `ms` is past).
    pub fn instant_at(&self, ms: u64) -> tokio::time::Instant {
        let offset = ms.saturating_sub(self.origin_ms);
        self.origin + std::time::Duration::from_millis(offset)
    }
}

/// A recurring schedule: one trigger per `period_ms` bucket, key
/// `scheduled:{id}:{bucket}`. Buckets missed while the daemon was down are
/// coalesced: only the current one is emitted (with an overdue note if late).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurring {
    pub id: String,
    pub agent: usize,
    pub period_ms: u64,
}

/// A one-time scheduled trigger, key `scheduled-once:{id}`, emitted at every
/// boot (the dedup key makes that idempotent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneTime {
    pub id: String,
    pub agent: usize,
    pub fire_at_ms: u64,
}

/// Everything the daemon does is a function of these fields, the disk, the
/// world and the clock.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub seed: u64,
    /// Boot number: mixed into every task's random stream, so a restarted
    /// daemon does not replay the previous boot's choices.
    pub boot: u32,
    /// The system's root on the `Fs` (sessions, the stores' database at
    /// [`crate::system::STORE_DB_FILE`], the lock).
    pub root: PathBuf,
    /// Worker agents (children of one `lead` root).
    pub agents: usize,
    pub slots: usize,
    /// Provider latency per completion, drawn uniformly from this range.
    pub latency_ms: (u64, u64),
    /// Pause between an agent's actions.
    pub think_ms: (u64, u64),
    /// Chance that one provider completion fails (the turn is retried).
    pub provider_failure: f64,
    /// Chance that a trigger's handler fails (retryable `ack_failed`).
    pub trigger_failure: f64,
    /// Chance that an agent action schedules a one-time reminder.
    pub reminder_probability: f64,
    pub lease_ms: u64,
    /// Upper bound on the scheduler's sleep (it also wakes when notified).
    pub poll_ms: u64,
    pub trigger_policy: TriggerPolicy,
    pub turn_retry: RetryPolicy,
    pub recurring: Vec<Recurring>,
    pub one_time: Vec<OneTime>,
    /// Known bugs to re-introduce (runtime, trigger store, ledger); empty
    /// in production.
    pub canaries: Canaries,
}

impl DaemonConfig {
    /// A small daemon with `agents` workers under `root`.
    pub fn new(seed: u64, agents: usize) -> Self {
        DaemonConfig {
            seed,
            boot: 0,
            root: PathBuf::from("/daemon"),
            agents,
            slots: 3,
            latency_ms: (50, 2_000),
            think_ms: (1_000, 20_000),
            provider_failure: 0.1,
            trigger_failure: 0.1,
            reminder_probability: 0.1,
            lease_ms: 30_000,
            poll_ms: 5_000,
            trigger_policy: TriggerPolicy {
                overdue_grace_ms: 1_000,
                ..TriggerPolicy::default()
            },
            turn_retry: RetryPolicy::default(),
            recurring: Vec::new(),
            one_time: Vec::new(),
            canaries: Canaries::none(),
        }
    }

    /// The dedup key of a one-time trigger.
    pub fn once_key(id: &str) -> String {
        format!("scheduled-once:{id}")
    }

    /// The dedup key of bucket `bucket` of a recurring schedule.
    pub fn recurring_key(id: &str, bucket: u64) -> String {
        format!("scheduled:{id}:{bucket}")
    }

    /// The payload of a trigger for worker `agent`, naming its task (the
    /// dedup key): the firing is keyed by the task, not by the row.
    pub fn trigger_payload(task: &str, agent: usize) -> serde_json::Value {
        serde_json::json!({ "task": task, "agent": agent })
    }

    /// The activity-ledger key of a trigger's firing.
    pub fn fire_key(dedup_key: &str) -> String {
        format!("fire:{dedup_key}")
    }

    /// The name of worker `i`.
    pub fn agent_name(i: usize) -> String {
        format!("agent-{i}")
    }
}

/// What the daemon did, in order: the simulation's trace and oracle input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonEvent {
    Booted {
        boot: u32,
        agents_recovered: u64,
        messages_reinjected: usize,
        leases_reclaimed: usize,
        intents_settled: usize,
    },
    AgentCreated {
        name: String,
    },
    /// `send_message` returned: the message is acknowledged.
    MessageAcked {
        id: String,
        from: String,
        to: String,
    },
    /// A turn is about to read these pending messages (its attempt may
    /// fail, or be cut by a crash).
    Reading {
        agent: String,
        ids: Vec<String>,
    },
    /// The turn that read these messages completed: they are delivered.
    Delivered {
        agent: String,
        ids: Vec<String>,
    },
    TurnCompleted {
        agent: String,
        tool_calls: usize,
    },
    TurnRetry {
        agent: String,
        attempt: u32,
        backoff_ms: u64,
    },
    TurnGaveUp {
        agent: String,
        attempts: u32,
    },
    /// `emit` returned (`inserted` false: the key already existed).
    TriggerEmitted {
        key: String,
        fire_at_ms: u64,
        inserted: bool,
    },
    TriggerClaimed {
        key: String,
        attempt: u32,
        overdue_ms: Option<u64>,
    },
    /// The handler ran; `from_ledger`: the side effect was already done by
    /// an earlier claim (nothing sent now); `needs_confirmation`: a crash
    /// left its INTENT unresolved and the world cannot dedup.
    TriggerFired {
        key: String,
        overdue_note: bool,
        from_ledger: bool,
        needs_confirmation: bool,
    },
    TriggerFailed {
        key: String,
        attempt: u32,
        status: String,
    },
    /// A handler found its lease expired (reclaimed meanwhile) and stood
    /// down: the newer claim owns the trigger.
    LeaseLost {
        key: String,
        attempt: u32,
    },
    LeasesReclaimed {
        ids: Vec<String>,
    },
    /// An unknown-outcome error stopped the daemon.
    Stopped {
        cause: String,
    },
}

/// Receives every event with the logical time it happened at. Lives outside
/// the daemon (it survives crashes), like the world.
pub trait DaemonObserver: Send + Sync + std::fmt::Debug {
    fn record(&self, now_ms: u64, event: DaemonEvent);
}

/// The daemon stopped: the outcome of the operation in flight is unknown.
/// Boot a new daemon (which recovers) to go on.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("boot: {0}")]
    Boot(#[from] crate::system::SystemError),
    #[error("runtime: {0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error("stores: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("activity ledger: {0}")]
    Activity(#[from] crate::store::activities::ActivityError),
    #[error("the daemon stopped after an earlier failure: {0}; boot again to recover")]
    Stopped(String),
}

/// Shared handle type for the observer.
pub type Observer = Arc<dyn DaemonObserver>;

#[cfg(all(test, not(madsim)))]
mod tests;
