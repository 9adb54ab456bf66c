//! The fast sweep's half of [`Exec`]: a crash-free dry run in SimFs's
//! capture mode, whose every I/O point leaves a [`CrashImage`], and the
//! judging of one image as if the run had been killed there.
//!
//! Invariant: judging a fork gives the verdict (and the adopted model) a
//! replay crashed at the same point would give. That holds because (1) the
//! image is bit-for-bit the disk of that replay, random draws included
//! (`SimFs::set_capture`, property-tested), (2) a sweep's crash is a kill
//! -9: the interrupted op is in flight whatever its doomed code returns,
//! and a dead process delivers nothing to the world, so nothing after the
//! point matters, and (3) each image carries the candidates, bookkeeping
//! and world of the moment it was taken, and SQLite's global PRNG is
//! saved around the fork's boot so the live run goes on unchanged.
//! `sim/tests/sweep.rs` checks the equivalence point by point.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use durable_agent::fs::{CrashImage, SimFs};
use durable_agent::sqlite::with_saved_prng;

use super::{Exec, GlobalCrash};
use crate::driver::Names;
use crate::model::{Action, Model};
use crate::op::CrashKind;
use crate::oracle::Side;
use crate::report::Failure;

/// What a replay crashed inside one phase of the run hands the oracle.
#[derive(Debug, Clone)]
pub struct Judging {
    before: Model,
    after: Option<Model>,
    action: Option<Action>,
    names: Names,
    /// Ops applied when the phase ran (the op in flight included).
    history_len: usize,
    step_start: u64,
}

impl Judging {
    /// A boot, a clean restart, or the reads between ops: the recovered
    /// state must equal `model`.
    pub(super) fn restart(model: &Model, names: Option<Names>, exec: &Exec) -> Judging {
        Judging {
            before: model.clone(),
            after: None,
            action: None,
            names: names.unwrap_or_default(),
            history_len: exec.history.len(),
            step_start: exec.step_start,
        }
    }

    /// An op in flight: before or after it.
    pub(super) fn in_flight(
        before: &Model,
        after: &Model,
        action: &Action,
        names: Option<Names>,
        exec: &Exec,
    ) -> Judging {
        Judging {
            before: before.clone(),
            after: Some(after.clone()),
            action: Some(action.clone()),
            names: names.unwrap_or_default(),
            history_len: exec.history.len(),
            step_start: exec.step_start,
        }
    }
}

/// One crash image of the dry run and how to judge it.
#[derive(Debug, Clone)]
pub struct Fork {
    pub image: CrashImage,
    pub judging: Arc<Judging>,
}

impl Exec {
    /// The dry run of the fast sweep: like [`Exec::new`] with a crash point
    /// that is never reached, but performing the install (not copying it)
    /// and capturing a [`Fork`] at every I/O point (take them with [`Exec::take_forks`] after each
    /// step and judge them with [`Exec::judge_fork`]).
    pub fn capturing(seed: u64, canaries: durable_agent::canary::Canaries) -> Result<Exec, Box<Failure>> {
        let never = GlobalCrash {
            point: u64::MAX,
            kind: CrashKind::Process,
        };
        Exec::start(seed, canaries, Some(never), true)
    }

