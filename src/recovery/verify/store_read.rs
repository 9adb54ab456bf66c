//! What SQLite makes of a copy of the store: its identity and the tool-call
//! ledger's call ids and idempotency keys ([`Ledger`]: an older copy of the
//! store lacks rows the logs' settled calls prove), or why it is not a
//! healthy store, or why this build may not use it (a newer build's) —
//! remembered per thread for the copies read lately.
//!
//! Why remembered: opening a store is SQLite's whole fixed cost (parse the
//! schema, rebuild the WAL index, roll back a hot journal, walk every
//! b-tree for `integrity_check`). `verify` pays it once per call, which an
//! operator never notices; the harness runs `verify` before every boot it
//! judges (oracle I7), and most of those disks hold a store some earlier
//! disk held byte for byte (a crash in a log write leaves the store as it
//! was), so this was a third of a `ci` fuzz.
//!
//! Invariant: [`read`] is a pure function of the three files' bytes (the
//! copy is opened on a fault-free in-memory [`SimFs`] under a fixed name,
//! so even SQLite's error texts depend on nothing else), and a copy is
//! looked up by its exact bytes — lengths first, then every byte — so a
//! remembered answer is the answer a fresh read gives. At most
//! [`MEMO_COPIES`] copies of at most [`MEMO_MAX_BYTES`] each are kept per
//! thread, oldest dropped first; a copy that could not even be put in
//! memory is never remembered.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io;
use std::path::Path;
use std::sync::Arc;

use rusqlite::OptionalExtension;

use crate::fs::{Fs, OpenMode, SimConfig, SimFs};
use crate::store::checkpoints::LOOP_CHECKPOINT_SCHEMA_VERSION;
use crate::store::schema::SCHEMA_VERSION;

/// `store.db`'s bytes, its WAL's and its rollback journal's, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoreCopy {
    pub db: Vec<u8>,
    pub wal: Option<Vec<u8>>,
    pub journal: Option<Vec<u8>>,
}

impl StoreCopy {
    fn len(&self) -> usize {
        self.db.len() + self.wal.as_ref().map_or(0, Vec::len) + self.journal.as_ref().map_or(0, Vec::len)
    }

    /// Equal bytes, the cheap comparisons first.
    fn same_as(&self, other: &StoreCopy) -> bool {
        let lens = |c: &StoreCopy| {
            (
                c.db.len(),
                c.wal.as_ref().map(Vec::len),
                c.journal.as_ref().map(Vec::len),
            )
        };
        lens(self) == lens(other) && self == other
    }
}

/// What SQLite made of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StoreRead {
    /// It opened, `integrity_check` found nothing, and its
    /// `application_id` (the store id) is this.
    Healthy { store_id: u32 },
    /// Not a healthy store: why, as the finding says it.
    Corrupt(String),
    /// A healthy store a newer build wrote (its schema, or a loop
    /// checkpoint's, is above this build's): why, as the finding says it.
    /// The boot refuses it (`StoreError::FutureSchema`,
    /// `StoreError::FutureCheckpoint`); it is not damage.
    Newer(String),
    /// The copy could not be put in memory (nothing said of the store).
    CopyFailed(String),
}

/// Copies kept per thread. The harness's sweep judges the forks of one op
/// in a row, and their stores take a handful of distinct states.
const MEMO_COPIES: usize = 8;

/// The largest copy kept (a production store past it is read once and
/// forgotten: `verify` runs once per process there).
const MEMO_MAX_BYTES: usize = 16 << 20;

thread_local! {
    static READ: RefCell<Vec<(StoreCopy, StoreRead, Ledger)>> = const { RefCell::new(Vec::new()) };
}

/// Every call id and idempotency key of a healthy copy's `tool_calls`
/// (empty for any other read, and for a store without the table).
pub(super) type Ledger = Arc<BTreeSet<String>>;

/// What SQLite makes of `copy`.
#[cfg(test)]
pub(super) fn read(copy: StoreCopy) -> StoreRead {
    read_with_ledger(copy).0
}

