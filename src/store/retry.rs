//! Retries with exponential backoff on a logical clock (seed 000's
//! `call_with_retry`): wait `base_ms * 2^attempt` after failed attempt
//! `attempt` (0-indexed), at most `max_retries` retries, every failure
//! reported with its attempt number (to persist it, see
//! [`crate::store::usage::UsageStore::persist_error`]).
//!
//! Invariant: no real sleeping and no wall clock — waiting goes through
//! [`Sleeper`], so simulated runs are deterministic and instant.

/// Waits on behalf of a retry loop.
pub trait Sleeper {
    fn sleep_ms(&mut self, ms: u64);
}

/// A logical clock that only moves when slept on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogicalClock {
    pub now_ms: u64,
}

impl Sleeper for LogicalClock {
    fn sleep_ms(&mut self, ms: u64) {
        self.now_ms = self.now_ms.saturating_add(ms);
    }
}

/// Backoff and limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub base_ms: u64,
    /// Retries after the first attempt (3 ⇒ 4 attempts in all).
    pub max_retries: u32,
    /// Upper bound on one wait.
    pub cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_ms: 500,
            max_retries: 3,
            cap_ms: 60_000,
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (0-indexed): `base * 2^attempt`.
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        let factor = 1u64.checked_shl(attempt).unwrap_or(u64::MAX);
        self.base_ms.saturating_mul(factor).min(self.cap_ms)
    }
}

/// Every attempt failed; the last error and how many attempts were made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gave up after {attempts} attempts: {last}")]
pub struct RetryExhausted<E: std::fmt::Display> {
    pub attempts: u32,
    pub last: E,
}

/// Run `op(attempt)` until it succeeds or `max_retries` retries failed.
/// `on_failure(attempt, &err)` runs for every failure (persist it there),
/// before the backoff wait.
pub fn call_with_retry<T, E: std::fmt::Display>(
    policy: &RetryPolicy,
    sleeper: &mut dyn Sleeper,
    mut on_failure: impl FnMut(u32, &E),
    mut op: impl FnMut(u32) -> Result<T, E>,
) -> Result<T, RetryExhausted<E>> {
    let mut attempt = 0u32;
    loop {
        match op(attempt) {
            Ok(v) => return Ok(v),
            Err(e) => {
                on_failure(attempt, &e);
                tracing::warn!(attempt, error = %e, "attempt failed");
                if attempt >= policy.max_retries {
                    return Err(RetryExhausted {
                        attempts: attempt + 1,
                        last: e,
                    });
                }
                sleeper.sleep_ms(policy.backoff_ms(attempt));
                attempt += 1;
            }
        }
    }
}
