//! How the soak's process dies: a [`Crash`] backend owns the directory the
//! runtime's root lives in and decides what that directory holds after the
//! `serve` process was `SIGKILL`ed.
//!
//! Invariant: the driver always kills the process first (from any thread,
//! at any moment — see [`super::serve::Serve::kill`]) and reaps it; only
//! then does [`Crash::after_kill`] run, so a backend never races a live
//! writer. [`Kill`] leaves the directory as the kernel has it (the page
//! cache survives a process death: everything written is there); a power
//! cut backend drops what was never synced before the next boot.

use std::path::{Path, PathBuf};

/// A way to crash the daemon, and the directory its root lives in.
pub trait Crash: Send {
    /// For reports and the repro command: `kill`, `power-cut`.
    fn name(&self) -> &'static str;

    /// The directory the root lives in (`<data_dir>/root-<generation>`).
    /// Exists once the backend is built.
    fn data_dir(&self) -> &Path;

    /// The process was killed and reaped: make [`Crash::data_dir`] what the
    /// next boot finds. `seed` drives every choice the backend makes (one
    /// seed per crash, from the soak's seed). Returns a short note for the
    /// failure report (what was dropped), or an error that ends the soak.
    fn after_kill(&mut self, seed: u64) -> Result<String, String>;

    /// The soak is over (or failed): release what the backend holds
    /// (unmount). Called once; the data directory may be inspected after.
    fn finish(&mut self) -> Result<(), String> {
        Ok(())
    }
}

/// `kill -9` on a plain directory: nothing more happens to the data.
#[derive(Debug)]
pub struct Kill {
    dir: PathBuf,
}

impl Kill {
    /// The root lives under `dir` (created if missing).
    pub fn new(dir: &Path) -> Result<Kill, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: cannot create: {e}", dir.display()))?;
        Ok(Kill {
            dir: dir.to_path_buf(),
        })
    }
}

impl Crash for Kill {
    fn name(&self) -> &'static str {
        "kill"
    }

    fn data_dir(&self) -> &Path {
        &self.dir
    }

    fn after_kill(&mut self, _seed: u64) -> Result<String, String> {
        // A process death loses nothing the process wrote: the page cache
        // is the kernel's.
        Ok("SIGKILL".to_string())
    }
}
