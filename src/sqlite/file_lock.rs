//! Lock and shared-memory methods of the VFS files: database-file locks
//! go to the in-process [`super::lock::LockTable`], the WAL index to the
//! in-memory [`super::shm::ShmTable`]. Neither touches the `Fs` seam: locks
//! and the wal-index are process state, not durable data.
//!
//! Invariant: only the main database file takes locks (as unix's `noLock`
//! for every other file type); a file attaches to its database's shared
//! memory on first use and detaches on xShmUnmap or xClose.

use std::ffi::{c_int, c_void};

use libsqlite3_sys as ffi;

use super::file::{state, Backing, Kind};
use super::shm::LockOp;
use super::vfs::guard;

pub(super) unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    guard(ffi::SQLITE_IOERR_LOCK, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        match (&st.backing, st.kind) {
            (Backing::Fs(path), Kind::Db) => {
                if st.vfs.locks.lock(path, &mut st.lock, level) {
                    ffi::SQLITE_OK
                } else {
                    ffi::SQLITE_BUSY
                }
            }
            _ => ffi::SQLITE_OK,
        }
    })
}

pub(super) unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    guard(ffi::SQLITE_IOERR_UNLOCK, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        if let (Backing::Fs(path), Kind::Db) = (&st.backing, st.kind) {
            st.vfs.locks.unlock(path, &mut st.lock, level);
        }
        ffi::SQLITE_OK
    })
}

pub(super) unsafe extern "C" fn x_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    guard(ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        let reserved = match &st.backing {
            // As unixCheckReservedLock: any connection of this process,
            // this one included, holding RESERVED or higher.
            Backing::Fs(path) if st.kind == Kind::Db => st.vfs.locks.reserved(path),
            _ => false,
        };
        // SAFETY: valid out pointer from SQLite.
        unsafe { *out = c_int::from(reserved) };
        ffi::SQLITE_OK
    })
}

pub(super) unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        let Backing::Fs(path) = &st.backing else {
            return ffi::SQLITE_IOERR_SHMOPEN;
        };
        let vfs = st.vfs.clone();
        let handle = st.shm.get_or_insert_with(|| vfs.shm.attach(path));
        let p = handle.map(region.max(0) as usize, size.max(0) as usize, extend != 0);
        // SAFETY: valid out pointer from SQLite.
        unsafe { *out = p.cast::<c_void>() };
        ffi::SQLITE_OK
    })
}

pub(super) unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    guard(ffi::SQLITE_IOERR_SHMLOCK, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        let Backing::Fs(path) = &st.backing else {
            return ffi::SQLITE_IOERR_SHMLOCK;
        };
        let vfs = st.vfs.clone();
        let handle = st.shm.get_or_insert_with(|| vfs.shm.attach(path));
        let op = if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
            LockOp::Unlock
        } else if flags & ffi::SQLITE_SHM_EXCLUSIVE != 0 {
            LockOp::Exclusive
        } else {
            LockOp::Shared
        };
        if handle.lock(offset.max(0) as usize, n.max(0) as usize, op) {
            ffi::SQLITE_OK
        } else {
            ffi::SQLITE_BUSY
        }
    })
}

pub(super) unsafe extern "C" fn x_shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

pub(super) unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, _delete: c_int) -> c_int {
    guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        if let (Backing::Fs(path), Some(h)) = (&st.backing, st.shm.take()) {
            st.vfs.shm.detach(path, h);
        }
        ffi::SQLITE_OK
    })
}
