//! The daemon's simulated provider: [`FlakyProvider`], the deterministic
//! fake LLM, failing a seeded share of completions (a timeout, a 5xx): the
//! turn is abandoned and retried.
//!
//! Invariant: whether a completion fails is a function of the seed, the
//! boot and the call order only.

use std::sync::Mutex;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::runtime::{FakeProvider, Provider, ProviderError, ProviderReply, ProviderRequest};

/// The fake provider, failing each completion with probability `failure`.
#[derive(Debug)]
pub struct FlakyProvider {
    inner: FakeProvider,
    failure: f64,
    rng: Mutex<ChaCha8Rng>,
}

impl FlakyProvider {
    pub fn new(seed: u64, boot: u32, failure: f64) -> Self {
        FlakyProvider {
            inner: FakeProvider::new(seed),
            failure: failure.clamp(0.0, 1.0),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed ^ (u64::from(boot) << 48) ^ 0xf1a4)),
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
        if fail {
            return Err(ProviderError("simulated provider timeout".into()));
        }
        self.inner.complete(request)
    }
}
