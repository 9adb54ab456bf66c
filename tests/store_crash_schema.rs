//! Migration under faults at every I/O point: the schema version is bumped
//! in the DDL's own transaction, so after any crash, lost reply or error
//! plus restart, opening again yields a complete current schema.

mod store_crash_common;

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::{Fs, SimConfig, SimFs};
use durable_agent::sqlite::SqliteOptions;
use durable_agent::store::schema::{open_store, user_version, SCHEMA_VERSION};
use store_crash_common::{DB_PATH, KILLS};

fn boot(seed: u64) -> (SimFs, Arc<dyn Fs>) {
    let sim = SimFs::new(SimConfig::new(seed));
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    fs.create_dir_all(Path::new("/data"), "test mkdir /data").unwrap();
    fs.sync_dir(Path::new("/"), "test sync_dir /").unwrap();
    (sim, fs)
}

fn table_count(db: &durable_agent::sqlite::Db) -> i64 {
    db.conn()
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn interrupted_first_migration_completes_on_next_open_at_every_fault_point() {
    let opts = SqliteOptions::default();
    let (sim, fs) = boot(0);
    let base = sim.points();
    let db = open_store(fs.clone(), Path::new(DB_PATH), &opts).unwrap();
    let tables = table_count(&db);
    drop(db);
    let points = sim.points() - base;
    assert!(tables >= 8 && points > 5, "{tables} tables, {points} points");
    let mut cases = 0;
    for kill in KILLS {
        for n in 1..=points {
            cases += 1;
            let (sim, fs) = boot(n);
            sim.set_fault(Some(kill.fault(sim.points() + n)));
            let _ = open_store(fs.clone(), Path::new(DB_PATH), &opts);
            sim.restart(kill.restart_mode());
            let db = open_store(fs, Path::new(DB_PATH), &opts)
                .unwrap_or_else(|e| panic!("{kill:?} at point {n}: reopen failed: {e}"));
            assert_eq!(
                user_version(db.conn()).unwrap(),
                SCHEMA_VERSION,
                "{kill:?} at {n}"
            );
            assert_eq!(table_count(&db), tables, "{kill:?} at {n}: half-applied schema");
        }
    }
    eprintln!("migration: {points} points, {cases} faulted cases, 0 violations");
}
