//! A human's answer for a NEEDS_CONFIRMATION key ([`ActivityStore::confirm`]).
//!
//! Invariant: only a NEEDS_CONFIRMATION row is changed, by one guarded
//! statement, so an answer can neither overwrite a settled result nor race
//! a send (the system runs ledger calls and confirmations under one
//! connection lock). After the answer, [`ActivityStore::execute_irreversible`]
//! for the same key sends it at most once more, and only if the human said
//! it was not delivered:
//!
//! - [`Resolution::Delivered`] → DONE with the human's provider reference:
//!   a re-run is answered from the ledger (`from_ledger: true`), never sent.
//! - [`Resolution::NotDelivered`] → the row is *deleted* (released). A
//!   re-run then takes the ordinary first-time path — INTENT committed,
//!   send, DONE — so it is sent exactly once, and a crash inside that path
//!   is handled like any first send (INTENT → recovery → NEEDS_CONFIRMATION
//!   again, never a blind re-send). Deleting rather than adding a
//!   "send again" status keeps the ledger's states closed (no value an
//!   older build would refuse to read) and leaves exactly one path that
//!   sends. What is lost is the audit trail of the first attempt; the log
//!   line below records the release.
//! - [`Resolution::Abandon`] → FAILED: nothing is sent, ever, for this key;
//!   a re-run is answered `Failed` from the ledger.
//!
//! "No irreversible side effect twice" therefore rests on the human's
//! answer being true; the ledger itself never sends a key twice.

use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};

use super::{ActivityStatus, ActivityStore};
use crate::store::cached::CachedSql;
use crate::store::schema::{sql, StoreError};

/// What a human says happened to a NEEDS_CONFIRMATION action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "resolution", rename_all = "snake_case")]
pub enum Resolution {
    /// It happened; `provider_ref` is the provider's reference for it (an
    /// email Message-ID) as the human found it.
    Delivered { provider_ref: String },
    /// It did not happen: release the key so a re-run sends it once.
    NotDelivered,
    /// Do not send it, whatever happened: settle the key as FAILED.
    Abandon,
}

/// The error text a FAILED row carries after [`Resolution::Abandon`].
pub const ABANDONED: &str = "abandoned by a human: never sent again for this key";

impl ActivityStore {
    /// Apply a human's `resolution` to the NEEDS_CONFIRMATION row `idem_key`
    /// (see the module docs). Returns the row's status afterwards, `None`
    /// when it was released. A missing row is [`StoreError::NotFound`]; a
    /// row in any other state is [`StoreError::WrongState`], unchanged.
    pub fn confirm(
        &self,
        conn: &Connection,
        idem_key: &str,
        resolution: &Resolution,
        now_ms: u64,
    ) -> Result<Option<ActivityStatus>, StoreError> {
        // Each arm is one autocommitted statement guarded by the status.
        let (changed, after) = match resolution {
            Resolution::Delivered { provider_ref } => (
                conn.execute_cached(
                    "UPDATE activity_log SET status = 'DONE', provider_ref = ?2, error = NULL, \
                     updated_at = ?3 WHERE idem_key = ?1 AND status = 'NEEDS_CONFIRMATION'",
                    params![idem_key, provider_ref, now_ms],
                )
                .map_err(sql("activity confirm delivered"))?,
                Some(ActivityStatus::Done),
            ),
            Resolution::NotDelivered => (
                conn.execute_cached(
                    "DELETE FROM activity_log WHERE idem_key = ?1 AND status = 'NEEDS_CONFIRMATION'",
                    params![idem_key],
                )
                .map_err(sql("activity confirm not delivered"))?,
                None,
            ),
            Resolution::Abandon => (
                conn.execute_cached(
                    "UPDATE activity_log SET status = 'FAILED', error = ?2, updated_at = ?3 \
                     WHERE idem_key = ?1 AND status = 'NEEDS_CONFIRMATION'",
                    params![idem_key, ABANDONED, now_ms],
                )
                .map_err(sql("activity confirm abandon"))?,
                Some(ActivityStatus::Failed),
            ),
        };
        if changed == 0 {
            return Err(match self.get(conn, idem_key)? {
                None => StoreError::NotFound {
                    table: "activity_log",
                    id: idem_key.to_string(),
                },
                Some(rec) => StoreError::WrongState {
                    table: "activity_log",
                    id: idem_key.to_string(),
                    op: "confirm",
                    expected: "NEEDS_CONFIRMATION",
                    actual: rec.status.as_str().to_string(),
                },
            });
        }
        tracing::info!(
            idem_key,
            ?resolution,
            "needs-confirmation activity resolved by a human"
        );
        Ok(after)
    }
}
