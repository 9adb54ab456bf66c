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

mod sqlite_harness;

use durable_agent::fs::{CrashMode, DirModel};
use durable_agent::sqlite::{JournalMode, Synchronous};
use sqlite_harness::{crash_table, mid_fsync_table, plain};

#[test]
fn wal_full_never_loses_or_corrupts_a_commit_under_any_crash_mode() {
    for (m, c) in crash_table("WAL+FULL", JournalMode::Wal, Synchronous::Full, plain) {
        assert!(c.cases > 0);
        assert_eq!((c.lost, c.corrupt), (0, 0), "WAL+FULL under {m:?}: {c:?}");
    }
}

/// The power is cut in the middle of every `fsync` the sweep crashes at
/// (FoundationDB's and Turso's power-loss model): a seeded subset of the
/// file's dirty pages, each whole, reached the disk. WAL + FULL still
/// loses nothing acknowledged and never corrupts: a half-written WAL
/// frame fails its checksum and ends the log there.
#[test]
fn wal_full_never_loses_a_commit_when_power_is_cut_in_the_middle_of_an_fsync() {
    for (m, c) in mid_fsync_table("WAL+FULL", JournalMode::Wal, Synchronous::Full) {
        assert!(c.mid_fsync > 0, "the sweep must cut fsyncs midway: {m:?} {c:?}");
        assert_eq!(
            (c.lost, c.corrupt),
            (0, 0),
            "WAL+FULL, mid-fsync cuts, {m:?}: {c:?}"
        );
    }
}

#[test]
fn delete_extra_never_loses_or_corrupts_a_commit_under_any_crash_mode() {
    for (m, c) in crash_table("DELETE+EXTRA", JournalMode::Delete, Synchronous::Extra, plain) {
        assert_eq!((c.lost, c.corrupt), (0, 0), "DELETE+EXTRA under {m:?}: {c:?}");
    }
}

#[test]
fn delete_full_can_lose_only_the_last_commit_under_power_loss() {
    let rows = crash_table("DELETE+FULL", JournalMode::Delete, Synchronous::Full, plain);
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
        let name = format!("{journal:?}+OFF").to_uppercase();
        for (m, c) in crash_table(&name, journal, Synchronous::Off, plain) {
            match m {
                CrashMode::ProcessCrash => assert_eq!((c.lost, c.corrupt), (0, 0), "{journal:?} {c:?}"),
                CrashMode::PowerLoss(_) => assert!(c.lost > 0, "{journal:?}+OFF {m:?} must lose: {c:?}"),
            }
        }
    }
}

#[test]
fn wal_normal_never_corrupts_and_is_safe_under_process_crash() {
    for (m, c) in crash_table("WAL+NORMAL", JournalMode::Wal, Synchronous::Normal, plain) {
        assert_eq!(c.corrupt, 0, "WAL+NORMAL {m:?}: {c:?}");
        if m == CrashMode::ProcessCrash {
            assert_eq!(c.lost, 0, "{c:?}");
        }
    }
}
