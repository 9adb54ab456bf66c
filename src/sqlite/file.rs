//! The per-file VFS methods (`sqlite3_io_methods`): every read, write,
//! truncate, sync and size query of a database, journal or WAL is one call
//! on the `Fs` seam with a label naming the step.
//!
//! Invariants:
//! - Sync semantics follow `os_unix.c`: `xSync` is a full `Fs::sync`
//!   (SQLITE_SYNC_DATAONLY / NORMAL / FULL all become an fsync — never
//!   weaker than asked), and the first successful `xSync` of a main
//!   journal, WAL or super-journal opened with SQLITE_OPEN_CREATE also
//!   fsyncs its directory (`UNIXFILE_DIRSYNC`, set from `isNewJrnl`), so
//!   the new entry is durable before SQLite relies on it. Unlike unixSync
//!   we report a failed directory fsync (SQLITE_IOERR_DIR_FSYNC) and retry
//!   it on the next sync instead of ignoring it: every `Fs` supports it.
//! - A short read zero-fills the rest of the buffer and returns
//!   SQLITE_IOERR_SHORT_READ (SQLite relies on the zeros).
//! - Temporary files (no name, or temp/sub-journal/transient types) live in
//!   memory: they hold no durable data and would only add noise points.
//! - Locks and the wal-index are in `file_lock` (no Fs I/O).

use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libsqlite3_sys as ffi;

use super::error::{io_to_code, IoStep};
use super::file_lock::{
    x_check_reserved_lock, x_lock, x_shm_barrier, x_shm_lock, x_shm_map, x_shm_unmap, x_unlock,
};
use super::shm::ShmHandle;
use super::vfs::{c_path, guard, inner, parent_dir, VfsInner};
use crate::fs::OpenMode;

/// What a file is to SQLite; names the step in every label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Db,
    Journal,
    Wal,
    SuperJournal,
    Temp,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Db => "db",
            Kind::Journal => "journal",
            Kind::Wal => "wal",
            Kind::SuperJournal => "super-journal",
            Kind::Temp => "temp",
        })
    }
}

impl Kind {
    fn from_flags(flags: c_int) -> Kind {
        if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
            Kind::Db
        } else if flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0 {
            Kind::Journal
        } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
            Kind::Wal
        } else if flags & ffi::SQLITE_OPEN_SUPER_JOURNAL != 0 {
            Kind::SuperJournal
        } else {
            Kind::Temp
        }
    }

    /// Best guess from a file name, for xDelete/xAccess which get no flags.
    pub(crate) fn from_name(path: &Path) -> Kind {
        let name = path.to_string_lossy();
        if name.ends_with("-journal") {
            Kind::Journal
        } else if name.ends_with("-wal") {
            Kind::Wal
        } else if name.contains("-mj") {
            Kind::SuperJournal
        } else {
            Kind::Db
        }
    }
}

pub(super) enum Backing {
    Fs(PathBuf),
    Memory(Vec<u8>),
}

pub(super) struct FileState {
    pub(super) vfs: Arc<VfsInner>,
    pub(super) kind: Kind,
    pub(super) backing: Backing,
    /// os_unix.c UNIXFILE_DIRSYNC: fsync the directory on the next sync.
    pub(super) dir_sync_pending: bool,
    pub(super) lock: c_int,
    pub(super) shm: Option<ShmHandle>,
}

/// The `sqlite3_file` SQLite allocates (`szOsFile` bytes) for our files.
#[repr(C)]
struct RawFile {
    base: ffi::sqlite3_file,
    state: *mut FileState,
}

pub(crate) const RAW_FILE_SIZE: c_int = std::mem::size_of::<RawFile>() as c_int;

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2, // xShm* for WAL; no xFetch/xUnfetch (no mmap)
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

