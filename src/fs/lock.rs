//! Exclusive locks on a path: the one-writer rule for a runtime root.
//!
//! Invariant: while an [`FsLock`] lives, no other holder (another process
//! with [`super::RealFs`], another boot on the same simulated disk with
//! [`super::SimFs`]) can take the same path; dropping the guard releases
//! it, and so does the death of the process that held it (the kernel drops
//! `flock` locks with the last descriptor; `SimFs::restart` clears them).
//!
//! A lock is process state, not persistent data: taking one is not an I/O
//! point in the simulated trace and leaves nothing durable behind that
//! recovery must read (the real lock file's content is never looked at).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// Held lock; dropping it releases the lock.
pub struct FsLock {
    path: PathBuf,
    _held: Box<dyn Send + Sync>,
}

impl FsLock {
    pub(crate) fn new(path: &Path, held: Box<dyn Send + Sync>) -> Self {
        FsLock {
            path: path.to_path_buf(),
            _held: held,
        }
    }

    /// The locked path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Debug for FsLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FsLock").field("path", &self.path).finish()
    }
}

/// The error every implementation returns for a lock someone else holds.
pub fn lock_held(path: &Path, label: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        format!(
            "{label}: {} is locked by another process (one writer per root)",
            path.display()
        ),
    )
}

/// SimFs's lock table: which paths are held, by which token. Shared by the
/// clones of one simulated disk, cleared when the simulated process dies.
#[derive(Debug, Default, Clone)]
pub(crate) struct SimLocks {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    next_token: u64,
    held: BTreeMap<PathBuf, u64>,
}

/// Releases one SimFs lock, unless a restart already cleared it (and maybe
/// a newer boot took the path since: its token differs).
struct SimGuard {
    locks: SimLocks,
    path: PathBuf,
    token: u64,
}

impl Drop for SimGuard {
    fn drop(&mut self) {
        let mut t = self.locks.table();
        if t.held.get(&self.path) == Some(&self.token) {
            t.held.remove(&self.path);
        }
    }
}

impl SimLocks {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Plain data updated in one step: a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn take(&self, path: &Path, label: &str) -> io::Result<FsLock> {
        let mut t = self.table();
        if t.held.contains_key(path) {
            return Err(lock_held(path, label));
        }
        t.next_token += 1;
        let token = t.next_token;
        t.held.insert(path.to_path_buf(), token);
        let guard = SimGuard {
            locks: self.clone(),
            path: path.to_path_buf(),
            token,
        };
        Ok(FsLock::new(path, Box::new(guard)))
    }

    /// The process died: every lock it held is gone.
    pub(crate) fn clear(&self) {
        self.table().held.clear();
    }
}
