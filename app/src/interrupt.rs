//! Stopping on SIGINT/SIGTERM at a safe boundary: [`Stop`] (the flag the
//! signals set, debounced) and [`InterruptibleProvider`] (the boundary).
//!
//! The safe boundary is a provider call. A completion has no side effect,
//! so abandoning one — before it starts or while it is waited for — is
//! always safe: the runtime sees a provider error, the turn is abandoned
//! without `turn.complete` (the documented "in-flight turn is lost whole"),
//! and re-running the same work turn later presents the same idempotency
//! keys to the activity ledger, which never re-sends an irreversible call
//! blindly. A tool call in progress is never interrupted: an irreversible
//! one finishes its INTENT → send → DONE/FAILED step first.
//!
//! Invariant: the first signal only sets the flag (the work stops at the
//! next boundary and the command exits normally); later signals are
//! logged and ignored, so the stop never runs twice. A `kill -9` skips all
//! of this and is equally safe: the next boot recovers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use durable_agent::runtime::{
    AgentId, ConversationItem, Provider, ProviderError, ProviderReply, ProviderRequest,
};

/// How often a waiting provider call checks the stop flag.
const POLL: Duration = Duration::from_millis(25);

/// The message of the provider error an interrupt produces.
pub use durable_agent::worker::INTERRUPTED;

/// A stop request, shared by clones.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    flag: Arc<AtomicBool>,
}

impl Stop {
    pub fn new() -> Stop {
        Stop::default()
    }

    /// Whether a stop was requested.
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Request a stop; returns whether this call was the first.
    pub fn request(&self) -> bool {
        !self.flag.swap(true, Ordering::AcqRel)
    }

    /// Request a stop on SIGINT or SIGTERM (a thread waits for them).
    pub fn on_signals(&self, what: &'static str) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
        let stop = self.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    let name = if signal == SIGINT { "SIGINT" } else { "SIGTERM" };
                    if stop.request() {
                        eprintln!("{name}: stopping {what} at the next safe boundary");
                    } else {
                        eprintln!("{name}: already stopping; ignored");
                    }
                }
            })?;
        Ok(())
    }
}

/// A [`Provider`] that gives up (with [`INTERRUPTED`]) once [`Stop`] is
/// requested: before a call starts, or while one is in flight — the call
/// runs on a helper thread that is abandoned (its reply is dropped; the
/// HTTP client's own timeout bounds it).
#[derive(Debug)]
pub struct InterruptibleProvider {
    inner: Arc<dyn Provider>,
    stop: Stop,
}

impl InterruptibleProvider {
    pub fn new(inner: Arc<dyn Provider>, stop: Stop) -> Self {
        InterruptibleProvider { inner, stop }
    }
}

impl Provider for InterruptibleProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        if self.stop.requested() {
            return Err(ProviderError(INTERRUPTED.to_string()));
        }
        // Owned copies: the helper thread may outlive this call.
        let owned = OwnedRequest {
            agent: request.agent.clone(),
            agent_name: request.agent_name.to_string(),
            instructions: request.instructions.to_string(),
            history: request.history.to_vec(),
            round: request.round,
        };
        let inner = Arc::clone(&self.inner);
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("provider-call".into())
            .spawn(move || {
                let request = ProviderRequest {
                    agent: &owned.agent,
                    agent_name: &owned.agent_name,
                    instructions: &owned.instructions,
                    history: &owned.history,
                    round: owned.round,
                };
                // The receiver is gone only if the call was abandoned.
                let _ = tx.send(inner.complete(&request));
            })
            .map_err(|e| ProviderError(format!("cannot start the provider call thread: {e}")))?;
        loop {
            match rx.recv_timeout(POLL) {
                Ok(result) => return result,
                Err(mpsc::RecvTimeoutError::Timeout) if self.stop.requested() => {
                    tracing::info!(agent = %request.agent, "provider call abandoned: stop requested");
                    return Err(ProviderError(INTERRUPTED.to_string()));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(ProviderError("the provider call thread panicked".to_string()))
                }
            }
        }
    }
}

struct OwnedRequest {
    agent: AgentId,
    agent_name: String,
    instructions: String,
    history: Vec<ConversationItem>,
    round: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use durable_agent::runtime::FakeProvider;

    #[test]
    fn a_requested_stop_abandons_the_call_and_a_second_request_is_not_first() {
        let stop = Stop::new();
        let provider = InterruptibleProvider::new(Arc::new(FakeProvider::new(1)), stop.clone());
        let agent = AgentId::from_hex("00000000000000aa").expect("valid id");
        let history = [ConversationItem::Prompt { text: "hi".into() }];
        let request = ProviderRequest {
            agent: &agent,
            agent_name: "a",
            instructions: "",
            history: &history,
            round: 1,
        };
        assert!(provider.complete(&request).is_ok());
        assert!(stop.request());
        assert!(!stop.request(), "debounced");
        let err = provider.complete(&request).expect_err("stopped");
        assert_eq!(err.0, INTERRUPTED);
    }
}
