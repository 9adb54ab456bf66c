//! The operator's views of a live system (`durable-agent inspect …`,
//! `GET /runs`, `/usage`, `/errors`, `/triggers`: `store::inspect`),
//! against the stores' own reads (issue 27's "operators and humans").
//!
//! The promise (`src/store/inspect.rs`): a page is `LIMIT`/`OFFSET` over
//! one total order, newest first, and its `total` is counted by the same
//! `WHERE`, so paging through a table that does not change visits every
//! row exactly once; a run is found by its id. So, whenever the stores
//! were re-read (after a boot or a store op):
//!
//! - **V1** paging each view (usage by session, errors, trigger ids, user
//!   runs) two rows at a time visits exactly the rows one page of
//!   [`MAX_LIMIT`] holds, in the same order, as many as its `total`;
//! - **V2** each view holds what the stores hold: the usage of each
//!   session is the sum of its `token_usage` rows, and so are the token
//!   sums the app's run, agent and usage views read (`token_sum`, per
//!   session and over every row) and the usage by model, every session
//!   with usage rows is listed, the errors are the `errors` rows (all of
//!   them), newest first, the trigger ids are the triggers there
//!   are, and the user runs are the runs not named `session:…`;
//! - **V3** every run of the tool-call ledger (all of its `runs` rows) is
//!   found by its id, as the ledger reads it (session and status);
//! - **V4** the reads the daemon and the API act on: the PENDING triggers
//!   (`TriggerStore::pending`, what a boot rehydrates) are the `PENDING`
//!   rows in run order (`fire_at`, priority, insertion), every trigger is
//!   found by its id (`get`, `GET /triggers/{id}`) with its status, and
//!   each run's in-flight calls (`ToolCallStore::in_flight`, what a
//!   resume replays and `status` lists) are its `prepared`/`running`
//!   rows, oldest first — each against the harness's own SQL.
//!
//! No relaxation: a view reads the same committed rows the stores read,
//! in one process, with nothing in between.

use std::collections::{BTreeMap, BTreeSet};

use durable_agent::store::inspect::{self, Page, MAX_LIMIT};
use durable_agent::store::tool_calls::ToolCallStore;
use durable_agent::store::triggers::TriggerStore;
use durable_agent::store::usage::UsageStore;
use durable_agent::store::StoreError;
use rusqlite::Connection;

use super::Driver;

/// Rows a page holds while paging: small, so every view with three rows or
/// more spans pages.
const STEP: u32 = 2;

/// V1 for one view: the rows of every page of [`STEP`] rows, in order,
/// against one page of [`MAX_LIMIT`] rows and the view's total.
fn paged<T: PartialEq + std::fmt::Debug>(
    view: &str,
    read: impl Fn(Page) -> Result<(Vec<T>, u64), StoreError>,
    out: &mut Vec<String>,
) -> Option<Vec<T>> {
    let whole = match read(Page::new(MAX_LIMIT, 0)) {
        Ok(whole) => whole,
        Err(e) => {
            out.push(format!("view {view}: cannot be read: {e}"));
            return None;
        }
    };
    let (all, total) = whole;
    if total > u64::from(MAX_LIMIT) {
        // Past one page: V1 would need its own paging to compare with.
        return Some(all);
    }
    let mut walked = Vec::new();
    let mut offset = 0u64;
    loop {
        match read(Page::new(STEP, offset)) {
            Ok((rows, page_total)) => {
                if page_total != total {
                    out.push(format!(
                        "V1: view {view}: the page at offset {offset} counts {page_total} rows, the first {total}"
                    ));
                    return Some(all);
                }
                let n = rows.len() as u64;
                walked.extend(rows);
                offset += n;
                if n < u64::from(STEP) || offset > total {
                    break;
                }
            }
            Err(e) => {
                out.push(format!(
                    "view {view}: the page at offset {offset} cannot be read: {e}"
                ));
                return Some(all);
            }
        }
    }
    if walked != all || all.len() as u64 != total {
        out.push(format!(
            "V1: view {view}: paging {STEP} rows at a time visits {walked:?}, one page holds {all:?}, total {total}"
        ));
    }
    Some(all)
}

/// Provider calls, input tokens, output tokens.
type Tokens = (u64, u64, u64);
const NO_TOKENS: Tokens = (0, 0, 0);

fn plus(a: Tokens, b: Tokens) -> Tokens {
    (a.0 + b.0, a.1 + b.1, a.2 + b.2)
}

/// A count the harness reads itself, beside the views' own.
fn count(conn: &Connection, sql: &str) -> rusqlite::Result<u64> {
    conn.query_row(sql, [], |r| r.get(0))
}

/// V1–V3 over `conn`.
/// The ids `sql` selects (one text column, bound to `arg` if given).
fn ids(conn: &Connection, sql: &str, arg: Option<&str>) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = match arg {
        Some(a) => stmt.query_map([a], |r| r.get(0))?.collect(),
        None => stmt.query_map([], |r| r.get(0))?.collect(),
    };
    rows
}