    /// The forks captured since the last call, in point order.
    pub fn take_forks(&mut self) -> Vec<Fork> {
        self.forks.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub(super) fn capturing_now(&self) -> bool {
        self.forks.is_some()
    }

    /// The bookkeeping a fork needs, when capturing.
    pub(super) fn names(&self) -> Option<Names> {
        self.capturing_now().then(|| self.driver.names())
    }

    /// File the images captured during the phase that just ended under
    /// the judging `make` builds (only called when there are images).
    pub(super) fn collect(&mut self, make: impl FnOnce(&Exec) -> Judging) {
        if !self.capturing_now() {
            return;
        }
        let images = self.driver.fs.take_captures();
        if images.is_empty() {
            return;
        }
        let judging = Arc::new(make(self));
        if let Some(forks) = self.forks.as_mut() {
            forks.extend(images.into_iter().map(|image| Fork {
                image,
                judging: Arc::clone(&judging),
            }));
        }
    }

    /// Judge a fork (`image`, taken under `j`) as a run killed at its point
    /// with `kind`: reboot the image, recover, check the invariants and
    /// ask the oracle. `Ok` holds the side the oracle accepted and the
    /// model the run would go on from. The live run is not touched.
    pub fn judge_fork(
        &self,
        image: CrashImage,
        j: &Judging,
        kind: CrashKind,
    ) -> Result<(Side, Model), Box<Failure>> {
        let point = image.point();
        let floor = (kind == CrashKind::PowerRot).then(|| image.durable_image_where(crate::rot::is_target));
        let disk = image.reboot(kind.mode());
        self.judge_disk(disk, floor.as_ref(), point, j, kind)
    }

    /// What the recovery of a fork killed at `point` can observe, beside
    /// its phase and mode: the rebooted `disk`'s content, and how many
    /// deliveries, model asks and lost lookup attempts the world had seen
    /// before the point.
    /// Two forks of one phase and mode with equal keys are judged alike
    /// (the verdict cache's invariant, see [`crate::verdicts`]).
    pub fn observed(&self, disk: &SimFs, point: u64) -> Observed {
        let (sent, asks) = self.driver.prefix_at(point);
        Observed {
            disk: disk_key(disk),
            sent,
            asks,
            lost_attempts: self.driver.lost_attempts_before(point),
        }
    }

    /// [`Exec::judge_fork`] of a disk already rebooted from its image
    /// (`floor`: the image's durable floor, for `PowerRot`).
    pub fn judge_disk(
        &self,
        disk: SimFs,
        floor: Option<&BTreeMap<PathBuf, Vec<u8>>>,
        point: u64,
        j: &Judging,
        kind: CrashKind,
    ) -> Result<(Side, Model), Box<Failure>> {
        let mut driver = self.driver.fork(disk, point, j.names.clone());
        // The clock of the op the point lies in (a boot's time is data: a
        // RESUME row's `fire_at`), not the live run's at judging time.
        driver.set_step(j.history_len as u64);
        driver.rot_fork(kind, floor, point);
        let mut exec = Exec {
            seed: self.seed,
            canaries: self.canaries.clone(),
            global: Some(GlobalCrash { point, kind }),
            driver,
            model: j.before.clone(),
            armed: None,
            armed_fault: None,
            history: self.history[..j.history_len.min(self.history.len())].to_vec(),
            restarts: self.restarts,
            crashes: 1,
            step_start: j.step_start,
            crash_mode: Some(kind),
            boundary: None,
            restart_notes: self.restart_notes.clone(),
            forks: None,
            crash_side: None,
            clean_restart: false,
            answered_failure: false,
            in_chain: false,
        };
        with_saved_prng(|| {
            let judged = exec.reopen_and_judge(kind, &j.before, j.after.as_ref(), j.action.as_ref());
            // Done with this disk: kill the fork rather than let SQLite's
            // close checkpoint a WAL nobody will read.
            exec.driver.discard();
            judged
        })?;
        // A fork is one crash, judged once: its side is always known.
        let side = exec.crash_side.unwrap_or(Side::After);
        Ok((side, exec.model))
    }
}

/// A 64-bit hash of what recovery reads of `disk`: every path, directory
/// and file, a SQLite WAL only as far as its last commit frame
/// ([`crate::wal::committed_len_upper`]: without checking the frames'
/// checksums, which would cost a pass over every page). Each file counts
/// by its digest ([`file_digest`]), which the SimFs remembers per version
/// of the file ([`durable_agent::fs::FileVersion::digest`]: slot 0 for a
/// whole file, slot 1 for a WAL's prefix), so a sweep hashes a version
/// once however many crash images hold it. ahash with fixed seeds:
/// in-process and deterministic (the cache never outlives a sweep, so no
/// stability across builds is needed); two distinct states of one phase
/// collide with odds of about n²/2⁶⁵ for n states (and as much again for
/// two versions of one file among m: m²/2⁶⁵).
fn disk_key(disk: &SimFs) -> u64 {
    content_key(disk, true)
}

/// [`disk_key`] with `wal_tail_ignored`; without it every file whole, a
/// WAL's uncommitted tail included: the key of a pure function of the
/// disk's bytes (the driver's memo of `verify`,
/// [`crate::driver::verified`]).
pub(crate) fn content_key(disk: &SimFs, wal_tail_ignored: bool) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::ffi::OsStrExt;

    let mut h = ahash::RandomState::with_seeds(0xda, 0x5e, 0xed, 0x5).build_hasher();
    disk.visit_versions(|path, file| {
        let spelled = path.as_os_str().as_bytes();
        h.write_usize(spelled.len());
        h.write(spelled);
        match file {
            None => h.write_u8(b'd'),
            Some(file) => {
                let wal = wal_tail_ignored && spelled.ends_with(b"-wal");
                h.write_u8(b'f');
                h.write_u64(file.digest(usize::from(wal), |bytes| file_digest(wal, bytes)));
            }
        }
    });
    h.finish()
}

/// The hash of what recovery reads of one file: a WAL's committed
/// prefix, any other file whole. A pure function of `(wal, bytes)`: what
/// [`disk_key`] may remember per version of the file.
fn file_digest(wal: bool, bytes: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};

    let n = if wal {
        crate::wal::committed_len_upper(bytes)
    } else {
        bytes.len()
    };
    let mut h = ahash::RandomState::with_seeds(0xf1, 0x1e, 0xd1, 0x6e).build_hasher();
    h.write_usize(n);
    h.write(&bytes[..n]);
    h.finish()
}

/// The part of a verdict cache key a fork's disk and world give (see
/// [`Exec::observed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Observed {
    /// FNV-1a of the rebooted disk's paths, directories and bytes, a
    /// SQLite WAL's as far as its last commit frame ([`crate::wal`]).
    pub disk: u64,
    /// Deliveries the world saw before the crash point.
    pub sent: usize,
    /// Model asks answered before the crash point.
    pub asks: usize,
    /// First attempts of lookups the world lost before the crash point
    /// ([`crate::standins::SimTools`]): a fork that remembers one answers
    /// its re-run at once, one that does not loses it then, and the two
    /// leave different attempt rows even on equal disks (the loss and the
    /// row's commit are separate points, and the key ignores a WAL's
    /// uncommitted tail).
    pub lost_attempts: usize,
}

impl Exec {
    /// A failure naming a fork of phase `j` killed at (`point`, `kind`),
    /// for a harness self-check that found two judgements disagreeing.
    pub fn harness_bug(
        &self,
        j: &Judging,
        point: u64,
        kind: CrashKind,
        what: String,
        detail: String,
    ) -> Box<Failure> {
        Box::new(Failure {
            case: super::Case {
                seed: self.seed,
                ops: self.history[..j.history_len.min(self.history.len())].to_vec(),
                canaries: self.canaries.clone(),
                crash_at: Some(GlobalCrash { point, kind }),
            },
            step: j.history_len.saturating_sub(1),
            what,
            detail,
            crash: None,
            expected: None,
            recovered: None,
            earlier_restarts: Vec::new(),
        })
    }
}
