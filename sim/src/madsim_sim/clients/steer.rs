//! Steering: now and then a client does the first kind of operation the
//! run has not acknowledged yet ([`STEERABLE`], from its own place in the
//! list), or what that kind needs first — an agent or schedule of its own
//! to delete, a trigger that dies to retry — so every run covers every
//! kind whatever its seed.
//!
//! Invariant: steering only picks among requests a client makes anyway;
//! whether it steers, and what, depends on the seed and the trace so far.

use rand::Rng;

use super::super::coverage::STEERABLE;
use super::requests::{Human, Prefer, TriggerKind};
use super::Client;

/// Chance that a client's next request steers toward a kind not yet seen.
const STEER_PROBABILITY: f64 = 0.25;

/// A client steering toward a DEAD trigger emits another poisoned one only
/// this long after its last (one dies within seconds: the policy's
/// backoffs, a few provider latencies).
const POISON_AGAIN_MS: u64 = 120_000;

impl Client {
    /// Steer, now and then: `true` if a request went out for it.
    pub(super) async fn steers(&mut self) -> bool {
        if !self.rng.random_bool(STEER_PROBABILITY) {
            return false;
        }
        match self.unseen() {
            Some(kind) => self.steer(kind).await,
            None => false,
        }
    }

    /// The first steerable kind (from this client's place in the list)
    /// the run has not acknowledged yet.
    fn unseen(&self) -> Option<&'static str> {
        let n = STEERABLE.len();
        (0..n)
            .map(|i| STEERABLE[(self.index + i) % n])
            .find(|kind| !self.ctx.recorder.acked(kind))
    }

    /// An op aimed at `kind`, or a step toward one (what it needs first:
    /// an agent or schedule of its own, a trigger that dies). `false`:
    /// nothing to do for it now.
    async fn steer(&mut self, kind: &str) -> bool {
        match kind {
            "delete_agent" => {
                if !self.delete_agent().await {
                    self.create_agent().await;
                }
            }
            "delete_schedule" => {
                if !self.delete_schedule().await {
                    self.add_schedule().await;
                }
            }
            "retry DEAD" => {
                let recently = self
                    .poisoned_at
                    .is_some_and(|at| self.ctx.clock.now_ms() < at + POISON_AGAIN_MS);
                if !self.retry_stuck(&["DEAD"]).await && !recently {
                    self.emit_new(TriggerKind::Poisoned).await;
                }
            }
            "retry FAILED" => return self.retry_stuck(&["FAILED"]).await,
            "confirm abandoned" => self.confirm(Human::GivesUp).await,
            "confirm delivered" | "confirm not delivered" => self.confirm(Human::Honest).await,
            "emit duplicate" => return self.emit_again(Prefer::Acked).await,
            "turn already done" => return self.turn_again(Prefer::Acked).await,
            "gc" => self.gc().await,
            _ => return false,
        }
        true
    }
}
