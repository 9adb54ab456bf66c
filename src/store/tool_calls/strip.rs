//! Payload stripping of settled tool calls (seed 001 §10's privacy note:
//! the ledger holds message content, do not keep it forever).
//!
//! Invariant: [`ToolCallStore::strip_payloads`] rewrites only `succeeded`
//! and `failed` rows last updated more than the TTL ago and outside the
//! runs the caller keeps, in one transaction: their `input_json` and
//! `result_json` become [`STRIPPED_JSON`] and a failed call's `error` (the
//! answer the model read) becomes [`STRIPPED_TEXT`]; id, run, tool names,
//! idempotency key, side-effect class, status, replay count and times stay.
//! Idempotent: a stripped row is not selected again, and `updated_at` is
//! not touched.
//!
//! Why the kept runs matter: a settled call asked again — a round a crash
//! rolled back, resumed — is answered from its row's result
//! (`SystemTools`), so the caller keeps the runs (`session:{id}`) of every
//! agent with a turn or work that may still resume; any other settled row
//! is never read back by a resume or an idempotency check, only shown.

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection};

use super::ToolCallStore;
pub use crate::store::activities::{StripReport, STRIPPED_JSON};
use crate::store::cached::{CachedSql, WriteTx};
use crate::store::schema::{sql, StoreError};
use crate::store::triggers::{cutoff_and_kept, cutoff_ms};

/// What replaces a stripped failed call's error text.
pub const STRIPPED_TEXT: &str = "[stripped]";

impl ToolCallStore {
    /// Strip the bodies of settled calls last updated more than `ttl_ms`
    /// before `now_ms`, except those of the runs `keep_run_ids` (see the
    /// module docs). Reports the call ids stripped.
    pub fn strip_payloads(
        &self,
        conn: &Connection,
        now_ms: u64,
        ttl_ms: u64,
        keep_run_ids: &[String],
    ) -> Result<StripReport, StoreError> {
        let cutoff_ms = cutoff_ms(now_ms, ttl_ms);
        let (kept, mut binds) = cutoff_and_kept(cutoff_ms, keep_run_ids);
        let json = binds.len() + 1;
        let text = json + 1;
        binds.push(Value::Text(STRIPPED_JSON.to_string()));
        binds.push(Value::Text(STRIPPED_TEXT.to_string()));
        // Stripped already: every body holds its marker. Arguments alone
        // could be `{"stripped":true}` as the model wrote them, and the
        // result and error would then be kept for ever (found by a review).
        let eligible = format!(
            "status IN ('succeeded', 'failed') AND updated_at < ?1 AND run_id NOT IN ({kept}) \
             AND NOT (input_json = ?{json} AND COALESCE(result_json, ?{json}) = ?{json} \
             AND COALESCE(error, ?{text}) = ?{text})"
        );
        let tx = WriteTx::begin(conn).map_err(sql("tool call strip begin"))?;
        let stripped = {
            let mut stmt = tx
                .prepare_cached(&format!(
                    "SELECT id FROM tool_calls WHERE {eligible} ORDER BY rowid"
                ))
                .map_err(sql("tool call strip select"))?;
            let rows = stmt
                .query_map(params_from_iter(binds.iter()), |r| r.get::<_, String>(0))
                .map_err(sql("tool call strip select"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("tool call strip select"))?
        };
        if !stripped.is_empty() {
            let n = tx
                .execute_cached(
                    &format!(
                        "UPDATE tool_calls SET input_json = ?{json}, \
                         result_json = CASE WHEN result_json IS NULL THEN NULL ELSE ?{json} END, \
                         error = CASE WHEN error IS NULL THEN NULL ELSE ?{text} END \
                         WHERE {eligible}"
                    ),
                    params_from_iter(binds.iter()),
                )
                .map_err(sql("tool call strip update"))?;
            // The write lock is held since the select.
            assert_eq!(
                n,
                stripped.len(),
                "tool call strip: update disagrees with its select"
            );
        }
        tx.commit().map_err(sql("tool call strip commit"))?;
        if !stripped.is_empty() {
            tracing::info!(
                count = stripped.len(),
                cutoff_ms,
                "stripped settled tool-call payloads"
            );
        }
        Ok(StripReport { cutoff_ms, stripped })
    }
}