pub(crate) unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    guard(ffi::SQLITE_CANTOPEN, || {
        let raw = file.cast::<RawFile>();
        // SAFETY: SQLite gives us szOsFile writable bytes at `file`. A null
        // pMethods tells SQLite not to call xClose if we fail below.
        unsafe {
            (*raw).base.pMethods = std::ptr::null();
            (*raw).state = std::ptr::null_mut();
        }
        // SAFETY: SQLite passes our registered VFS and a valid (or NULL) name.
        let (vfs_inner, name) = unsafe { (inner(vfs), c_path(z_name)) };
        let kind = Kind::from_flags(flags);
        let backing = match name {
            Some(path) if kind != Kind::Temp => {
                let mode = if flags & ffi::SQLITE_OPEN_EXCLUSIVE != 0 {
                    OpenMode::CreateNew
                } else if flags & ffi::SQLITE_OPEN_CREATE != 0 {
                    OpenMode::Create
                } else {
                    OpenMode::Existing
                };
                if let Err(e) = vfs_inner.fs.open(&path, mode, &format!("sqlite {kind} open")) {
                    vfs_inner.record(format!("{}: open: {e}", path.display()));
                    return ffi::SQLITE_CANTOPEN;
                }
                Backing::Fs(path)
            }
            _ => Backing::Memory(Vec::new()),
        };
        let is_new_journal = flags & ffi::SQLITE_OPEN_CREATE != 0
            && matches!(kind, Kind::Journal | Kind::Wal | Kind::SuperJournal);
        // SAFETY: pAppData is the Arc<VfsInner> the Vfs keeps alive; bump
        // its count so this file keeps it alive too (released in xClose).
        let vfs_arc = unsafe {
            let ptr = (*vfs).pAppData as *const VfsInner;
            Arc::increment_strong_count(ptr);
            Arc::from_raw(ptr)
        };
        let state = Box::new(FileState {
            vfs: vfs_arc,
            kind,
            backing,
            dir_sync_pending: is_new_journal,
            lock: ffi::SQLITE_LOCK_NONE,
            shm: None,
        });
        // SAFETY: as above; the state is freed in xClose.
        unsafe {
            (*raw).state = Box::into_raw(state);
            (*raw).base.pMethods = &IO_METHODS;
            if !out_flags.is_null() {
                *out_flags = flags;
            }
        }
        ffi::SQLITE_OK
    })
}

