//! What a soak did, and its human summary.
//!
//! Invariant: a report passes only with no failure and at least the
//! required number of crashes survived; the summary says which it was.

use std::time::Duration;

/// What a soak did.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub crash: String,
    pub seed: u64,
    pub crashes: u64,
    /// Crashes that cut a request in flight (its answer lost).
    pub crashes_mid_request: u64,
    /// Of those, crashes inside a tool call (the sink had the request).
    pub crashes_mid_tool: u64,
    pub generations: u64,
    pub ops_acked: u64,
    pub ops_refused: u64,
    pub ops_unknown: u64,
    /// Turns whose answer a kill swallowed, re-asked and acknowledged.
    pub turns_retried: u64,
    /// Acknowledged ops verified present (at a restart and the deep check).
    pub acked_checked: u64,
    /// Promises checked in all (each restart re-checks all of them).
    pub promises_checked: u64,
    pub lock_probes: u64,
    pub irreversible_delivered: u64,
    /// Completions the rewording mock answered (each one differently).
    pub model_asks: u64,
    pub confirmations: u64,
    pub elapsed: Duration,
    pub failure: Option<String>,
}

impl SoakReport {
    pub fn passed(&self, min_crashes: u64) -> bool {
        self.failure.is_none() && self.crashes >= min_crashes
    }

    /// The human summary.
    pub fn summary(&self, min_crashes: u64) -> String {
        let minutes = self.elapsed.as_secs_f64() / 60.0;
        let mut s = format!(
            "== durable-agent-sim soak --{}: summary ==\n\
             seed        {}\n\
             crashes     {} survived ({:.0}/min; {} mid-request, {} of them mid-tool), {} root(s)\n\
             operations  {} acknowledged, {} refused, {} unknown (cut by a crash; {} turns re-asked and acknowledged)\n\
             checked     {} acknowledged ops verified, {} promises checked; {} root-lock probes refused\n\
             model       rewording echo mock: {} asks, no two answered alike\n\
             effects     {} irreversible deliveries, 0 duplicates allowed (per key and per logical action), each with a logged decision; {} confirmations answered\n\
             lost        {}\n\
             time        {:.1?}\n",
            self.crash,
            self.seed,
            self.crashes,
            self.crashes as f64 / minutes.max(1e-9),
            self.crashes_mid_request,
            self.crashes_mid_tool,
            self.generations,
            self.ops_acked,
            self.ops_refused,
            self.ops_unknown,
            self.turns_retried,
            self.acked_checked,
            self.promises_checked,
            self.lock_probes,
            self.model_asks,
            self.irreversible_delivered,
            self.confirmations,
            if self.failure.is_some() { "see the failure" } else { "0" },
            self.elapsed,
        );
        if self.crashes < min_crashes && self.failure.is_none() {
            s.push_str(&format!(
                "FAILED: only {} crashes in the time given, {min_crashes} required\n",
                self.crashes
            ));
        }
        if let Some(f) = &self.failure {
            s.push_str(&format!("FAILED: {f}\n"));
        }
        s
    }
}