/// V4 for one read: the ids a store read (`what`) are the ids the
/// harness's SQL selects (`rows`), in the same order.
fn same_ids(
    what: &str,
    rows: &str,
    read: Result<Vec<String>, StoreError>,
    want: rusqlite::Result<Vec<String>>,
    out: &mut Vec<String>,
) {
    match (read, want) {
        (Ok(read), Ok(want)) if read == want => {}
        (Ok(read), Ok(want)) => out.push(format!("V4: {what} read {read:?}, {rows} are {want:?}")),
        (Err(e), _) => out.push(format!("{what}: cannot be read: {e}")),
        (_, Err(e)) => out.push(format!("{what}: cannot be counted: {e}")),
    }
}

/// V4 (see the module doc) at `now` (ms).
fn acted_on(
    conn: &Connection,
    triggers: &TriggerStore,
    trigger_ids: &BTreeSet<String>,
    runs: &[String],
    now: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    let want = ids(
        conn,
        "SELECT id FROM triggers WHERE status = 'PENDING' ORDER BY fire_at, priority, rowid",
        None,
    );
    let read = triggers
        .pending(conn, now)
        .map(|ts| ts.into_iter().map(|t| t.id).collect());
    same_ids(
        "the PENDING triggers",
        "the rows in run order",
        read,
        want,
        &mut out,
    );
    for id in trigger_ids {
        let status = conn.query_row("SELECT status FROM triggers WHERE id = ?1", [id], |r| {
            r.get::<_, String>(0)
        });
        match (triggers.get(conn, id, now), status) {
            (Ok(Some(t)), Ok(status)) if &t.id == id && t.status.as_str() == status => {}
            (Ok(t), status) => out.push(format!(
                "V4: trigger {id} read by its id is {:?}, its row's status {status:?}",
                t.map(|t| (t.id, t.status))
            )),
            (Err(e), _) => out.push(format!("trigger {id}: cannot be read: {e}")),
        }
    }
    let store = ToolCallStore::default();
    for run in runs {
        let want = ids(
            conn,
            "SELECT id FROM tool_calls WHERE run_id = ?1 AND status IN ('prepared', 'running') \
             ORDER BY created_at, rowid",
            Some(run),
        );
        let read = store
            .in_flight(conn, run)
            .map(|cs| cs.into_iter().map(|c| c.id).collect());
        same_ids(
            &format!("run {run}'s in-flight calls"),
            "its rows",
            read,
            want,
            &mut out,
        );
    }
    out
}