/// What SQLite makes of `copy`, with its [`Ledger`]: remembered if this
/// thread read an equal copy lately, else read afresh.
pub(super) fn read_with_ledger(copy: StoreCopy) -> (StoreRead, Ledger) {
    let known = READ.with_borrow(|memo| {
        memo.iter()
            .find(|(seen, _, _)| seen.same_as(&copy))
            .map(|(_, read, ledger)| (read.clone(), ledger.clone()))
    });
    if let Some(known) = known {
        return known;
    }
    let (read, ledger) = fresh(&copy);
    if !matches!(read, StoreRead::CopyFailed(_)) && copy.len() <= MEMO_MAX_BYTES {
        READ.with_borrow_mut(|memo| {
            if memo.len() >= MEMO_COPIES {
                memo.remove(0);
            }
            memo.push((copy, read.clone(), ledger.clone()));
        });
    }
    (read, ledger)
}

/// The call ids and idempotency keys of `db`'s `tool_calls`, if it has the
/// table.
fn ledger_of(db: &crate::sqlite::Db) -> Result<Ledger, String> {
    let conn = db.conn();
    let has_table = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'tool_calls'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(|e| e.to_string())?
        > 0;
    let mut out = BTreeSet::new();
    if has_table {
        let mut stmt = conn
            .prepare("SELECT id, idempotency_key FROM tool_calls")
            .map_err(|e| e.to_string())?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| e.to_string())?;
        for row in rows {
            let (id, key) = row.map_err(|e| e.to_string())?;
            out.insert(id);
            out.insert(key);
        }
    }
    Ok(Arc::new(out))
}

