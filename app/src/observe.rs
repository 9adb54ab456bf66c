//! Per-attempt records of provider calls, handed to a [`CallObserver`] the
//! caller supplies (the runtime will persist them into its usage and errors
//! stores).
//!
//! Invariant: every HTTP attempt the provider makes produces exactly one
//! [`Attempt`], in order, numbered from 1 within its call — successes with
//! their token usage, failures with their typed error and the wait before
//! the next attempt (None when it was the last). A streamed attempt's text
//! arrives first as [`TextDelta`]s, each before its attempt's [`Attempt`];
//! deltas are for watching only — a failed attempt's deltas are not part
//! of any reply, and what the runtime logs is the complete reply alone.

use std::sync::Mutex;

use crate::openai::OpenAiError;

/// Token counts reported by the provider (`usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// One HTTP attempt of one completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The agent whose turn asked for the completion.
    pub agent: String,
    pub model: String,
    /// 1-based within the call.
    pub number: u32,
    /// Wall time of this attempt (the request and reading the reply).
    pub elapsed_ms: u64,
    pub outcome: AttemptOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A usable completion; `usage` is None when the server sent none.
    Success { usage: Option<Usage> },
    /// This attempt failed; `retry_in_ms` is the wait before the next one,
    /// None if no attempt follows (not retryable, or retries exhausted).
    Failure {
        error: OpenAiError,
        retry_in_ms: Option<u64>,
    },
}

/// A piece of a streamed reply's text, as it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextDelta<'a> {
    /// The agent whose turn asked for the completion.
    pub agent: &'a str,
    /// 1-based attempt the delta belongs to (a retried attempt streams
    /// its text again from the start).
    pub attempt: u32,
    pub text: &'a str,
}

/// Receives every attempt as it finishes. Called on the provider's thread:
/// keep it quick and do not panic.
pub trait CallObserver: Send + Sync + std::fmt::Debug {
    fn on_attempt(&self, attempt: &Attempt);

    /// A streamed reply's text as it arrives (`[provider] stream = true`).
    /// Observers that only count attempts ignore it.
    fn on_text_delta(&self, _delta: &TextDelta<'_>) {}
}

/// Discards attempts.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl CallObserver for NoopObserver {
    fn on_attempt(&self, _attempt: &Attempt) {}
}

/// Keeps every attempt (tests, `status` output).
#[derive(Debug, Default)]
pub struct RecordingObserver {
    attempts: Mutex<Vec<Attempt>>,
}

impl RecordingObserver {
    pub fn new() -> Self {
        RecordingObserver::default()
    }

    pub fn attempts(&self) -> Vec<Attempt> {
        // A Vec push cannot be left half-done by a panic elsewhere.
        self.attempts.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The attempt numbers, in order (1, 2, 1, ... across calls).
    pub fn numbers(&self) -> Vec<u32> {
        self.attempts().iter().map(|a| a.number).collect()
    }
}

impl CallObserver for RecordingObserver {
    fn on_attempt(&self, attempt: &Attempt) {
        self.attempts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(attempt.clone());
    }
}
