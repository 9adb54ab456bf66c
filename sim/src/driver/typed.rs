//! The typed errors the SQLite seam promises (`src/sqlite/error.rs`: "an
//! I/O error at the seam is never reported as a generic SQLite failure
//! when its extended code says what it was"), checked on every error a
//! boot answers: the harness injects full disks (`ENOSPC`) and I/O errors
//! into the store's files, and an operator reads the boot's error to
//! decide what to do (free space, reopen, restore a backup).
//!
//! T1: no [`SqliteError`] in the error's source chain is the generic
//! `Sqlite` variant while its SQLite code has a variant of its own (a
//! full disk, an I/O error, corruption, not a database, cannot open,
//! busy or locked).

use durable_agent::sqlite::SqliteError;
use durable_agent::store::schema::StoreError;
use rusqlite::ErrorCode;

/// T1 for `error`: the violation, if one [`SqliteError`] in its chain is
/// typed generic although its code says what it was.
pub(super) fn generic_sqlite_error(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut at = Some(error);
    while let Some(e) = at {
        // `StoreError::Open` is transparent: its `source()` skips the
        // SqliteError it holds, so it is looked into by name.
        let sqlite = match e.downcast_ref::<StoreError>() {
            Some(StoreError::Open(inner)) => Some(inner),
            _ => e.downcast_ref::<SqliteError>(),
        };
        if let Some(v) = sqlite.and_then(|s| generic(s, error)) {
            return Some(v);
        }
        at = e.source();
    }
    None
}

fn generic(e: &SqliteError, whole: &dyn std::error::Error) -> Option<String> {
    let SqliteError::Sqlite { path, op, source } = e else {
        return None;
    };
    let rusqlite::Error::SqliteFailure(f, _) = &**source else {
        return None;
    };
    matches!(
        f.code,
        ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::DatabaseCorrupt
            | ErrorCode::NotADatabase
            | ErrorCode::CannotOpen
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
    )
    .then(|| {
        format!(
            "T1: {} during {op}: SQLite said {:?} (code {}), but the error is typed as a generic SQLite failure: {whole}",
            path.display(),
            f.code,
            f.extended_code
        )
    })
}
