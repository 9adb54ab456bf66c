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

use std::sync::Arc;

use durable_agent::fs::CrashImage;
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
        let mut driver = self
            .driver
            .fork(image.reboot(kind.mode()), point, j.names.clone());
        driver.rot_fork(kind, floor.as_ref(), point);
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
