//! Schema versioning and damaged databases: clear typed errors, no panics.

use durable_agent::store::schema::{migrate, user_version, SCHEMA_VERSION};
use durable_agent::store::StoreError;
use rusqlite::Connection;

#[test]
fn fresh_database_migrates_to_current_version_and_is_idempotent() {
    let conn = Connection::open_in_memory().unwrap();
    assert_eq!(migrate(&conn, "mem").unwrap(), 0);
    assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION);
    assert_eq!(migrate(&conn, "mem").unwrap(), SCHEMA_VERSION);
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for t in [
        "activity_log",
        "errors",
        "loop_checkpoints",
        "messages",
        "runs",
        "token_usage",
        "tool_calls",
        "triggers",
    ] {
        assert!(tables.iter().any(|n| n == t), "missing table {t} in {tables:?}");
    }
}

#[test]
fn database_from_newer_schema_is_refused_with_names_and_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 7)
            .unwrap();
    }
    let conn = Connection::open(&path).unwrap();
    let err = migrate(&conn, &path.display().to_string()).unwrap_err();
    match &err {
        StoreError::FutureSchema { db, found, supported } => {
            assert_eq!(*found, SCHEMA_VERSION + 7);
            assert_eq!(*supported, SCHEMA_VERSION);
            assert!(db.ends_with("sessions.db"));
        }
        other => panic!("expected FutureSchema, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("sessions.db") && text.contains(&format!("{}", SCHEMA_VERSION + 7)),
        "{text}"
    );
    // Refused before touching anything: no tables were created.
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn garbage_file_is_reported_corrupt_not_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    std::fs::write(&path, vec![0xA5u8; 8192]).unwrap();
    let conn = Connection::open(&path).unwrap();
    let err = migrate(&conn, "sessions.db").unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { ref db, .. } if db == "sessions.db"),
        "{err:?}"
    );
    assert!(err.to_string().contains("corrupt"), "{err}");
}

#[test]
fn database_with_damaged_pages_gives_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.db");
    {
        let conn = Connection::open(&path).unwrap();
        migrate(&conn, "sessions.db").unwrap();
    }
    // Keep the valid header page, smash every page after it.
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 4096);
    for b in bytes.iter_mut().skip(4096) {
        *b = 0xEE;
    }
    std::fs::write(&path, &bytes).unwrap();
    let conn = Connection::open(&path).unwrap();
    // The header still says "current version"; damage surfaces on first use
    // of a table as a typed error.
    let _ = migrate(&conn, "sessions.db");
    let store = durable_agent::store::triggers::TriggerStore::default();
    let res = store.pending(&conn, 0);
    assert!(res.is_err(), "damaged table must not read as empty: {res:?}");
}

mod over_the_vfs {
    use std::path::Path;
    use std::sync::Arc;

    use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
    use durable_agent::sqlite::{SqliteError, SqliteOptions};
    use durable_agent::store::schema::{open_store, SCHEMA_VERSION};
    use durable_agent::store::StoreError;

    fn sim_with(bytes: Option<&[u8]>) -> Arc<dyn Fs> {
        let fs: Arc<dyn Fs> = Arc::new(SimFs::new(SimConfig::new(3)));
        fs.create_dir_all(Path::new("/data"), "test mkdir").unwrap();
        if let Some(bytes) = bytes {
            let p = Path::new("/data/sessions.db");
            fs.open(p, OpenMode::CreateNew, "test create").unwrap();
            fs.write_at(p, 0, bytes, "test write").unwrap();
        }
        fs
    }

    #[test]
    fn store_opens_and_migrates_on_simfs() {
        let fs = sim_with(None);
        let db = open_store(
            fs.clone(),
            Path::new("/data/sessions.db"),
            &SqliteOptions::default(),
        )
        .unwrap();
        let v: u32 = db
            .conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn garbage_database_on_simfs_is_a_typed_error_naming_the_path() {
        let fs = sim_with(Some(&[0x5Au8; 4096]));
        let err = open_store(fs, Path::new("/data/sessions.db"), &SqliteOptions::default()).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Open(SqliteError::NotADatabase { .. }) | StoreError::Corrupt { .. }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("/data/sessions.db"), "{err}");
    }

    #[test]
    fn future_schema_on_simfs_is_refused() {
        let fs = sim_with(None);
        let path = Path::new("/data/sessions.db");
        {
            let db = durable_agent::sqlite::open(fs.clone(), path, &SqliteOptions::default()).unwrap();
            db.conn()
                .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        let err = open_store(fs, path, &SqliteOptions::default()).unwrap_err();
        assert!(
            matches!(err, StoreError::FutureSchema { found, .. } if found == SCHEMA_VERSION + 1),
            "{err:?}"
        );
        assert!(err.to_string().contains("/data/sessions.db"), "{err}");
    }
}

/// A full disk at any point of a fresh store's open and migration gives
/// an error that names the database file (an operator must know which
/// file system to free), never a bare "sqlite error during migrate".
#[test]
fn a_full_disk_while_migrating_names_the_database() {
    use durable_agent::fs::sim::FailKind;
    use durable_agent::fs::{Fault, Fs, SimConfig, SimFs};
    use durable_agent::sqlite::SqliteOptions;
    use durable_agent::store::schema::open_store;
    use std::path::Path;
    use std::sync::Arc;

    let path = Path::new("/data/store.db");
    let mut migrating = 0;
    for point in 1.. {
        let sim = Arc::new(SimFs::new(SimConfig::new(7)));
        sim.create_dir_all(Path::new("/data"), "mkdir").unwrap();
        let start = sim.points();
        sim.set_fault(Some(Fault::FailAt(start + point, FailKind::Enospc)));
        let fs: Arc<dyn Fs> = sim.clone();
        let opened = open_store(fs, path, &SqliteOptions::default());
        if sim.points() < start + point {
            break; // past the open's last point: nothing was injected
        }
        // (Some points' failures are absorbed: an open that succeeds.)
        let Err(err) = opened else { continue };
        let text = err.to_string();
        assert!(text.contains("/data/store.db"), "ENOSPC at point {point}: {text}");
        if let StoreError::Migrate { db, .. } = &err {
            assert_eq!(db, "/data/store.db");
            migrating += 1;
        }
    }
    assert!(migrating > 0, "no ENOSPC landed in the migration");
}
