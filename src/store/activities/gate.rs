//! [`ActivityGate`]: the activity ledger packaged for a multi-threaded
//! caller — the runtime's `ToolExecutor` (which must be `Send + Sync`)
//! holds one and calls [`ActivityGate::execute`] for every irreversible tool.
//!
//! Invariant: one gate serialises its ledger calls on its own connection
//! (a `Mutex`), so INTENT → send → DONE for one key never interleaves with
//! another call's on the same connection.

use std::sync::{Arc, Mutex};

use super::{ActivityError, ActivityOutcome, ActivityStore, IrreversibleCall};
use crate::sqlite::Db;
use crate::world::Outbox;

/// The ledger, its database and the external provider, shareable.
#[derive(Debug, Clone)]
pub struct ActivityGate {
    db: Arc<Mutex<Db>>,
    outbox: Arc<dyn Outbox>,
    store: ActivityStore,
}

impl ActivityGate {
    /// `db` must already be migrated (see `store::schema::open_store`).
    pub fn new(db: Db, outbox: Arc<dyn Outbox>, store: ActivityStore) -> Self {
        Self::shared(Arc::new(Mutex::new(db)), outbox, store)
    }

    /// A gate on a connection other stores use too (under the same lock,
    /// so their transactions never interleave with a ledger call's). Never
    /// call the gate while holding `db`'s lock: the gate takes it.
    pub fn shared(db: Arc<Mutex<Db>>, outbox: Arc<dyn Outbox>, store: ActivityStore) -> Self {
        ActivityGate { db, outbox, store }
    }

    fn with_db<T>(&self, f: impl FnOnce(&Db) -> T) -> T {
        // A panic inside a ledger call leaves no half-applied SQL (each step
        // is its own transaction), so a poisoned lock is still usable.
        let guard = self.db.lock().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    /// Perform `call` at most once (see [`ActivityStore::execute_irreversible`]).
    pub fn execute(&self, call: &IrreversibleCall, now_ms: u64) -> Result<ActivityOutcome, ActivityError> {
        self.with_db(|db| {
            self.store
                .execute_irreversible(db.conn(), self.outbox.as_ref(), call, now_ms)
        })
    }

    /// The ledger itself, for calls that bring their own connection (the
    /// system's admin operations, under the system's connection lock).
    pub fn store(&self) -> &ActivityStore {
        &self.store
    }

    /// Boot recovery of INTENT rows (see [`ActivityStore::recover`]).
    pub fn recover(&self, now_ms: u64) -> Result<Vec<ActivityOutcome>, ActivityError> {
        self.with_db(|db| self.store.recover(db.conn(), self.outbox.as_ref(), now_ms))
    }
}
