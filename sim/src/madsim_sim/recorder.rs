//! [`Recorder`]: what the simulated clients and the worker's lifecycle
//! reported, in order, outliving every crash as the world does. It is the
//! oracle's record of what was acknowledged.
//!
//! Invariant: append-only; clones share one trace.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{fnv1a, Event, FNV_START};

/// Shared, append-only event trace.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<(u64, Event)>>>,
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, Vec<(u64, Event)>> {
        // Append-only: a panic elsewhere cannot leave it half-written.
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, now_ms: u64, event: Event) {
        self.lock().push((now_ms, event));
    }

    /// Every event so far, with its logical time.
    pub fn events(&self) -> Vec<(u64, Event)> {
        self.lock().clone()
    }

    /// Stable hash of the trace.
    pub fn hash(&self) -> u64 {
        self.lock().iter().fold(FNV_START, |h, (t, e)| {
            fnv1a(fnv1a(h, &t.to_le_bytes()), format!("{e:?}").as_bytes())
        })
    }
}
