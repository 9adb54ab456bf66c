//! The SQLite schema of the stores, its version, and the one error type the
//! stores return.
//!
//! Invariant: a connection is used by a store only after [`migrate`] brought
//! it to [`SCHEMA_VERSION`] (kept in `PRAGMA user_version`, bumped inside the
//! same transaction as the DDL, so a crash mid-migration leaves the old
//! version and no half-applied tables). A new database is created at the
//! current version in one step; an older one migrates version by version;
//! both end with the same tables, columns and indexes. A database written by a *newer*
//! build is refused with [`StoreError::FutureSchema`] before anything is
//! read or written; a file that is not a SQLite database gives
//! [`StoreError::Corrupt`]. Neither ever panics.
//!
//! Times are logical milliseconds (`INTEGER`, `u64` in Rust) passed in by the
//! caller: no wall clock is read here (the seeds used `REAL` seconds).

use rusqlite::{Connection, ErrorCode, TransactionBehavior};

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 4;

/// Every store's error: what failed, on which database/table/row, and what
/// to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database was written by a newer build.
    #[error(
        "database {db} has schema version {found} but this build supports at most {supported}; \
         upgrade durable-agent or open a database written by this version"
    )]
    FutureSchema { db: String, found: u32, supported: u32 },
    /// The file is not a readable SQLite database.
    #[error("database {db} is corrupt or not a SQLite database ({source}); restore it from a backup or move it aside")]
    Corrupt {
        db: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A SQLite call failed (I/O error included): the outcome of the
    /// operation is unknown; recover before retrying.
    #[error("sqlite error during {op}: {source}")]
    Sqlite {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    /// Checking or migrating the schema of `db` failed (a full disk, an
    /// I/O error). The migration is one transaction: the file holds the
    /// schema it had, or — if the failure was the commit's — possibly the
    /// new one; either opens again once the cause is fixed.
    #[error(
        "database {db}: checking or migrating its schema failed ({source}); the migration is one \
         transaction, so the file keeps its old schema or has the new one: fix the cause (free space \
         on a full disk) and open it again"
    )]
    Migrate {
        db: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A JSON column could not be encoded or decoded.
    #[error("bad JSON in {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// A column held a value this build does not know (e.g. a status).
    #[error("table {table} column {column} holds unknown value {value:?}")]
    UnknownValue {
        table: &'static str,
        column: &'static str,
        value: String,
    },
    /// A state transition was asked for a row in the wrong state.
    #[error("{table} row {id} is {actual}, expected {expected} for {op}")]
    WrongState {
        table: &'static str,
        id: String,
        op: &'static str,
        expected: &'static str,
        actual: String,
    },
    /// A trigger ack from a claim that no longer holds the lease.
    #[error(
        "trigger {id}: {op} by attempt {attempt} refused: the row is {status} at attempt {attempts} \
         (the lease was reclaimed; the newer claim owns the trigger)"
    )]
    LeaseLost {
        id: String,
        op: &'static str,
        attempt: u32,
        status: String,
        attempts: u32,
    },
    /// The row does not exist.
    #[error("{table} row {id} not found")]
    NotFound { table: &'static str, id: String },
    /// Opening the database over the `Fs` seam failed (I/O, not a
    /// database, …); the error names the path.
    #[error(transparent)]
    Open(#[from] crate::sqlite::SqliteError),
    /// A loop checkpoint of `run_id` asked for in a session another run
    /// already checkpoints: the session's messages are one sequence with
    /// no run column, so resuming either run would roll back the other's
    /// acknowledged messages ([`crate::store::checkpoints`]).
    #[error(
        "loop checkpoint for run {run_id} refused: session {session_id} already holds checkpoints \
         of run {other_run}, and a session's messages are one sequence (resuming one run would \
         roll back the other's); give each run its own session"
    )]
    SessionOfAnotherRun {
        run_id: String,
        session_id: String,
        other_run: String,
    },
    /// A loop checkpoint was written by a newer build (seed 003).
    #[error(
        "loop checkpoint for run {run_id} has schema version {found} but this build supports at \
         most {supported}; refusing to resume from an incompatible future checkpoint"
    )]
    FutureCheckpoint {
        run_id: String,
        found: u32,
        supported: u32,
    },
}

/// Wrap a rusqlite error with the operation that raised it.
pub(crate) fn sql(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sqlite { op, source }
}

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)
    )
}

