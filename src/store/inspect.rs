//! Read-only queries for the operator's views (`GET /runs`, `/usage`,
//! `/errors`, `/triggers`; `durable-agent inspect …`): pages of the SQLite
//! tables, newest first.
//!
//! Invariant: every function here only SELECTs — no statement writes, and
//! none opens a write transaction — so a view can never change what
//! recovery or the oracle later reads. A page is `LIMIT`/`OFFSET` over one
//! total order (newest first, ties in the clock broken by insertion order,
//! the rowid: never by a text key, where `trg-9` sorts after `trg-10` —
//! a boot emits all its RESUME triggers in one millisecond), and its
//! `total` is counted by the same `WHERE`, so paging through a table that
//! does not change visits every row exactly once.
//!
//! Bookkeeping runs (the tool-call ledger's `session:{id}` run per agent
//! session, see `crate::system::session_run`) are not user runs:
//! [`user_runs`] leaves them out; [`run`] still finds one by its id.

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::cached::CachedSql;
use crate::store::schema::{sql, StoreError};
use crate::store::tool_calls::RunStatus;
use crate::store::triggers::TriggerStatus;

/// Rows a page holds when the caller does not say.
pub const DEFAULT_LIMIT: u32 = 50;
/// The most rows one page may hold (a bound on every answer's size).
pub const MAX_LIMIT: u32 = 500;

/// The prefix of the tool-call ledger's per-session bookkeeping runs.
pub const BOOKKEEPING_RUN_PREFIX: &str = "session:";

/// One page: at most `limit` rows after skipping `offset`, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub limit: u32,
    pub offset: u64,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            limit: DEFAULT_LIMIT,
            offset: 0,
        }
    }
}

impl Page {
    /// A page of `limit` rows (clamped to 1..=[`MAX_LIMIT`]) at `offset`.
    pub fn new(limit: u32, offset: u64) -> Page {
        Page {
            limit: limit.clamp(1, MAX_LIMIT),
            offset,
        }
    }

    fn sql_offset(&self) -> i64 {
        // SQLite's OFFSET is a signed 64-bit integer.
        i64::try_from(self.offset).unwrap_or(i64::MAX)
    }
}

/// A run as the runs table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    pub run_id: String,
    pub session_id: String,
    pub status: RunStatus,
    pub parent_run_id: Option<String>,
    /// The job, as the caller's JSON (job runs only).
    pub job_json: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
}

const RUN_COLUMNS: &str = "run_id, session_id, status, parent_run_id, job_json, created_at, updated_at";

type RawRun = (String, String, String, Option<String>, Option<String>, u64, u64);

fn run_row(raw: RawRun) -> Result<RunRow, StoreError> {
    let (run_id, session_id, status, parent_run_id, job_json, created_at_ms, updated_at_ms) = raw;
    Ok(RunRow {
        status: RunStatus::parse(&status)?,
        run_id,
        session_id,
        parent_run_id,
        job_json,
        created_at_ms,
        updated_at_ms,
    })
}

/// A page of the user runs (every run but the bookkeeping ones), newest
/// first, and how many there are.
pub fn user_runs(conn: &Connection, page: Page) -> Result<(Vec<RunRow>, u64), StoreError> {
    let pattern = format!("{BOOKKEEPING_RUN_PREFIX}%");
    let total: u64 = conn
        .query_row_cached(
            "SELECT COUNT(*) FROM runs WHERE run_id NOT LIKE ?1",
            [&pattern],
            |r| r.get(0),
        )
        .map_err(sql("inspect runs count"))?;
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE run_id NOT LIKE ?1 \
             ORDER BY created_at DESC, rowid DESC LIMIT ?2 OFFSET ?3"
        ))
        .map_err(sql("inspect runs"))?;
    let raws: Vec<RawRun> = stmt
        .query_map(params![pattern, page.limit, page.sql_offset()], |r| {
            RawRun::try_from(r)
        })
        .map_err(sql("inspect runs"))?
        .collect::<Result<_, _>>()
        .map_err(sql("inspect runs"))?;
    let rows = raws.into_iter().map(run_row).collect::<Result<Vec<_>, _>>()?;
    Ok((rows, total))
}

/// One run (a bookkeeping one too), if it exists.
pub fn run(conn: &Connection, run_id: &str) -> Result<Option<RunRow>, StoreError> {
    let raw: Option<RawRun> = conn
        .query_row_cached(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1"),
            [run_id],
            |r| RawRun::try_from(r),
        )
        .optional()
        .map_err(sql("inspect run"))?;
    raw.map(run_row).transpose()
}

