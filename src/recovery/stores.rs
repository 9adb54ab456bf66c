//! Boot recovery of the SQLite stores (step 0 of the recovery procedure):
//! run before the runtime's own recovery, so that no turn can start while
//! an irreversible action's fate is undecided or a trigger is leased to a
//! process that no longer exists.
//!
//! Invariant: afterwards no activity is left in INTENT without a decision
//! (retried with its key where the provider dedups, else
//! `needs_confirmation`), and no trigger is CLAIMED: the caller holds the
//! root's exclusive lock ([`crate::system::System::boot`]), so every lease
//! found belongs to a process that died, expired or not.
//! Both steps are idempotent, so a crash during them is recovered by
//! running them again.

use std::sync::Mutex;

use serde::Serialize;

use crate::sqlite::Db;
use crate::store::activities::{ActivityError, ActivityGate};
use crate::store::triggers::TriggerStore;
use crate::store::StoreError;

/// What store recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StoreRecovery {
    /// Decisions taken on INTENT rows, in ledger order.
    pub activities: Vec<String>,
    /// Triggers whose lease was reclaimed (CLAIMED → PENDING/DEAD).
    pub reclaimed_triggers: Vec<String>,
}

/// Why store recovery stopped (the outcome of the failing step is unknown:
/// reopen and run recovery again).
#[derive(Debug, thiserror::Error)]
pub enum StoreRecoveryError {
    #[error("activity ledger recovery: {0}")]
    Activities(#[from] ActivityError),
    #[error("trigger lease reclaim: {0}")]
    Triggers(#[from] StoreError),
}

/// Recover the activity ledger through `gate`, then reclaim every trigger
/// lease on `db` (the trigger store's connection, possibly the gate's
/// own), at logical time `now_ms`. Only the root lock's holder may call it.
pub fn recover_stores(
    gate: &ActivityGate,
    triggers: &TriggerStore,
    db: &Mutex<Db>,
    now_ms: u64,
) -> Result<StoreRecovery, StoreRecoveryError> {
    let activities = gate
        .recover(now_ms)?
        .iter()
        .map(|outcome| format!("{outcome:?}"))
        .collect();
    // Locked only now: `db` may be the gate's own connection.
    let db = db.lock().unwrap_or_else(|e| e.into_inner());
    let reclaimed_triggers = triggers.reclaim_orphaned(db.conn(), now_ms)?;
    Ok(StoreRecovery {
        activities,
        reclaimed_triggers,
    })
}
