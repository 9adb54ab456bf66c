//! SQLite on SimFs beyond clean crashes: an I/O error (EIO, ENOSPC) or a
//! lost reply at any point, then a crash, never loses an acknowledged
//! commit under the safe configs; and the directory fsyncs the VFS copies
//! from os_unix.c are load-bearing — an `Fs` that skips them makes the
//! harness see loss under the strict directory model.
//!
//! Run with `--nocapture` to see the table of counts.

mod sqlite_harness;

use durable_agent::fs::sim::FailKind;
use durable_agent::fs::{CrashMode, DirModel};
use durable_agent::sqlite::{JournalMode, Synchronous};
use sqlite_harness::{crash_table, no_dir_sync, plain, print_row, sweep, Inject};

const INJECTS: [Inject; 3] = [
    Inject::Fail(FailKind::Eio),
    Inject::Fail(FailKind::Enospc),
    Inject::LostReply,
];

#[test]
fn io_errors_and_lost_replies_never_lose_an_acknowledged_commit_in_safe_configs() {
    let configs = [
        ("WAL+FULL", JournalMode::Wal, Synchronous::Full),
        ("DELETE+EXTRA", JournalMode::Delete, Synchronous::Extra),
    ];
    for (name, journal, sync) in configs {
        for inject in INJECTS {
            for mode in [CrashMode::ProcessCrash, CrashMode::PowerLoss(DirModel::Strict)] {
                let c = sweep(name, journal, sync, inject, mode, plain);
                print_row(name, &format!("{inject:?} then {mode:?}"), &c);
                assert!(c.cases > 0);
                assert_eq!(
                    (c.lost, c.corrupt),
                    (0, 0),
                    "{name} {inject:?} then {mode:?}: {c:?}"
                );
            }
        }
    }
}

#[test]
fn skipping_directory_fsyncs_loses_wal_commits_under_strict_power_loss() {
    let rows = crash_table(
        "WAL+FULL no dir sync",
        JournalMode::Wal,
        Synchronous::Full,
        no_dir_sync,
    );
    for (m, c) in rows {
        match m {
            // The new WAL's directory entry is never made durable, so the
            // whole WAL (every commit since the last checkpoint) can vanish.
            CrashMode::PowerLoss(DirModel::Strict) => assert!(c.lost > 0, "{c:?}"),
            // ext4-like: the WAL's fsync also commits its creation.
            CrashMode::PowerLoss(DirModel::Eager) | CrashMode::ProcessCrash => {
                assert_eq!((c.lost, c.corrupt), (0, 0), "{m:?} {c:?}")
            }
        }
    }
}

#[test]
fn skipping_directory_fsyncs_breaks_delete_extra_under_strict_power_loss() {
    let rows = crash_table(
        "DELETE+EXTRA no dir sync",
        JournalMode::Delete,
        Synchronous::Extra,
        no_dir_sync,
    );
    for (m, c) in rows {
        match m {
            // The journal's creation or unlink may not survive: a commit
            // rolls back (unlink undone) or a torn commit cannot be rolled
            // back (journal gone) — os_unix.c's comment on unixSync.
            CrashMode::PowerLoss(DirModel::Strict) => assert!(c.lost + c.corrupt > 0, "{c:?}"),
            CrashMode::ProcessCrash => assert_eq!((c.lost, c.corrupt), (0, 0), "{c:?}"),
            CrashMode::PowerLoss(DirModel::Eager) => {}
        }
    }
}
