//! The SimFs fault model, checked as a table of POSIX scenarios: each row
//! runs some ops, restarts under each crash mode for many seeds, and names
//! the outcome it sees. The set of outcomes seen must equal the row's
//! expected set exactly — every allowed outcome occurs (the relaxation is
//! real, not just permitted) and nothing else ever does.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use durable_agent::fs::sim::{FailKind, IoOp, Outcome};
use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, OpenMode, SimConfig, SimFs};

type Files = BTreeMap<PathBuf, Vec<u8>>;

const SEEDS: u64 = 64;
const STRICT: CrashMode = CrashMode::PowerLoss(DirModel::Strict);
const EAGER: CrashMode = CrashMode::PowerLoss(DirModel::Eager);
const MODES: [CrashMode; 3] = [CrashMode::ProcessCrash, STRICT, EAGER];

fn p(s: &str) -> &Path {
    Path::new(s)
}

fn get<'a>(files: &'a Files, path: &str) -> Option<&'a [u8]> {
    files.get(p(path)).map(Vec::as_slice)
}

/// `/d` exists and is durable; `/d/f` holds `content`, fully durable.
fn durable_file(fs: &SimFs, path: &str, content: &[u8]) {
    fs.create_dir_all(p("/d"), "mkdir d").unwrap();
    fs.sync_dir(p("/"), "sync root").unwrap();
    fs.open(p(path), OpenMode::Create, "create").unwrap();
    fs.append(p(path), content, "append").unwrap();
    fs.sync(p(path), "sync").unwrap();
    fs.sync_dir(p("/d"), "sync d").unwrap();
}

fn arm_next(fs: &SimFs, fault: impl FnOnce(u64) -> Fault) {
    fs.set_fault(Some(fault(fs.points() + 1)));
}

struct Row {
    name: &'static str,
    run: fn(&SimFs),
    probe: fn(&Files) -> &'static str,
    /// Exact outcome sets under ProcessCrash, PowerLoss(Strict), PowerLoss(Eager).
    expect: [&'static [&'static str]; 3],
}

fn presence(files: &Files, path: &str, content: &[u8]) -> &'static str {
    match get(files, path) {
        None => "vanished",
        Some(c) if c == content => "kept",
        Some(_) => "corrupt",
    }
}

fn old_or_new(files: &Files) -> &'static str {
    match get(files, "/d/f") {
        Some(b"old") => "old",
        Some(b"new") => "new",
        _ => "other",
    }
}

fn create_synced_file(fs: &SimFs) {
    fs.create_dir_all(p("/d"), "mkdir d").unwrap();
    fs.sync_dir(p("/"), "sync root").unwrap();
    fs.open(p("/d/f"), OpenMode::CreateNew, "create f").unwrap();
    fs.append(p("/d/f"), b"hello", "append f").unwrap();
    fs.sync(p("/d/f"), "sync f").unwrap();
}

fn replace_via_rename(fs: &SimFs) {
    durable_file(fs, "/d/f", b"old");
    fs.open(p("/d/tmp"), OpenMode::CreateNew, "create tmp").unwrap();
    fs.append(p("/d/tmp"), b"new", "write tmp").unwrap();
    fs.sync(p("/d/tmp"), "sync tmp").unwrap();
    fs.rename(p("/d/tmp"), p("/d/f"), "rename tmp over f").unwrap();
}

fn synced_then_unsynced_tail(files: &Files) -> &'static str {
    let Some(c) = get(files, "/d/f") else {
        return "vanished";
    };
    let whole: &[u8] = b"abcdefgh";
    match c.len() {
        _ if c == b"ab" => "synced only",
        _ if c == whole => "whole tail",
        n if n > 2 && n < whole.len() && whole.starts_with(c) => "torn tail",
        _ => "corrupt",
    }
}

/// `/d/f` durable, then `/d` moved to `/q/d` (as `repair --quarantine`
/// moves a session's directory), `/q` durable first.
fn move_dir(fs: &SimFs) {
    durable_file(fs, "/d/f", b"data");
    fs.create_dir_all(p("/q"), "mkdir q").unwrap();
    fs.sync_dir(p("/"), "sync root").unwrap();
    fs.rename(p("/d"), p("/q/d"), "rename d").unwrap();
}