/// Bring the database to [`SCHEMA_VERSION`]; `db` names it in errors.
/// Returns the version found before migrating (0 for a fresh database).
/// Also readies the connection for the stores' statement cache
/// (`cached::configure`).
pub fn migrate(conn: &Connection, db: &str) -> Result<u32, StoreError> {
    let classify = |source: rusqlite::Error| {
        if is_corruption(&source) {
            StoreError::Corrupt {
                db: db.to_string(),
                source,
            }
        } else {
            StoreError::Migrate {
                db: db.to_string(),
                source,
            }
        }
    };
    // Every store connection comes through here: ready it for the
    // stores' statement cache.
    super::cached::configure(conn).map_err(classify)?;
    let found = user_version(conn).map_err(classify)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::FutureSchema {
            db: db.to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(found);
    }
    let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).map_err(classify)?;
    // Re-read under the write lock: another connection may have migrated.
    let locked = user_version(&tx).map_err(classify)?;
    if locked == 0 {
        // A new database gets the current schema in one step.
        tx.execute_batch(CURRENT).map_err(classify)?;
    } else {
        // Version by version: each step's DDL exactly once.
        if locked < 2 {
            tx.execute_batch(V2).map_err(classify)?;
        }
        if locked < 3 {
            tx.execute_batch(V3).map_err(classify)?;
        }
        if locked < 4 {
            tx.execute_batch(V4).map_err(classify)?;
        }
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(classify)?;
    tx.commit().map_err(classify)?;
    tracing::info!(db, from = found, to = SCHEMA_VERSION, "schema migrated");
    Ok(found)
}

/// Open the stores' database at `path` on `fs` (WAL + synchronous=FULL
/// unless `opts` say otherwise) and migrate it: the one way the runtime
/// gets a store connection.
pub fn open_store(
    fs: std::sync::Arc<dyn crate::fs::Fs>,
    path: &std::path::Path,
    opts: &crate::sqlite::SqliteOptions,
) -> Result<crate::sqlite::Db, StoreError> {
    let db = crate::sqlite::open(fs, path, opts)?;
    migrate(db.conn(), &path.display().to_string())?;
    Ok(db)
}

/// The stored schema version (`PRAGMA user_version`).
pub fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |r| r.get::<_, u32>(0))
}

/// Version 1: every store's tables (seeds 000, 001, 003, 004), as a
/// version-1 database holds them (kept to check [`CURRENT`] against, and
/// to make the stores older builds left: [`older_schema`]).
#[cfg(any(test, feature = "fakes"))]
const V1: &str = r#"
CREATE TABLE triggers (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, dedup_key TEXT UNIQUE,
    session_id TEXT, fire_at INTEGER NOT NULL, not_before INTEGER,
    priority INTEGER NOT NULL, description TEXT, payload_json TEXT NOT NULL,
    status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, lease_until INTEGER,
    last_error TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);
CREATE INDEX idx_triggers_due ON triggers(status, fire_at, priority);

CREATE TABLE activity_log (
    idem_key TEXT PRIMARY KEY, task_id TEXT NOT NULL, action TEXT NOT NULL,
    payload_json TEXT NOT NULL, status TEXT NOT NULL, provider_ref TEXT,
    error TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);
CREATE INDEX idx_activity_status ON activity_log(status);

CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
    turn INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    tool_call_id TEXT, tool_name TEXT, tool_args TEXT, created_at INTEGER NOT NULL
);
CREATE INDEX idx_messages_session ON messages(session_id, id);

CREATE TABLE loop_checkpoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, session_id TEXT NOT NULL,
    turn INTEGER NOT NULL, last_msg_id INTEGER NOT NULL, messages_json TEXT NOT NULL,
    usage_json TEXT NOT NULL, tool_calls_count INTEGER NOT NULL,
    schema_version INTEGER NOT NULL, created_at INTEGER NOT NULL
);
CREATE INDEX idx_checkpoints_run ON loop_checkpoints(run_id, id);

CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);

CREATE TABLE tool_calls (
    id TEXT PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs(run_id),
    tool_name TEXT NOT NULL, raw_tool_name TEXT NOT NULL, input_json TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE, side_effect TEXT NOT NULL, status TEXT NOT NULL,
    result_json TEXT, error TEXT, replay_attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);
CREATE INDEX idx_tool_calls_run ON tool_calls(run_id, status);

CREATE TABLE token_usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    turn INTEGER NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE errors (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    turn INTEGER NOT NULL, context TEXT NOT NULL, message TEXT NOT NULL,
    attempt INTEGER NOT NULL, created_at INTEGER NOT NULL
);
"#;

/// The tables of a store that a build of schema `version` created and
/// left (1 ≤ `version` ≤ [`SCHEMA_VERSION`]): version 1's and each step
/// after it up to `version`, without the `user_version` stamp; `None` for
/// a version this build never had. For tests and the harness, which boot
/// this build on an older build's store (an upgrade), so that [`migrate`]'s
/// steps run, and crash, like any other I/O. Not for production: a store
/// is only ever created at [`CURRENT`].
#[cfg(any(test, feature = "fakes"))]
pub fn older_schema(version: u32) -> Option<String> {
    let steps = [V1, V2, V3, V4];
    const _: () = assert!(SCHEMA_VERSION == 4, "add the new version's step to older_schema");
    let upto = usize::try_from(version)
        .ok()
        .filter(|v| (1..=steps.len()).contains(v))?;
    Some(steps[..upto].concat())
}

