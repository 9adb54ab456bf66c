//! Typed errors for SQLite over the `Fs` seam, and the mapping from
//! `std::io::Error` to SQLite result codes used by the VFS callbacks.
//!
//! Invariant: every error leaving this module names the database path and
//! the step that failed; an I/O error at the seam is never reported as a
//! generic SQLite failure when its extended code says what it was.

use std::io;
use std::path::PathBuf;

use libsqlite3_sys as ffi;

/// The VFS step an io error happened in; picks the `SQLITE_IOERR_*` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoStep {
    Read,
    Write,
    Truncate,
    Sync,
    DirSync,
    FileSize,
    Delete,
    Access,
}

/// Map an io error at the seam to the SQLite result code for `step`.
/// `StorageFull` is `SQLITE_FULL` so SQLite reports "database or disk is
/// full" instead of a generic I/O error; everything else is the matching
/// extended `SQLITE_IOERR_*`, which SQLite treats as "outcome unknown".
pub(crate) fn io_to_code(step: IoStep, err: &io::Error) -> i32 {
    if err.kind() == io::ErrorKind::StorageFull {
        return ffi::SQLITE_FULL;
    }
    match step {
        IoStep::Read => ffi::SQLITE_IOERR_READ,
        IoStep::Write => ffi::SQLITE_IOERR_WRITE,
        IoStep::Truncate => ffi::SQLITE_IOERR_TRUNCATE,
        IoStep::Sync => ffi::SQLITE_IOERR_FSYNC,
        IoStep::DirSync => ffi::SQLITE_IOERR_DIR_FSYNC,
        IoStep::FileSize => ffi::SQLITE_IOERR_FSTAT,
        IoStep::Delete if err.kind() == io::ErrorKind::NotFound => ffi::SQLITE_IOERR_DELETE_NOENT,
        IoStep::Delete => ffi::SQLITE_IOERR_DELETE,
        IoStep::Access => ffi::SQLITE_IOERR_ACCESS,
    }
}

/// An error from opening or using a SQLite database on an `Fs`.
#[derive(Debug, thiserror::Error)]
pub enum SqliteError {
    /// The file exists but is not a SQLite database (bad header, garbage,
    /// or encrypted). Nothing was written; move the file aside to start
    /// afresh.
    #[error("{path}: not a SQLite database (during {op}); the file header is not SQLite's — move it aside or restore a backup: {source}")]
    NotADatabase {
        path: PathBuf,
        op: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// SQLite detected corruption inside the database (a malformed page or
    /// a failed integrity check).
    #[error("{path}: database is corrupt (during {op}): {source}")]
    Corrupt {
        path: PathBuf,
        op: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// The filesystem is full (ENOSPC at the seam). The transaction did not
    /// commit; free space and retry.
    #[error("{path}: disk full during {op}; the transaction did not commit: {source}{detail}")]
    Full {
        path: PathBuf,
        op: String,
        detail: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// An I/O error at the seam (`SQLITE_IOERR_*`). The outcome of the
    /// step is unknown: drop the handle and reopen (recovery runs on open).
    #[error(
        "{path}: I/O error during {op}, outcome unknown — drop this handle and reopen: {source}{detail}"
    )]
    Io {
        path: PathBuf,
        op: String,
        detail: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// The database could not be opened (missing directory, or the file
    /// could not be created).
    #[error("{path}: cannot open database (during {op}): {source}{detail}")]
    CantOpen {
        path: PathBuf,
        op: String,
        detail: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// The database is locked by another connection of this process.
    #[error("{path}: database is busy (during {op}): {source}")]
    Busy {
        path: PathBuf,
        op: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// Any other SQLite error (constraint, SQL syntax, misuse).
    #[error("{path}: {op}: {source}")]
    Sqlite {
        path: PathBuf,
        op: String,
        #[source]
        source: Box<rusqlite::Error>,
    },
    /// A pragma did not take the value asked for (e.g. WAL refused).
    #[error("{path}: PRAGMA {pragma} is {actual:?}, wanted {wanted:?}")]
    Pragma {
        path: PathBuf,
        pragma: &'static str,
        wanted: String,
        actual: String,
    },
    /// The path cannot be passed to SQLite (interior NUL byte).
    #[error("{path}: path cannot be used as a SQLite file name: {reason}")]
    BadPath { path: PathBuf, reason: String },
    /// Making the state SQLite adopted at open durable failed (outcome
    /// unknown: drop the handle and open again).
    #[error("{path}: {step} at open failed: {source}")]
    Adopt {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The VFS could not be registered with SQLite.
    #[error("cannot register SQLite VFS {name}: sqlite3_vfs_register returned {code}")]
    Register { name: String, code: i32 },
}

impl SqliteError {
    /// Classify a rusqlite error by its SQLite code. `detail` is the last
    /// io error the VFS saw (", last io error: ..."), or empty.
    pub fn classify(path: PathBuf, op: impl Into<String>, source: rusqlite::Error, detail: String) -> Self {
        let op = op.into();
        let source = Box::new(source);
        let code = match &*source {
            rusqlite::Error::SqliteFailure(e, _) => Some(e.code),
            _ => None,
        };
        use rusqlite::ErrorCode as C;
        match code {
            Some(C::NotADatabase) => SqliteError::NotADatabase { path, op, source },
            Some(C::DatabaseCorrupt) => SqliteError::Corrupt { path, op, source },
            Some(C::DiskFull) => SqliteError::Full {
                path,
                op,
                detail,
                source,
            },
            Some(C::SystemIoFailure) => SqliteError::Io {
                path,
                op,
                detail,
                source,
            },
            Some(C::CannotOpen) => SqliteError::CantOpen {
                path,
                op,
                detail,
                source,
            },
            Some(C::DatabaseBusy) | Some(C::DatabaseLocked) => SqliteError::Busy { path, op, source },
            _ => SqliteError::Sqlite { path, op, source },
        }
    }

    /// The extended SQLite result code, when the error came from SQLite.
    pub fn sqlite_code(&self) -> Option<i32> {
        let source = match self {
            SqliteError::NotADatabase { source, .. }
            | SqliteError::Corrupt { source, .. }
            | SqliteError::Full { source, .. }
            | SqliteError::Io { source, .. }
            | SqliteError::CantOpen { source, .. }
            | SqliteError::Busy { source, .. }
            | SqliteError::Sqlite { source, .. } => source,
            _ => return None,
        };
        match &**source {
            rusqlite::Error::SqliteFailure(e, _) => Some(e.extended_code),
            _ => None,
        }
    }
}
