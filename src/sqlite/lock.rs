//! In-process database-file locks with SQLite's five-level protocol
//! (NONE < SHARED < RESERVED < PENDING < EXCLUSIVE).
//!
//! The `Fs` seam has no file locks, so the VFS keeps them here, per VFS
//! instance (one instance models one process). Invariant, per path: any
//! number of SHARED holders; at most one connection holds RESERVED or
//! higher; PENDING blocks new SHARED locks; EXCLUSIVE is granted only when
//! its holder is the sole SHARED holder. This is what `os_unix.c` builds
//! from POSIX byte-range locks, minus cross-process visibility, which a
//! single simulated process never needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use libsqlite3_sys as ffi;

#[derive(Debug, Default)]
struct Inode {
    shared: u32,
    /// Some connection holds RESERVED or higher (it is the writer).
    reserved: bool,
    /// The writer holds PENDING or higher: new readers must wait.
    pending: bool,
    exclusive: bool,
}

/// Lock state of every database file this VFS has open.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    inodes: Mutex<BTreeMap<PathBuf, Inode>>,
}

impl LockTable {
    fn inodes(&self) -> MutexGuard<'_, BTreeMap<PathBuf, Inode>> {
        // Lock state is plain counters; a panic elsewhere leaves it usable.
        self.inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Raise the lock `held` by one connection on `path` to `want`.
    /// Returns false (SQLITE_BUSY) when another connection's lock
    /// conflicts; `held` then says what was obtained (maybe PENDING).
    pub(crate) fn lock(&self, path: &Path, held: &mut i32, want: i32) -> bool {
        if *held >= want {
            return true;
        }
        let mut inodes = self.inodes();
        let inode = inodes.entry(path.to_path_buf()).or_default();
        if *held == ffi::SQLITE_LOCK_NONE {
            if inode.pending || inode.exclusive {
                return false;
            }
            inode.shared += 1;
            *held = ffi::SQLITE_LOCK_SHARED;
        }
        if want == ffi::SQLITE_LOCK_SHARED {
            return true;
        }
        if *held == ffi::SQLITE_LOCK_SHARED {
            // Becoming the writer (RESERVED, or straight to EXCLUSIVE for a
            // hot-journal rollback) needs that nobody else is the writer.
            if inode.reserved {
                return false;
            }
            inode.reserved = true;
            *held = ffi::SQLITE_LOCK_RESERVED;
        }
        if want == ffi::SQLITE_LOCK_RESERVED {
            return true;
        }
        // PENDING or EXCLUSIVE: we are the writer here.
        debug_assert!(inode.reserved);
        inode.pending = true;
        *held = ffi::SQLITE_LOCK_PENDING;
        if want == ffi::SQLITE_LOCK_PENDING {
            return true;
        }
        if inode.shared > 1 {
            return false;
        }
        inode.exclusive = true;
        *held = ffi::SQLITE_LOCK_EXCLUSIVE;
        true
    }

    /// Lower the lock `held` on `path` to `want` (SHARED or NONE).
    pub(crate) fn unlock(&self, path: &Path, held: &mut i32, want: i32) {
        if *held <= want {
            return;
        }
        let mut inodes = self.inodes();
        let Some(inode) = inodes.get_mut(path) else {
            *held = want;
            return;
        };
        if *held > ffi::SQLITE_LOCK_SHARED {
            inode.reserved = false;
            inode.pending = false;
            inode.exclusive = false;
            *held = ffi::SQLITE_LOCK_SHARED;
        }
        if want == ffi::SQLITE_LOCK_NONE {
            inode.shared = inode.shared.saturating_sub(1);
            *held = ffi::SQLITE_LOCK_NONE;
            if inode.shared == 0 {
                inodes.remove(path);
            }
        }
    }

    /// Whether any connection holds RESERVED or higher on `path`.
    pub(crate) fn reserved(&self, path: &Path) -> bool {
        self.inodes().get(path).is_some_and(|i| i.reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffi::{SQLITE_LOCK_EXCLUSIVE as EX, SQLITE_LOCK_NONE as NONE, SQLITE_LOCK_PENDING as PEN};
    use ffi::{SQLITE_LOCK_RESERVED as RES, SQLITE_LOCK_SHARED as SH};

    #[test]
    fn one_writer_and_exclusive_waits_for_readers() {
        let t = LockTable::default();
        let p = Path::new("/db");
        let (mut a, mut b) = (NONE, NONE);
        assert!(t.lock(p, &mut a, SH));
        assert!(t.lock(p, &mut b, SH));
        assert!(t.lock(p, &mut a, RES));
        assert!(!t.lock(p, &mut b, RES), "second writer must be refused");
        assert!(t.reserved(p));
        assert!(!t.lock(p, &mut a, EX), "exclusive while b reads");
        assert_eq!(a, PEN);
        let mut c = NONE;
        assert!(!t.lock(p, &mut c, SH), "pending blocks new readers");
        t.unlock(p, &mut b, NONE);
        assert!(t.lock(p, &mut a, EX));
        t.unlock(p, &mut a, SH);
        assert!(!t.reserved(p));
        assert!(t.lock(p, &mut c, SH));
        t.unlock(p, &mut a, NONE);
        t.unlock(p, &mut c, NONE);
        assert!(t.inodes().is_empty());
    }
}
