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

#[test]
fn sqlite_now_reads_the_logical_clock() {
    let (_sim, fs) = sim();
    let opts = SqliteOptions {
        clock_unix_ms: 1_234_567_890_000,
        ..SqliteOptions::default()
    };
    let db = open(fs, Path::new("/data/clock.db"), &opts).unwrap();
    let now: i64 = db
        .conn()
        .query_row("SELECT unixepoch('now')", [], |r| r.get(0))
        .unwrap();
    assert_eq!(now, 1_234_567_890);
    db.set_clock_unix_ms(1_300_000_000_500);
    let now: String = db
        .conn()
        .query_row("SELECT datetime('now')", [], |r| r.get(0))
        .unwrap();
    assert_eq!(now, "2011-03-13 07:06:40");
}

/// Wraps SimFs; once `full` is set every write fails with ENOSPC.
#[derive(Debug)]
struct FullFs {
    inner: SimFs,
    full: std::sync::atomic::AtomicBool,
}

impl Fs for FullFs {
    fn create_dir_all(&self, p: &Path, l: &str) -> std::io::Result<()> {
        self.inner.create_dir_all(p, l)
    }
    fn open(&self, p: &Path, m: OpenMode, l: &str) -> std::io::Result<()> {
        self.inner.open(p, m, l)
    }
    fn write_at(&self, p: &Path, o: u64, d: &[u8], l: &str) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "test ENOSPC",
            ));
        }
        self.inner.write_at(p, o, d, l)
    }
    fn append(&self, p: &Path, d: &[u8], l: &str) -> std::io::Result<u64> {
        self.inner.append(p, d, l)
    }
    fn read_at(&self, p: &Path, o: u64, b: &mut [u8], l: &str) -> std::io::Result<usize> {
        self.inner.read_at(p, o, b, l)
    }
    fn read(&self, p: &Path, l: &str) -> std::io::Result<Vec<u8>> {
        self.inner.read(p, l)
    }
    fn len(&self, p: &Path, l: &str) -> std::io::Result<u64> {
        self.inner.len(p, l)
    }
    fn truncate(&self, p: &Path, n: u64, l: &str) -> std::io::Result<()> {
        self.inner.truncate(p, n, l)
    }
    fn sync(&self, p: &Path, l: &str) -> std::io::Result<()> {
        self.inner.sync(p, l)
    }
    fn sync_dir(&self, p: &Path, l: &str) -> std::io::Result<()> {
        self.inner.sync_dir(p, l)
    }
    fn rename(&self, f: &Path, t: &Path, l: &str) -> std::io::Result<()> {
        self.inner.rename(f, t, l)
    }
    fn remove(&self, p: &Path, l: &str) -> std::io::Result<()> {
        self.inner.remove(p, l)
    }
    fn list(&self, p: &Path, l: &str) -> std::io::Result<Vec<String>> {
        self.inner.list(p, l)
    }
    fn exists(&self, p: &Path, l: &str) -> std::io::Result<bool> {
        self.inner.exists(p, l)
    }
}

#[test]
fn disk_full_is_a_typed_full_error_and_the_commit_is_not_visible() {
    let (sim, _) = sim();
    let full = Arc::new(FullFs {
        inner: sim.clone(),
        full: false.into(),
    });
    let fs: Arc<dyn Fs> = full.clone();
    let path = Path::new("/data/full.db");
    let db = open(fs.clone(), path, &SqliteOptions::default()).unwrap();
    db.conn().execute_batch("CREATE TABLE t (x)").unwrap();
    full.full.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = db
        .conn()
        .execute("INSERT INTO t VALUES (zeroblob(100000))", [])
        .unwrap_err();
    let err = db.error("insert", e);
    assert!(matches!(err, SqliteError::Full { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("/data/full.db") && msg.contains("ENOSPC"), "{msg}");
    full.full.store(false, std::sync::atomic::Ordering::SeqCst);
    let n: i64 = db
        .conn()
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0);
}
