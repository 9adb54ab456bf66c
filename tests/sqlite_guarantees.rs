//! Validates the SimFs fault model against real SQLite's documented
//! durability guarantees (DESIGN.md "Validate the model").
//!
//! Workload: N small transactions (insert row i), each acknowledged when
//! COMMIT returns Ok. Crash at every I/O point k of the workload (setup is
//! not swept), restart under each crash mode, reopen, and check that
//! `PRAGMA integrity_check` is ok and every acknowledged row is present
//! (the in-flight row may be present or absent; nothing else may appear).
//!
//! Expected (asserted): WAL+FULL and DELETE+EXTRA lose nothing and never
//! corrupt under any mode; every config is safe under ProcessCrash (the
//! page cache survives); synchronous=OFF loses commits under power loss;
//! DELETE+FULL under PowerLoss(Strict) can lose the last commit, because
//! the journal's unlink is not dir-synced, so the hot journal reappears
//! and rolls the committed transaction back.
//!
//! Run with `--nocapture` to see the table of counts.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::sim::Outcome;
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, SimConfig, SimFs};
use durable_agent::sqlite::{open, JournalMode, SqliteOptions, Synchronous};

const ROWS: i64 = 10;
const SEEDS: [u64; 3] = [1, 2, 3];
const DB: &str = "/data/guarantees.db";

const MODES: [CrashMode; 3] = [
    CrashMode::ProcessCrash,
    CrashMode::PowerLoss(DirModel::Strict),
    CrashMode::PowerLoss(DirModel::Eager),
];

fn opts(journal: JournalMode, sync: Synchronous, seed: u64) -> SqliteOptions {
    SqliteOptions {
        journal_mode: journal,
        synchronous: sync,
        seed,
        ..SqliteOptions::default()
    }
}

/// A fresh disk with the table created and closed (not swept).
fn setup(seed: u64, o: &SqliteOptions) -> (SimFs, Arc<dyn Fs>) {
    let sim = SimFs::new(SimConfig::new(seed));
    sim.create_dir_all(Path::new("/data"), "test mkdir").unwrap();
    sim.sync_dir(Path::new("/"), "test sync root").unwrap();
    let fs: Arc<dyn Fs> = Arc::new(sim.clone());
    // Set up durably whatever the config under test (synchronous=OFF never
    // syncs the database file): only the workload is swept.
    let durable = SqliteOptions {
        synchronous: Synchronous::Extra,
        ..o.clone()
    };
    let db = open(fs.clone(), Path::new(DB), &durable).unwrap();
    db.conn()
        .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .unwrap();
    db.close().unwrap();
    sim.sync_dir(Path::new("/data"), "test sync setup").unwrap();
    (sim, fs)
}

/// Run the workload until it finishes or the first error (the crash).
/// Returns the acknowledged ids and the id in flight when it stopped.
fn workload(fs: Arc<dyn Fs>, o: &SqliteOptions) -> (Vec<i64>, Option<i64>) {
    let mut acked = Vec::new();
    let Ok(mut db) = open(fs, Path::new(DB), o) else {
        return (acked, Some(0));
    };
    // Checkpoint often so the sweep crosses WAL checkpoints and restarts.
    if db.conn().execute_batch("PRAGMA wal_autocheckpoint=4").is_err() {
        return (acked, Some(0));
    }
    for i in 0..ROWS {
        let body = vec![(i % 251) as u8; 300 + (i as usize * 37) % 500];
        let r = db.conn_mut().transaction().and_then(|tx| {
            tx.execute("INSERT INTO t (id, body) VALUES (?1, ?2)", (i, body))?;
            tx.commit()
        });
        if r.is_err() {
            return (acked, Some(i));
        }
        acked.push(i);
    }
    // The close (final checkpoint, WAL delete) is swept too; its failure
    // leaves every commit acknowledged.
    let _ = db.close();
    (acked, None)
}

/// "point N: label" of the crash, for failure reports.
fn crash_label(sim: &SimFs) -> String {
    sim.trace()
        .iter()
        .find(|t| t.outcome == Outcome::Crashed)
        .map(|t| format!("point {} {:?} {}: {}", t.point, t.op, t.path, t.label))
        .unwrap_or_else(|| "<no crash in trace>".into())
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    cases: u64,
    /// Cases where an acknowledged commit is missing after recovery.
    lost: u64,
    /// Of those, cases missing a commit older than the last acknowledged.
    lost_older: u64,
    /// Cases that failed to reopen, failed integrity_check, or showed a
    /// row that was never written.
    corrupt: u64,
}

/// Reopen after the crash and judge it: Ok(missing acked ids) or Err(why
/// the database is corrupt).
fn check(
    fs: Arc<dyn Fs>,
    o: &SqliteOptions,
    acked: &[i64],
    inflight: Option<i64>,
) -> Result<Vec<i64>, String> {
    let db = open(fs, Path::new(DB), o).map_err(|e| format!("reopen: {e}"))?;
    let problems = db
        .integrity_check()
        .map_err(|e| format!("integrity_check: {e}"))?;
    if !problems.is_empty() {
        return Err(format!("integrity_check: {problems:?}"));
    }
    let ids: BTreeSet<i64> = (|| {
        let mut s = db.conn().prepare("SELECT id FROM t")?;
        let ids = s.query_map([], |r| r.get(0))?.collect::<Result<_, _>>();
        ids
    })()
    .map_err(|e| format!("select: {e}"))?;
    let allowed: BTreeSet<i64> = acked.iter().copied().chain(inflight).collect();
    if let Some(p) = ids.difference(&allowed).next() {
        return Err(format!("row {p} was never written; ids {ids:?}"));
    }
    Ok(acked.iter().copied().filter(|i| !ids.contains(i)).collect())
}

