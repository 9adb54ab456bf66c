//! [`Recorder`]: the daemon observer that outlives every crash, as the
//! world does. What it holds is what the daemon acknowledged, in order.
//!
//! Invariant: append-only; clones share one trace.

use std::sync::{Arc, Mutex, MutexGuard};

use durable_agent::daemon::{DaemonEvent, DaemonObserver};

use super::{fnv1a, FNV_START};

/// Shared, append-only event trace.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<(u64, DaemonEvent)>>>,
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, Vec<(u64, DaemonEvent)>> {
        // Append-only: a panic elsewhere cannot leave it half-written.
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every event so far, with its logical time.
    pub fn events(&self) -> Vec<(u64, DaemonEvent)> {
        self.lock().clone()
    }

    /// Stable hash of the trace.
    pub fn hash(&self) -> u64 {
        self.lock().iter().fold(FNV_START, |h, (t, e)| {
            fnv1a(fnv1a(h, &t.to_le_bytes()), format!("{e:?}").as_bytes())
        })
    }
}

impl DaemonObserver for Recorder {
    fn record(&self, now_ms: u64, event: DaemonEvent) {
        self.lock().push((now_ms, event));
    }
}
