//! Opening a SQLite database on an `Fs`: VFS lookup, deterministic PRNG,
//! journal mode and synchronous level, and a header check so a garbage file
//! fails at open with a typed error.
//!
//! Invariant: a [`Db`] owns its `rusqlite::Connection` and the `Arc<Vfs>`
//! it runs on, and drops the connection first, so the VFS is never
//! unregistered under an open connection. After a simulated crash, drop
//! every `Db` of the dead process *before* `SimFs::restart` (their close
//! then fails harmlessly against the dead disk instead of checkpointing
//! onto the rebooted one).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use libsqlite3_sys as ffi;
use rusqlite::{Connection, OpenFlags};

use super::error::SqliteError;
use super::vfs::Vfs;
use crate::canary::Canaries;
use crate::fs::Fs;

/// `PRAGMA journal_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum JournalMode {
    /// Write-ahead log (`-wal` file, in-memory wal-index).
    Wal,
    /// Rollback journal, deleted at commit.
    Delete,
}

impl JournalMode {
    fn as_sql(self) -> &'static str {
        match self {
            JournalMode::Wal => "wal",
            JournalMode::Delete => "delete",
        }
    }
}

/// `PRAGMA synchronous`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Synchronous {
    Off,
    Normal,
    Full,
    /// FULL plus a directory fsync after deleting the rollback journal.
    Extra,
}

impl Synchronous {
    fn as_sql(self) -> (&'static str, i64) {
        match self {
            Synchronous::Off => ("OFF", 0),
            Synchronous::Normal => ("NORMAL", 1),
            Synchronous::Full => ("FULL", 2),
            Synchronous::Extra => ("EXTRA", 3),
        }
    }
}

/// How to open a database. The default is the runtime's: WAL +
/// synchronous=FULL, under which no committed transaction is lost.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SqliteOptions {
    pub journal_mode: JournalMode,
    pub synchronous: Synchronous,
    /// Seeds SQLite's PRNG (WAL salts, journal nonces) and xRandomness.
    pub seed: u64,
    /// Start of the logical clock SQLite reads (`datetime('now')`).
    pub clock_unix_ms: i64,
    /// Known-bug switches of the VFS (harness builds only; see
    /// [`crate::canary`]). Like `seed`, they apply when the VFS registers.
    pub canaries: Canaries,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            journal_mode: JournalMode::Wal,
            synchronous: Synchronous::Full,
            seed: 0,
            clock_unix_ms: 1_700_000_000_000,
            canaries: Canaries::none(),
        }
    }
}

/// An open database: the connection plus the VFS it runs on.
pub struct Db {
    // Field order matters: the connection closes before the VFS may go.
    conn: Connection,
    vfs: Arc<Vfs>,
    fs: Arc<dyn Fs>,
    path: PathBuf,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("path", &self.path)
            .field("vfs", &self.vfs.name())
            .finish()
    }
}

/// Open (creating if missing) the SQLite database at `path` on `fs`.
///
/// Every byte SQLite reads or writes goes through `fs`. Connections opened
/// on the same `Arc<dyn Fs>` share one VFS (locks, wal-index), like
/// connections of one process. Fails with a typed error naming `path`:
/// [`SqliteError::NotADatabase`] for a garbage file, [`SqliteError::Io`]
/// when the seam fails (then drop and reopen later).
pub fn open(fs: Arc<dyn Fs>, path: &Path, opts: &SqliteOptions) -> Result<Db, SqliteError> {
    let vfs = Vfs::for_fs(&fs, opts.seed, opts.clock_unix_ms, &opts.canaries)?;
    if path.to_str().is_none_or(|s| s.contains('\0')) {
        return Err(SqliteError::BadPath {
            path: path.to_path_buf(),
            reason: "not UTF-8 or contains NUL".into(),
        });
    }
    let flags =
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    reseed_prng(opts.seed);
    let conn = Connection::open_with_flags_and_vfs(path, flags, vfs.name())
        .map_err(|e| classify(&vfs, path, "open", e))?;
    let db = Db {
        conn,
        vfs,
        fs,
        path: path.to_path_buf(),
    };
    db.configure(opts)?;
    if opts.journal_mode == JournalMode::Wal && opts.synchronous != Synchronous::Off {
        db.persist_adopted()?;
    }
    Ok(db)
}

/// Reseed SQLite's process-global PRNG so the bytes it feeds into files
/// (WAL salts, journal nonces) repeat run to run. The bundled build does
/// not define SQLITE_UNTESTABLE, so SQLITE_TESTCTRL_PRNG_SEED is available.
/// The seed becomes SQLite's `iPrngSeed`, which replaces xRandomness for
/// seeding, so a zero seed is mapped to a fixed non-zero one.
fn reseed_prng(seed: u64) {
    let folded = (seed ^ (seed >> 32)) as u32 as std::ffi::c_int;
    let x = if folded == 0 { 0x5eed } else { folded };
    // SAFETY: PRNG_SEED takes (int seed, sqlite3 *db); a NULL db means
    // "use the seed as given". It only touches SQLite's global PRNG state
    // under SQLite's PRNG mutex.
    unsafe {
        ffi::sqlite3_test_control(
            ffi::SQLITE_TESTCTRL_PRNG_SEED,
            x,
            std::ptr::null_mut::<ffi::sqlite3>(),
        );
    }
}