/// Sweep every crash point of the workload for one config and mode.
fn sweep(journal: JournalMode, sync: Synchronous, mode: CrashMode) -> Counts {
    let mut c = Counts::default();
    let mut reported = 0;
    for seed in SEEDS {
        let o = opts(journal, sync, seed);
        let (sim, fs) = setup(seed, &o);
        let base = sim.points();
        let (acked, _) = workload(fs, &o);
        assert_eq!(
            acked.len() as i64,
            ROWS,
            "unfaulted workload must commit everything"
        );
        let total = sim.points() - base;
        for k in 1..=total {
            c.cases += 1;
            let (sim, fs) = setup(seed, &o);
            sim.set_fault(Some(Fault::CrashAt(sim.points() + k)));
            let (acked, inflight) = workload(fs.clone(), &o);
            assert!(sim.crashed(), "seed {seed} point {k}: crash point not reached");
            sim.restart(mode);
            let at = crash_label(&sim);
            let what = format!("{journal:?}+{sync:?} {mode:?} seed {seed} k {k} at {at}");
            match check(fs, &o, &acked, inflight) {
                Err(why) => {
                    c.corrupt += 1;
                    if reported < 3 {
                        reported += 1;
                        eprintln!("CORRUPT {what}: {why}");
                    }
                }
                Ok(missing) if !missing.is_empty() => {
                    c.lost += 1;
                    if missing.iter().any(|i| Some(i) != acked.last()) {
                        c.lost_older += 1;
                    }
                    if reported < 3 {
                        reported += 1;
                        eprintln!("LOST {what}: acked {acked:?} missing {missing:?}");
                    }
                }
                Ok(_) => {}
            }
        }
    }
    c
}

fn table(name: &str, journal: JournalMode, sync: Synchronous) -> Vec<(CrashMode, Counts)> {
    let rows: Vec<(CrashMode, Counts)> = MODES.iter().map(|&m| (m, sweep(journal, sync, m))).collect();
    for (m, c) in &rows {
        eprintln!(
            "sqlite guarantees | {name:<12} | {:<22} | cases {:>5} | lost {:>4} (older than last {:>4}) | corrupt {:>4}",
            format!("{m:?}"),
            c.cases,
            c.lost,
            c.lost_older,
            c.corrupt
        );
    }
    rows
}

#[test]
fn wal_full_never_loses_or_corrupts_a_commit_under_any_crash_mode() {
    for (m, c) in table("WAL+FULL", JournalMode::Wal, Synchronous::Full) {
        assert!(c.cases > 0);
        assert_eq!((c.lost, c.corrupt), (0, 0), "WAL+FULL under {m:?}: {c:?}");
    }
}

#[test]
fn delete_extra_never_loses_or_corrupts_a_commit_under_any_crash_mode() {
    for (m, c) in table("DELETE+EXTRA", JournalMode::Delete, Synchronous::Extra) {
        assert_eq!((c.lost, c.corrupt), (0, 0), "DELETE+EXTRA under {m:?}: {c:?}");
    }
}

#[test]
fn delete_full_can_lose_only_the_last_commit_under_power_loss() {
    let rows = table("DELETE+FULL", JournalMode::Delete, Synchronous::Full);
    for (m, c) in rows {
        assert_eq!(c.corrupt, 0, "DELETE+FULL never corrupts: {m:?} {c:?}");
        // The next transaction's new journal is dir-synced before the
        // database is touched, which makes the earlier unlink durable.
        assert_eq!(
            c.lost_older, 0,
            "DELETE+FULL loses at most the last commit: {m:?} {c:?}"
        );
        match m {
            CrashMode::ProcessCrash => assert_eq!(c.lost, 0, "{c:?}"),
            CrashMode::PowerLoss(DirModel::Strict) => {
                assert!(
                    c.lost > 0,
                    "the harness must see the un-dir-synced journal unlink lose a commit: {c:?}"
                )
            }
            CrashMode::PowerLoss(DirModel::Eager) => {}
        }
    }
}

#[test]
fn synchronous_off_loses_commits_under_power_loss_but_not_process_crash() {
    for journal in [JournalMode::Wal, JournalMode::Delete] {
        for (m, c) in table(
            &format!("{journal:?}+OFF").to_uppercase(),
            journal,
            Synchronous::Off,
        ) {
            match m {
                CrashMode::ProcessCrash => assert_eq!((c.lost, c.corrupt), (0, 0), "{journal:?} {c:?}"),
                CrashMode::PowerLoss(_) => assert!(c.lost > 0, "{journal:?}+OFF {m:?} must lose: {c:?}"),
            }
        }
    }
}

#[test]
fn wal_normal_never_corrupts_and_is_safe_under_process_crash() {
    for (m, c) in table("WAL+NORMAL", JournalMode::Wal, Synchronous::Normal) {
        assert_eq!(c.corrupt, 0, "WAL+NORMAL {m:?}: {c:?}");
        if m == CrashMode::ProcessCrash {
            assert_eq!(c.lost, 0, "{c:?}");
        }
    }
}
