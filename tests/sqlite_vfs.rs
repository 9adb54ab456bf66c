//! The SQLite VFS routes real SQLite through `Fs`: transactions commit and
//! read back on SimFs and RealFs, every step is a labelled I/O point, and
//! bad input gives typed errors.

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, OpenMode, RealFs, SimConfig, SimFs};
use durable_agent::sqlite::{open, JournalMode, SqliteError, SqliteOptions, Synchronous};

fn sim() -> (SimFs, Arc<dyn Fs>) {
    let sim = SimFs::new(SimConfig::new(7));
    sim.create_dir_all(Path::new("/data"), "test mkdir").unwrap();
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    (sim, fs)
}

fn write_rows(fs: Arc<dyn Fs>, path: &Path, opts: &SqliteOptions, n: i64) {
    let mut db = open(fs, path, opts).unwrap();
    db.conn()
        .execute_batch("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
        .unwrap();
    for i in 0..n {
        let tx = db.conn_mut().transaction().unwrap();
        tx.execute("INSERT INTO t (id, v) VALUES (?1, ?2)", (i, format!("row {i}")))
            .unwrap();
        tx.commit().unwrap();
    }
    db.close().unwrap();
}

fn count_rows(fs: Arc<dyn Fs>, path: &Path, opts: &SqliteOptions) -> i64 {
    let db = open(fs, path, opts).unwrap();
    assert!(db.integrity_check().unwrap().is_empty());
    db.conn()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn wal_transactions_commit_and_read_back_on_simfs() {
    let (sim, fs) = sim();
    let path = Path::new("/data/a.db");
    let opts = SqliteOptions::default();
    write_rows(fs.clone(), path, &opts, 5);
    assert_eq!(count_rows(fs.clone(), path, &opts), 5);
    let labels: Vec<String> = sim.trace().into_iter().map(|t| t.label).collect();
    for want in [
        "sqlite wal write off=",
        "sqlite wal sync",
        "sqlite dir sync new wal",
        "sqlite db read off=0 len=100",
    ] {
        assert!(
            labels.iter().any(|l| l.starts_with(want)),
            "no label {want:?} in trace: {labels:#?}"
        );
    }
}

#[test]
fn delete_journal_transactions_commit_and_read_back_on_simfs() {
    let (sim, fs) = sim();
    let path = Path::new("/data/d.db");
    let opts = SqliteOptions {
        journal_mode: JournalMode::Delete,
        synchronous: Synchronous::Extra,
        ..SqliteOptions::default()
    };
    write_rows(fs.clone(), path, &opts, 3);
    assert_eq!(count_rows(fs, path, &opts), 3);
    let labels: Vec<String> = sim.trace().into_iter().map(|t| t.label).collect();
    for want in [
        "sqlite journal write",
        "sqlite journal sync",
        "sqlite dir sync new journal",
        "sqlite journal delete",
        "sqlite dir sync after journal delete",
    ] {
        assert!(labels.iter().any(|l| l.starts_with(want)), "no label {want:?}");
    }
    assert!(!sim.disk_image().contains_key(Path::new("/data/d.db-journal")));
}

#[test]
fn transactions_commit_and_read_back_on_real_fs() {
    let dir = tempfile::tempdir().unwrap();
    let fs: Arc<dyn Fs> = Arc::new(RealFs::new());
    let path = dir.path().join("r.db");
    for mode in [JournalMode::Wal, JournalMode::Delete] {
        let opts = SqliteOptions {
            journal_mode: mode,
            ..SqliteOptions::default()
        };
        let p = path.with_extension(format!("{mode:?}"));
        write_rows(fs.clone(), &p, &opts, 4);
        assert_eq!(count_rows(fs.clone(), &p, &opts), 4);
    }
}

#[test]
fn two_connections_on_one_fs_share_locks_and_wal_index() {
    let (_sim, fs) = sim();
    let path = Path::new("/data/shared.db");
    let opts = SqliteOptions::default();
    let a = open(fs.clone(), path, &opts).unwrap();
    let b = open(fs.clone(), path, &opts).unwrap();
    assert_eq!(a.vfs_name(), b.vfs_name());
    a.conn()
        .execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    let n: i64 = b
        .conn()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1, "b sees a's commit through the shared wal-index");
    a.conn().execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = b.conn().execute_batch("BEGIN IMMEDIATE").unwrap_err();
    assert_eq!(err.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy));
    a.conn().execute_batch("COMMIT").unwrap();
}

#[test]
fn independent_fs_instances_get_independent_vfses() {
    let (sim1, fs1) = sim();
    let (sim2, fs2) = sim();
    let path = Path::new("/data/x.db");
    let opts = SqliteOptions::default();
    let a = open(fs1, path, &opts).unwrap();
    let b = open(fs2, path, &opts).unwrap();
    assert_ne!(a.vfs_name(), b.vfs_name());
    a.conn().execute_batch("CREATE TABLE only_in_one (x)").unwrap();
    b.conn().execute_batch("CREATE TABLE only_in_two (x)").unwrap();
    drop((a, b));
    assert!(sim1.disk_image().contains_key(path));
    assert!(sim2.disk_image().contains_key(path));
}

#[test]
fn garbage_database_file_is_a_typed_not_a_database_error() {
    let (_sim, fs) = sim();
    let path = Path::new("/data/garbage.db");
    fs.open(path, OpenMode::Create, "test").unwrap();
    fs.write_at(path, 0, &[0xAB; 8192], "test garbage").unwrap();
    let err = open(fs, path, &SqliteOptions::default()).unwrap_err();
    assert!(matches!(err, SqliteError::NotADatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("/data/garbage.db"), "{err}");
}

#[test]
fn corrupt_page_after_valid_header_is_a_typed_error() {
    let (sim, fs) = sim();
    let path = Path::new("/data/corrupt.db");
    let opts = SqliteOptions {
        journal_mode: JournalMode::Delete,
        ..SqliteOptions::default()
    };
    write_rows(fs.clone(), path, &opts, 50);
    let len = sim.disk_image()[path].len() as u64;
    // Keep the 100-byte header, smash the rest of page 1 (the schema).
    fs.write_at(path, 100, &vec![0xFF; 4096 - 100], "test corrupt")
        .unwrap();
    let err = open(fs.clone(), path, &opts).unwrap_err();
    assert!(
        matches!(
            err,
            SqliteError::Corrupt { .. } | SqliteError::NotADatabase { .. }
        ),
        "{err:?}, len {len}"
    );
    assert!(err.to_string().contains("/data/corrupt.db"), "{err}");
}

#[test]
fn missing_directory_is_a_typed_cant_open_error() {
    let (_sim, fs) = sim();
    let err = open(fs, Path::new("/nope/x.db"), &SqliteOptions::default()).unwrap_err();
    assert!(matches!(err, SqliteError::CantOpen { .. }), "{err:?}");
    assert!(err.to_string().contains("/nope/x.db"), "{err}");
}
