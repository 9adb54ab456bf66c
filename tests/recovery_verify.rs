//! `recovery::verify` on SimFs: a healthy root verifies healthy; each
//! damage is reported with its file (and line and offset where it has
//! them) and the disk is byte for byte as it was; a damaged last line that
//! `events.pending` holds whole is the crash model (repaired at boot, not
//! damage); a damaged parent with a live child is refused by the
//! quarantine plan unless forced, and then the child goes along.

mod boot_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_agent::fs::{CrashMode, DirModel, Fault, Fs, OpenMode, SimConfig, SimFs};
use durable_agent::log::{EVENTS_FILE, PENDING_FILE};
use durable_agent::recovery::verify::{
    plan_quarantine, verify, FindingKind, ReadOnlyFs, Remedy, RepairError, Verification,
};
use durable_agent::store::session::SESSION_FILE;
use durable_agent::system::{System, SystemError};

const SEED: u64 = 12;
use boot_support::ROOT;

fn boot(fs: &SimFs) -> Result<System, SystemError> {
    boot_support::boot(fs, SEED)
}

/// A root with a parent and a child agent, each with a turn.
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

/// Verify, checking that the disk did not change.
fn checked(fs: &SimFs) -> Verification {
    let before = fs.disk_image();
    let root = Path::new(ROOT);
    let v = verify(Arc::new(fs.clone()), root, &root.join("store.db"));
    assert!(fs.disk_image() == before, "verify changed the disk");
    v
}

#[test]
fn a_healthy_root_verifies_healthy() {
    let (fs, _, _) = tree();
    let v = checked(&fs);
    assert!(v.is_healthy(), "{:#?}", v.damaged);
    assert_eq!(v.sessions.len(), 2);
    assert!(v.store_present);
    assert!(
        v.healthy.iter().any(|c| c.what.contains("integrity_check ok")),
        "{:#?}",
        v.healthy
    );
    // And the boot agrees.
    boot(&fs).expect("a healthy root boots");
}

#[test]
fn a_parent_whose_log_lost_everything_needs_force_to_go_with_its_child() {
    let (fs, parent, child) = tree();
    fs.open(&parent.join(EVENTS_FILE), OpenMode::Truncate, "test empties")
        .expect("truncate");
    fs.remove(&parent.join(PENDING_FILE), "test removes the mark")
        .expect("remove");
    let v = checked(&fs);
    let f = &v.damaged[0];
    assert_eq!(v.damaged.len(), 1, "{:#?}", v.damaged);
    assert_eq!(f.kind, FindingKind::MissingCreated);
    assert_eq!(f.path, parent.join(EVENTS_FILE));
    assert_eq!(f.remedy, Remedy::QuarantineSession);
    match plan_quarantine(&v, false, false) {
        Err(RepairError::LiveChildren { children, .. }) => assert_eq!(children.len(), 1),
        other => panic!("expected LiveChildren, got {other:?}"),
    }
    let plan = plan_quarantine(&v, true, false).expect("forced plan");
    let moved: Vec<&Path> = plan.items.iter().map(|i| i.path.as_path()).collect();
    let rel = |d: &Path| d.strip_prefix(ROOT).expect("under root").to_path_buf();
    assert_eq!(moved, vec![rel(&parent).as_path(), rel(&child).as_path()]);
    assert!(!plan.store_loss);
}

#[test]
fn a_lost_tail_is_reported_with_expected_found_line_and_offset() {
    let (fs, parent, _) = tree();
    let log = parent.join(EVENTS_FILE);
    let bytes = fs.read(&log, "t").expect("read");
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    assert!(lines.len() >= 3);
    let kept: Vec<u8> = lines[..1].concat();
    fs.truncate(&log, kept.len() as u64, "test shortens")
        .expect("truncate");
    let v = checked(&fs);
    let f = v
        .damaged
        .iter()
        .find(|f| f.kind == FindingKind::LostEntries)
        .expect("lost entries reported");
    assert_eq!(f.path, log);
    assert_eq!(f.line, Some(2));
    assert_eq!(f.offset, Some(kept.len() as u64));
    assert!(
        f.message.contains(&format!("{} were acknowledged", lines.len())),
        "{}",
        f.message
    );
}

