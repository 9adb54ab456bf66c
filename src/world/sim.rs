//! The simulated external world (cargo feature `fakes`: tests and the
//! harness only): where irreversible side effects land (an
//! outbox that records every delivery). It lives outside the `Fs` seam, so it
//! survives every crash — exactly like a sent email — which is what lets the
//! oracle count duplicates.
//!
//! Invariant: [`World::deliveries`] lists every side effect that reached the
//! provider, in order, including duplicates; a dedup-capable world
//! ([`World::with_dedup`]) delivers at most once per idempotency key and
//! answers a re-send with the original `provider_ref`. Clones share one
//! world, so a test keeps a handle across the runtime's crash and restart.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{DeliveryError, Outbox};

/// One side effect that reached the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub idem_key: String,
    pub action: String,
    pub payload: serde_json::Value,
    pub provider_ref: String,
}

/// A scripted answer for the next send, instead of a clean delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scripted {
    /// Refuse without delivering.
    Reject,
    /// Deliver, but lose the reply (the caller sees `Unknown`).
    DeliverLoseReply,
    /// Time out without delivering (the caller sees `Unknown`).
    DropSilently,
}

#[derive(Debug, Default)]
struct State {
    dedup: bool,
    deliveries: Vec<Delivery>,
    seen: BTreeMap<String, String>,
    script: VecDeque<Scripted>,
    sends: u64,
}

/// The simulated external world. Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct World {
    state: Arc<Mutex<State>>,
}

impl World {
    /// A provider without idempotency keys: every send is a new delivery.
    pub fn without_dedup() -> Self {
        World::default()
    }

    /// A provider that honours idempotency keys.
    pub fn with_dedup() -> Self {
        let world = World::default();
        world.lock().dedup = true;
        world
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave State half-updated (each method
        // mutates it in one step), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue scripted answers for the next sends.
    pub fn script(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.lock().script.extend(answers);
    }

    /// Every delivery so far, in order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().deliveries.clone()
    }

    /// What an honest human answers for a key that needs confirmation,
    /// having looked it up here: delivered (with this world's reference)
    /// or not.
    pub fn honest_answer(&self, idem_key: &str) -> crate::store::activities::Resolution {
        use crate::store::activities::Resolution;
        match self.lock().deliveries.iter().find(|d| d.idem_key == idem_key) {
            Some(d) => Resolution::Delivered {
                provider_ref: d.provider_ref.clone(),
            },
            None => Resolution::NotDelivered,
        }
    }

    /// How many deliveries so far (`deliveries().len()` without the copy).
    pub fn deliveries_len(&self) -> usize {
        self.lock().deliveries.len()
    }

    /// How many deliveries carried `idem_key`.
    pub fn deliveries_for(&self, idem_key: &str) -> usize {
        self.lock()
            .deliveries
            .iter()
            .filter(|d| d.idem_key == idem_key)
            .count()
    }

    /// Keys delivered more than once, with their counts (the oracle's check).
    pub fn duplicates(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for d in &self.lock().deliveries {
            *counts.entry(d.idem_key.clone()).or_default() += 1;
        }
        counts.retain(|_, n| *n > 1);
        counts
    }

    /// How many times `send` was called (deduped re-sends included).
    pub fn sends(&self) -> u64 {
        self.lock().sends
    }

    /// An independent world as this one was after its first `n`
    /// deliveries: what a run forked at that earlier instant sees (the
    /// harness's fast crash sweep). Scripted answers still queued are
    /// carried; `sends` restarts at `n`.
    pub fn fork_prefix(&self, n: usize) -> World {
        let s = self.lock();
        let deliveries: Vec<Delivery> = s.deliveries.iter().take(n).cloned().collect();
        let seen = deliveries
            .iter()
            .map(|d| (d.idem_key.clone(), d.provider_ref.clone()))
            .collect();
        World {
            state: Arc::new(Mutex::new(State {
                dedup: s.dedup,
                sends: deliveries.len() as u64,
                deliveries,
                seen,
                script: s.script.clone(),
            })),
        }
    }
}

impl Outbox for World {
    fn supports_dedup(&self, _action: &str) -> bool {
        self.lock().dedup
    }

    fn send(
        &self,
        idem_key: &str,
        action: &str,
        payload: &serde_json::Value,
    ) -> Result<String, DeliveryError> {
        let mut s = self.lock();
        s.sends += 1;
        if s.dedup {
            if let Some(existing) = s.seen.get(idem_key) {
                return Ok(existing.clone());
            }
        }
        let scripted = s.script.pop_front();
        match scripted {
            Some(Scripted::Reject) => {
                return Err(DeliveryError::Rejected {
                    idem_key: idem_key.to_string(),
                    reason: "scripted rejection".to_string(),
                })
            }
            Some(Scripted::DropSilently) => {
                return Err(DeliveryError::Unknown {
                    idem_key: idem_key.to_string(),
                })
            }
            Some(Scripted::DeliverLoseReply) | None => {}
        }
        let provider_ref = format!("ref-{}", s.deliveries.len() + 1);
        s.deliveries.push(Delivery {
            idem_key: idem_key.to_string(),
            action: action.to_string(),
            payload: payload.clone(),
            provider_ref: provider_ref.clone(),
        });
        s.seen.insert(idem_key.to_string(), provider_ref.clone());
        tracing::debug!(idem_key, action, provider_ref, "delivered");
        if scripted == Some(Scripted::DeliverLoseReply) {
            return Err(DeliveryError::Unknown {
                idem_key: idem_key.to_string(),
            });
        }
        Ok(provider_ref)
    }
}
