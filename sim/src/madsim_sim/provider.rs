//! The simulation's provider: [`FlakyProvider`], the deterministic
//! fake LLM, failing a seeded share of completions (a timeout, a 5xx): the
//! turn is abandoned and retried. A turn whose prompt carries [`POISON`]
//! fails every time (a job the model always times out on): its trigger
//! dies after the policy's attempts, for a human to retry. Like a real model it never words a tool
//! call the same way twice: each answer's calls carry the ask's number in
//! their arguments, so a round asked again gets other idempotency keys
//! (only the runtime's durable decision keeps a call's key).
//!
//! Invariant: whether a completion fails, and its wording, are a function
//! of the seed, the boot and the call order only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use durable_agent::runtime::{
    ConversationItem, FakeProvider, Provider, ProviderError, ProviderReply, ProviderRequest,
};

/// A prompt holding this fails every completion.
pub const POISON: &str = "[always times out]";

/// Whether the open turn's prompt (the last in the history) is poisoned.
fn poisoned(request: &ProviderRequest<'_>) -> bool {
    let prompt = request.history.iter().rev().find_map(|item| match item {
        ConversationItem::Prompt { text } => Some(text),
        _ => None,
    });
    prompt.is_some_and(|p| p.contains(POISON))
}

/// The fake provider, failing each completion with probability `failure`.
#[derive(Debug)]
pub struct FlakyProvider {
    inner: FakeProvider,
    failure: f64,
    rng: Mutex<ChaCha8Rng>,
    asks: AtomicU64,
}

impl FlakyProvider {
    pub fn new(seed: u64, boot: u32, failure: f64) -> Self {
        FlakyProvider {
            inner: FakeProvider::new(seed),
            failure: failure.clamp(0.0, 1.0),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed ^ (u64::from(boot) << 48) ^ 0xf1a4)),
            asks: AtomicU64::new(0),
        }
    }
}

impl Provider for FlakyProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn complete(&self, request: &ProviderRequest<'_>) -> Result<ProviderReply, ProviderError> {
        // The rng is plain data: a poisoned lock (panic elsewhere) is usable.
        let fail = self
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random_bool(self.failure);
        if fail || poisoned(request) {
            return Err(ProviderError("simulated provider timeout".into()));
        }
        let ask = self.asks.fetch_add(1, Ordering::Relaxed);
        let mut reply = self.inner.complete(request)?;
        for call in &mut reply.tool_calls {
            if let Some(args) = call.args.as_object_mut() {
                args.insert("wording".into(), serde_json::json!(format!("ask {ask}")));
            }
        }
        Ok(reply)
    }
}
