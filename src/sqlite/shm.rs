//! The WAL index ("-shm") kept in memory, per VFS instance.
//!
//! The wal-index is not durable data: SQLite rebuilds it from the WAL file
//! whenever it finds it missing or zeroed (`walIndexRecover`), which is what
//! happens after every crash. One VFS instance models one process, so its
//! shared memory dies with it, exactly like a `-shm` file whose content no
//! other process trusts after a reboot. Keeping it off the `Fs` seam means
//! no I/O points for it — a deliberate choice: faults there could only
//! exercise SQLite's recovery of a cache, not the durability of data.
//!
//! Invariant: region memory stays at a fixed address from first map until
//! the last connection unmaps (SQLite holds raw pointers into it); each of
//! the `SQLITE_SHM_NLOCK` lock slots has either one exclusive holder or any
//! number of shared holders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

const NLOCK: usize = libsqlite3_sys::SQLITE_SHM_NLOCK as usize;

/// One zeroed region, 8-byte aligned (SQLite reads it as u32/u64 words).
struct Region(*mut [u64]);

// SAFETY: the region is plain memory owned by this struct; SQLite
// synchronises its own accesses with the shm locks and xShmBarrier.
unsafe impl Send for Region {}

impl Region {
    fn new(bytes: usize) -> Self {
        let words = bytes.div_ceil(8);
        Region(Box::into_raw(vec![0u64; words].into_boxed_slice()))
    }

    fn ptr(&self) -> *mut u8 {
        self.0.cast::<u8>()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::into_raw in `new` and is freed
        // only here, once, after every connection unmapped it.
        drop(unsafe { Box::from_raw(self.0) });
    }
}

#[derive(Default)]
struct Shm {
    regions: Vec<Region>,
    shared: [u32; NLOCK],
    exclusive: [bool; NLOCK],
    refs: usize,
}

/// The shared-memory areas of one VFS instance, by database path.
#[derive(Default)]
pub(crate) struct ShmTable {
    map: Mutex<BTreeMap<PathBuf, Arc<Mutex<Shm>>>>,
}

impl std::fmt::Debug for ShmTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmTable").finish_non_exhaustive()
    }
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Counters and owned memory only; still consistent after a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One connection's attachment to a shared-memory area.
pub(crate) struct ShmHandle {
    shm: Arc<Mutex<Shm>>,
    shared_mask: u16,
    exclusive_mask: u16,
}

impl ShmTable {
    /// Attach a connection of `db` to its shared memory (created empty).
    pub(crate) fn attach(&self, db: &Path) -> ShmHandle {
        let mut map = guard(&self.map);
        let shm = map.entry(db.to_path_buf()).or_default().clone();
        guard(&shm).refs += 1;
        ShmHandle {
            shm,
            shared_mask: 0,
            exclusive_mask: 0,
        }
    }

    /// Detach: release the handle's locks; the last detach frees the memory.
    pub(crate) fn detach(&self, db: &Path, mut handle: ShmHandle) {
        handle.lock(0, NLOCK, LockOp::Unlock);
        let mut map = guard(&self.map);
        let last = {
            let mut shm = guard(&handle.shm);
            shm.refs = shm.refs.saturating_sub(1);
            shm.refs == 0
        };
        if last {
            map.remove(db);
        }
    }
}

/// A shm lock request (`xShmLock` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockOp {
    Unlock,
    Shared,
    Exclusive,
}

impl ShmHandle {
    /// Pointer to region `index` of `size` bytes; allocates missing regions
    /// when `extend`, else returns null for a region not yet created.
    pub(crate) fn map(&self, index: usize, size: usize, extend: bool) -> *mut u8 {
        let mut shm = guard(&self.shm);
        if shm.regions.len() <= index {
            if !extend {
                return std::ptr::null_mut();
            }
            while shm.regions.len() <= index {
                shm.regions.push(Region::new(size));
            }
        }
        shm.regions[index].ptr()
    }

    /// Take or release slots `offset..offset+n`. False means SQLITE_BUSY.
    pub(crate) fn lock(&mut self, offset: usize, n: usize, op: LockOp) -> bool {
        let end = (offset + n).min(NLOCK);
        let mut shm = guard(&self.shm);
        for i in offset..end {
            let bit = 1u16 << i;
            match op {
                LockOp::Unlock => {
                    if self.exclusive_mask & bit != 0 {
                        shm.exclusive[i] = false;
                    }
                    if self.shared_mask & bit != 0 {
                        shm.shared[i] = shm.shared[i].saturating_sub(1);
                    }
                }
                LockOp::Shared => {
                    if self.shared_mask & bit == 0 && self.exclusive_mask & bit == 0 && shm.exclusive[i] {
                        return false;
                    }
                }
                LockOp::Exclusive => {
                    let own_shared = u32::from(self.shared_mask & bit != 0);
                    if self.exclusive_mask & bit == 0 && (shm.exclusive[i] || shm.shared[i] > own_shared) {
                        return false;
                    }
                }
            }
        }
        // Every slot is free for us: apply the request.
        for i in offset..end {
            let bit = 1u16 << i;
            match op {
                LockOp::Unlock => {
                    self.shared_mask &= !bit;
                    self.exclusive_mask &= !bit;
                }
                LockOp::Shared => {
                    if self.shared_mask & bit == 0 && self.exclusive_mask & bit == 0 {
                        shm.shared[i] += 1;
                        self.shared_mask |= bit;
                    }
                }
                LockOp::Exclusive => {
                    if self.exclusive_mask & bit == 0 {
                        shm.exclusive[i] = true;
                        self.exclusive_mask |= bit;
                    }
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_shm_slot_excludes_readers_and_memory_is_shared() {
        let t = ShmTable::default();
        let db = Path::new("/d.db");
        let mut a = t.attach(db);
        let mut b = t.attach(db);
        assert!(a.map(0, 32768, false).is_null());
        let pa = a.map(0, 32768, true);
        assert_eq!(pa, b.map(0, 32768, false), "both see one region");
        assert_eq!(pa as usize % 8, 0);
        assert!(a.lock(3, 1, LockOp::Shared));
        assert!(!b.lock(3, 1, LockOp::Exclusive));
        assert!(b.lock(0, 2, LockOp::Exclusive));
        assert!(!a.lock(1, 1, LockOp::Shared));
        assert!(b.lock(0, 2, LockOp::Unlock));
        assert!(a.lock(1, 1, LockOp::Shared));
        t.detach(db, a);
        t.detach(db, b);
        assert!(guard(&t.map).is_empty(), "last detach frees the area");
        let c = t.attach(db);
        assert!(
            c.map(0, 32768, false).is_null(),
            "a new process sees no wal-index"
        );
        t.detach(db, c);
    }
}