/// Run `f` with SQLite's process-global PRNG saved before and restored
/// after: whatever `f` opens (each [`open`] reseeds the PRNG) leaves the
/// draws of connections opened before it as they would have been. The
/// harness judges forked crash images this way in the middle of a live run
/// whose WAL salts must not change. Not reentrant (one save slot).
pub fn with_saved_prng<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: PRNG_SAVE / PRNG_RESTORE take no arguments and copy SQLite's
    // PRNG state to / from its one save slot under the PRNG mutex.
    unsafe {
        ffi::sqlite3_test_control(ffi::SQLITE_TESTCTRL_PRNG_SAVE);
    }
    let out = f();
    // SAFETY: as above.
    unsafe {
        ffi::sqlite3_test_control(ffi::SQLITE_TESTCTRL_PRNG_RESTORE);
    }
    out
}

fn classify(vfs: &Vfs, path: &Path, op: &str, e: rusqlite::Error) -> SqliteError {
    let detail = vfs
        .take_last_error()
        .map(|s| format!("; last io error: {s}"))
        .unwrap_or_default();
    SqliteError::classify(path.to_path_buf(), op, e, detail)
}

impl Db {
    /// Make durable what SQLite adopted at open. A crash can leave a
    /// committed WAL frame only in the page cache (its commit never
    /// returned); SQLite replays it on open, so the reopened process sees
    /// that transaction. If a later power loss then dropped it, a state
    /// that recovery already acted on would vanish. So before anyone reads:
    /// fsync the WAL and the database, then their directory (their entries
    /// may not be durable either). The same rule as the event log's
    /// recovery ("recovery persists what it relies on").
    fn persist_adopted(&self) -> Result<(), SqliteError> {
        let fs = &self.fs;
        let adopt = |step: &'static str| {
            let path = self.path.clone();
            move |source| SqliteError::Adopt { path, step, source }
        };
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        if fs
            .exists(&wal, "sqlite open wal exists")
            .map_err(adopt("wal lookup"))?
        {
            fs.sync(&wal, "sqlite open adopt wal fsync")
                .map_err(adopt("wal fsync"))?;
        }
        if fs
            .exists(&self.path, "sqlite open db exists")
            .map_err(adopt("db lookup"))?
        {
            fs.sync(&self.path, "sqlite open adopt db fsync")
                .map_err(adopt("db fsync"))?;
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs.sync_dir(dir, "sqlite open adopt dir fsync")
                .map_err(adopt("dir fsync"))?;
        }
        Ok(())
    }

    /// Settings and their checks in three statements, each parsed afresh
    /// on this new connection (so as few as possible): the settings that
    /// return nothing, in one batch; one query that reads the header and
    /// schema (a garbage file fails here) and the synchronous level back;
    /// the journal mode, which answers with what it became.
    fn configure(&self, opts: &SqliteOptions) -> Result<(), SqliteError> {
        let (sync_sql, sync_num) = opts.synchronous.as_sql();
        self.conn
            .execute_batch(&format!(
                "PRAGMA synchronous={sync_sql}; PRAGMA temp_store=MEMORY;"
            ))
            .map_err(|e| self.error("set PRAGMA synchronous", e))?;
        let actual: i64 = self
            .conn
            .query_row(
                "SELECT (SELECT count(*) FROM sqlite_schema), \
                 (SELECT synchronous FROM pragma_synchronous)",
                [],
                |r| r.get(1),
            )
            .map_err(|e| self.error("read schema", e))?;
        let mode: String = self
            .conn
            .query_row(
                &format!("PRAGMA journal_mode={}", opts.journal_mode.as_sql()),
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.error("set PRAGMA journal_mode", e))?;
        if !mode.eq_ignore_ascii_case(opts.journal_mode.as_sql()) {
            return Err(SqliteError::Pragma {
                path: self.path.clone(),
                pragma: "journal_mode",
                wanted: opts.journal_mode.as_sql().into(),
                actual: mode,
            });
        }
        if actual != sync_num {
            return Err(SqliteError::Pragma {
                path: self.path.clone(),
                pragma: "synchronous",
                wanted: sync_sql.into(),
                actual: actual.to_string(),
            });
        }
        Ok(())
    }

    /// The connection, for queries and statements.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The connection, mutably (for `transaction()`).
    pub fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The database path on the `Fs`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Name of the VFS this connection runs on.
    pub fn vfs_name(&self) -> &str {
        self.vfs.name()
    }

    /// Set the logical clock SQLite reads (shared by every Db on this Fs).
    pub fn set_clock_unix_ms(&self, ms: i64) {
        self.vfs.set_clock_unix_ms(ms);
    }

    /// Type a rusqlite error from step `op` on this database, adding the
    /// last io error the seam returned.
    pub fn error(&self, op: &str, e: rusqlite::Error) -> SqliteError {
        classify(&self.vfs, &self.path, op, e)
    }

    /// `PRAGMA integrity_check`: the problems found (empty means ok).
    pub fn integrity_check(&self) -> Result<Vec<String>, SqliteError> {
        let mut stmt = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(|e| self.error("integrity_check", e))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(|e| self.error("integrity_check", e))?;
        let mut problems = Vec::new();
        for row in rows {
            let line = row.map_err(|e| self.error("integrity_check", e))?;
            if line != "ok" {
                problems.push(line);
            }
        }
        Ok(problems)
    }

    /// Close the connection, reporting a failed final checkpoint or close.
    pub fn close(self) -> Result<(), SqliteError> {
        let Db {
            conn,
            vfs,
            path,
            fs: _,
        } = self;
        let result = conn.close().map_err(|(_, e)| classify(&vfs, &path, "close", e));
        drop(vfs);
        result
    }
}