/// Version 2: a run records the job it runs and the run it was forked
/// from (seed 004's `--job` / `--fork`).
const V2: &str = r#"
ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN job_json TEXT;
"#;

/// Version 3: every failed attempt of a tool call (a hard failure that was
/// retried, or the last one), numbered, beside the call's ledger row.
const V3: &str = r#"
CREATE TABLE tool_call_attempts (
    call_id TEXT NOT NULL, attempt INTEGER NOT NULL, error TEXT NOT NULL,
    created_at INTEGER NOT NULL, PRIMARY KEY (call_id, attempt)
);
"#;

/// Version 4: the model each provider call was made with, so usage can be
/// shown per model. Rows written before it have none (`NULL`: not
/// recorded, never guessed).
const V4: &str = r#"
ALTER TABLE token_usage ADD COLUMN model TEXT;
"#;

/// The schema at [`SCHEMA_VERSION`], which a new database is created with:
/// version 1 with version 2's and 4's columns folded into their tables and
/// version 3's table added (the
/// `schema_tests` check that it equals a version-1 database migrated step
/// by step). Keep it in step with every new version.
const CURRENT: &str = r#"
CREATE TABLE triggers (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, dedup_key TEXT UNIQUE,
    session_id TEXT, fire_at INTEGER NOT NULL, not_before INTEGER,
    priority INTEGER NOT NULL, description TEXT, payload_json TEXT NOT NULL,
    status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, lease_until INTEGER,
    last_error TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);
CREATE INDEX idx_triggers_due ON triggers(status, fire_at, priority);

CREATE TABLE activity_log (
    idem_key TEXT PRIMARY KEY, task_id TEXT NOT NULL, action TEXT NOT NULL,
    payload_json TEXT NOT NULL, status TEXT NOT NULL, provider_ref TEXT,
    error TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);
CREATE INDEX idx_activity_status ON activity_log(status);

CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
    turn INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    tool_call_id TEXT, tool_name TEXT, tool_args TEXT, created_at INTEGER NOT NULL
);
CREATE INDEX idx_messages_session ON messages(session_id, id);

CREATE TABLE loop_checkpoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, session_id TEXT NOT NULL,
    turn INTEGER NOT NULL, last_msg_id INTEGER NOT NULL, messages_json TEXT NOT NULL,
    usage_json TEXT NOT NULL, tool_calls_count INTEGER NOT NULL,
    schema_version INTEGER NOT NULL, created_at INTEGER NOT NULL
);
CREATE INDEX idx_checkpoints_run ON loop_checkpoints(run_id, id);

CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
    parent_run_id TEXT, job_json TEXT
);

CREATE TABLE tool_calls (
    id TEXT PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs(run_id),
    tool_name TEXT NOT NULL, raw_tool_name TEXT NOT NULL, input_json TEXT NOT NULL,
    idempotency_key TEXT NOT NULL UNIQUE, side_effect TEXT NOT NULL, status TEXT NOT NULL,
    result_json TEXT, error TEXT, replay_attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL
);
CREATE INDEX idx_tool_calls_run ON tool_calls(run_id, status);

CREATE TABLE tool_call_attempts (
    call_id TEXT NOT NULL, attempt INTEGER NOT NULL, error TEXT NOT NULL,
    created_at INTEGER NOT NULL, PRIMARY KEY (call_id, attempt)
);

CREATE TABLE token_usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    turn INTEGER NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    created_at INTEGER NOT NULL, model TEXT
);

CREATE TABLE errors (
    id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, agent_id TEXT NOT NULL,
    turn INTEGER NOT NULL, context TEXT NOT NULL, message TEXT NOT NULL,
    attempt INTEGER NOT NULL, created_at INTEGER NOT NULL
);
"#;

/// A closed set of values stored as TEXT: `as_str` for writing, `parse`
/// (typed [`StoreError::UnknownValue`] on anything else) for reading.
macro_rules! str_enum {
    ($(#[$m:meta])* $vis:vis enum $name:ident in $table:literal . $col:literal {
        $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        $vis enum $name { $($(#[$vm])* $var),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The stored spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$var => $s),+ }
            }

            /// Read a stored value back.
            pub fn parse(s: &str) -> Result<Self, $crate::store::StoreError> {
                match s {
                    $($s => Ok($name::$var),)+
                    other => Err($crate::store::StoreError::UnknownValue {
                        table: $table,
                        column: $col,
                        value: other.to_string(),
                    }),
                }
            }
        }
    };
}
pub(crate) use str_enum;

#[cfg(test)]
#[path = "schema_tests.rs"]
mod schema_tests;