/// Token counts summed over provider calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenSum {
    /// Provider calls that reported their usage.
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The token usage of one agent session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionUsage {
    pub session_id: String,
    pub agent_id: String,
    pub sum: TokenSum,
    /// When its latest call was recorded.
    pub last_at_ms: u64,
}

/// Every recorded call's tokens, summed (`session` = `None`), or one
/// session's.
pub fn token_sum(conn: &Connection, session: Option<&str>) -> Result<TokenSum, StoreError> {
    conn.query_row_cached(
        "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) \
         FROM token_usage WHERE ?1 IS NULL OR session_id = ?1",
        [session],
        |r| {
            Ok(TokenSum {
                calls: r.get(0)?,
                input_tokens: r.get(1)?,
                output_tokens: r.get(2)?,
            })
        },
    )
    .map_err(sql("inspect token sum"))
}

/// The token usage of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelUsage {
    /// `None`: calls recorded before the store kept the model (schema 3
    /// and older).
    pub model: Option<String>,
    pub sum: TokenSum,
}

/// The usage per model, by name (unrecorded last); at most
/// [`MAX_LIMIT`] models (a root talks to one provider at a time: a
/// handful).
pub fn usage_by_model(conn: &Connection) -> Result<Vec<ModelUsage>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT model, COUNT(*), SUM(input_tokens), SUM(output_tokens) FROM token_usage \
             GROUP BY model ORDER BY model IS NULL, model LIMIT ?1",
        )
        .map_err(sql("inspect usage by model"))?;
    let rows = stmt
        .query_map([MAX_LIMIT], |r| {
            Ok(ModelUsage {
                model: r.get(0)?,
                sum: TokenSum {
                    calls: r.get(1)?,
                    input_tokens: r.get(2)?,
                    output_tokens: r.get(3)?,
                },
            })
        })
        .map_err(sql("inspect usage by model"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql("inspect usage by model"))?;
    Ok(rows)
}

/// A page of the usage per agent session, the most recently active first,
/// and how many sessions recorded usage.
pub fn usage_by_session(conn: &Connection, page: Page) -> Result<(Vec<SessionUsage>, u64), StoreError> {
    let total: u64 = conn
        .query_row_cached("SELECT COUNT(DISTINCT session_id) FROM token_usage", [], |r| {
            r.get(0)
        })
        .map_err(sql("inspect usage count"))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT session_id, MIN(agent_id), COUNT(*), SUM(input_tokens), SUM(output_tokens), \
             MAX(created_at) AS last FROM token_usage GROUP BY session_id \
             ORDER BY last DESC, MAX(id) DESC LIMIT ?1 OFFSET ?2",
        )
        .map_err(sql("inspect usage"))?;
    let rows = stmt
        .query_map(params![page.limit, page.sql_offset()], |r| {
            Ok(SessionUsage {
                session_id: r.get(0)?,
                agent_id: r.get(1)?,
                sum: TokenSum {
                    calls: r.get(2)?,
                    input_tokens: r.get(3)?,
                    output_tokens: r.get(4)?,
                },
                last_at_ms: r.get(5)?,
            })
        })
        .map_err(sql("inspect usage"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql("inspect usage"))?;
    Ok((rows, total))
}

/// A stored provider-call failure, with where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorRow {
    pub session_id: String,
    pub agent_id: String,
    /// The turn's number in the agent's conversation.
    pub turn: u64,
    pub context: String,
    pub message: String,
    /// 0-indexed retry attempt that failed.
    pub attempt: u32,
    pub created_at_ms: u64,
}

/// A page of the stored errors (of one session, or all), newest first,
/// and how many there are.
pub fn errors(
    conn: &Connection,
    session: Option<&str>,
    page: Page,
) -> Result<(Vec<ErrorRow>, u64), StoreError> {
    let total: u64 = conn
        .query_row_cached(
            "SELECT COUNT(*) FROM errors WHERE ?1 IS NULL OR session_id = ?1",
            [session],
            |r| r.get(0),
        )
        .map_err(sql("inspect errors count"))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT session_id, agent_id, turn, context, message, attempt, created_at FROM errors \
             WHERE ?1 IS NULL OR session_id = ?1 ORDER BY id DESC LIMIT ?2 OFFSET ?3",
        )
        .map_err(sql("inspect errors"))?;
    let rows = stmt
        .query_map(params![session, page.limit, page.sql_offset()], |r| {
            Ok(ErrorRow {
                session_id: r.get(0)?,
                agent_id: r.get(1)?,
                turn: r.get(2)?,
                context: r.get(3)?,
                message: r.get(4)?,
                attempt: r.get(5)?,
                created_at_ms: r.get(6)?,
            })
        })
        .map_err(sql("inspect errors"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql("inspect errors"))?;
    Ok((rows, total))
}

