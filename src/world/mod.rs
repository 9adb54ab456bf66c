//! The outside world the runtime acts on: [`Outbox`], where irreversible
//! side effects go (an email API, a payment provider), and — for tests and
//! the harness only (cargo feature `fakes`) — [`World`], a simulated one.
//!
//! Invariant: an [`Outbox`] answers each send with a provider reference,
//! a definite refusal ([`DeliveryError::Rejected`]: nothing happened) or an
//! unknown outcome ([`DeliveryError::Unknown`]: it may have happened) —
//! never anything that lets the caller guess.

#[cfg(feature = "fakes")]
mod sim;

#[cfg(feature = "fakes")]
pub use sim::{Delivery, Scripted, World};

/// An external provider of irreversible actions (email, payment, post).
pub trait Outbox: Send + Sync + std::fmt::Debug {
    /// Whether the provider of `action` deduplicates by idempotency key
    /// (an email Message-ID, a payment idempotency header). Per action: one
    /// outbox may route several irreversible tools to different endpoints.
    fn supports_dedup(&self, action: &str) -> bool;

    /// Perform `action` with `payload`, carrying `idem_key` to the provider.
    /// Returns the provider's reference for the effect.
    fn send(
        &self,
        idem_key: &str,
        action: &str,
        payload: &serde_json::Value,
    ) -> Result<String, DeliveryError>;
}

/// Why a send did not return a provider reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// The provider refused; nothing was delivered.
    #[error("provider rejected {idem_key}: {reason}")]
    Rejected { idem_key: String, reason: String },
    /// No answer (timeout, connection reset): it may or may not have been
    /// delivered. Callers must treat the outcome as unknown.
    #[error("no answer from provider for {idem_key}: outcome unknown")]
    Unknown { idem_key: String },
}