fn where_dir(files: &Files) -> &'static str {
    match (get(files, "/d/f"), get(files, "/q/d/f")) {
        (Some(b"data"), None) => "old",
        (None, Some(b"data")) => "moved",
        _ => "other",
    }
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "directory_rename_without_dir_sync_can_revert_whole",
            run: move_dir,
            probe: where_dir,
            expect: [&["moved"], &["moved", "old"], &["moved", "old"]],
        },
        Row {
            name: "directory_rename_with_both_parents_synced_is_durable_whole",
            run: |fs| {
                move_dir(fs);
                fs.sync_dir(p("/q"), "sync q").unwrap();
                fs.sync_dir(p("/"), "sync root").unwrap();
            },
            probe: where_dir,
            expect: [&["moved"], &["moved"], &["moved"]],
        },
        Row {
            name: "file_fsynced_without_dir_sync_can_vanish_under_strict",
            run: create_synced_file,
            probe: |f| presence(f, "/d/f", b"hello"),
            expect: [&["kept"], &["kept", "vanished"], &["kept"]],
        },
        Row {
            name: "file_fsynced_with_dir_sync_never_vanishes",
            run: |fs| {
                create_synced_file(fs);
                fs.sync_dir(p("/d"), "sync d").unwrap();
            },
            probe: |f| presence(f, "/d/f", b"hello"),
            expect: [&["kept"], &["kept"], &["kept"]],
        },
        Row {
            name: "file_in_new_unsynced_dirs_can_vanish_under_strict_even_after_its_dir_sync",
            run: |fs| {
                fs.create_dir_all(p("/a/b"), "mkdir a/b").unwrap();
                fs.open(p("/a/b/f"), OpenMode::Create, "create f").unwrap();
                fs.append(p("/a/b/f"), b"x", "append f").unwrap();
                fs.sync(p("/a/b/f"), "sync f").unwrap();
                fs.sync_dir(p("/a/b"), "sync a/b").unwrap();
            },
            probe: |f| presence(f, "/a/b/f", b"x"),
            expect: [&["kept"], &["kept", "vanished"], &["kept"]],
        },
        Row {
            name: "rename_without_dir_sync_can_revert",
            run: replace_via_rename,
            probe: old_or_new,
            expect: [&["new"], &["new", "old"], &["new", "old"]],
        },
        Row {
            name: "rename_then_file_sync_is_kept_under_eager_only",
            run: |fs| {
                replace_via_rename(fs);
                fs.sync(p("/d/f"), "sync f after rename").unwrap();
            },
            probe: old_or_new,
            expect: [&["new"], &["new", "old"], &["new"]],
        },
        Row {
            name: "rename_then_dir_sync_is_kept",
            run: |fs| {
                replace_via_rename(fs);
                fs.sync_dir(p("/d"), "sync d after rename").unwrap();
            },
            probe: old_or_new,
            expect: [&["new"], &["new"], &["new"]],
        },
        Row {
            name: "remove_is_durable_under_eager_after_a_sibling_sync",
            run: |fs| {
                durable_file(fs, "/d/f", b"old");
                fs.open(p("/d/g"), OpenMode::Create, "create g").unwrap();
                fs.sync_dir(p("/d"), "sync d").unwrap();
                fs.remove(p("/d/f"), "remove f").unwrap();
                fs.append(p("/d/g"), b"1", "append g").unwrap();
                fs.sync(p("/d/g"), "sync g").unwrap();
            },
            probe: |f| presence(f, "/d/f", b"old"),
            expect: [&["vanished"], &["kept", "vanished"], &["vanished"]],
        },
        Row {
            name: "synced_appends_survive_and_unsynced_tail_may_be_torn",
            run: |fs| {
                durable_file(fs, "/d/f", b"a");
                fs.append(p("/d/f"), b"b", "append b").unwrap();
                fs.sync(p("/d/f"), "sync b").unwrap();
                fs.append(p("/d/f"), b"cdefgh", "append tail").unwrap();
            },
            probe: synced_then_unsynced_tail,
            expect: [
                &["whole tail"],
                &["synced only", "torn tail", "whole tail"],
                &["synced only", "torn tail", "whole tail"],
            ],
        },
        Row {
            name: "failed_fsync_leaves_data_unknown_even_after_a_later_good_sync",
            run: |fs| {
                durable_file(fs, "/d/f", b"a");
                fs.append(p("/d/f"), b"b", "append b").unwrap();
                arm_next(fs, |n| Fault::FailAt(n, FailKind::Eio));
                assert_eq!(
                    fs.sync(p("/d/f"), "sync fails").unwrap_err().kind(),
                    ErrorKind::Other
                );
                fs.set_fault(None);
                fs.sync(p("/d/f"), "sync again").unwrap();
            },
            probe: |f| match get(f, "/d/f") {
                Some(b"a") => "lost",
                Some(b"ab") => "kept",
                _ => "other",
            },
            expect: [&["kept"], &["kept", "lost"], &["kept", "lost"]],
        },
        Row {
            name: "good_fsync_makes_data_durable",
            run: |fs| {
                durable_file(fs, "/d/f", b"a");
                fs.append(p("/d/f"), b"b", "append b").unwrap();
                fs.sync(p("/d/f"), "sync").unwrap();
            },
            probe: |f| match get(f, "/d/f") {
                Some(b"ab") => "kept",
                _ => "other",
            },
            expect: [&["kept"], &["kept"], &["kept"]],
        },
        Row {
            name: "lost_reply_rename_takes_effect",
            run: |fs| {
                durable_file(fs, "/d/f", b"old");
                fs.open(p("/d/tmp"), OpenMode::CreateNew, "create tmp").unwrap();
                fs.append(p("/d/tmp"), b"new", "write tmp").unwrap();
                fs.sync(p("/d/tmp"), "sync tmp").unwrap();
                arm_next(fs, Fault::LostReplyAt);
                let err = fs.rename(p("/d/tmp"), p("/d/f"), "rename").unwrap_err();
                assert_eq!(err.kind(), ErrorKind::Other);
                assert_eq!(fs.read(p("/d/f"), "read f").unwrap(), b"new");
                fs.sync_dir(p("/d"), "sync d").unwrap();
            },
            probe: old_or_new,
            expect: [&["new"], &["new"], &["new"]],
        },
    ]
}

