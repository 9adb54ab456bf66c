//! **F2**: the operator's `verify` under an injected I/O fault says it
//! could not read. At a sample of boots, `verify` of the disk is run on a
//! detached copy with one EIO armed at a point of its own reads (the
//! point drawn from the run's seed and the disk's point count). The
//! report must be the fault-free one (a read it did not need), or else
//! not call the root healthy and name the file the fault hit in an
//! `unreadable` finding (as its file or in its message; a fault in the
//! store's WAL or rollback journal may be named as the store, whose copy
//! it is part of). Taking the error for an absent file, or going on
//! without it, gives a report that describes another disk: a store read
//! without its WAL (committed transactions missing), a log without its
//! pending copy, a tree without one of its live sessions.
//!
//! Invariant: the check runs on detached copies only, so the run's points,
//! draws and armed fault are untouched, and it is a function of the disk
//! and the seed (the same disk and seed draw the same point).

use std::path::Path;
use std::sync::Arc;

use durable_agent::fs::sim::{FailKind, Outcome};
use durable_agent::fs::{Fault, SimConfig, SimFs};
use durable_agent::recovery::verify::{verify_with, FindingKind, Verification, Writers};

/// One boot in this many runs the check (one verify under the fault; the
/// fault-free report and its point count are the boot's own, from
/// [`super::verified`]).
pub const SAMPLE_EVERY: u64 = 8;

/// The violation of F2 on `fs`'s disk, if this boot is sampled and the
/// faulted verify breaks it; `(fresh, points)` is the fault-free report of
/// this disk and the I/O points it took. Whether a boot is checked depends
/// on the seed and the run's point count only (not on the memo of
/// [`super::verified`], which only saves computing `fresh`), so a replay
/// or a shrink checks the same boots.
pub fn check(
    fs: &SimFs,
    seed: u64,
    (fresh, points): (&Verification, u64),
    root: &Path,
    db: &Path,
) -> Option<String> {
    let draw = mix(seed ^ fs.points().wrapping_mul(0x9e37_79b9_7f4a_7c15));
    if !draw.is_multiple_of(SAMPLE_EVERY) {
        return None;
    }
    if points == 0 {
        return None;
    }
    let copy = Arc::new(fs.detached(SimConfig::new(seed)));
    let start = copy.points();
    let at = start + 1 + (draw >> 8) % points;
    copy.set_fault(Some(Fault::FailAt(at, FailKind::Eio)));
    let report = verify_with(copy.clone(), root, db, Writers::None);
    let hit = copy.trace_from(at).into_iter().find(|e| e.point == at)?;
    if !matches!(hit.outcome, Outcome::Failed(_)) {
        return None; // the point was not a failable one
    }
    if &report == fresh {
        return None; // a read the report did not need (a second look)
    }
    let path = Path::new(&hit.path);
    judge(&report, path, db).err().map(|why| {
        format!(
            "F2: verify under an injected EIO at its point {} ({} {:?} on {}) {why}: {report:?}",
            at - start,
            hit.label,
            hit.op,
            hit.path
        )
    })
}

/// Whether `report`, made with an EIO at a read of `path`, says so.
fn judge(report: &Verification, path: &Path, db: &Path) -> Result<(), String> {
    if report.is_healthy() {
        return Err("called the root healthy".into());
    }
    let store_part = |p: &Path| {
        let name = p.to_string_lossy();
        name.strip_suffix("-wal")
            .or_else(|| name.strip_suffix("-journal"))
            .is_some_and(|base| Path::new(base) == db)
    };
    // Named as the finding's file, or in its message (a log's finding
    // names the pending copy it could not read), or — for the WAL or the
    // journal — as the store they are part of.
    let shown = path.to_string_lossy();
    let named = report.damaged.iter().any(|f| {
        f.kind == FindingKind::Unreadable
            && (f.path == path || f.message.contains(shown.as_ref()) || (store_part(path) && f.path == db))
    });
    if named {
        Ok(())
    } else {
        Err("did not name that file unreadable".into())
    }
}

/// SplitMix64's finalizer: a well-spread draw from a combined key.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
