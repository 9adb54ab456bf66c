//! The `errors` rows a live system shows, against the failures the
//! scripted provider handed out (issue 27's "bookkeeping: error rows with
//! their attempt numbers").
//!
//! The promise (`src/runtime/turn_task.rs` `provider_replied`,
//! `src/system/calls.rs`, `src/store/usage.rs`): a failed provider call
//! leaves one `errors` row, committed before the turn fails with
//! `RuntimeError::Provider` — under the agent's session, the turn's number
//! (its agent's completed turns when it began), context `llm_complete
//! round {r}` and the provider's message — and its attempt is the number
//! of rows already recorded for the same call (session, turn, context):
//! 0 for the first, then 1, 2, … across any restart (the store numbers it,
//! nothing in memory). So, for every live agent:
//!
//! - **E1** its rows, in order, are the failures the provider handed to a
//!   live process running that agent's turns ([`ProviderFaults`]), in the
//!   order handed out, each with its turn number, context and message —
//!   except that the row of a failure handed out in an op a crash, an
//!   injected I/O fault or a lost answer cut may be missing (its commit
//!   may not have happened, or not be durable) — unless that op answered
//!   the failure (`RuntimeError::Provider`, the process alive: the row
//!   was committed before the answer, `Exec::answered_failure`);
//! - **E2** each row's attempt is the count of the rows before it with the
//!   same turn and context.
//!
//! Relaxation: as U1–U3 ([`super::usage`]), an agent alive at a GC (TTL
//! 0) is not checked — the GC deletes the rows of settled sessions —
//! unless its log ends in an open turn, whose session the GC keeps.
//!
//! [`ProviderFaults`]: crate::standins::ProviderFaults

use durable_agent::store::usage::{StoredError, UsageStore};

use super::Driver;
use crate::standins::FailedAsk;

/// The context the runtime records a failed completion of round `round` under.
fn context_of(round: u32) -> String {
    format!("llm_complete round {round}")
}

fn same(f: &FailedAsk, row: &StoredError) -> bool {
    f.turn == Some(row.turn) && row.context == context_of(f.round) && row.message == f.message
}

impl Driver {
    /// Whether the last op's turn failed with the provider's error.
    pub fn take_provider_failed(&mut self) -> bool {
        std::mem::take(&mut self.provider_failed)
    }

    /// How many asks of each round the provider failed so far (what the
    /// model's [`crate::model::Model::provider_failed`] must be).
    pub fn provider_failures(&self) -> std::collections::BTreeMap<String, u8> {
        self.faults.counts()
    }

    /// The op that began after point `since` ran a turn numbered `turn`:
    /// the failures handed out in it are that turn's.
    pub fn note_failed_turn(&self, since: u64, turn: u64) {
        self.faults.note_turn(since, turn);
    }

    /// The op that began after point `since` was cut (crash, I/O fault,
    /// lost answer): its failures' rows may be missing (E1).
    pub fn cut_failures_since(&self, since: u64) {
        self.faults.cut_since(since);
    }

    /// E1–E2 for every live agent not alive at a GC (or open through it).
    pub(super) fn error_violations(&self) -> Vec<String> {
        let Ok(system) = self.system() else {
            return Vec::new();
        };
        let rt = system.runtime();
        let db = system.db();
        let failed = self.faults.all();
        let mut out = Vec::new();
        for (id, node) in rt.tree().nodes() {
            if self.usage_unchecked.contains(id) {
                continue;
            }
            let Some(session) = rt.session_id(id) else {
                continue;
            };
            let agent = &node.name;
            let rows = match UsageStore.errors(db.conn(), session.as_str()) {
                Ok(rows) => rows,
                Err(e) => {
                    out.push(format!("errors of {agent}: cannot be read: {e}"));
                    continue;
                }
            };
            for (i, row) in rows.iter().enumerate() {
                let earlier = rows[..i]
                    .iter()
                    .filter(|r| r.turn == row.turn && r.context == row.context)
                    .count();
                if row.attempt as usize != earlier {
                    out.push(format!(
                        "E2: errors of {agent}: the row of turn {} {:?} records attempt {}, but {earlier} failure(s) of that call are recorded before it",
                        row.turn, row.context, row.attempt
                    ));
                }
            }
            let mut expected = failed.iter().filter(|f| &f.agent == agent);
            let show = |f: &FailedAsk| format!("turn {:?} {:?} {:?}", f.turn, context_of(f.round), f.message);
            'rows: for row in &rows {
                loop {
                    match expected.next() {
                        Some(f) if same(f, row) => continue 'rows,
                        // Its op was cut before the row became durable.
                        Some(f) if f.cut => continue,
                        Some(f) => {
                            out.push(format!(
                                "E1: errors of {agent}: the provider failed {} (its op answered), but the next row is turn {} {:?} {:?}",
                                show(f),
                                row.turn,
                                row.context,
                                row.message
                            ));
                            break 'rows;
                        }
                        None => {
                            out.push(format!(
                                "E1: errors of {agent}: a row of turn {} {:?} {:?} that no failure handed out to a live process accounts for",
                                row.turn, row.context, row.message
                            ));
                            break 'rows;
                        }
                    }
                }
            }
            if let Some(f) = expected.find(|f| !f.cut) {
                if out.iter().all(|v| !v.contains(&format!("errors of {agent}:"))) {
                    out.push(format!(
                        "E1: errors of {agent}: the provider failed {} (its op answered), and no row records it ({} rows)",
                        show(f),
                        rows.len()
                    ));
                }
            }
        }
        out
    }
}
