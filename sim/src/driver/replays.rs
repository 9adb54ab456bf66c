//! The tool calls a crash left in the ledger, as the boot after it found
//! them — in flight, or settled before their result reached the log — and
//! how many replays each had begun: what the ledger check
//! ([`super::Driver::ledger_violations`]) holds a replay's count to.
//!
//! Invariant: the map is exact for the process it was read in, or absent.
//! It is read once per boot that a crash did not cut short — on a
//! detached copy of the disk, so the read adds no I/O point and moves no
//! crash point of a case — and it
//! follows each row a turn the process answered settled. An op that failed
//! in a live process may leave calls in flight that the same process
//! replays later, so it drops the map ([`InFlight::forget`]) until the next
//! boot: the counts are then held to the looser rule alone (oracle R9).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use durable_agent::log::{DecidedCall, Event};

use durable_agent::sqlite::Db;
use durable_agent::store::tool_calls::{ToolCallStatus, ToolCallStore};
use durable_agent::store::StoreError;

/// Call id → (replays begun, status), of every call the last boot found;
/// `None` for a call the boot found settled without reading its row (the
/// logs answer every decided call: a resumed turn may still answer it
/// from its log, with whatever count an earlier process left — found by
/// a review: taken for a first run, such a call's count was a false
/// alarm).
#[derive(Debug, Clone, Default)]
pub(super) struct InFlight(Option<BTreeMap<String, Option<(u32, ToolCallStatus)>>>);

/// What the count of a call's row must be after the turn answered it,
/// given what the boot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Not known (no map): only R9's looser rule applies.
    Unknown,
    /// The call was not in flight at the boot: this process ran it first
    /// (no replay, count 0).
    FirstRun,
    /// In flight at the boot with this many replays begun: a reversible
    /// call's answer was one more replay's (or a refusal, which begins
    /// none); an irreversible one's the activity ledger's (no replay
    /// counted).
    Replayed(u32),
    /// Left `prepared` (never started) with this count, and asked again
    /// under its own id: a first attempt, not a replay
    /// (`SystemTools::enter`).
    Unstarted(u32),
    /// Settled before the boot (a crash between the ledger's commit and
    /// the result's log line): answered from the ledger, count unchanged
    /// (found by a review: taken for a first run, a replayed call's
    /// count was a false alarm).
    Settled(u32),
}

impl InFlight {
    /// What the boot left in the ledger. A call is in the ledger only once
    /// its round's decision is durable (I6), and settled before its
    /// result is logged (`SystemTools`), so a boot whose logs answer
    /// every decided call has none in flight, and a resumed turn answers
    /// those calls from its log, their counts whatever they were (held to
    /// R9's looser rule): the store is read (`open`,
    /// a copy: an SQLite open, +13% of the `ci` fuzz's instructions if
    /// paid at every boot) only when some decided call has no result.
    pub(super) fn after_boot(
        decided: &[DecidedCall],
        logs: Option<&BTreeMap<PathBuf, Vec<u8>>>,
        open: impl FnOnce() -> Result<Db, String>,
    ) -> InFlight {
        let Some(logs) = logs else {
            return InFlight(None);
        };
        let answered = answered_calls(logs);
        if decided.iter().all(|c| answered.contains(c.call_id.as_str())) {
            return InFlight(Some(decided.iter().map(|c| (c.call_id.clone(), None)).collect()));
        }
        open()
            .ok()
            .and_then(|db| InFlight::read(&db).ok())
            .unwrap_or_default()
    }

    /// Read the ledger the boot left, on `db`: every run's calls.
    fn read(db: &Db) -> Result<InFlight, StoreError> {
        let store = ToolCallStore::default();
        let conn = db.conn();
        let mut calls = BTreeMap::new();
        for run in store.run_ids(conn)? {
            for call in store.calls_of(conn, &run)? {
                calls.insert(call.id, Some((call.replay_attempts, call.status)));
            }
        }
        Ok(InFlight(Some(calls)))
    }

    /// Unknown until the next boot (see the module doc).
    pub(super) fn forget(&mut self) {
        self.0 = None;
    }

    /// What row `row_id` must show, answered to the turn's call `call_id`.
    pub(super) fn expect(&self, row_id: &str, call_id: &str) -> Expect {
        let Some(calls) = &self.0 else {
            return Expect::Unknown;
        };
        match calls.get(row_id) {
            None => Expect::FirstRun,
            Some(None) => Expect::Unknown,
            Some(Some((n, ToolCallStatus::Succeeded | ToolCallStatus::Failed))) => Expect::Settled(*n),
            Some(Some((n, ToolCallStatus::Prepared))) if row_id == call_id => Expect::Unstarted(*n),
            Some(Some((n, _))) => Expect::Replayed(*n),
        }
    }

    /// Rows a turn answered, as the check read them after it: settled,
    /// so an ask of one of them again is answered from the ledger.
    pub(super) fn settled(&mut self, rows: Vec<(String, u32, ToolCallStatus)>) {
        if let Some(calls) = &mut self.0 {
            for (id, n, status) in rows {
                calls.insert(id, Some((n, status)));
            }
        }
    }
}

/// The call ids of every `tool.result` in the event logs `logs`.
fn answered_calls(logs: &BTreeMap<PathBuf, Vec<u8>>) -> BTreeSet<String> {
    super::project::events_named(logs, "tool.result")
        .filter_map(|event| match event {
            Event::ToolResult { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect()
}
