//! Damage outside the crash model, on SimFs through the one boot: a
//! session whose `agent.created` is gone although its child names it is a
//! damaged log (refused, naming the file), not a crash orphan (cleaned);
//! a log emptied below its `events.pending` high-water mark, and a root
//! whose manifest names a store that is gone, are refused too. Every
//! refusal leaves the disk byte for byte as it was.

mod boot_support;

use std::path::PathBuf;
use std::sync::Arc;

use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};
use durable_agent::log::{EVENTS_FILE, PENDING_FILE};
use durable_agent::recovery::DamageError;
use durable_agent::system::{System, SystemError};

const SEED: u64 = 11;

fn boot(fs: &SimFs) -> Result<System, SystemError> {
    boot_support::boot(fs, SEED)
}

/// A root with a parent and a child agent, each with a turn; the parent's
/// and child's session directories.
fn tree() -> (SimFs, PathBuf, PathBuf) {
    let fs = SimFs::new(SimConfig::new(SEED));
    let mut system = boot(&fs).expect("boot");
    let rt = system.runtime_mut();
    let parent = rt.create_root("parent", "lead").expect("root");
    let child = rt.spawn_child(&parent, "child", "help").expect("child");
    rt.run_turn(&parent, "hello").expect("turn");
    rt.run_turn(&child, "hi").expect("turn");
    let dirs = (
        rt.session_dir(&parent).expect("dir"),
        rt.session_dir(&child).expect("dir"),
    );
    drop(system);
    (fs, dirs.0, dirs.1)
}

fn empty(fs: &SimFs, path: &std::path::Path) {
    fs.open(path, OpenMode::Truncate, "test empties")
        .expect("truncate");
}

#[test]
fn a_parent_whose_log_lost_everything_is_damage_not_an_orphan() {
    let (fs, parent, _) = tree();
    empty(&fs, &parent.join(EVENTS_FILE));
    fs.remove(&parent.join(PENDING_FILE), "test removes the mark")
        .expect("remove");
    let image = fs.disk_image();
    match boot(&fs) {
        Err(SystemError::Damaged(DamageError::MissingCreated { path, evidence })) => {
            assert_eq!(path, parent.join(EVENTS_FILE));
            assert!(evidence.contains("names session"), "{evidence}");
        }
        other => panic!("expected MissingCreated, got {:?}", other.map(|_| ())),
    }
    assert!(fs.disk_image() == image, "the refused boot changed the disk");
}

#[test]
fn an_emptied_log_is_refused_with_expected_and_found() {
    let (fs, _, child) = tree();
    empty(&fs, &child.join(EVENTS_FILE));
    let image = fs.disk_image();
    match boot(&fs) {
        Err(SystemError::Damaged(DamageError::LostEntries {
            path,
            expected,
            found,
        })) => {
            assert_eq!(path, child.join(EVENTS_FILE));
            assert_eq!(found, 0);
            assert!(expected >= 2, "{expected}");
        }
        other => panic!("expected LostEntries, got {:?}", other.map(|_| ())),
    }
    assert!(fs.disk_image() == image, "the refused boot changed the disk");
}

#[test]
fn a_missing_store_is_refused_not_recreated() {
    let (fs, _, _) = tree();
    let db = PathBuf::from("/root/store.db");
    fs.remove(&db, "test deletes the store").expect("remove");
    let image = fs.disk_image();
    match boot(&fs) {
        Err(SystemError::Damaged(DamageError::StoreMissing { path, .. })) => assert_eq!(path, db),
        other => panic!("expected StoreMissing, got {:?}", other.map(|_| ())),
    }
    assert!(fs.disk_image() == image, "the refused boot changed the disk");
    assert!(!fs.exists(&db, "t").expect("exists"), "the store was recreated");
}

#[test]
fn an_intact_root_with_its_marks_boots_again_and_again() {
    // (A crash orphan is still cleaned: tests/runtime_crash_points.rs,
    // crash_after_record_before_agent_created_cleans_the_orphan_session.)
    let (fs, _, _) = tree();
    boot(&fs).expect("first reboot");
    boot(&fs).expect("second reboot");
}

/// A session record deleted while its log holds `agent.created` (written
/// only once the record is durable) is damage, not a crash orphan: the
/// boot refuses it instead of deleting the log.
#[test]
fn a_lost_record_whose_log_holds_agent_created_is_refused_not_deleted() {
    let (fs, _, child) = tree();
    let record = child.join(durable_agent::store::session::SESSION_FILE);
    fs.remove(&record, "test deletes the record").expect("remove");
    let image = fs.disk_image();
    match boot(&fs) {
        Err(SystemError::Damaged(DamageError::MissingRecord { path, .. })) => assert_eq!(path, record),
        other => panic!("expected MissingRecord, got {:?}", other.map(|_| ())),
    }
    assert!(fs.disk_image() == image, "the refused boot changed the disk");
    assert!(
        fs.exists(&child.join(EVENTS_FILE), "t").expect("exists"),
        "the log is kept"
    );
}

/// Two damages at once: the record deleted and a line of the log rotted
/// (here its first, `agent.created`). The log holds a complete line, and
/// every line is appended after the record is durable, so the session is
/// not a crash orphan (whose log holds no complete line): the boot refuses
/// it, naming the record, instead of deleting the session's files, and
/// `verify` reports the same damage.
#[test]
fn a_lost_record_whose_log_line_rotted_is_refused_not_deleted() {
    let (fs, _, child) = tree();
    let record = child.join(durable_agent::store::session::SESSION_FILE);
    let log = child.join(EVENTS_FILE);
    fs.remove(&record, "test deletes the record").expect("remove");
    let bytes = fs.read(&log, "test reads the log").expect("read");
    let at = bytes.iter().position(|&b| b == b'"').expect("a JSON line") + 1;
    fs.write_at(&log, at as u64, &[bytes[at] ^ 0x01], "test rots a byte")
        .expect("write");
    let image = fs.disk_image();
    match boot(&fs) {
        Err(SystemError::Damaged(DamageError::MissingRecord { path, evidence })) => {
            assert_eq!(path, record);
            assert!(evidence.contains("complete line"), "{evidence}");
        }
        other => panic!("expected MissingRecord, got {:?}", other.map(|_| ())),
    }
    assert!(fs.disk_image() == image, "the refused boot changed the disk");
    let report = durable_agent::recovery::verify::verify_with(
        Arc::new(fs.clone()),
        std::path::Path::new("/root"),
        std::path::Path::new("/root/store.db"),
        durable_agent::recovery::verify::Writers::None,
    );
    assert!(!report.is_healthy(), "{report:?}");
    assert!(
        report.damaged.iter().any(
            |f| f.kind == durable_agent::recovery::verify::FindingKind::MissingRecord && f.path == record
        ),
        "{report:?}"
    );
}