fn violations(conn: &Connection, trigger_ids: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let usage = paged(
        "usage by session",
        |p| inspect::usage_by_session(conn, p),
        &mut out,
    );
    let triple = |t: inspect::TokenSum| (t.calls, t.input_tokens, t.output_tokens);
    let mut all = NO_TOKENS;
    let mut by_model: BTreeMap<Option<String>, Tokens> = BTreeMap::new();
    let usage = usage.unwrap_or_default();
    // Past one page the sessions listed are not all of them.
    let every_session = usage.len() < MAX_LIMIT as usize;
    match count(conn, "SELECT COUNT(DISTINCT session_id) FROM token_usage") {
        Ok(n) if n == usage.len() as u64 || !every_session => {}
        Ok(n) => out.push(format!(
            "V2: view usage by session: lists {} sessions, {n} sessions have usage rows",
            usage.len()
        )),
        Err(e) => out.push(format!("usage: sessions cannot be counted: {e}")),
    }
    for s in usage {
        match UsageStore.token_usage(conn, &s.session_id) {
            Ok(rows) => {
                let mut sum = NO_TOKENS;
                for r in &rows {
                    let one = (1, r.input_tokens, r.output_tokens);
                    sum = plus(sum, one);
                    let m = by_model.entry(r.model.clone()).or_insert(NO_TOKENS);
                    *m = plus(*m, one);
                }
                all = plus(all, sum);
                let shown = triple(s.sum);
                if shown != sum {
                    out.push(format!(
                        "V2: view usage by session: session {} shows (calls, input, output) {shown:?}, its rows sum to {sum:?}",
                        s.session_id
                    ));
                }
                match inspect::token_sum(conn, Some(&s.session_id)).map(triple) {
                    Ok(summed) if summed == sum => {}
                    Ok(summed) => out.push(format!(
                        "V2: token sum of session {}: (calls, input, output) {summed:?}, its rows sum to {sum:?}",
                        s.session_id
                    )),
                    Err(e) => out.push(format!("token sum of session {}: cannot be read: {e}", s.session_id)),
                }
            }
            Err(e) => out.push(format!("usage of session {}: cannot be read: {e}", s.session_id)),
        }
    }
    match inspect::token_sum(conn, None).map(triple) {
        Ok(summed) if summed == all || !every_session => {}
        Ok(summed) => out.push(format!(
            "V2: token sum of every session: (calls, input, output) {summed:?}, the sessions' rows sum to {all:?}"
        )),
        Err(e) => out.push(format!("token sum of every session: cannot be read: {e}")),
    }
    match inspect::usage_by_model(conn) {
        Ok(models) => {
            let shown: BTreeMap<Option<String>, Tokens> =
                models.into_iter().map(|m| (m.model, triple(m.sum))).collect();
            if every_session && shown != by_model {
                out.push(format!(
                    "V2: view usage by model: shows {shown:?}, the rows sum to {by_model:?} by model"
                ));
            }
        }
        Err(e) => out.push(format!("view usage by model: cannot be read: {e}")),
    }
    let errors = paged("errors", |p| inspect::errors(conn, None, p), &mut out).unwrap_or_default();
    // Every row, not only the sessions the view lists (compared below).
    match count(conn, "SELECT COUNT(*) FROM errors") {
        Ok(n) if n == errors.len() as u64 || n > u64::from(MAX_LIMIT) => {}
        Ok(n) => out.push(format!(
            "V2: view errors: lists {} rows, the errors table holds {n}",
            errors.len()
        )),
        Err(e) => out.push(format!("errors: cannot be counted: {e}")),
    }
    let mut by_session: BTreeMap<&str, Vec<(u64, &str, &str, u32)>> = BTreeMap::new();
    for e in &errors {
        by_session.entry(e.session_id.as_str()).or_default().push((
            e.turn,
            e.context.as_str(),
            e.message.as_str(),
            e.attempt,
        ));
    }
    for (session, mut shown) in by_session {
        shown.reverse();
        match UsageStore.errors(conn, session) {
            Ok(rows) => {
                let stored: Vec<_> = rows
                    .iter()
                    .map(|r| (r.turn, r.context.as_str(), r.message.as_str(), r.attempt))
                    .collect();
                if shown != stored {
                    out.push(format!(
                        "V2: view errors: session {session} shows {shown:?} (oldest first), its rows are {stored:?}"
                    ));
                }
            }
            Err(e) => out.push(format!("errors of session {session}: cannot be read: {e}")),
        }
    }
    let ids = paged("trigger ids", |p| inspect::trigger_ids(conn, None, p), &mut out);
    if let Some(ids) = ids {
        let shown: BTreeSet<String> = ids.into_iter().collect();
        if &shown != trigger_ids {
            out.push(format!(
                "V2: view trigger ids: shows {shown:?}, the triggers there are {trigger_ids:?}"
            ));
        }
    }
    let store = ToolCallStore::default();
    let runs = match store.run_ids(conn) {
        Ok(runs) => runs,
        Err(e) => {
            out.push(format!("runs: cannot be read: {e}"));
            return out;
        }
    };
    match count(conn, "SELECT COUNT(*) FROM runs") {
        Ok(n) if n == runs.len() as u64 => {}
        Ok(n) => out.push(format!(
            "V3: the ledger lists {} runs, its runs table holds {n}",
            runs.len()
        )),
        Err(e) => out.push(format!("runs: cannot be counted: {e}")),
    }
    let user_runs = paged("user runs", |p| inspect::user_runs(conn, p), &mut out);
    if let Some(user_runs) = user_runs {
        let shown: BTreeSet<&str> = user_runs.iter().map(|r| r.run_id.as_str()).collect();
        let want: BTreeSet<&str> = runs
            .iter()
            .map(String::as_str)
            .filter(|r| !r.starts_with(inspect::BOOKKEEPING_RUN_PREFIX))
            .collect();
        if shown != want {
            out.push(format!(
                "V2: view user runs: shows {shown:?}, the user runs are {want:?}"
            ));
        }
    }
    for id in &runs {
        let ledger = store.get_run(conn, id);
        let shown = inspect::run(conn, id);
        match (ledger, shown) {
            (Ok(Some(l)), Ok(Some(s))) if l.session_id == s.session_id && l.status == s.status => {}
            (Ok(l), Ok(s)) => out.push(format!(
                "V3: run {id}: the ledger reads {:?}, the operator's view {:?}",
                l.map(|l| (l.session_id, l.status)),
                s.map(|s| (s.session_id, s.status))
            )),
            (Err(e), _) | (_, Err(e)) => out.push(format!("run {id}: cannot be read: {e}")),
        }
    }
    out
}

impl Driver {
    /// V1–V3 on the live system's store; `trigger_ids` are the triggers
    /// the trigger store reads.
    pub(super) fn view_violations(&self, trigger_ids: &BTreeSet<String>) -> Vec<String> {
        match self.system() {
            Ok(system) => {
                let db = system.db();
                let conn = db.conn();
                let mut out = violations(conn, trigger_ids);
                match ToolCallStore::default().run_ids(conn) {
                    Ok(runs) => out.extend(acted_on(conn, system.triggers(), trigger_ids, &runs, self.now())),
                    Err(e) => out.push(format!("runs: cannot be read: {e}")),
                }
                out
            }
            Err(_) => Vec::new(),
        }
    }
}