/// A page of trigger ids (with `status`, or all), newest first, and how
/// many there are; read each with `TriggerStore::get`.
pub fn trigger_ids(
    conn: &Connection,
    status: Option<TriggerStatus>,
    page: Page,
) -> Result<(Vec<String>, u64), StoreError> {
    let status = status.map(|s| s.as_str());
    let total: u64 = conn
        .query_row_cached(
            "SELECT COUNT(*) FROM triggers WHERE ?1 IS NULL OR status = ?1",
            [status],
            |r| r.get(0),
        )
        .map_err(sql("inspect triggers count"))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT id FROM triggers WHERE ?1 IS NULL OR status = ?1 \
             ORDER BY created_at DESC, rowid DESC LIMIT ?2 OFFSET ?3",
        )
        .map_err(sql("inspect triggers"))?;
    let ids = stmt
        .query_map(params![status, page.limit, page.sql_offset()], |r| {
            r.get::<_, String>(0)
        })
        .map_err(sql("inspect triggers"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql("inspect triggers"))?;
    Ok((ids, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::schema::migrate;
    use crate::store::tool_calls::ToolCallStore;
    use crate::store::usage::{TurnRef, UsageStore};

    fn db() -> Connection {
        let conn = Connection::open_in_memory().expect("in-memory db");
        migrate(&conn, "test").expect("migrate");
        conn
    }

    #[test]
    fn user_runs_page_newest_first_without_bookkeeping_runs() {
        let conn = db();
        let store = ToolCallStore::default();
        for (i, id) in ["job-1", "session:aa", "job-2", "job-3"].iter().enumerate() {
            store.create_run(&conn, id, "s", 10 + i as u64).expect("create");
        }
        let (first, total) = user_runs(&conn, Page::new(2, 0)).expect("page");
        assert_eq!(total, 3);
        let ids: Vec<&str> = first.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["job-3", "job-2"]);
        let (second, _) = user_runs(&conn, Page::new(2, 2)).expect("page");
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].run_id, "job-1");
        assert!(run(&conn, "session:aa").expect("run").is_some());
        assert!(run(&conn, "nope").expect("run").is_none());
    }

    #[test]
    fn usage_and_errors_sum_and_page() {
        let conn = db();
        let at = |s: &str| TurnRef {
            session_id: s.into(),
            agent_id: format!("agent-{s}"),
            turn: 0,
        };
        UsageStore
            .persist_token_usage(&conn, &at("a"), "m1", 10, 1, 5)
            .expect("usage");
        UsageStore
            .persist_token_usage(&conn, &at("a"), "m2", 20, 2, 6)
            .expect("usage");
        UsageStore
            .persist_token_usage(&conn, &at("b"), "m1", 5, 5, 7)
            .expect("usage");
        let all = token_sum(&conn, None).expect("sum");
        assert_eq!((all.calls, all.input_tokens, all.output_tokens), (3, 35, 8));
        assert_eq!(token_sum(&conn, Some("a")).expect("sum").input_tokens, 30);
        let (by, total) = usage_by_session(&conn, Page::default()).expect("by session");
        assert_eq!(total, 2);
        assert_eq!(by[0].session_id, "b", "the most recently active first");
        // A row from before schema 4 has no model: its own row, never guessed.
        conn.execute_cached(
            "INSERT INTO token_usage (session_id, agent_id, turn, input_tokens, output_tokens, \
             created_at) VALUES ('c', 'agent-c', 0, 1, 1, 1)",
            [],
        )
        .expect("legacy row");
        let models: Vec<(Option<String>, u64, u64)> = usage_by_model(&conn)
            .expect("by model")
            .into_iter()
            .map(|m| (m.model, m.sum.calls, m.sum.input_tokens))
            .collect();
        assert_eq!(
            models,
            [
                (Some("m1".into()), 2, 15),
                (Some("m2".into()), 1, 20),
                (None, 1, 1)
            ]
        );
        UsageStore
            .persist_failed_attempt(&conn, &at("a"), "llm", "boom 0", 8)
            .expect("error");
        UsageStore
            .persist_failed_attempt(&conn, &at("a"), "llm", "boom 1", 9)
            .expect("error");
        let (errs, total) = errors(&conn, Some("a"), Page::new(1, 0)).expect("errors");
        assert_eq!((total, errs[0].attempt), (2, 1));
        assert_eq!(errors(&conn, Some("b"), Page::default()).expect("errors").1, 0);
    }
}
