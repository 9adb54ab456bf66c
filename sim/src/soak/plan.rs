//! When each crash epoch's kill lands: a few ops, then the kill, idle or
//! in flight.
//!
//! Invariant: a plan is drawn from the soak's seeded generator only, so
//! the same seed gives the same sequence of plans.

use rand::Rng;

/// When an epoch's crash happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillAt {
    /// `delay_ms` after the last answer, no request in flight.
    Idle { delay_ms: u64 },
    /// `delay_ms` after a turn request was sent (mid-turn).
    MidRequest { delay_ms: u64 },
    /// `delay_us` after any request was sent (mostly between its commit
    /// and its answer, or before its commit).
    MidOp { delay_us: u64 },
    /// When the sink receives the next tool call of a turn in flight.
    MidTool,
}

/// One epoch's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KillPlan {
    pub ops_before: u32,
    pub at: KillAt,
}

impl KillPlan {
    pub fn draw(rng: &mut impl Rng) -> KillPlan {
        let ops_before = rng.random_range(0..=5);
        let at = match rng.random_range(0..10) {
            0..=1 => KillAt::Idle {
                delay_ms: rng.random_range(0..300),
            },
            2..=4 => KillAt::MidRequest {
                delay_ms: rng.random_range(0..60),
            },
            5..=6 => KillAt::MidOp {
                delay_us: rng.random_range(0..4_000),
            },
            _ => KillAt::MidTool,
        };
        KillPlan { ops_before, at }
    }
}
