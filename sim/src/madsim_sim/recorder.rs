//! [`Recorder`]: what the simulated clients and the worker's lifecycle
//! reported, in order, outliving every crash as the world does. It is the
//! oracle's record of what was acknowledged, and tells the clients which
//! kinds of operation the run has acknowledged so far (they steer toward
//! the others, see [`super::coverage`]).
//!
//! Invariant: append-only; clones share one trace; the acknowledged kinds
//! are exactly those of the trace's `Acked` events.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use super::coverage::op_kind;
use super::{fnv1a, Event, FNV_START};

#[derive(Debug, Default)]
struct Trace {
    events: Vec<(u64, Event)>,
    acked_kinds: BTreeSet<&'static str>,
}

/// Shared, append-only event trace.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    trace: Arc<Mutex<Trace>>,
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, Trace> {
        // Append-only: a panic elsewhere cannot leave it half-written.
        self.trace.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn record(&self, now_ms: u64, event: Event) {
        let mut trace = self.lock();
        if let Event::Acked { op, reply, .. } = &event {
            trace.acked_kinds.insert(op_kind(op, reply));
        }
        trace.events.push((now_ms, event));
    }

    /// Every event so far, with its logical time.
    pub fn events(&self) -> Vec<(u64, Event)> {
        self.lock().events.clone()
    }

    /// Whether an operation of coverage kind `kind` was acknowledged.
    pub fn acked(&self, kind: &str) -> bool {
        self.lock().acked_kinds.contains(kind)
    }

    /// Stable hash of the trace.
    pub fn hash(&self) -> u64 {
        self.lock().events.iter().fold(FNV_START, |h, (t, e)| {
            fnv1a(fnv1a(h, &t.to_le_bytes()), format!("{e:?}").as_bytes())
        })
    }
}
