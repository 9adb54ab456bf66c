//! How the stores talk to SQLite: every statement through the
//! connection's prepared-statement cache (`prepare_cached`, and
//! [`CachedSql`] for `execute` / `query_row`), and every write transaction
//! opened and committed by cached statements too ([`WriteTx`]).
//!
//! Invariant: the SQL text, its order and its transactions are exactly
//! what the stores wrote before the cache (`execute`, `query_row`,
//! `prepare` and `rusqlite::Transaction` with `BEGIN IMMEDIATE`): caching
//! changes how often SQLite parses a statement, never what runs. A cached
//! statement is reset when its execution or its rows end, and its
//! bindings are cleared when it goes back to the cache (rusqlite), so
//! none holds a read transaction open between calls.
//!
//! Why: a long-lived connection (a daemon's) runs the same few statements
//! for every turn, call and fire, and every `BEGIN`/`COMMIT`; preparing
//! them again each time is most of a small statement's cost. The cache is
//! not free: rusqlite prepares a cached statement with
//! `SQLITE_PREPARE_PERSISTENT`, which keeps the parse out of the
//! connection's lookaside memory, so a statement prepared for the cache
//! and never reused costs more than a plain one. The few statements only
//! boot's resume runs, once per connection by construction, are therefore
//! prepared plainly (`CheckpointStore::resume_all` and what it calls).
//! Measured on the harness's ci fuzz (callgrind, a fresh connection per
//! judged boot): caching with [`configure`]'s planner guarantee costs
//! within 1% of not caching; without the guarantee it cost 5% more.

use std::ops::Deref;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, Params, Row};

/// Prepared statements a store connection keeps. The stores have about
/// 90 distinct statements, plus a GC shape per count of kept ids (few);
/// all of them fit, so a long-lived connection parses each once.
pub(crate) const STATEMENT_CACHE_CAPACITY: usize = 256;

/// Make `conn` ready for the stores' cached statements: room for all of
/// them (rusqlite keeps 16 by default), and SQLite's query planner
/// stability guarantee on. Without it, a statement with a `col = ?` term
/// is marked to be planned again whenever its parameters are rebound —
/// and rusqlite clears a statement's bindings when it goes back to the
/// cache — so every reuse re-parsed it (10,803 times in one ci fuzz,
/// costing more than preparing afresh). With it, a statement keeps the
/// plan it got when first prepared, which is the plan an uncached
/// statement gets too (nothing is bound then): results are the same.
pub(crate) fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// `execute` and `query_row` through the statement cache.
pub(crate) trait CachedSql {
    /// [`Connection::execute`], with the statement from the cache.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// [`Connection::query_row`], with the statement from the cache.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;

    /// Every row of a query, mapped, with the statement from the cache.
    fn query_all_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<Vec<T>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> rusqlite::Result<T>;
}

impl CachedSql for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    fn query_all_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<Vec<T>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_map(params, f)?.collect()
    }
}

/// A write transaction (`BEGIN IMMEDIATE`): what
/// `rusqlite::Transaction::new_unchecked(conn, Immediate)` gave the stores,
/// with `BEGIN IMMEDIATE` and `COMMIT` taken from the statement cache.
/// Dropped without a successful [`WriteTx::commit`] — an early return, an
/// error, a failed `COMMIT` — it rolls back if a transaction is still open,
/// as rusqlite's does.
pub(crate) struct WriteTx<'c> {
    conn: &'c Connection,
}

impl<'c> WriteTx<'c> {
    /// `BEGIN IMMEDIATE`: the write lock now, or an error (busy, I/O).
    pub(crate) fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        conn.execute_cached("BEGIN IMMEDIATE", [])?;
        Ok(WriteTx { conn })
    }

    /// `COMMIT`. On an error the transaction is rolled back on drop (if
    /// SQLite has not already), so the outcome is "not committed" unless
    /// the error is an I/O error, whose outcome the caller treats as
    /// unknown.
    pub(crate) fn commit(self) -> rusqlite::Result<()> {
        self.conn.execute_cached("COMMIT", [])?;
        Ok(())
    }
}

impl Deref for WriteTx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        // After a successful COMMIT the connection is in autocommit mode
        // again: nothing to do. Otherwise roll back, ignoring the result
        // as rusqlite's `Transaction` does (the error that brought us here
        // is the one the caller reports).
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_cached("ROLLBACK", []);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CachedSql, WriteTx};
    use rusqlite::Connection;

    fn count(conn: &Connection) -> i64 {
        conn.query_row_cached("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .expect("count")
    }

    #[test]
    fn a_write_tx_commits_or_rolls_back_when_dropped() {
        let conn = Connection::open_in_memory().expect("in-memory db");
        conn.execute_batch("CREATE TABLE t (x INTEGER)").expect("table");
        let tx = WriteTx::begin(&conn).expect("begin");
        tx.execute_cached("INSERT INTO t VALUES (?1)", [1])
            .expect("insert");
        tx.commit().expect("commit");
        assert!(conn.is_autocommit());
        assert_eq!(count(&conn), 1);

        {
            let tx = WriteTx::begin(&conn).expect("begin");
            tx.execute_cached("INSERT INTO t VALUES (?1)", [2])
                .expect("insert");
            // Dropped without a commit: an early return in a store.
        }
        assert!(conn.is_autocommit(), "the drop ended the transaction");
        assert_eq!(count(&conn), 1, "the uncommitted row was rolled back");

        // The same statements again come from the cache and still work.
        let tx = WriteTx::begin(&conn).expect("begin again");
        tx.execute_cached("INSERT INTO t VALUES (?1)", [3])
            .expect("insert");
        tx.commit().expect("commit again");
        assert_eq!(count(&conn), 2);
    }
}