/// The state behind a file SQLite opened through `x_open`.
///
/// # Safety
/// `file` must have been opened successfully by `x_open` and not closed.
pub(super) unsafe fn state<'a>(file: *mut ffi::sqlite3_file) -> &'a mut FileState {
    // SAFETY: per the contract, `state` is the Box x_open leaked; SQLite
    // serialises calls on one file, so no other &mut exists meanwhile.
    unsafe { &mut *(*file.cast::<RawFile>()).state }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    guard(ffi::SQLITE_IOERR_CLOSE, || {
        let raw = file.cast::<RawFile>();
        // SAFETY: opened by x_open; SQLite calls xClose once per open.
        let ptr = unsafe { (*raw).state };
        if ptr.is_null() {
            return ffi::SQLITE_OK;
        }
        // SAFETY: the Box leaked in x_open, reclaimed exactly once here.
        let mut st = unsafe { Box::from_raw(ptr) };
        // SAFETY: `raw` is still SQLite's allocation for this file.
        unsafe { (*raw).state = std::ptr::null_mut() };
        if let Backing::Fs(path) = &st.backing {
            let mut held = st.lock;
            st.vfs.locks.unlock(path, &mut held, ffi::SQLITE_LOCK_NONE);
            if let Some(h) = st.shm.take() {
                st.vfs.shm.detach(path, h);
            }
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    guard(ffi::SQLITE_IOERR_READ, || {
        // SAFETY: opened file; `buf` has room for `amt` bytes.
        let (st, buf) = unsafe {
            (
                state(file),
                std::slice::from_raw_parts_mut(buf.cast::<u8>(), amt.max(0) as usize),
            )
        };
        let off = off.max(0) as u64;
        let n = match &st.backing {
            Backing::Memory(data) => {
                let start = (off as usize).min(data.len());
                let n = buf.len().min(data.len() - start);
                buf[..n].copy_from_slice(&data[start..start + n]);
                n
            }
            Backing::Fs(path) => {
                let label = format!("sqlite {} read off={off} len={}", st.kind, buf.len());
                // xRead's contract: fewer bytes than asked means end of
                // file, so a short `pread` must be asked again.
                let read = if st.vfs.one_read_is_enough {
                    st.vfs.fs.read_at(path, off, buf, &label)
                } else {
                    crate::fs::read_full_at(&*st.vfs.fs, path, off, buf, &label)
                };
                match read {
                    Ok(n) => n,
                    Err(e) => {
                        st.vfs.record(format!("{}: read off={off}: {e}", path.display()));
                        return io_to_code(IoStep::Read, &e);
                    }
                }
            }
        };
        if n < buf.len() {
            buf[n..].fill(0);
            return ffi::SQLITE_IOERR_SHORT_READ;
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    guard(ffi::SQLITE_IOERR_WRITE, || {
        // SAFETY: opened file; `buf` holds `amt` readable bytes.
        let (st, data) = unsafe {
            (
                state(file),
                std::slice::from_raw_parts(buf.cast::<u8>(), amt.max(0) as usize),
            )
        };
        let off = off.max(0) as u64;
        match &mut st.backing {
            Backing::Memory(mem) => {
                let end = off as usize + data.len();
                if mem.len() < end {
                    mem.resize(end, 0);
                }
                mem[off as usize..end].copy_from_slice(data);
                ffi::SQLITE_OK
            }
            Backing::Fs(path) => {
                let label = format!("sqlite {} write off={off} len={}", st.kind, data.len());
                match st.vfs.fs.write_at(path, off, data, &label) {
                    Ok(()) => ffi::SQLITE_OK,
                    Err(e) => {
                        st.vfs.record(format!(
                            "{}: write off={off} len={}: {e}",
                            path.display(),
                            data.len()
                        ));
                        io_to_code(IoStep::Write, &e)
                    }
                }
            }
        }
    })
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    guard(ffi::SQLITE_IOERR_TRUNCATE, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        let size = size.max(0) as u64;
        match &mut st.backing {
            Backing::Memory(mem) => {
                mem.resize(size as usize, 0);
                ffi::SQLITE_OK
            }
            Backing::Fs(path) => {
                match st
                    .vfs
                    .fs
                    .truncate(path, size, &format!("sqlite {} truncate len={size}", st.kind))
                {
                    Ok(()) => ffi::SQLITE_OK,
                    Err(e) => {
                        st.vfs
                            .record(format!("{}: truncate to {size}: {e}", path.display()));
                        io_to_code(IoStep::Truncate, &e)
                    }
                }
            }
        }
    })
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    guard(ffi::SQLITE_IOERR_FSYNC, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        let Backing::Fs(path) = &st.backing else {
            return ffi::SQLITE_OK;
        };
        if let Err(e) = st.vfs.fs.sync(path, &format!("sqlite {} sync", st.kind)) {
            st.vfs.record(format!("{}: sync: {e}", path.display()));
            return io_to_code(IoStep::Sync, &e);
        }
        if st.dir_sync_pending {
            let dir = parent_dir(path);
            if let Err(e) = st
                .vfs
                .fs
                .sync_dir(&dir, &format!("sqlite dir sync new {}", st.kind))
            {
                st.vfs.record(format!(
                    "{}: dir sync for new {}: {e}",
                    dir.display(),
                    path.display()
                ));
                return io_to_code(IoStep::DirSync, &e);
            }
            st.dir_sync_pending = false;
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, out: *mut ffi::sqlite3_int64) -> c_int {
    guard(ffi::SQLITE_IOERR_FSTAT, || {
        // SAFETY: opened file.
        let st = unsafe { state(file) };
        let len = match &st.backing {
            Backing::Memory(mem) => mem.len() as u64,
            Backing::Fs(path) => match st.vfs.fs.len(path, &format!("sqlite {} size", st.kind)) {
                Ok(n) => n,
                Err(e) => {
                    st.vfs.record(format!("{}: size: {e}", path.display()));
                    return io_to_code(IoStep::FileSize, &e);
                }
            },
        };
        // SAFETY: valid out pointer from SQLite.
        unsafe { *out = len as ffi::sqlite3_int64 };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn x_file_control(_file: *mut ffi::sqlite3_file, _op: c_int, _arg: *mut c_void) -> c_int {
    // No file controls: SQLite falls back to its defaults for every op.
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn x_sector_size(_file: *mut ffi::sqlite3_file) -> c_int {
    4096 // SQLITE_DEFAULT_SECTOR_SIZE, as unixSectorSize
}

unsafe extern "C" fn x_device_characteristics(_file: *mut ffi::sqlite3_file) -> c_int {
    // As os_unix.c by default (psow=1): a torn write never damages bytes
    // outside the range written. SimFs power loss keeps or drops whole
    // writes or tears inside them, so this holds for it too.
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}
