//! Retry timing for provider calls: exponential backoff, a server's
//! `Retry-After`, and the [`Sleeper`] that waits (injectable, so tests do
//! not wait for real).
//!
//! Invariant: no delay ever exceeds `max_ms` — not a runaway exponent, not
//! a server asking for an hour — and the number of attempts is bounded by
//! `1 + max_retries`.

use std::sync::Mutex;
use std::time::Duration;

/// When to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    pub base_ms: u64,
    pub max_ms: u64,
}

impl RetryPolicy {
    /// The wait before attempt `next_attempt` (2 for the first retry):
    /// `retry_after_ms` if the server sent one, else `base_ms * 2^(n-2)`;
    /// either way capped at `max_ms`.
    pub fn delay_ms(&self, next_attempt: u32, retry_after_ms: Option<u64>) -> u64 {
        debug_assert!(next_attempt >= 2, "attempt 1 is never delayed");
        let backoff = || {
            let exponent = next_attempt.saturating_sub(2).min(32);
            self.base_ms.saturating_mul(1u64 << exponent)
        };
        retry_after_ms.unwrap_or_else(backoff).min(self.max_ms)
    }

    /// Total attempts allowed.
    pub fn max_attempts(&self) -> u32 {
        self.max_retries.saturating_add(1)
    }
}

/// Waits between attempts.
pub trait Sleeper: Send + Sync + std::fmt::Debug {
    fn sleep(&self, duration: Duration);
}

/// `std::thread::sleep`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ThreadSleeper;

impl Sleeper for ThreadSleeper {
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }
}

/// Records every requested wait and returns at once (tests).
#[derive(Debug, Default)]
pub struct RecordingSleeper {
    slept: Mutex<Vec<Duration>>,
}

impl RecordingSleeper {
    pub fn new() -> Self {
        RecordingSleeper::default()
    }

    /// Every wait requested so far, in order.
    pub fn slept(&self) -> Vec<Duration> {
        // A panicking test thread cannot leave a Vec half-pushed.
        self.slept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Sleeper for RecordingSleeper {
    fn sleep(&self, duration: Duration) {
        self.slept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(duration);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = RetryPolicy {
            max_retries: 5,
            base_ms: 100,
            max_ms: 1_000,
        };
        assert_eq!(p.delay_ms(2, None), 100);
        assert_eq!(p.delay_ms(3, None), 200);
        assert_eq!(p.delay_ms(4, None), 400);
        assert_eq!(p.delay_ms(6, None), 1_000);
        assert_eq!(p.delay_ms(u32::MAX, None), 1_000);
        assert_eq!(p.max_attempts(), 6);
    }

    #[test]
    fn retry_after_wins_but_is_capped() {
        let p = RetryPolicy {
            max_retries: 1,
            base_ms: 100,
            max_ms: 5_000,
        };
        assert_eq!(p.delay_ms(2, Some(2_000)), 2_000);
        assert_eq!(p.delay_ms(2, Some(3_600_000)), 5_000);
    }
}