#[test]
fn posix_scenarios_give_exactly_the_expected_outcomes_per_crash_mode() {
    let mut failures = Vec::new();
    for row in rows() {
        for (mode, expected) in MODES.iter().zip(row.expect) {
            let mut seen = BTreeSet::new();
            for seed in 0..SEEDS {
                let fs = SimFs::new(SimConfig::new(seed));
                (row.run)(&fs);
                fs.restart(*mode);
                seen.insert((row.probe)(&fs.disk_image()));
            }
            let expected: BTreeSet<&str> = expected.iter().copied().collect();
            if seen != expected {
                failures.push(format!(
                    "{}: under {mode:?} over seeds 0..{SEEDS} saw {seen:?}, expected {expected:?}",
                    row.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[path = "fs_model/faults.rs"]
mod faults;
#[path = "fs_model/props.rs"]
mod props;

/// `copy_in` (a file copied back from a backup, or from another disk, at
/// rest): the wanted files of this disk are replaced by the other disk's,
/// durable at once (a power loss keeps them), a wanted file the other
/// disk lacks leaves this one, and nothing else changes.
#[test]
fn copy_in_replaces_the_wanted_files_durably_and_nothing_else() {
    let old = SimFs::new(SimConfig::new(1));
    durable_file(&old, "/d/f", b"old f");
    let backup = old.backup();
    let fs = SimFs::new(SimConfig::new(2));
    durable_file(&fs, "/d/f", b"new f, longer");
    fs.open(p("/d/f-wal"), OpenMode::Create, "create wal").unwrap();
    fs.append(p("/d/f-wal"), b"frames", "append wal").unwrap();
    fs.open(p("/d/g"), OpenMode::Create, "create g").unwrap();
    fs.append(p("/d/g"), b"kept", "append g").unwrap();
    fs.sync(p("/d/g"), "sync g").unwrap();
    fs.sync_dir(p("/d"), "sync d").unwrap();
    fs.sync(p("/d/f-wal"), "sync wal").unwrap();
    let copied = fs
        .copy_in(&backup, |path| path == p("/d/f") || path == p("/d/f-wal"))
        .expect("copy in");
    assert_eq!(copied, vec![PathBuf::from("/d/f")]);
    for mode in MODES {
        let after = fs.detached(SimConfig::new(3));
        after.restart(mode);
        let files = after.disk_image();
        assert_eq!(get(&files, "/d/f"), Some(&b"old f"[..]), "{mode:?}");
        assert_eq!(
            get(&files, "/d/f-wal"),
            None,
            "{mode:?}: a wanted file the copy lacks stays"
        );
        assert_eq!(get(&files, "/d/g"), Some(&b"kept"[..]), "{mode:?}");
    }
    let missing_dir = SimFs::new(SimConfig::new(4));
    assert!(
        missing_dir.copy_in(&backup, |path| path == p("/d/f")).is_err(),
        "a copy into a directory this disk lacks"
    );
}