/// Why the store `db` is a newer build's, if it is: its schema version
/// above this build's ([`crate::store::schema::SCHEMA_VERSION`]), or a
/// loop checkpoint's above [`LOOP_CHECKPOINT_SCHEMA_VERSION`] — what the
/// boot refuses before (`migrate`) and after (the loops' resume) it
/// recovers the logs.
fn newer_of(db: &crate::sqlite::Db) -> Result<Option<String>, String> {
    let conn = db.conn();
    let schema = crate::store::schema::user_version(conn).map_err(|e| e.to_string())?;
    if schema > SCHEMA_VERSION {
        return Ok(Some(format!(
            "schema version {schema}, written by a newer durable-agent (this build supports at most \
             {SCHEMA_VERSION}): the boot refuses it; run the newer build, or restore a backup this \
             build wrote"
        )));
    }
    // Not migrated yet (a crash inside the first boot's one migration
    // transaction): no table to read. Every version has the checkpoints'.
    if schema == 0 {
        return Ok(None);
    }
    let newest: Option<(String, u32)> = conn
        .query_row(
            // Each run's latest checkpoint: the one the boot resumes.
            "SELECT run_id, schema_version FROM loop_checkpoints c WHERE schema_version > ?1 \
             AND id = (SELECT MAX(id) FROM loop_checkpoints WHERE run_id = c.run_id) \
             ORDER BY run_id LIMIT 1",
            [LOOP_CHECKPOINT_SCHEMA_VERSION],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(|e| e.to_string())?;
    Ok(newest.map(|(run, version)| {
        format!(
            "the loop checkpoint of run {run} has schema version {version}, written by a newer \
             durable-agent (this build supports at most {LOOP_CHECKPOINT_SCHEMA_VERSION}): the boot \
             refuses to resume it; run the newer build, or restore a backup this build wrote"
        )
    }))
}

/// Open `copy` on a fault-free in-memory disk, read its identity, run
/// `integrity_check` and, when healthy, read its [`Ledger`] — or why a
/// newer build wrote it.
fn fresh(copy: &StoreCopy) -> (StoreRead, Ledger) {
    let (read, db) = fresh_read(copy);
    let (StoreRead::Healthy { .. }, Some(db)) = (&read, db) else {
        return (read, Ledger::default());
    };
    match newer_of(&db) {
        Ok(None) => {}
        Ok(Some(why)) => return (StoreRead::Newer(why), Ledger::default()),
        Err(e) => {
            return (
                StoreRead::Corrupt(format!("cannot read its schema versions: {e}")),
                Ledger::default(),
            )
        }
    }
    match ledger_of(&db) {
        Ok(ledger) => (read, ledger),
        Err(e) => (
            StoreRead::Corrupt(format!("cannot read the tool-call ledger: {e}")),
            Ledger::default(),
        ),
    }
}

/// [`fresh`] without the ledger: the read, and the opened copy.
fn fresh_read(copy: &StoreCopy) -> (StoreRead, Option<crate::sqlite::Db>) {
    let mem = SimFs::new(SimConfig::new(0));
    let path = Path::new("/verify/store.db");
    let put = |path: &Path, bytes: &[u8]| -> io::Result<()> {
        mem.open(path, OpenMode::Truncate, "verify copy create")?;
        mem.write_at(path, 0, bytes, "verify copy write")
    };
    let copied = mem
        .create_dir_all(Path::new("/verify"), "verify copy mkdir")
        .and_then(|()| put(path, &copy.db))
        .and_then(|()| match &copy.wal {
            Some(w) => put(Path::new("/verify/store.db-wal"), w),
            None => Ok(()),
        })
        .and_then(|()| match &copy.journal {
            Some(j) => put(Path::new("/verify/store.db-journal"), j),
            None => Ok(()),
        });
    if let Err(e) = copied {
        return (
            StoreRead::CopyFailed(format!("copying it into memory: {e}")),
            None,
        );
    }
    let opts = crate::sqlite::SqliteOptions::default();
    let db = match crate::sqlite::open(Arc::new(mem), path, &opts) {
        Ok(db) => db,
        Err(e) => {
            return (
                StoreRead::Corrupt(format!("does not open as a SQLite database: {e}")),
                None,
            )
        }
    };
    let found = match db
        .conn()
        .query_row("PRAGMA application_id", [], |r| r.get::<_, i32>(0))
    {
        // The id is stored as SQLite's signed 32-bit header field.
        Ok(id) => id as u32,
        Err(e) => return (StoreRead::Corrupt(format!("cannot read its identity: {e}")), None),
    };
    let read = match db.integrity_check() {
        Ok(problems) if problems.is_empty() => StoreRead::Healthy { store_id: found },
        Ok(problems) => {
            let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
            StoreRead::Corrupt(format!(
                "PRAGMA integrity_check: {} problem(s): {}",
                problems.len(),
                shown.join("; ")
            ))
        }
        Err(e) => StoreRead::Corrupt(format!("PRAGMA integrity_check failed: {e}")),
    };
    (read, Some(db))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::{read, StoreCopy, StoreRead, READ, SCHEMA_VERSION};
    use crate::fs::{Fs, SimConfig, SimFs};

    /// A store whose `application_id` is `id`, as its files' bytes.
    fn store(id: u32) -> StoreCopy {
        let fs = Arc::new(SimFs::new(SimConfig::new(1)));
        let path = Path::new("/s/store.db");
        fs.create_dir_all(Path::new("/s"), "test mkdir").expect("mkdir");
        let db =
            crate::sqlite::open(fs.clone(), path, &crate::sqlite::SqliteOptions::default()).expect("open");
        db.conn()
            .execute_batch(&format!(
                "PRAGMA application_id = {id}; CREATE TABLE t(x); INSERT INTO t VALUES (1);"
            ))
            .expect("write");
        let copy = copy_of(&fs);
        drop(db);
        copy
    }

    /// The bytes of the test store at `/s/store.db` and its WAL.
    fn copy_of(fs: &SimFs) -> StoreCopy {
        StoreCopy {
            db: fs.read(Path::new("/s/store.db"), "test read db").expect("db"),
            wal: fs.read(Path::new("/s/store.db-wal"), "test read wal").ok(),
            journal: None,
        }
    }

    #[test]
    fn an_equal_copy_gets_the_first_answer_and_a_different_one_is_read_afresh() {
        READ.with_borrow_mut(Vec::clear);
        let seven = store(7);
        assert_eq!(read(seven.clone()), StoreRead::Healthy { store_id: 7 });
        assert_eq!(read(seven.clone()), StoreRead::Healthy { store_id: 7 });
        assert_eq!(READ.with_borrow(Vec::len), 1, "an equal copy is not kept twice");
        // Same lengths, other bytes: never the remembered answer.
        let eight = store(8);
        assert_eq!(eight.db.len(), seven.db.len());
        assert_eq!(read(eight), StoreRead::Healthy { store_id: 8 });
        let garbage = StoreCopy {
            db: vec![0x5a; 4096],
            wal: None,
            journal: None,
        };
        let first = read(garbage.clone());
        assert!(matches!(first, StoreRead::Corrupt(_)), "{first:?}");
        assert_eq!(read(garbage), first);
        assert_eq!(READ.with_borrow(Vec::len), 3);
    }

    /// A migrated store holding one loop checkpoint per `versions` entry
    /// (in that order, all of run `r`), its own schema version then set to
    /// `schema` when given.
    fn migrated(versions: &[u32], schema: Option<u32>) -> StoreCopy {
        let fs = Arc::new(SimFs::new(SimConfig::new(1)));
        let path = Path::new("/s/store.db");
        fs.create_dir_all(Path::new("/s"), "test mkdir").expect("mkdir");
        let db = crate::store::schema::open_store(fs.clone(), path, &crate::sqlite::SqliteOptions::default())
            .expect("open");
        for v in versions {
            db.conn()
                .execute(
                    "INSERT INTO loop_checkpoints (run_id, session_id, turn, last_msg_id, messages_json, \
                     usage_json, tool_calls_count, schema_version, created_at) \
                     VALUES ('r', 's', 1, 0, '[]', '{}', 0, ?1, 0)",
                    [v],
                )
                .expect("checkpoint");
        }
        if let Some(schema) = schema {
            db.conn()
                .pragma_update(None, "user_version", schema)
                .expect("user_version");
        }
        let copy = copy_of(&fs);
        drop(db);
        copy
    }

    #[test]
    fn a_newer_builds_store_or_latest_checkpoint_is_newer_and_nothing_else_is() {
        READ.with_borrow_mut(Vec::clear);
        let newer = |copy| match read(copy) {
            StoreRead::Newer(why) => Some(why),
            StoreRead::Healthy { .. } => None,
            other => panic!("neither healthy nor newer: {other:?}"),
        };
        assert_eq!(newer(migrated(&[], None)), None);
        assert_eq!(newer(migrated(&[1, 1], None)), None);
        let why = newer(migrated(&[1, 2], None)).expect("a newer latest checkpoint");
        assert!(why.contains("run r has schema version 2"), "{why}");
        // Only the latest checkpoint of a run is resumed, so only it counts.
        assert_eq!(newer(migrated(&[2, 1], None)), None);
        let why = newer(migrated(&[], Some(SCHEMA_VERSION + 1))).expect("a newer schema");
        assert!(
            why.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
            "{why}"
        );
        assert_eq!(newer(migrated(&[], Some(SCHEMA_VERSION))), None);
    }

    #[test]
    fn the_memo_keeps_the_newest_copies_only() {
        READ.with_borrow_mut(Vec::clear);
        for id in 0..(super::MEMO_COPIES as u32 + 3) {
            assert_eq!(read(store(id)), StoreRead::Healthy { store_id: id });
        }
        assert_eq!(READ.with_borrow(Vec::len), super::MEMO_COPIES);
        let oldest = READ.with_borrow(|m| m[0].1.clone());
        assert_eq!(oldest, StoreRead::Healthy { store_id: 3 });
    }
}