#[test]
fn a_corrupt_middle_line_and_record_are_damage_a_damaged_last_line_is_not() {
    let (fs, parent, child) = tree();
    // The parent's last line rotted: events.pending holds it whole.
    let log = parent.join(EVENTS_FILE);
    let mut bytes = fs.read(&log, "t").expect("read");
    let last_start = bytes[..bytes.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    bytes[last_start + 5] ^= 0x01;
    fs.write_at(&log, 0, &bytes, "test rots").expect("write");
    // The child's record rotted.
    let record = child.join(SESSION_FILE);
    let mut rec = fs.read(&record, "t").expect("read");
    rec[10] ^= 0x02;
    fs.write_at(&record, 0, &rec, "test rots").expect("write");
    let v = checked(&fs);
    assert!(
        v.repaired_at_boot.iter().any(|c| c.path == log),
        "the damaged last line is the crash model: {:#?} {:#?}",
        v.repaired_at_boot,
        v.damaged
    );
    assert!(!v.damaged.iter().any(|f| f.path == log), "{:#?}", v.damaged);
    let f = v
        .damaged
        .iter()
        .find(|f| f.path == record)
        .expect("the record reported");
    assert_eq!(f.kind, FindingKind::RecordDamaged);
    assert_eq!((f.line, f.offset), (Some(1), Some(0)));
    // A middle line: damage, with its line and offset.
    let mut bytes = fs.read(&log, "t").expect("read");
    let second = bytes.iter().position(|&b| b == b'\n').expect("a line") + 1;
    bytes[second + 7] ^= 0x01;
    fs.write_at(&log, 0, &bytes, "test rots").expect("write");
    let v = checked(&fs);
    let f = v
        .damaged
        .iter()
        .find(|f| f.path == log)
        .expect("the log reported");
    assert_eq!(f.kind, FindingKind::CorruptLine);
    assert_eq!((f.line, f.offset), (Some(2), Some(second as u64)));
}

#[test]
fn a_missing_store_needs_accept_store_loss() {
    let (fs, _, _) = tree();
    let db = Path::new(ROOT).join("store.db");
    fs.remove(&db, "test deletes the store").expect("remove");
    let _ = fs.remove(&Path::new(ROOT).join("store.db-wal"), "test deletes the wal");
    let v = checked(&fs);
    assert_eq!(v.damaged.len(), 1, "{:#?}", v.damaged);
    assert_eq!(v.damaged[0].kind, FindingKind::StoreMissing);
    assert_eq!(v.damaged[0].path, db);
    assert!(matches!(
        plan_quarantine(&v, false, false),
        Err(RepairError::StoreLoss { .. })
    ));
    let plan = plan_quarantine(&v, false, true).expect("accepted");
    assert!(plan.store_loss);
}

#[test]
fn the_read_only_view_refuses_every_change() {
    let fs = SimFs::new(SimConfig::new(SEED));
    fs.create_dir_all(Path::new("/d"), "t").expect("mkdir");
    fs.open(Path::new("/d/f"), OpenMode::Truncate, "t")
        .expect("create");
    let before = fs.disk_image();
    let ro = ReadOnlyFs(Arc::new(fs.clone()));
    let f = Path::new("/d/f");
    assert!(ro.write_at(f, 0, b"x", "t").is_err());
    assert!(ro.append(f, b"x", "t").is_err());
    assert!(ro.truncate(f, 0, "t").is_err());
    assert!(ro.open(f, OpenMode::Truncate, "t").is_err());
    assert!(ro.rename(f, Path::new("/d/g"), "t").is_err());
    assert!(ro.remove(f, "t").is_err());
    assert!(ro.create_dir_all(Path::new("/e"), "t").is_err());
    assert!(ro.lock_exclusive(Path::new("/d/LOCK"), "t").is_err());
    assert!(ro.read(f, "t").is_ok());
    assert!(fs.disk_image() == before);
}

/// A power cut while the first boot writes the store (it is created in
/// rollback-journal mode before it switches to WAL, so a cut while its
/// first pages are written leaves a hot `store.db-journal` beside a
/// half-written `store.db`): whatever the next boot recovers, `verify`
/// reports no damage. It once copied the store without its journal and
/// called the half-written file corrupt, with remedy accept-store-loss
/// (found by the fuzzer's oracle I7). A header torn short enough is rare,
/// so every store write is cut under many seeds.
#[test]
fn verify_agrees_with_the_boot_after_a_power_cut_in_the_first_store_writes() {
    let writes: Vec<u64> = {
        let fs = SimFs::new(SimConfig::new(SEED));
        drop(boot(&fs).expect("boot"));
        fs.trace()
            .iter()
            .filter(|e| e.label.starts_with("sqlite db write"))
            .map(|e| e.point)
            .collect()
    };
    assert!(!writes.is_empty(), "the first boot wrote no store page");
    let mut judged = 0;
    for seed in 0..64 {
        for &point in &writes {
            // Torn writes often: a half-written first page is the case.
            let fs = SimFs::new(SimConfig {
                torn_write_probability: 0.9,
                ..SimConfig::new(seed)
            });
            fs.set_fault(Some(Fault::CrashAt(point)));
            drop(boot(&fs));
            fs.restart(CrashMode::PowerLoss(DirModel::Strict));
            let v = checked(&fs);
            if boot(&fs).is_ok() {
                judged += 1;
                assert!(
                    v.is_healthy(),
                    "seed {seed}, power cut at point {point}: the boot recovers, verify says {:#?}",
                    v.damaged
                );
            }
        }
    }
    assert!(judged > 0, "no boot recovered");
}

/// A parent's whole directory lost while its child lives: the boot
/// terminates the child for good (GUARANTEES 9), so `verify` must say so
/// before it — the child listed as done at boot, nothing called damage —
/// instead of calling the root healthy with nothing to do.
#[test]
fn a_child_whose_parent_directory_is_gone_is_listed_as_terminated_at_boot() {
    let (fs, parent, child) = tree();
    // A power cut first: the disk at rest, as a loss wants it.
    fs.restart(CrashMode::PowerLoss(DirModel::Strict));
    fs.lose(&parent).expect("lose the parent's directory");
    let v = checked(&fs);
    assert!(v.is_healthy(), "{:#?}", v.damaged);
    assert!(
        v.repaired_at_boot
            .iter()
            .any(|c| c.path == child && c.what.contains("terminates this session")),
        "{:#?}",
        v.repaired_at_boot
    );
    let mut system = boot(&fs).expect("the boot terminates the child");
    assert!(
        system.runtime_mut().tree().nodes().is_empty(),
        "the child was not terminated"
    );
}
