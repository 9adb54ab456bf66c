//! A read-only snapshot of a stopped root, for the CLI's views when no
//! daemon holds it.
//!
//! The choice, and why. A view must not write, and a CLI view beside a
//! running `serve` must not read files a writer is changing. So:
//! - a daemon holds the root (its `LOCK` is taken): the CLI asks the
//!   daemon's API, which answers from its booted system
//!   ([`super::cli`]); nothing is read here;
//! - no daemon: the CLI takes the root lock — so no daemon can start and
//!   change the files mid-copy — copies the root's files into memory (a
//!   fault-free [`SimFs`]; `LOCK` and `quarantine/` left out), releases the
//!   lock, and reads the copy: the runtime is opened on it
//!   ([`Runtime::open`], whose log repair then happens in memory only) and
//!   the store is opened on it (a migration, if any, in memory only).
//!
//! Not booting ([`durable_agent::system::System::boot`]) is deliberate:
//! boot's store recovery decides INTENTs (possibly calling out), reclaims
//! leases and emits RESUME triggers — it writes, and what it shows is the
//! root after a restart, not the root as it is. `verify` reads without
//! the lock through a read-only `Fs` and copies only the store; the views
//! need the whole runtime state (conversations, open turns), which only
//! [`Runtime::open`] rebuilds, and it writes while it repairs — hence the
//! in-memory copy, the same idea as `verify`'s store copy.
//!
//! Invariant: nothing under the root is written: every path read from it
//! is read through [`RealFs`] (`read`, `list`), every write lands in the
//! in-memory copy, and the lock is held only while copying.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_agent::fs::{Fs, OpenMode, RealFs, SimConfig, SimFs};
use durable_agent::recovery::verify::QUARANTINE_DIR;
use durable_agent::runtime::{Runtime, RuntimeConfig, RuntimeError};
use durable_agent::sqlite::{Db, SqliteOptions};
use durable_agent::store::schema::open_store;
use durable_agent::store::StoreError;
use durable_agent::system::{LOCK_FILE, STORE_DB_FILE};

use crate::boot::SYSTEM_SEED;
use crate::schedule::{Schedule, ScheduleError, Schedules};

/// Most files copied (a bound: a root holds a few per agent session).
const MAX_FILES: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Another process holds the root: ask its daemon instead.
    #[error("{0} is locked by another process (a daemon?)")]
    Held(PathBuf),
    #[error("{0}: no such root directory")]
    NoRoot(PathBuf),
    #[error("reading {path} for a snapshot: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} has more than {MAX_FILES} files; inspect it through `serve` instead")]
    TooBig(PathBuf),
    #[error("the root's sessions do not open (run `durable-agent verify`): {0}")]
    Runtime(#[from] RuntimeError),
    #[error("the root's store does not open (run `durable-agent verify`): {0}")]
    Store(#[from] StoreError),
    #[error("the root's schedules do not load: {0}")]
    Schedules(#[from] ScheduleError),
}

/// The root as it was when copied.
#[derive(Debug)]
pub struct Snapshot {
    pub runtime: Runtime,
    pub db: Db,
    pub schedules: Vec<Schedule>,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Copy `dir` (recursively) from `real` into `mem` at the same paths.
fn copy_dir(
    real: &RealFs,
    mem: &SimFs,
    dir: &Path,
    root: &Path,
    files: &mut usize,
) -> Result<(), SnapshotError> {
    mem.create_dir_all(dir, "inspect snapshot mkdir")
        .map_err(io_at(dir))?;
    for name in real.list(dir, "inspect snapshot list").map_err(io_at(dir))? {
        let path = dir.join(&name);
        if dir == root && (name == LOCK_FILE || name == QUARANTINE_DIR) {
            continue;
        }
        // Not `is_dir`: a symlink is not followed into a directory (no
        // loop); a root has none, and reading one names it in the error.
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if is_dir {
            copy_dir(real, mem, &path, root, files)?;
            continue;
        }
        *files += 1;
        if *files > MAX_FILES {
            return Err(SnapshotError::TooBig(root.to_path_buf()));
        }
        let bytes = match real.read(&path, "inspect snapshot read") {
            Ok(bytes) => bytes,
            // Gone between the listing and the read (a `.tmp` cleaned up).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_at(&path)(e)),
        };
        mem.open(&path, OpenMode::Truncate, "inspect snapshot create")
            .and_then(|()| mem.write_at(&path, 0, &bytes, "inspect snapshot write"))
            .map_err(io_at(&path))?;
    }
    Ok(())
}

/// Snapshot the stopped root `root` ([`SnapshotError::Held`] if a daemon
/// holds it).
pub fn open(root: &Path) -> Result<Snapshot, SnapshotError> {
    let root = std::path::absolute(root).map_err(io_at(root))?;
    if !root.is_dir() {
        return Err(SnapshotError::NoRoot(root));
    }
    let real = RealFs::new();
    let lock_path = root.join(LOCK_FILE);
    // No LOCK file: no process ever booted this root, none holds it.
    let lock = match lock_path.exists() {
        true => match real.lock_exclusive(&lock_path, "inspect snapshot lock") {
            Ok(lock) => Some(lock),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(SnapshotError::Held(root)),
            Err(e) => return Err(io_at(&lock_path)(e)),
        },
        false => None,
    };
    let mem = SimFs::new(SimConfig::new(0));
    let mut files = 0;
    copy_dir(&real, &mem, &root, &root, &mut files)?;
    drop(lock);
    tracing::debug!(root = %root.display(), files, "root copied into memory for a read-only view");
    let fs: Arc<dyn Fs> = Arc::new(mem);
    // Silenced: their log lines ("recovery done", "schema migrated") would
    // describe the in-memory copy as if the root itself had been recovered;
    // every failure is returned, not logged.
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        let (runtime, _report) = Runtime::open(fs.clone(), &root, RuntimeConfig::new(SYSTEM_SEED))?;
        let db = open_store(fs.clone(), &root.join(STORE_DB_FILE), &SqliteOptions::default())?;
        let schedules = Schedules::load(fs, &root)?.list();
        Ok(Snapshot {
            runtime,
            db,
            schedules,
        })
    })
}
