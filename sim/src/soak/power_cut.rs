//! `--power-cut`: the daemon's root lives on the power-cut FUSE mount
//! (`durable-agent-powercut`), and every crash is a `SIGKILL` followed by a
//! power cut: what the binary never `fsync`ed (file data) or never
//! `fsync`ed the directory of (creates, renames, removes) is kept or lost
//! as SimFs's `PowerLoss` decides from the crash's seed, then the disk is
//! remounted for the restart.
//!
//! Invariant: the mount is cut only after the process was killed and
//! reaped (the [`Crash`] contract), so nothing writes during a cut; each
//! cut's choices — which unsynced writes and directory ops survive, which
//! writes tear, and the directory model (strict three times in four,
//! eager otherwise) — come from the crash seed alone.

use std::path::{Path, PathBuf};

use durable_agent::fs::DirModel;
use durable_agent_powercut::{MountConfig, PowerCutMount};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::crash::Crash;

/// The power-cut backend: a backing directory (the disk at rest) and the
/// FUSE mount the daemon's roots live under.
#[derive(Debug)]
pub struct PowerCut {
    backing: PathBuf,
    mountpoint: PathBuf,
    mount: Option<PowerCutMount>,
    /// Directory model of the current mount's next cut.
    model: DirModel,
}

/// Strict three times in four: it is the model that catches a missing
/// directory fsync; eager (ext4-like) keeps the runs honest on the
/// behaviour most disks have.
fn draw_model(rng: &mut impl Rng) -> DirModel {
    if rng.random_ratio(3, 4) {
        DirModel::Strict
    } else {
        DirModel::Eager
    }
}

impl PowerCut {
    /// Mount a fresh, empty disk under `dir` (`dir/disk` rests between
    /// mounts, `dir/mnt` is the mountpoint). Fails — loudly, naming what is
    /// missing — where FUSE cannot be mounted: a power-cut soak that cannot
    /// cut power must not pass.
    pub fn new(dir: &Path, seed: u64) -> Result<PowerCut, String> {
        let backing = dir.join("disk");
        let mountpoint = dir.join("mnt");
        for d in [&backing, &mountpoint] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: cannot create: {e}", d.display()))?;
        }
        let model = draw_model(&mut ChaCha8Rng::seed_from_u64(seed));
        let mount = PowerCutMount::mount(&backing, &mountpoint, MountConfig::new(model))
            .map_err(|e| format!("FUSE UNAVAILABLE, the power-cut soak cannot run: {e}"))?;
        Ok(PowerCut {
            backing,
            mountpoint,
            mount: Some(mount),
            model,
        })
    }

    /// Where the disk rests between mounts (and after the soak).
    pub fn backing(&self) -> &Path {
        &self.backing
    }
}

impl Crash for PowerCut {
    fn name(&self) -> &'static str {
        "power-cut"
    }

    fn data_dir(&self) -> &Path {
        &self.mountpoint
    }

    fn after_kill(&mut self, seed: u64) -> Result<String, String> {
        let mount = self
            .mount
            .take()
            .ok_or("the disk is not mounted (an earlier remount failed)")?;
        let model = self.model;
        let cut = mount.cut_power(seed).map_err(|e| e.to_string())?;
        self.model = draw_model(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x5eed));
        self.mount = Some(
            PowerCutMount::mount(&self.backing, &self.mountpoint, MountConfig::new(self.model))
                .map_err(|e| format!("remount after the cut: {e}"))?,
        );
        Ok(format!(
            "SIGKILL + power cut ({model:?}, seed {seed}): {} unsynced op(s) decided",
            cut.undecided.len()
        ))
    }

    fn finish(&mut self) -> Result<(), String> {
        match self.mount.take() {
            // A clean shutdown: what was written reaches the backing disk,
            // which stays for inspection.
            Some(mount) => mount.unmount().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}
